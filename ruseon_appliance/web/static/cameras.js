// Several cameras on the device page: a grid of every camera, a click watches one large, and
// /#<camera> deep links straight to one. With one camera nothing changes. This module owns the
// grid, its tiles and the Cameras button; device.js plays the camera named in player.camera.
//
// Tiles: a live WHEP viewer each up to LIVE_TILES_MAX cameras; beyond that a keyframe snapshot
// per tile, refreshed every SNAPSHOT_MS (a phone cannot decode many H.264 streams at once, and
// the board's cost per snapshot tile is about that of a live one: see README, Several cameras).
// A tile plays (or snapshots) the camera's sub-stream where it has one (/whep/<camera>/sub: a
// quarter of the pixels and bytes), the big picture the main stream; each tile shows the size
// it receives.
import { $, iconButton, player } from "./page.js";
import { WhepClient, webrtcSupport } from "./whep.js";

const LIVE_TILES_MAX = 4;
const SNAPSHOT_MS = 3000;
const STATUS_MS = 3000;
const RETRY_MS = 4000;

const grid = { cameras: [], tiles: new Map(), open: false, mode: "live", element: null };
window.ruseonCameras = grid; // for diagnostics and the end-to-end tests

function hashCamera() { return decodeURIComponent(location.hash.slice(1)); }

async function fetchCameras() {
  const response = await fetch("/api/cameras", { cache: "no-store" });
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  return (await response.json()).cameras;
}

// ---------------------------------------------------------------------------------------------
// Tiles

function tileStream(camera) {
  return camera.substream && camera.substream.enabled ? "sub" : "main";
}

function makeTile(camera) {
  const stream = tileStream(camera);
  const tile = document.createElement("button");
  tile.type = "button";
  tile.className = "cam-tile";
  tile.dataset.camera = camera.name;
  tile.dataset.stream = stream;
  tile.title = `Watch ${camera.name}`;
  const media = document.createElement(grid.mode === "live" ? "video" : "img");
  media.className = "cam-media";
  if (grid.mode === "live") Object.assign(media, { muted: true, autoplay: true, playsInline: true });
  else media.alt = camera.name;
  const label = document.createElement("span");
  label.className = "cam-label";
  label.innerHTML = '<span class="cam-name"></span><span class="cam-size"></span>'
    + '<span class="cam-problem"></span>';
  label.querySelector(".cam-name").textContent = camera.name;
  tile.append(media, label);
  tile.addEventListener("click", () => { location.hash = `#${encodeURIComponent(camera.name)}`; });
  const entry = { camera: camera.name, stream, element: tile, media, client: null, timer: 0,
                  frames: 0, run: 0 };
  const sized = () => showSize(entry);
  for (const event of ["loadedmetadata", "resize", "load"]) media.addEventListener(event, sized);
  return entry;
}

// What the tile receives: the decoded picture's size, and which stream it is.
function showSize(tile) {
  const media = tile.media;
  const width = media.videoWidth || media.naturalWidth || 0;
  const height = media.videoHeight || media.naturalHeight || 0;
  tile.element.dataset.width = String(width);
  tile.element.dataset.height = String(height);
  const text = width ? `${width}×${height}${tile.stream === "sub" ? " · sub" : ""}` : "";
  tile.element.querySelector(".cam-size").textContent = text;
}

function streamPath(tile) {
  return tile.stream === "sub" ? "/sub" : "";
}

function showState(tile, camera) {
  tile.element.dataset.up = String(Boolean(camera.up));
  tile.element.querySelector(".cam-problem").textContent = camera.up ? "" : (camera.problem || "down");
}

async function startLive(tile) {
  // Never two sessions for one tile: each holds one of the board's viewer places.
  clearTimeout(tile.timer);
  if (tile.client) tile.client.close();
  // The grid's tiles are muted pictures: no sound is asked for (nothing sent, nothing decoded).
  const client = new WhepClient(`/whep/${encodeURIComponent(tile.camera)}${streamPath(tile)}`,
    { audio: false });
  tile.client = client;
  try {
    const pc = await client.connect((track, stream) => {
      tile.media.srcObject = stream;
      tile.media.play().catch(() => {});
    });
    pc.onconnectionstatechange = () => {
      if (tile.client === client && ["failed", "closed"].includes(pc.connectionState)) retryLive(tile);
    };
  } catch {
    if (tile.client === client) retryLive(tile);
  }
}

function retryLive(tile) {
  if (tile.client) tile.client.close();
  tile.client = null;
  clearTimeout(tile.timer);
  tile.timer = setTimeout(() => { if (grid.open) startLive(tile); }, RETRY_MS);
}

async function refreshSnapshot(tile, run = ++tile.run) {
  clearTimeout(tile.timer);
  try {
    const query = tile.stream === "sub" ? "?stream=sub" : "";
    const url = `/snapshot/${encodeURIComponent(tile.camera)}.jpg${query}`;
    const response = await fetch(url, { cache: "no-store" });
    if (response.ok) {
      const old = tile.media.src;
      tile.media.src = URL.createObjectURL(await response.blob());
      tile.frames++;
      if (old) URL.revokeObjectURL(old);
    }
  } catch {
    // The next refresh tries again; the tile's state line says why a camera is down.
  }
  // Only the newest chain goes on (a close and reopen while a fetch was out started another).
  if (grid.open && run === tile.run) tile.timer = setTimeout(() => refreshSnapshot(tile, run), SNAPSHOT_MS);
}

function stopTile(tile) {
  clearTimeout(tile.timer);
  tile.run++;
  if (tile.client) tile.client.close();
  tile.client = null;
  if (tile.media.srcObject) tile.media.srcObject = null;
}

// ---------------------------------------------------------------------------------------------
// The grid and the big picture

function buildGrid() {
  const element = document.createElement("section");
  element.id = "camera-grid";
  element.className = "cam-grid";
  element.setAttribute("aria-label", "Cameras");
  element.hidden = true;
  element.style.setProperty("--cols", String(Math.ceil(Math.sqrt(grid.cameras.length))));
  for (const camera of grid.cameras) {
    const tile = makeTile(camera);
    grid.tiles.set(camera.name, tile);
    showState(tile, camera);
    element.append(tile.element);
  }
  $("stage").append(element);
  grid.element = element;

  const button = iconButton("btn-cameras", "All cameras",
    '<rect x="3" y="3" width="8" height="8" rx="1"/><rect x="13" y="3" width="8" height="8" rx="1"/>'
    + '<rect x="3" y="13" width="8" height="8" rx="1"/><rect x="13" y="13" width="8" height="8" rx="1"/>',
    "Cameras");
  button.addEventListener("click", () => { location.hash = ""; });
  document.querySelector(".bar-bottom").prepend(button);
}

function openGrid() {
  if (grid.open) return; // e.g. /#<unknown> while the grid shows: its tiles play already
  const p = player();
  if (p && p.stopWebrtc) p.stopWebrtc(); // the big picture waits while the grid shows
  if (p && p.setState) p.setState("grid", "");
  window.dispatchEvent(new CustomEvent("ruseon:grid")); // hls-fallback.js stops HLS meanwhile
  labelGrid();
  grid.open = true;
  grid.element.hidden = false;
  $("stage").dataset.view = "grid";
  for (const tile of grid.tiles.values()) {
    if (grid.mode === "live") startLive(tile);
    else refreshSnapshot(tile);
  }
}

// The transport label says what the grid's tiles are while it shows (not the big picture's
// transport, which rests): live WebRTC tiles, or snapshots and why. hls-fallback.js labels the
// big picture again when a camera is chosen.
function labelGrid() {
  const el = $("transport");
  if (!el) return;
  const live = grid.mode === "live";
  const support = (player() && player().webrtc) || webrtcSupport();
  const reason = live ? "" : support.ok ? `more than ${LIVE_TILES_MAX} cameras` : support.reason;
  el.textContent = live ? "WebRTC" : "Snapshots";
  el.dataset.transport = live ? "webrtc" : "snapshot";
  el.dataset.reason = reason;
  el.title = live ? "Every tile plays live over WebRTC" : `Tiles are snapshots, refreshed: ${reason}`;
}

function closeGrid() {
  grid.open = false;
  grid.element.hidden = true;
  $("stage").dataset.view = "camera";
  for (const tile of grid.tiles.values()) stopTile(tile);
}

function watch(name) {
  const p = player();
  if (!p) return;
  $("device-name").dataset.camera = name;
  if (p.camera === name && p.client) return;
  p.camera = name;
  if (p.stopWebrtc) p.stopWebrtc();
  if (p.setState) p.setState("connecting", `Connecting to ${name}…`);
  window.dispatchEvent(new CustomEvent("ruseon:camera", { detail: name })); // HLS plays it anew
  if (p.startWebrtc && p.transport === "webrtc") p.startWebrtc();
}

function route() {
  const name = hashCamera();
  if (name && grid.tiles.has(name)) {
    closeGrid();
    watch(name);
  } else {
    openGrid();
  }
}

async function pollStatus() {
  try {
    for (const camera of await fetchCameras()) {
      const tile = grid.tiles.get(camera.name);
      if (tile) showState(tile, camera);
    }
  } catch {
    // Restarting, or viewing needs a login: device.js asks for the token.
  }
}

async function start() {
  let cameras;
  try {
    cameras = await fetchCameras();
  } catch {
    setTimeout(start, RETRY_MS); // e.g. 401 until the token dialog (device.js) has logged in
    return;
  }
  grid.cameras = cameras;
  if (cameras.length < 2) return; // one camera: the page as it always was
  // Live tiles are WHEP viewers: a browser without WebRTC (or its H.264) gets snapshots.
  grid.mode = cameras.length <= LIVE_TILES_MAX && webrtcSupport().ok ? "live" : "snapshot";
  buildGrid();
  window.addEventListener("hashchange", route);
  route();
  setInterval(pollStatus, STATUS_MS);
}

start();
