// Motion on the device page: the live event stream (GET /api/events/stream, Server-Sent Events),
// the motion indicator on the picture (and on the camera grid's tiles), the Motion panel with
// today's events and their snapshots (a click plays the event from its pre-roll, as its mark on
// the timeline does), and, for admin, the tuner (detection on/off, a sensitivity slider with the
// live meter of the current score, as Frigate's motion tuner) and the zone editor drawn on the
// picture (click points to make a polygon, include or exclude, save).
//
// The timeline's marks come from the stream as events happen (recordings.js addMotionEvent);
// recordings.js's polling of /api/events stays as the fallback (a browser without EventSource,
// a stream refused because the board serves its most, a proxy that buffers). Settings go to
// PATCH /api/camera/<camera>/motion through session.js's adminFetch; the board saves them.
// cameras.js is not touched: the camera on screen is player.camera, and the grid's tiles are
// found by their data-camera.
import { $, iconButton, player, toast } from "./page.js";
import { adminFetch, ensureAdmin, session } from "./session.js";
import { addMotionEvent, playEvent } from "./recordings.js";

const RETRY_MS = 10000; // a stream refused (503, 401 before the login): try again after this
const LIST_MS = 30000; // today's events, refreshed this often while the panel is open
const METER_SCALE = 0.1; // the meter's full width: a tenth of the picture changed
const PHONE = window.matchMedia("(max-width: 560px)");

const video = $("video");
const motion = {
  stream: "connecting", // "open", "connecting", "closed" (retrying), "unsupported"
  streamEvents: 0, // motion_started/ended that came by the stream
  meters: {}, // camera -> {score, threshold, active, enabled}
  events: [], // today's events of the camera on screen, newest first (/api/events items)
  defaultCamera: "",
  settings: null, // GET /api/camera/<camera>/motion while the tuner shows
  editor: null, // {zones, drawing, include} while the zone editor is open
  open: false,
  error: null,
};
window.ruseonMotion = motion; // for diagnostics and the end-to-end tests

function cameraName() { const p = player(); return (p && p.camera) || motion.defaultCamera; }
function motionUrl() {
  const p = player();
  return p && p.camera ? `/api/camera/${encodeURIComponent(p.camera)}/motion` : "/api/camera/motion";
}
function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}
function percent(share) { return `${(share * 100).toFixed(share < 0.1 ? 1 : 0)} %`; }
async function problem(response) {
  try { return (await response.json()).detail || `HTTP ${response.status}`; } catch { return `HTTP ${response.status}`; }
}

// ---------------------------------------------------------------------------------------------
// The stream

let source = null;
let retryTimer = 0;

function connect() {
  clearTimeout(retryTimer);
  if (!window.EventSource) { motion.stream = "unsupported"; return; }
  if (source) source.close();
  const es = new EventSource("/api/events/stream");
  source = es;
  motion.stream = "connecting";
  es.addEventListener("open", () => { motion.stream = "open"; });
  es.addEventListener("hello", (event) => {
    motion.meters = JSON.parse(event.data).cameras;
    renderLive();
  });
  for (const name of ["motion_started", "motion_ended"]) {
    es.addEventListener(name, (event) => {
      const data = JSON.parse(event.data);
      motion.streamEvents++;
      motion.meters[data.camera] = { ...(motion.meters[data.camera] || {}), active: name === "motion_started" };
      addMotionEvent(data); // the timeline's mark, now
      if (data.camera === cameraName()) {
        const item = {
          id: data.event_id, camera: data.camera, start: data.start, end: data.end ?? null,
          peak_score: data.score, snapshot: data.snapshot || null,
        };
        motion.events = [item, ...motion.events.filter((e) => e.id !== item.id)];
        renderList();
      }
      renderLive();
    });
  }
  es.addEventListener("motion_score", (event) => {
    const meter = JSON.parse(event.data);
    motion.meters[meter.camera] = meter;
    renderLive();
  });
  es.addEventListener("error", () => {
    if (source !== es) return;
    if (es.readyState === EventSource.CLOSED) { // refused: EventSource does not try again
      motion.stream = "closed";
      es.close();
      source = null;
      retryTimer = setTimeout(connect, RETRY_MS);
    } else {
      motion.stream = "connecting"; // the browser reconnects by itself
    }
  });
}

// ---------------------------------------------------------------------------------------------
// The indicator (the big picture's, and the grid's tiles)

function renderLive() {
  const name = cameraName();
  const meter = motion.meters[name];
  const active = Boolean(meter && meter.active);
  const indicator = $("motion-indicator");
  indicator.hidden = !active;
  indicator.dataset.camera = name;
  if (active) { // on the picture's own corner (not the letterbox around it)
    const rect = pictureRect();
    indicator.style.left = `${rect.left + 8}px`;
    indicator.style.top = `${rect.top + 8}px`;
  }
  $("mo-now").hidden = !active; // the panel may cover the picture's corner (a phone)
  for (const tile of document.querySelectorAll(".cam-tile[data-camera]")) {
    const m = motion.meters[tile.dataset.camera];
    tile.dataset.motion = String(Boolean(m && m.active));
  }
  renderMeter();
}

function renderMeter() {
  const meter = motion.meters[cameraName()];
  const fill = $("mo-meter-fill");
  if (!fill) return;
  const score = meter ? meter.score || 0 : 0;
  const threshold = meter ? meter.threshold || 0 : 0;
  fill.style.width = `${Math.min(100, (100 * score) / METER_SCALE)}%`;
  fill.dataset.motion = String(threshold > 0 && score >= threshold);
  $("mo-meter-threshold").style.left = `${Math.min(100, (100 * threshold) / METER_SCALE)}%`;
  $("mo-meter-label").textContent = !meter ? "No score yet"
    : meter.enabled === false ? "Detection is paused"
      : `Changed now: ${percent(score)} · motion from ${percent(threshold)}`;
}

// ---------------------------------------------------------------------------------------------
// Today's events

async function loadEvents() {
  const midnight = new Date();
  midnight.setHours(0, 0, 0, 0);
  const name = cameraName();
  const query = `kind=motion&since=${midnight.getTime() / 1000}${name ? `&camera=${encodeURIComponent(name)}` : ""}`;
  try {
    const response = await fetch(`/api/events?${query}`, { cache: "no-store" });
    if (!response.ok) throw new Error(await problem(response));
    const doc = await response.json();
    motion.defaultCamera = doc.default_camera;
    const camera = cameraName();
    motion.events = doc.events.filter((e) => e.camera === camera).reverse();
    motion.error = null;
  } catch (error) {
    motion.error = `Events unavailable: ${error.message}`;
  }
  renderList();
}

function renderList() {
  const list = $("mo-list");
  if (!list) return;
  $("mo-empty").hidden = motion.events.length > 0;
  $("mo-empty").textContent = motion.error || "No motion today.";
  list.replaceChildren(...motion.events.map((e) => {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "mo-event";
    button.dataset.event = e.id;
    button.title = "Play from the pre-roll";
    if (e.snapshot) {
      const img = document.createElement("img");
      img.loading = "lazy";
      img.alt = "";
      img.src = e.snapshot;
      button.append(img);
    } else {
      const blank = document.createElement("span");
      blank.className = "mo-noshot";
      button.append(blank);
    }
    const text = document.createElement("span");
    text.className = "mo-event-text";
    const when = document.createElement("strong");
    when.textContent = clock(e.start * 1000);
    const what = document.createElement("span");
    what.textContent = e.end === null ? "now" : `${Math.max(1, Math.round(e.end - e.start))} s · peak ${percent(e.peak_score)}`;
    text.append(when, what);
    button.append(text);
    button.addEventListener("click", () => {
      if (PHONE.matches) show(false); // the picture needs the screen
      playEvent({ start: e.start * 1000 });
    });
    item.append(button);
    return item;
  }));
}

// ---------------------------------------------------------------------------------------------
// The tuner (admin)

async function loadSettings() {
  const response = await adminFetch(motionUrl(), { cache: "no-store" });
  if (!response) return false;
  if (!response.ok) throw new Error(await problem(response));
  motion.settings = await response.json();
  return true;
}

async function change(body) {
  const response = await adminFetch(motionUrl(), {
    method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (!response) { renderTuner(); return false; }
  if (!response.ok) {
    toast(await problem(response), 3000);
    renderTuner();
    return false;
  }
  motion.settings = await response.json();
  const name = cameraName();
  motion.meters[name] = { ...(motion.meters[name] || {}), threshold: motion.settings.threshold, enabled: motion.settings.enabled };
  renderTuner();
  renderMeter();
  return true;
}

function renderTuner() {
  const admin = session.role === "admin";
  const tuner = $("mo-tuner");
  tuner.hidden = !admin || !motion.settings;
  $("mo-tune").hidden = admin && Boolean(motion.settings);
  if (!motion.settings) return;
  $("mo-enabled").checked = motion.settings.enabled;
  $("mo-sensitivity").value = motion.settings.sensitivity;
  $("mo-sensitivity-value").textContent = motion.settings.sensitivity;
  const zones = motion.settings.zones.length;
  $("mo-zones-info").textContent = zones ? `${zones} zone${zones > 1 ? "s" : ""}` : "the whole picture";
}

async function openTuner() {
  try {
    if (!(await ensureAdmin())) return;
    if (!(await loadSettings())) return;
  } catch (error) {
    toast(`Motion settings unavailable: ${error.message}`, 3000);
    return;
  }
  renderTuner();
  renderMeter();
}

// ---------------------------------------------------------------------------------------------
// The zone editor: polygons on the picture, in the picture's own 0..1 coordinates

const SVG = "http://www.w3.org/2000/svg";

function pictureRect() {
  const stage = $("stage").getBoundingClientRect();
  const box = video.getBoundingClientRect();
  const vw = video.videoWidth || 16;
  const vh = video.videoHeight || 9;
  const scale = Math.min(box.width / vw, box.height / vh);
  const width = vw * scale;
  const height = vh * scale;
  return {
    left: box.left - stage.left + (box.width - width) / 2,
    top: box.top - stage.top + (box.height - height) / 2, width, height,
  };
}

function openEditor() {
  if (!motion.settings) return;
  motion.editor = {
    zones: motion.settings.zones.map((z) => ({ points: z.points.map((p) => [...p]), include: z.include })),
    drawing: [], include: true,
  };
  $("mo-editor").hidden = false;
  motion.reopen = motion.open;
  show(false); // the picture is the editor: nothing lies on it but the zones
  renderEditor();
}

function closeEditor(back = true) {
  if (!motion.editor) return;
  motion.editor = null;
  $("mo-editor").hidden = true;
  if (back && motion.reopen) show(true); // the panel as it was
}

function finishPolygon() {
  const ed = motion.editor;
  if (!ed) return;
  if (ed.drawing.length >= 3) ed.zones.push({ points: ed.drawing, include: ed.include });
  else if (ed.drawing.length) toast("A zone needs at least 3 points");
  ed.drawing = [];
  renderEditor();
}

function renderEditor() {
  const ed = motion.editor;
  if (!ed) return;
  const rect = pictureRect();
  const svg = $("mo-zone-svg");
  Object.assign(svg.style, {
    left: `${rect.left}px`, top: `${rect.top}px`, width: `${rect.width}px`, height: `${rect.height}px`,
  });
  const shapes = ed.zones.map((z, i) => {
    const polygon = document.createElementNS(SVG, "polygon");
    polygon.setAttribute("points", z.points.map((p) => p.join(",")).join(" "));
    polygon.setAttribute("class", z.include ? "mo-include" : "mo-exclude");
    polygon.dataset.zone = String(i);
    return polygon;
  });
  if (ed.drawing.length) {
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", ed.drawing.map((p) => p.join(",")).join(" "));
    line.setAttribute("class", `mo-drawing ${ed.include ? "mo-include" : "mo-exclude"}`);
    shapes.push(line);
    for (const [x, y] of ed.drawing) {
      const dot = document.createElementNS(SVG, "ellipse");
      dot.setAttribute("cx", x);
      dot.setAttribute("cy", y);
      dot.setAttribute("rx", String(5 / Math.max(1, rect.width)));
      dot.setAttribute("ry", String(5 / Math.max(1, rect.height)));
      dot.setAttribute("class", "mo-point");
      shapes.push(dot);
    }
  }
  svg.replaceChildren(...shapes);
  // The bar goes under the picture where there is room (a phone held upright), else on top.
  const bar = $("mo-editor-bar");
  const room = $("stage").getBoundingClientRect().height - (rect.top + rect.height) - 140;
  bar.style.top = room > bar.offsetHeight ? `${rect.top + rect.height + 8}px` : "";
  $("mo-mode").textContent = ed.include ? "Next zone: include" : "Next zone: exclude";
  $("mo-mode").dataset.include = String(ed.include);
  $("mo-editor-info").textContent = ed.drawing.length
    ? `${ed.drawing.length} point${ed.drawing.length > 1 ? "s" : ""}: click more, then Finish`
    : `${ed.zones.length} zone${ed.zones.length === 1 ? "" : "s"}: click the picture to draw one`;
}

async function saveZones() {
  const ed = motion.editor;
  if (!ed) return;
  if (ed.drawing.length) finishPolygon();
  const zones = ed.zones.map((z) => ({
    points: z.points.map(([x, y]) => [Number(x.toFixed(4)), Number(y.toFixed(4))]), include: z.include,
  }));
  if (await change({ zones })) {
    toast(zones.length ? `${zones.length} zone${zones.length > 1 ? "s" : ""} saved` : "Zones cleared: the whole picture counts");
    closeEditor();
  }
}

// ---------------------------------------------------------------------------------------------
// The panel and its button

function show(open) {
  motion.open = open;
  $("motion-panel").hidden = !open;
  $("btn-motion").setAttribute("aria-pressed", String(open));
}

let listTimer = 0;
async function toggle() {
  if (motion.open) { show(false); clearInterval(listTimer); return; }
  show(true);
  $("mo-camera").textContent = cameraName();
  renderTuner();
  loadEvents();
  clearInterval(listTimer);
  listTimer = setInterval(() => { if (motion.open) loadEvents(); }, LIST_MS);
  if (session.role === "admin") openTuner();
}

function install() {
  const stage = $("stage");
  const footer = document.querySelector(".bar-bottom");
  if (!stage || !footer) return;
  const indicator = document.createElement("div");
  indicator.id = "motion-indicator";
  indicator.className = "motion-indicator";
  indicator.hidden = true;
  indicator.setAttribute("role", "status");
  indicator.innerHTML = '<span class="motion-dot" aria-hidden="true"></span>Motion';
  stage.append(indicator);

  const button = iconButton("btn-motion", "Motion: today's events, sensitivity, zones",
    '<path d="M3 12h4l3-7 4 14 3-7h4"/>', "Motion");
  button.setAttribute("aria-pressed", "false");
  footer.insertBefore(button, $("btn-fullscreen"));

  const panel = document.createElement("section");
  panel.id = "motion-panel";
  panel.className = "motion-panel";
  panel.hidden = true;
  panel.setAttribute("aria-label", "Motion");
  panel.innerHTML = `
    <h2>Motion <span id="mo-camera" class="mo-camera"></span>
      <span id="mo-now" class="mo-now" hidden>now</span></h2>
    <button id="mo-tune" type="button" class="mo-small">Tune detection…</button>
    <div id="mo-tuner" class="mo-tuner" hidden>
      <label class="mo-row"><span>Detection</span><input id="mo-enabled" type="checkbox"></label>
      <label class="mo-row"><span>Sensitivity</span>
        <input id="mo-sensitivity" type="range" min="0" max="100" step="1">
        <output id="mo-sensitivity-value"></output></label>
      <div class="mo-meter" aria-hidden="true"><div id="mo-meter-fill" class="mo-meter-fill"></div><div id="mo-meter-threshold" class="mo-meter-threshold"></div></div>
      <p id="mo-meter-label" class="mo-meter-label"></p>
      <div class="mo-row"><span>Zones</span><span id="mo-zones-info" class="mo-muted"></span>
        <button id="mo-zones" type="button" class="mo-small">Edit zones</button></div>
    </div>
    <h3>Today</h3>
    <p id="mo-empty" class="mo-muted">No motion today.</p>
    <ol id="mo-list" class="mo-list"></ol>`;
  stage.append(panel);

  const editor = document.createElement("div");
  editor.id = "mo-editor";
  editor.className = "mo-editor";
  editor.hidden = true;
  editor.innerHTML = `
    <svg id="mo-zone-svg" class="mo-zone-svg" viewBox="0 0 1 1" preserveAspectRatio="none"></svg>
    <div id="mo-editor-bar" class="mo-editor-bar" role="toolbar" aria-label="Zone editor">
      <span id="mo-editor-info" class="mo-editor-info"></span>
      <button id="mo-mode" type="button" class="mo-small" title="What the next zone is: looked at only (include) or never (exclude)">Next zone: include</button>
      <button id="mo-finish" type="button" class="mo-small">Finish</button>
      <button id="mo-undo" type="button" class="mo-small">Undo</button>
      <button id="mo-clear" type="button" class="mo-small">Clear</button>
      <button id="mo-save" type="button" class="mo-small mo-primary">Save</button>
      <button id="mo-cancel" type="button" class="mo-small">Cancel</button>
    </div>`;
  stage.append(editor);

  button.addEventListener("click", toggle);
  $("mo-tune").addEventListener("click", openTuner);
  $("mo-enabled").addEventListener("change", (event) => change({ enabled: event.target.checked }));
  const slider = $("mo-sensitivity");
  slider.addEventListener("input", () => { $("mo-sensitivity-value").textContent = slider.value; });
  slider.addEventListener("change", () => change({ sensitivity: Math.round(Number(slider.value)) }));
  $("mo-zones").addEventListener("click", openEditor);
  $("mo-zone-svg").addEventListener("click", (event) => {
    const ed = motion.editor;
    if (!ed) return;
    event.stopPropagation();
    const box = event.currentTarget.getBoundingClientRect();
    const x = Math.min(1, Math.max(0, (event.clientX - box.left) / box.width));
    const y = Math.min(1, Math.max(0, (event.clientY - box.top) / box.height));
    const last = ed.drawing[ed.drawing.length - 1];
    // A double click (Finish) clicks twice on one spot: one point.
    if (!last || Math.hypot(last[0] - x, last[1] - y) > 0.005) ed.drawing.push([x, y]);
    renderEditor();
  });
  $("mo-zone-svg").addEventListener("dblclick", (event) => { event.preventDefault(); finishPolygon(); });
  $("mo-mode").addEventListener("click", () => {
    if (!motion.editor) return;
    motion.editor.include = !motion.editor.include;
    renderEditor();
  });
  $("mo-finish").addEventListener("click", finishPolygon);
  $("mo-undo").addEventListener("click", () => {
    const ed = motion.editor;
    if (!ed) return;
    if (ed.drawing.length) ed.drawing.pop();
    else ed.zones.pop();
    renderEditor();
  });
  $("mo-clear").addEventListener("click", () => {
    if (!motion.editor) return;
    motion.editor.zones = [];
    motion.editor.drawing = [];
    renderEditor();
  });
  $("mo-save").addEventListener("click", saveZones);
  $("mo-cancel").addEventListener("click", () => closeEditor());
  window.addEventListener("resize", () => { renderEditor(); renderLive(); });
  video.addEventListener("resize", () => { renderEditor(); renderLive(); });

  // Another camera on screen (cameras.js): its events, its meter, its settings.
  window.addEventListener("ruseon:camera", () => {
    closeEditor(false);
    motion.settings = null;
    motion.events = [];
    setTimeout(() => { // player.camera is set by the time the event's listeners return
      $("mo-camera").textContent = cameraName();
      renderLive();
      renderTuner();
      if (motion.open) {
        loadEvents();
        if (session.role === "admin") openTuner();
      }
    }, 0);
  });
  window.addEventListener("ruseon:session", () => {
    if (session.role !== "admin") { closeEditor(false); motion.settings = null; }
    renderTuner();
    if (!source) connect(); // logged in: a stream refused for want of a credential may open now
  });
}

install();
connect();
// The default camera's name (the unnamed routes'): /api/events says it.
loadEvents();
// Without the stream (refused, or a browser without EventSource), the indicator follows the
// timeline's polled marks (recordings.js: every 5 s), the grid's tiles their camera's.
setInterval(() => {
  if (motion.stream === "open") return;
  const name = cameraName();
  if (!name || !window.ruseonMotionMarks) return;
  const lasting = window.ruseonMotionMarks().some((e) => e.lasting);
  motion.meters[name] = { ...(motion.meters[name] || {}), active: lasting };
  renderLive();
}, 5000);
