// Recordings on the device page: a timeline of what is on disk under the picture; click a moment
// (or drag a range) to play it in the same <video>, "Live" to go back; download, delete; record
// button. Record/Stop and Delete are admin's: they go through session.js's adminFetch (it asks
// for the admin secret once); watching and downloading carry the session cookie, if any, by
// themselves.
//
// Playback fetches /recordings/get?format=fmp4 and streams it into Media Source Extensions, so
// it never holds a whole clip in memory.
// device.js owns WebRTC and hls-fallback.js owns HLS: this module takes the <video> from them
// (player.stopWebrtc, the HLS state's mode) and hands it back (player.startWebrtc).
import { $, player, saveUrl, setText, toast } from "./page.js";
import { adminFetch } from "./session.js";

const LIST_MS = 5000;
const CLIP_WINDOW_S = 300; // what one click loads; the next window follows when it ends
const WINDOW_MIN_MS = 2 * 60 * 1000;
const WINDOW_MAX_MS = 24 * 3600 * 1000;
const APPEND_BYTES = 256 * 1024;

const video = $("video");
const track = $("rec-track");
const rec = {
  ranges: [], // [{start, end}] in ms since the epoch
  events: [], // motion events [{id, start, end, snapshot}] in ms, of the camera on screen
  defaultCamera: "", // the camera the unnamed routes serve (/api/events' default_camera)
  fromStream: 0, // marks the event stream brought (addMotionEvent)
  state: "stopped",
  reason: "",
  preroll: 0,
  from: 0,
  to: 0,
  playing: null, // {start, end, clipStart, rangeEnd} while a recording plays
  selection: null, // {start, end}
  held: false, // the pointer is on the track: the window holds still
  renders: 0,
  loads: 0,
  error: null,
  holesSkipped: 0, // holes in the buffered recording jumped over (jumpHole)
  sourceBuffer: null, // the playing clip's SourceBuffer
  abort: null,
  codec: "avc1.42e01f",
};
window.ruseonRecordings = rec; // for diagnostics and the end-to-end tests

// The camera on screen (cameras.js: /#<camera>) as the playback API's ?path=; none: the first.
function camera() { const p = player(); return p && p.camera ? p.camera : ""; }
function withPath(url) {
  const name = camera();
  return name ? `${url}${url.includes("?") ? "&" : "?"}path=${encodeURIComponent(name)}` : url;
}
function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}
function iso(ms) { return new Date(ms).toISOString(); }
function showPlayback(message) {
  player().setState("playback", message);
  $("state-text").textContent = "Recording";
}

// ---------------------------------------------------------------------------------------------
// What is recorded

async function refresh() {
  try {
    const since = encodeURIComponent(iso(Date.now() - WINDOW_MAX_MS));
    const [list, status, events] = await Promise.all([
      fetch(withPath("/recordings/list"), { cache: "no-store" }),
      fetch("/api/status", { cache: "no-store" }),
      fetch(`/api/events?kind=motion&since=${since}`, { cache: "no-store" }),
    ]);
    if (events.ok) {
      const doc = await events.json();
      rec.defaultCamera = doc.default_camera;
      const name = camera() || doc.default_camera;
      rec.events = doc.events.filter((e) => e.camera === name).map((e) => ({
        id: e.id, start: e.start * 1000, end: (e.end || Date.now() / 1000) * 1000,
        lasting: e.end === null, snapshot: e.snapshot,
      }));
    }
    if (list.ok) {
      rec.ranges = (await list.json()).map((r) => {
        const start = Date.parse(r.start);
        // Recorded while the device's clock was not known to be right: in order, but its
        // time of day may be wrong.
        return { start, end: start + r.duration * 1000, uncertain: !!r.time_uncertain };
      });
    }
    if (status.ok) {
      const doc = await status.json();
      const name = camera();
      const r = (name && doc.recordings && doc.recordings[name]) || doc.recording || {};
      const row = name && doc.cameras ? doc.cameras.find((c) => c.name === name) : null;
      rec.state = r.state || "stopped";
      rec.reason = r.reason || "";
      rec.preroll = r.preroll_s || 0;
      const plid = row ? row.profile_level_id : doc.source && doc.source.profile_level_id;
      if (plid) rec.codec = `avc1.${plid}`;
    }
  } catch {
    // The service may be restarting; the next poll tries again.
  }
  playOn();
  render();
}

function render() {
  rec.renders += 1;
  const recording = rec.state !== "stopped";
  const button = $("btn-record");
  button.setAttribute("aria-pressed", String(recording));
  button.querySelector(".label").textContent = recording ? "Stop" : "Record";
  button.title = recording ? "Stop recording" : `Record (starts ${rec.preroll} s back)`;
  $("rec-timeline").hidden = rec.ranges.length === 0 && rec.events.length === 0 && !rec.playing;
  // The window follows "now", except while the pointer is on the track: what is under the
  // pointer holds still while someone aims, clicks or drags (it would slide by a pixel a
  // tenth of a second at the narrowest window).
  if (!rec.held || !rec.to) {
    const now = Date.now();
    const oldest = Math.min(rec.ranges.length ? rec.ranges[0].start : now,
                            rec.events.length ? rec.events[0].start : now);
    rec.to = Math.max(now, rec.ranges.length ? rec.ranges[rec.ranges.length - 1].end : now);
    rec.from = Math.max(rec.to - WINDOW_MAX_MS, Math.min(oldest, rec.to - WINDOW_MIN_MS));
  }
  const span = rec.to - rec.from;
  const pct = (t) => `${(100 * (Math.min(Math.max(t, rec.from), rec.to) - rec.from)) / span}%`;
  const box = $("rec-ranges");
  box.replaceChildren(...rec.ranges.filter((r) => r.end > rec.from).map((r) => {
    const el = document.createElement("div");
    el.style.left = pct(r.start);
    el.style.width = `calc(${pct(r.end)} - ${pct(r.start)})`;
    el.title = `${clock(r.start)} – ${clock(r.end)}`;
    if (r.uncertain) {
      el.className = "uncertain";
      el.title += " (time uncertain: the device's clock was not set)";
    }
    return el;
  }));
  // Motion events: a mark each (what is recorded of it shows under it, in the ranges).
  $("rec-events").replaceChildren(...rec.events.filter((e) => e.end > rec.from).map((e) => {
    const el = document.createElement("div");
    el.style.left = pct(e.start);
    el.style.width = `calc(${pct(e.end)} - ${pct(e.start)})`;
    el.className = e.lasting ? "lasting" : "";
    el.dataset.event = e.id;
    el.title = `motion ${clock(e.start)}${e.lasting ? " (now)" : ` – ${clock(e.end)}`}`;
    return el;
  }));
  const sel = $("rec-selection");
  sel.hidden = !rec.selection;
  if (rec.selection) {
    sel.style.left = pct(rec.selection.start);
    sel.style.width = `calc(${pct(rec.selection.end)} - ${pct(rec.selection.start)})`;
  }
  const head = $("rec-playhead");
  head.hidden = !rec.playing;
  if (rec.playing) head.style.left = pct(rec.playing.clipStart + video.currentTime * 1000);
  $("rec-from").textContent = clock(rec.from);
  $("rec-to").textContent = "now";
  let info = "";
  if (rec.playing) info = `▶ ${clock(rec.playing.clipStart + video.currentTime * 1000)}`;
  else if (rec.state === "recording" || rec.state === "waiting") info = "● recording";
  else if (rec.reason) info = `not recording: ${rec.reason}`;
  $("rec-info").textContent = info;
  $("rec-info").title = rec.reason;
  $("btn-live").hidden = !rec.playing;
  $("btn-download").hidden = !(rec.playing || rec.selection);
  $("btn-delete").hidden = !(rec.playing || rec.selection);
}

// ---------------------------------------------------------------------------------------------
// Playback in the page's <video>

function takeVideo() {
  const p = player();
  const hls = window.ruseonHls;
  if (hls) {
    if (hls.hls) { hls.hls.destroy(); hls.hls = null; }
    clearInterval(hls.statsTimer);
    hls.mode = "playback"; // hls-fallback.js leaves the video alone while it is not "webrtc"
  }
  p.transport = "playback"; // device.js neither reconnects nor checks for stalls meanwhile
  p.stopWebrtc();
  // The label says a recording plays, not the live transport that rests meanwhile; going back
  // to live, hls-fallback.js labels WebRTC or HLS again.
  const el = $("transport");
  if (el) {
    el.textContent = "Recording";
    el.dataset.transport = "recording";
    el.dataset.reason = "";
    el.title = "A recording from the device plays, not the live picture";
  }
}

async function play(at, seconds) {
  const range = rec.ranges.find((r) => r.end > at);
  if (!range) { toast("Nothing is recorded there"); return; }
  const clipStart = Math.max(at, range.start);
  const duration = seconds || Math.min(CLIP_WINDOW_S, (range.end - clipStart) / 1000);
  if (duration <= 0.05) { toast("Nothing is recorded there"); return; }
  const load = ++rec.loads;
  if (rec.abort) rec.abort.abort();
  const abort = new AbortController();
  rec.abort = abort;
  if (!rec.playing) takeVideo();
  rec.error = null;
  rec.playing = { start: clipStart, end: clipStart + duration * 1000, clipStart, rangeEnd: range.end, selected: !!seconds };
  showPlayback("Loading the recording…");
  render();
  const ms = new MediaSource();
  if (video.src && video.src.startsWith("blob:")) URL.revokeObjectURL(video.src);
  video.srcObject = null;
  video.src = URL.createObjectURL(ms);
  try {
    await new Promise((resolve) => ms.addEventListener("sourceopen", resolve, { once: true }));
    const url = withPath(`/recordings/get?start=${encodeURIComponent(iso(clipStart))}&duration=${duration.toFixed(3)}&format=fmp4`);
    const response = await fetch(url, { signal: abort.signal });
    if (!response.ok) {
      let detail = `HTTP ${response.status}`;
      try { detail = (await response.json()).detail || detail; } catch { /* not JSON */ }
      throw new Error(detail);
    }
    const start = Date.parse(response.headers.get("X-Clip-Start") || "") || clipStart;
    rec.playing.clipStart = start;
    // The clip's own tracks (H.264, and AAC when the camera has sound): a SourceBuffer
    // refuses an init segment with a track its type did not name.
    const codecs = response.headers.get("X-Clip-Codecs") || rec.codec;
    const type = `video/mp4; codecs="${codecs}"`;
    const fallback = codecs.includes("mp4a.") ? "avc1.42e01f,mp4a.40.2" : "avc1.42e01f";
    const sb = ms.addSourceBuffer(MediaSource.isTypeSupported(type) ? type : `video/mp4; codecs="${fallback}"`);
    rec.sourceBuffer = sb; // for diagnostics and the end-to-end tests
    const append = (bytes) => new Promise((resolve, reject) => {
      sb.addEventListener("updateend", resolve, { once: true });
      sb.addEventListener("error", () => reject(new Error("the browser could not decode the recording")), { once: true });
      sb.appendBuffer(bytes);
    });
    const reader = response.body.getReader();
    let pending = [];
    let size = 0;
    let started = false;
    for (;;) {
      const { done, value } = await reader.read();
      if (load !== rec.loads) return;
      if (value) { pending.push(value); size += value.byteLength; }
      if (size >= APPEND_BYTES || (done && size)) {
        const chunk = new Uint8Array(size);
        let offset = 0;
        for (const part of pending) { chunk.set(part, offset); offset += part.byteLength; }
        pending = [];
        size = 0;
        await append(chunk);
        if (!started) {
          started = true;
          video.play().catch(() => {});
        }
      }
      if (done) break;
    }
    if (load === rec.loads && ms.readyState === "open") ms.endOfStream();
  } catch (error) {
    if (load !== rec.loads || error.name === "AbortError") return;
    rec.error = error.message;
    showPlayback(`The recording could not be played: ${error.message}`);
    toast(`Cannot play: ${error.message}`);
  }
  render();
}

video.addEventListener("playing", () => { if (rec.playing) showPlayback(); });
video.addEventListener("error", () => {
  if (rec.playing) rec.error = video.error ? video.error.message || `media error ${video.error.code}` : "media error";
});
// A click plays a window of the range; carry on with the next one until the range ends: the
// range as the list has it now, since one still being recorded has grown since the click (it
// grows each time the recorder makes the open segment durable). Tried when playback ends and,
// ended, after each refresh of the list: playback then follows the recording a few seconds
// behind until "Live" or the recording stops.
function rangeEndNow(p) {
  const range = rec.ranges.find((r) => r.start <= p.end && r.end > p.end - 1000);
  return Math.max(p.rangeEnd, range ? range.end : 0);
}
function playOn() {
  const p = rec.playing;
  if (p && !p.selected && video.ended && p.end < rangeEndNow(p) - 500) play(p.end);
}
video.addEventListener("ended", playOn);
video.addEventListener("timeupdate", () => { if (rec.playing) render(); });

// A hole in what the browser buffered (WebKitGTK's MSE leaves some in a clip whose fragments
// are continuous: 0.1-2 s here) stops playback for good at its edge, as a live stream's would
// (hls.js jumps those): while a recording plays and time stands still at the end of a buffered
// range, skip to the next one if it starts close ahead.
const HOLE_MAX_S = 5;
const STUCK_MS = 1000;
let stuck = { time: -1, since: 0 };
function jumpHole() {
  if (!rec.playing || video.paused || video.seeking) { stuck.time = -1; return; }
  const now = performance.now();
  if (video.currentTime !== stuck.time) { stuck = { time: video.currentTime, since: now }; return; }
  if (now - stuck.since < STUCK_MS) return;
  const ranges = video.buffered;
  for (let i = 0; i < ranges.length; i++) {
    const start = ranges.start(i);
    if (start > video.currentTime && start - video.currentTime <= HOLE_MAX_S) {
      rec.holesSkipped = (rec.holesSkipped || 0) + 1;
      video.currentTime = start + 0.001;
      stuck.time = -1;
      return;
    }
  }
}
setInterval(jumpHole, 250);

function backToLive() {
  if (!rec.playing) return;
  rec.loads++;
  if (rec.abort) rec.abort.abort();
  rec.abort = null;
  rec.playing = null;
  rec.selection = null;
  if (video.src && video.src.startsWith("blob:")) URL.revokeObjectURL(video.src);
  video.removeAttribute("src");
  video.load();
  const hls = window.ruseonHls;
  if (hls) { hls.mode = "webrtc"; hls.notLiveSince = performance.now(); }
  player().startWebrtc();
  render();
}

// ---------------------------------------------------------------------------------------------
// The timeline: click to play a moment, drag to select a range (then it plays and downloads)

function timeAt(clientX) {
  const box = track.getBoundingClientRect();
  const x = Math.min(Math.max(clientX - box.left, 0), box.width);
  return rec.from + (x / box.width) * (rec.to - rec.from);
}

let drag = null;
track.addEventListener("pointerenter", () => { rec.held = true; });
track.addEventListener("pointerleave", () => { rec.held = false; render(); });
track.addEventListener("pointerdown", (event) => {
  drag = { x: event.clientX, start: timeAt(event.clientX) };
  track.setPointerCapture(event.pointerId);
});
track.addEventListener("pointermove", (event) => {
  if (!drag || Math.abs(event.clientX - drag.x) < 6) return;
  const t = timeAt(event.clientX);
  rec.selection = { start: Math.min(drag.start, t), end: Math.max(drag.start, t) };
  render();
});
track.addEventListener("pointerup", (event) => {
  if (!drag) return;
  const moved = Math.abs(event.clientX - drag.x) >= 6;
  const at = drag.start;
  drag = null;
  if (moved && rec.selection) {
    play(rec.selection.start, Math.max(1, (rec.selection.end - rec.selection.start) / 1000));
  } else {
    rec.selection = null;
    const mark = eventAt(event.clientX);
    // A click on a motion mark plays the event from its pre-roll.
    play(mark ? Math.max(mark.start - rec.preroll * 1000, recordedFrom(mark.start)) : at);
  }
});

// The motion event under the pointer (within a few pixels: marks are thin on a long window).
function eventAt(clientX) {
  const box = track.getBoundingClientRect();
  const slack = ((rec.to - rec.from) * 6) / Math.max(1, box.width);
  const t = timeAt(clientX);
  return rec.events.find((e) => t >= e.start - slack && t <= e.end + slack) || null;
}
// Where the recording that holds ``t`` (or the next one after it) starts.
function recordedFrom(t) {
  const range = rec.ranges.find((r) => r.end >= t);
  return range ? Math.min(range.start, t) : t;
}
window.ruseonMotionMarks = () => rec.events.map((e) => ({ ...e })); // for the end-to-end tests

/** A motion event from the event stream (motion.js: {camera, event_id, start, end?, snapshot},
 * seconds): its mark shows now, not at the next poll (which stays, as the fallback). */
export function addMotionEvent(data) {
  if (data.camera !== (camera() || rec.defaultCamera)) return;
  const e = {
    id: data.event_id, start: data.start * 1000, end: (data.end || Date.now() / 1000) * 1000,
    lasting: data.end === undefined || data.end === null, snapshot: data.snapshot || null,
  };
  rec.events = rec.events.filter((x) => x.id !== e.id).concat([e]).sort((a, b) => a.start - b.start);
  rec.fromStream += 1;
  render();
}

/** Play a motion event ({start} in ms) from its pre-roll, as a click on its mark does. */
export async function playEvent(e) {
  if (!rec.ranges.some((r) => r.end >= e.start)) await refresh(); // recorded since the last poll
  play(Math.max(e.start - rec.preroll * 1000, recordedFrom(e.start)));
}
track.addEventListener("pointercancel", () => { drag = null; });
track.addEventListener("keydown", (event) => {
  // Keyboard: Enter plays the last minute recorded.
  if (event.key === "Enter" && rec.ranges.length) {
    const last = rec.ranges[rec.ranges.length - 1];
    play(Math.max(last.start, last.end - 60000));
  }
});

$("btn-live").addEventListener("click", backToLive);

async function problem(response) {
  try { return (await response.json()).detail || `HTTP ${response.status}`; } catch { return `HTTP ${response.status}`; }
}

$("btn-record").addEventListener("click", async () => {
  const recording = rec.state !== "stopped";
  try {
    const response = await adminFetch(withPath(`/api/recording/${recording ? "stop" : "start"}`), { method: "POST" });
    if (!response) return; // the admin dialog was cancelled
    if (!response.ok) throw new Error(await problem(response));
    const doc = await response.json();
    rec.state = doc.state;
    rec.reason = doc.reason || "";
    toast(recording ? "Recording stopped" : `Recording (from ${doc.preroll_s} s ago)`);
  } catch (error) {
    toast(`Recording could not be ${recording ? "stopped" : "started"}: ${error.message}`);
  }
  refresh();
});

// What Download and Delete act on: the range selected, else the window playing.
function chosenSpan() {
  const span = rec.selection || (rec.playing ? { start: rec.playing.clipStart, end: rec.playing.end } : null);
  return span && { start: span.start, seconds: Math.max(1, (span.end - span.start) / 1000) };
}
function spanQuery(span) { return `start=${encodeURIComponent(iso(span.start))}&duration=${span.seconds.toFixed(3)}`; }

$("btn-download").addEventListener("click", () => {
  const span = chosenSpan();
  if (!span) return;
  const name = `ruseon-${iso(span.start).replace(/[:.]/g, "-").slice(0, 19)}.mp4`;
  // Streamed straight to disk by the browser (with the session cookie when viewing needs one).
  saveUrl(withPath(`/recordings/get?${spanQuery(span)}`), name);
  toast("Downloading the recording");
});

$("btn-delete").addEventListener("click", async () => {
  const span = chosenSpan();
  if (!span) return;
  const to = span.start + span.seconds * 1000;
  if (!window.confirm(`Delete the recording from ${clock(span.start)} to ${clock(to)}?`)) return;
  try {
    const response = await adminFetch(withPath(`/recordings?${spanQuery(span)}`), { method: "DELETE" });
    if (!response) return; // the admin dialog was cancelled
    if (!response.ok) throw new Error(await problem(response));
    const doc = await response.json();
    const kept = doc.kept.length ? ` (kept: ${doc.kept.map((k) => k.why).join(", ")})` : "";
    toast(`Recording deleted${kept}`);
  } catch (error) {
    toast(`The recording could not be deleted: ${error.message}`);
    return;
  }
  backToLive();
  rec.selection = null;
  refresh();
});

// While a recording plays, the stats overlay describes it (device.js only fills it for WebRTC).
let lastFrames = 0;
function statsTick() {
  if (!rec.playing) { lastFrames = 0; return; }
  const quality = video.getVideoPlaybackQuality ? video.getVideoPlaybackQuality() : null;
  const frames = quality ? quality.totalVideoFrames : 0;
  const fps = lastFrames && !video.paused ? Math.max(0, frames - lastFrames) : 0;
  lastFrames = frames;
  setText("stat-resolution", video.videoWidth ? `${video.videoWidth}×${video.videoHeight}` : "–");
  setText("stat-fps", fps ? `${fps} fps` : "–");
  for (const id of ["stat-bitrate", "stat-loss", "stat-rtt", "stat-jitter"]) setText(id, "–");
  setText("stat-codec", "H264 · recording");
}

function start() {
  if (!player() || !player().stopWebrtc) { setTimeout(start, 50); return; }
  refresh();
  setInterval(refresh, LIST_MS);
  setInterval(statsTick, 1000);
}
start();
