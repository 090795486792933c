// The device page: plays the camera over WHEP, reconnects by itself, shows live statistics.
import { $, saveBlob, setText, toast } from "./page.js";
import { login } from "./session.js";
import { WhepClient, WhepError, webrtcSupport } from "./whep.js";

const STATS_INTERVAL_MS = 1000;
// The sound meter's refresh (getStats' audioLevel of what arrives, muted or not).
const SOUND_INTERVAL_MS = 250;
const STATUS_INTERVAL_MS = 5000;
// A connection that shows no new frame for this long is torn down and reopened.
const STALL_MS = 6000;
// How long "disconnected" may last before we stop waiting for ICE to recover by itself.
const DISCONNECTED_GRACE_MS = 3000;
const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 10000];

const stage = $("stage");
const video = $("video");

const player = {
  client: null,
  state: "connecting",
  attempt: 0,
  generation: 0,
  retryTimer: 0,
  lastStats: null,
  previous: null,
  lastFrames: 0,
  lastFrameChange: 0,
  viewers: null, // every viewer the status counts (showViewers)
  viewerCounts: null, // {webrtc, hls, rtsp, relays}
  // What this browser can play, decided once before any offer (whep.js webrtcSupport), and
  // learnt from a 406 (no codec in common): {ok} or {ok: false, reason}. Without it the page
  // plays HLS (hls-fallback.js) and never calls the camera unreachable for it.
  webrtc: webrtcSupport(),
  transport: "webrtc", // "hls" while hls-fallback.js plays the stream instead
  // false while the board does not answer HTTP at all (down, rebooting, restarting): HLS would
  // not play either, so hls-fallback.js does not give up on WebRTC for that.
  reachable: true,
  // Which camera: /#<name> deep links straight to it (cameras.js switches it with the grid).
  camera: decodeURIComponent(location.hash.slice(1)),
  get endpoint() { return this.camera ? `/whep/${encodeURIComponent(this.camera)}` : "/whep"; },
  get pc() { return this.client ? this.client.pc : null; },
  // Sound: whether this session carries any, whether the person turned it on (kept across
  // reconnects; browsers only let a page start sound after a click), and the receiver's
  // figures (getStats inbound-rtp audio: samples received, concealed, level).
  audio: false,
  soundOn: false,
  audioStats: null,
};
window.ruseon = player; // for diagnostics and the end-to-end tests

function setState(state, message) {
  player.state = state;
  stage.dataset.state = state;
  const labels = {
    connecting: "Connecting", live: "Live", reconnecting: "Reconnecting",
    // "error": the page cannot play (a refusal, no HLS); the camera may well be up.
    busy: "Busy", auth: "Locked", error: "Not playing", grid: "Cameras",
  };
  $("state-text").textContent = labels[state] || state;
  if (message) $("veil-text").textContent = message;
}

// ---------------------------------------------------------------------------------------------
// Connection lifecycle

async function connect() {
  clearTimeout(player.retryTimer);
  if (player.transport !== "webrtc") return; // HLS plays instead (hls-fallback.js)
  if (webrtcUnavailable()) return;
  const generation = ++player.generation;
  if (player.client) player.client.close();
  const client = new WhepClient(player.endpoint); // the session cookie, when viewing needs one
  player.client = client;
  player.previous = null;
  player.lastFrames = 0;
  player.lastFrameChange = performance.now();
  showSound(false);
  if (player.state !== "reconnecting") setState("connecting", "Connecting to the camera…");
  try {
    const pc = await client.connect((track, stream) => {
      if (generation !== player.generation) return;
      if (video.srcObject !== stream) video.srcObject = stream;
      if (track.kind === "audio") showSound(true);
      video.play().catch(() => {});
    });
    if (generation !== player.generation) return;
    player.reachable = true;
    let graceTimer = 0;
    pc.onconnectionstatechange = () => {
      if (generation !== player.generation) return;
      const s = pc.connectionState;
      clearTimeout(graceTimer);
      if (s === "failed" || s === "closed") {
        scheduleReconnect("The connection was lost. Reconnecting…");
      } else if (s === "disconnected") {
        graceTimer = setTimeout(() => {
          if (generation === player.generation && pc.connectionState !== "connected") {
            scheduleReconnect("The connection was lost. Reconnecting…");
          }
        }, DISCONNECTED_GRACE_MS);
      }
    };
  } catch (error) {
    if (generation !== player.generation) return;
    handleConnectError(error);
  }
}

// Not a network failure: this browser cannot do WebRTC (or shares no codec with the camera).
// hls-fallback.js plays HLS; nothing here marks the camera unreachable or retries.
function webrtcUnavailable() {
  if (player.webrtc.ok) return false;
  window.dispatchEvent(new CustomEvent("ruseon:webrtc-unavailable", { detail: player.webrtc.reason }));
  return true;
}

function handleConnectError(error) {
  // A WhepError is an HTTP answer (or our own close); anything else: fetch found no board.
  player.reachable = error instanceof WhepError;
  if (error instanceof WhepError && (error.status === 406 || error.status === 422)) {
    // The server and this browser share no codec (the appliance answers 422: the offer is
    // well-formed but has no H.264; 406 from others): asking again would be refused again, so
    // WebRTC is off for this page and hls-fallback.js plays HLS instead.
    player.webrtc = { ok: false, reason: `the camera refused WebRTC: ${error.message}` };
    window.dispatchEvent(new CustomEvent("ruseon:webrtc-unsupported", { detail: error.message }));
    return;
  }
  if (error instanceof WhepError) {
    if (error.status === 401) { // [auth] viewing = "credential" and this page has no session
      askForToken();
      return;
    }
    if (error.status === 503 || error.status === 429) {  // full, or this address has offers pending
      const wait = Math.max(1, error.retryAfter || 5) * 1000;
      setState("busy", `${error.message}. Retrying…`);
      retryIn(wait);
      return;
    }
    setState("error", `The camera refused the stream: ${error.message}`);
    retryIn(BACKOFF_MS[BACKOFF_MS.length - 1]);
    return;
  }
  scheduleReconnect("The camera is not reachable. Retrying…");
}

function scheduleReconnect(message) {
  if (player.client) player.client.close();
  player.client = null;
  player.generation++;
  const base = BACKOFF_MS[Math.min(player.attempt, BACKOFF_MS.length - 1)];
  player.attempt++;
  setState("reconnecting", message);
  retryIn(base * (0.8 + Math.random() * 0.4)); // jitter, so many viewers do not return at once
}

function retryIn(ms) {
  clearTimeout(player.retryTimer);
  player.retryTimer = setTimeout(connect, ms);
}

const TOKEN_HINT = $("token-hint").textContent;

function askForToken() {
  setState("auth", "Watching this camera needs its viewer token.");
  const dialog = $("token-dialog");
  if (dialog.open) return;
  $("token-hint").textContent = TOKEN_HINT;
  $("token-input").value = "";
  dialog.showModal();
}

// Logs in (POST /api/session: the cookie then goes with every request of the page) and plays;
// a refusal stays in the dialog and says why.
$("token-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const value = $("token-input").value.trim();
  if (!value) return;
  const { role, message } = await login(value);
  if (!role) {
    $("token-hint").textContent = message;
    $("token-input").select();
    return;
  }
  $("token-dialog").close();
  player.attempt = 0;
  connect();
  refreshStatus();
});

window.addEventListener("pagehide", () => { if (player.client) player.client.close(); });

// For hls-fallback.js: hand the video element over to HLS and take it back.
player.setState = setState;
player.askForToken = askForToken;
player.showSound = (present) => showSound(present);
player.stopWebrtc = () => {
  clearTimeout(player.retryTimer);
  player.generation++;
  if (player.client) player.client.close();
  player.client = null;
  video.srcObject = null;
  showSound(false);
};
player.startWebrtc = () => {
  if (webrtcUnavailable()) return;
  player.transport = "webrtc";
  player.attempt = 0;
  connect();
};

// ---------------------------------------------------------------------------------------------
// Statistics

function formatBitrate(bps) {
  if (bps >= 1e6) return `${(bps / 1e6).toFixed(2)} Mbit/s`;
  return `${Math.round(bps / 1e3)} kbit/s`;
}

async function collectStats() {
  const pc = player.pc;
  if (!pc) return null;
  const report = await pc.getStats();
  let inbound = null;
  let pair = null;
  let transport = null;
  const byId = new Map();
  report.forEach((s) => {
    byId.set(s.id, s);
    if (s.type === "inbound-rtp" && s.kind === "video") inbound = s;
    if (s.type === "transport") transport = s;
  });
  if (transport && transport.selectedCandidatePairId) pair = byId.get(transport.selectedCandidatePairId);
  if (!pair) report.forEach((s) => { if (s.type === "candidate-pair" && s.nominated && s.state === "succeeded") pair = s; });
  if (!inbound) return null;
  const codec = inbound.codecId ? byId.get(inbound.codecId) : null;
  const now = inbound.timestamp;
  const prev = player.previous;
  const out = {
    framesDecoded: inbound.framesDecoded || 0,
    width: inbound.frameWidth || video.videoWidth || 0,
    height: inbound.frameHeight || video.videoHeight || 0,
    fps: inbound.framesPerSecond || 0,
    codec: codec ? codec.mimeType : "",
    fmtp: codec ? codec.sdpFmtpLine || "" : "",
    rttMs: pair && pair.currentRoundTripTime !== undefined ? pair.currentRoundTripTime * 1000 : null,
    bitrate: null,
    lossPct: null,
    jitterMs: null,
    packetsLost: inbound.packetsLost || 0,
    packetsReceived: inbound.packetsReceived || 0,
  };
  if (prev) {
    const dt = (now - prev.timestamp) / 1000;
    if (dt > 0) out.bitrate = ((inbound.bytesReceived - prev.bytesReceived) * 8) / dt;
    const lost = (inbound.packetsLost || 0) - (prev.packetsLost || 0);
    const got = (inbound.packetsReceived || 0) - (prev.packetsReceived || 0);
    if (lost + got > 0) out.lossPct = (100 * Math.max(0, lost)) / (lost + got);
    const emitted = (inbound.jitterBufferEmittedCount || 0) - (prev.jitterBufferEmittedCount || 0);
    if (emitted > 0) {
      out.jitterMs = (1000 * ((inbound.jitterBufferDelay || 0) - (prev.jitterBufferDelay || 0))) / emitted;
    }
  }
  player.previous = inbound;
  return out;
}

function render(stats) {
  if (!stats) {
    for (const id of ["stat-resolution", "stat-fps", "stat-bitrate", "stat-loss", "stat-rtt", "stat-jitter", "stat-codec"]) setText(id, "–");
    return;
  }
  setText("stat-resolution", stats.width ? `${stats.width}×${stats.height}` : "–");
  setText("stat-fps", stats.fps ? `${stats.fps.toFixed(0)} fps` : "–");
  setText("stat-bitrate", stats.bitrate !== null ? formatBitrate(stats.bitrate) : "–");
  setText("stat-loss", stats.lossPct !== null ? `${stats.lossPct.toFixed(1)} %` : "–");
  setText("stat-rtt", stats.rttMs !== null ? `${stats.rttMs.toFixed(0)} ms` : "–");
  setText("stat-jitter", stats.jitterMs !== null ? `${stats.jitterMs.toFixed(0)} ms` : "–");
  setText("stat-codec", stats.codec ? stats.codec.replace("video/", "") : "–");
}

async function statsTick() {
  if (player.transport !== "webrtc") return; // hls-fallback.js shows its own figures
  let stats = null;
  try { stats = await collectStats(); } catch { stats = null; }
  player.lastStats = stats;
  render(stats);
  if (!player.pc || player.state === "auth") return;
  const now = performance.now();
  if (stats && stats.framesDecoded > player.lastFrames) {
    player.lastFrames = stats.framesDecoded;
    player.lastFrameChange = now;
    if (player.state !== "live") {
      setState("live");
      player.attempt = 0;
      refreshStatus(); // the viewer count now includes us; do not wait for the next poll
    }
  } else if (now - player.lastFrameChange > STALL_MS) {
    scheduleReconnect("The picture stopped. Reconnecting…");
  }
}

// Everyone watching, as /api/status counts them (viewers.by_transport): WebRTC sessions, HLS
// clients (an address + user agent seen in the last seconds: a page on HLS is one), RTSP clients
// playing and relays sending. The total, then each way that has anyone ("3 (1 HLS · 1 RTSP ·
// 1 relay)"); just the number when all of them are on WebRTC.
const VIEWER_KINDS = [["webrtc", "WebRTC"], ["hls", "HLS"], ["rtsp", "RTSP"], ["relays", "relay"]];
function showViewers(status) {
  const by = status.viewers.by_transport || { webrtc: status.viewers.count };
  const counts = Object.fromEntries(VIEWER_KINDS.map(([key]) => [key, Number.isFinite(by[key]) ? by[key] : 0]));
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  player.viewers = total;
  player.viewerCounts = counts;
  const parts = VIEWER_KINDS.filter(([key]) => counts[key] > 0)
    .map(([key, name]) => `${counts[key]} ${name}${key === "relays" && counts[key] !== 1 ? "s" : ""}`);
  $("stat-viewers").textContent = total === counts.webrtc ? String(total) : `${total} (${parts.join(" · ")})`;
}

async function refreshStatus() {
  try {
    const response = await fetch("/api/status", { cache: "no-store" });
    if (!response.ok) return;
    const status = await response.json();
    showViewers(status);
    $("device-name").textContent = status.device.hostname || "";
    document.title = `${status.device.hostname || "RUSEON"} · Camera`;
    // A camera that is down (none detected, unplugged, refusing) says why on the picture.
    const shown = (status.cameras || []).find((c) => c.name === player.camera) || (status.cameras || [])[0];
    player.cameraProblem = shown && !shown.up ? shown.problem : null;
    stage.dataset.camera = !shown || shown.up ? "up" : shown.missing ? "missing" : "down";
    if (player.cameraProblem && player.state !== "live") {
      $("veil-text").textContent = shown.missing ? `No camera detected: ${player.cameraProblem}` : `The camera is down: ${player.cameraProblem}`;
    }
  } catch {
    // The service may be restarting; the next tick will try again.
  }
}

// ---------------------------------------------------------------------------------------------
// Sound: off until the person turns it on (autoplay rules), a meter of what arrives either way

const soundButton = $("btn-sound");

function showSound(present) {
  player.audio = present;
  soundButton.hidden = !present;
  video.muted = !(present && player.soundOn);
  if (!present) {
    player.audioStats = null;
    $("sound-level").style.width = "0";
    setText("stat-audio", "–");
  }
}

function setSound(on) {
  player.soundOn = on;
  video.muted = !on;
  soundButton.setAttribute("aria-pressed", String(on));
  soundButton.title = on ? "Turn the sound off" : "Turn the sound on";
  setText("sound-label", on ? "Sound on" : "Sound off");
  if (on) video.play().catch(() => {});
}

soundButton.addEventListener("click", () => setSound(!player.soundOn));

async function soundTick() {
  const pc = player.pc;
  if (!player.audio || !pc || player.transport !== "webrtc") return;
  let inbound = null;
  let codec = null;
  try {
    const report = await pc.getStats();
    report.forEach((s) => { if (s.type === "inbound-rtp" && s.kind === "audio") inbound = s; });
    if (inbound && inbound.codecId) codec = report.get(inbound.codecId);
  } catch {
    return;
  }
  if (!inbound) return;
  const level = inbound.audioLevel || 0; // 0..1, linear
  const db = level > 0 ? 20 * Math.log10(level) : -Infinity;
  player.audioStats = {
    totalSamplesReceived: inbound.totalSamplesReceived || 0,
    concealedSamples: inbound.concealedSamples || 0,
    packetsReceived: inbound.packetsReceived || 0,
    audioLevel: level,
    levelDb: Number.isFinite(db) ? db : null,
  };
  // The meter spans -60..0 dBFS.
  const width = Number.isFinite(db) ? Math.max(0, Math.min(1, (db + 60) / 60)) : 0;
  $("sound-level").style.width = `${Math.round(width * 100)}%`;
  const name = codec ? codec.mimeType.replace("audio/", "") : "audio"; // e.g. "opus"
  setText("stat-audio", Number.isFinite(db) ? `${name} · ${db.toFixed(0)} dB` : name);
}

// ---------------------------------------------------------------------------------------------
// Controls

const statsPanel = $("stats");
$("btn-stats").addEventListener("click", (event) => {
  statsPanel.hidden = !statsPanel.hidden;
  event.currentTarget.setAttribute("aria-pressed", String(!statsPanel.hidden));
});

$("btn-fullscreen").addEventListener("click", async () => {
  try {
    if (document.fullscreenElement) await document.exitFullscreen();
    else if (stage.requestFullscreen) await stage.requestFullscreen();
    else if (video.webkitEnterFullscreen) video.webkitEnterFullscreen(); // iOS Safari
  } catch {
    toast("Fullscreen is not available here");
  }
});

$("btn-snapshot").addEventListener("click", async () => {
  const stamp = new Date().toISOString().replace(/[:.]/g, "-").slice(0, 19);
  const name = `ruseon-${stamp}.jpg`;
  // The frame on screen, at full resolution; the server's keyframe when nothing is playing.
  if (video.videoWidth) {
    const canvas = document.createElement("canvas");
    canvas.width = video.videoWidth;
    canvas.height = video.videoHeight;
    canvas.getContext("2d").drawImage(video, 0, 0);
    canvas.toBlob((blob) => { if (blob) { saveBlob(blob, name); toast("Snapshot saved"); } }, "image/jpeg", 0.92);
    return;
  }
  try {
    const url = player.camera ? `/snapshot/${encodeURIComponent(player.camera)}.jpg` : "/snapshot.jpg";
    const response = await fetch(url, { cache: "no-store" });
    if (!response.ok) throw new Error(String(response.status));
    saveBlob(await response.blob(), name);
    toast("Snapshot saved");
  } catch {
    toast("No picture to save yet");
  }
});

// Controls fade out while the picture plays and nobody touches the page (only where the bars
// float over the picture: see the landscape rule in device.css); any touch brings them back.
const IDLE_MS = 3500;
function wake() {
  stage.classList.remove("idle");
  clearTimeout(wake.timer);
  wake.timer = setTimeout(() => {
    if (player.state === "live") stage.classList.add("idle");
    else wake();
  }, IDLE_MS);
}
// The panels and the toast sit above the bottom bar, whose height grows when its buttons wrap
// (a narrow window, a logged-in admin's extra buttons): they read it from --bar-bottom-h.
const bottomBar = document.querySelector(".bar-bottom");
if (bottomBar && typeof ResizeObserver !== "undefined") {
  new ResizeObserver(() => {
    stage.style.setProperty("--bar-bottom-h", `${bottomBar.offsetHeight}px`);
  }).observe(bottomBar);
}

for (const type of ["pointermove", "pointerdown", "keydown", "focusin"]) {
  stage.addEventListener(type, wake, { passive: true });
}
wake();

// ---------------------------------------------------------------------------------------------

// The offer first: its POST takes the connection the page was loaded on, ahead of the status.
connect();
setInterval(statsTick, STATS_INTERVAL_MS);
setInterval(soundTick, SOUND_INTERVAL_MS);
setInterval(refreshStatus, STATUS_INTERVAL_MS);
refreshStatus();
