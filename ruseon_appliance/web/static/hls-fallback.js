// HLS for the device page when WebRTC cannot play: UDP blocked (guest Wi-Fi, VPNs), a browser
// without H.264 for WebRTC (Firefox without OpenH264), or a server that answers /whep with 406.
// Safari plays the appliance's LL-HLS natively; other browsers use the vendored hls.js
// (/static/vendor/hls.min.js, loaded only when needed). A button switches by hand.
//
// device.js owns WebRTC; this module only takes the <video> over (player.stopWebrtc) and gives
// it back (player.startWebrtc). window.ruseon.transport says which one plays.
import { $, player, setText } from "./page.js";

// The camera device.js plays (cameras.js: /#<camera>), else the first camera's /hls/.
function playlist() {
  const p = player();
  return p && p.camera ? `/hls/${encodeURIComponent(p.camera)}/index.m3u8` : "/hls/index.m3u8";
}
const HLS_SCRIPT = "/static/vendor/hls.min.js";
const CHOICE_KEY = "ruseon.transport"; // "webrtc" | "hls" when chosen by hand (per tab)
// WebRTC that has not shown a picture this long after it started trying is given up on.
const FALLBACK_MS = 5000;
const WATCH_MS = 500;
const STATS_MS = 1000;
const RETRY_MS = 1000;

const video = $("video");
const state = {
  mode: "webrtc", // what plays now
  reason: "",
  hls: null, // the hls.js instance
  generation: 0, // bumped whenever HLS is started or stopped: a stale start gives up
  native: false,
  notLiveSince: performance.now(),
  lastFrames: 0,
  lastTime: 0,
  statsTimer: 0,
  media: [], // the newest loaded fragments and parts: {key, sn, bytes, duration}
};
window.ruseonHls = state; // for diagnostics and the end-to-end tests

function chosen() { return sessionStorage.getItem(CHOICE_KEY) || ""; }

function label(text, title) {
  const el = $("transport");
  if (!el) return;
  el.textContent = text;
  el.title = title || "";
  el.dataset.transport = state.mode;
  // Why it is not WebRTC, shown beside the mode (device.css) as well as in the title.
  el.dataset.reason = state.mode === "hls" ? state.reason : "";
  const button = $("btn-transport");
  if (button) {
    const webrtc = webrtcSupport();
    button.querySelector(".label").textContent = state.mode === "hls" ? "WebRTC" : "HLS";
    // Offer only what this browser can use, and say why not.
    button.disabled = state.mode === "hls" && !webrtc.ok;
    button.title = state.mode !== "hls" ? "Switch to HLS"
      : webrtc.ok ? "Switch to WebRTC" : `WebRTC is not available: ${webrtc.reason}`;
  }
  // The stats panel's names say what each figure is in this mode (hlsTick fills them).
  const hls = state.mode === "hls";
  statName("stat-loss", hls ? "Buffer" : "Packet loss");
  statName("stat-jitter", hls ? "Live latency" : "Jitter buffer");
}

function statName(id, text) {
  const dd = $(id);
  const dt = dd ? dd.previousElementSibling : null;
  if (dt && dt.textContent !== text) dt.textContent = text;
}

// device.js decides once what this browser can play (whep.js webrtcSupport) and learns from a
// 406; until it has run, ask the browser directly.
function webrtcSupport() {
  const p = player();
  return p && p.webrtc ? p.webrtc : { ok: true };
}

function useNative() {
  // Safari (and iOS browsers, all WebKit) plays HLS itself, with LL-HLS; others via hls.js.
  const apple = /Apple/.test(navigator.vendor || "");
  return apple && video.canPlayType("application/vnd.apple.mpegurl") !== "";
}

let hlsJsLoading = null; // one <script> however often HLS is started while it loads

function loadHlsJs() {
  if (window.Hls) return Promise.resolve(window.Hls);
  if (hlsJsLoading) return hlsJsLoading;
  hlsJsLoading = new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = HLS_SCRIPT;
    script.onload = () => (window.Hls ? resolve(window.Hls) : reject(new Error("hls.js did not load")));
    script.onerror = () => { script.remove(); reject(new Error("hls.js could not be loaded")); };
    document.head.appendChild(script);
  });
  hlsJsLoading.catch(() => { hlsJsLoading = null; }); // a later attempt may try again
  return hlsJsLoading;
}

async function playHls(reason) {
  if (state.mode === "hls") return;
  const p = player();
  // HLS may be stopped and started again (the button, a login) while hls.js still loads:
  // only the newest start may go on, or two hls.js instances would feed the one <video>.
  const generation = ++state.generation;
  state.mode = "hls";
  state.reason = reason;
  p.transport = "hls";
  p.stopWebrtc();
  p.setState("connecting", `Playing over HLS (${reason})…`);
  label("HLS", reason);
  // No credential here: the session cookie (when viewing needs one) goes with hls.js's requests
  // and with the native player's by itself.
  try {
    if (useNative()) {
      state.native = true;
      video.src = playlist();
      // Native HLS (Safari) says whether there is sound once it has the media's tracks.
      video.addEventListener("loadedmetadata", () => {
        if (state.native && video.audioTracks && video.audioTracks.length) p.showSound(true);
      }, { once: true });
      label("HLS", `native HLS: ${reason}`);
    } else {
      const Hls = await loadHlsJs();
      // Stale: stopped or started again meanwhile, or recordings.js took the video ("playback").
      if (generation !== state.generation || state.mode !== "hls") return;
      if (!Hls.isSupported()) throw new Error("this browser has neither WebRTC H.264 nor MSE");
      const hls = new Hls({
        lowLatencyMode: true,
        backBufferLength: 10,
      });
      state.hls = hls;
      hls.on(Hls.Events.ERROR, (event, data) => onHlsError(Hls, hls, data));
      hls.on(Hls.Events.FRAG_LOADED, (event, data) => noteMedia(data));
      // The camera's sound (an AAC track in the init segment; hls.js names one muxed fMP4
      // "audiovideo"): the page's Sound button unmutes it.
      hls.on(Hls.Events.BUFFER_CODECS, (event, data) => {
        const muxed = data && data.audiovideo && /mp4a/.test(data.audiovideo.codec || "");
        if (state.hls === hls && data && (data.audio || muxed)) p.showSound(true);
      });
      hls.loadSource(playlist());
      hls.attachMedia(video);
      label("LL-HLS", `hls.js ${Hls.version}: ${reason}`);
    }
    video.play().catch(() => {});
  } catch (error) {
    if (generation !== state.generation || state.mode !== "hls") return;
    p.setState("error", `HLS is not available: ${error.message}`);
  }
  clearInterval(state.statsTimer);
  state.statsTimer = setInterval(hlsTick, STATS_MS);
}

function onHlsError(Hls, hls, data) {
  const status = data.response ? data.response.code : 0;
  if (status === 401) {
    player().askForToken();
    return;
  }
  if (!data.fatal) return;
  if (status === 404 && data.details === Hls.ErrorDetails.MANIFEST_LOAD_ERROR) {
    player().setState("error", "This camera does not serve HLS ([hls] enable = false).");
    return;
  }
  if (data.type === Hls.ErrorTypes.MEDIA_ERROR) {
    hls.recoverMediaError();
  } else {
    // A fresh instance, not hls.startLoad(): after a failed manifest load (the board starting
    // up or restarting) startLoad() does nothing (video-dev/hls.js#834), and a restarted board
    // names its parts anew anyway.
    player().setState("reconnecting", "The HLS stream was interrupted. Reconnecting…");
    setTimeout(() => { if (state.hls === hls) restartHls(); }, RETRY_MS);
  }
}

// The stream's bitrate is what its media weigh per second of media: the bytes of the newest
// parts and fragments over their durations (not hls.js's bandwidthEstimate, which is how fast
// they downloaded: tens of Mbit/s on a LAN for a 2 Mbit/s stream).
const MEDIA_WINDOW_S = 4;

function noteMedia(data) {
  const frag = data.frag;
  if (!frag || typeof frag.sn !== "number") return; // the init segment has no media time
  const piece = data.part || frag;
  // The loader's byte count: the payload itself may already be handed to the transmuxer's
  // worker (a transferred ArrayBuffer reads 0 bytes).
  const bytes = (piece.stats && piece.stats.loaded) || (data.payload ? data.payload.byteLength : 0);
  if (!bytes || !(piece.duration > 0)) return;
  const key = data.part ? `${frag.sn}.${data.part.index}` : `${frag.sn}`;
  // A whole fragment whose parts were counted already is the same media again.
  if (state.media.some((m) => m.key === key || (!data.part && m.sn === frag.sn))) return;
  state.media.push({ key, sn: frag.sn, bytes, duration: piece.duration });
  let total = 0;
  for (let i = state.media.length - 1; i >= 0; i--) {
    total += state.media[i].duration;
    if (total > MEDIA_WINDOW_S) { state.media.splice(0, i); break; }
  }
}

function mediaBitrate() {
  const seconds = state.media.reduce((sum, m) => sum + m.duration, 0);
  const bytes = state.media.reduce((sum, m) => sum + m.bytes, 0);
  return seconds >= 1 ? (bytes * 8) / seconds : null;
}

function bufferedAhead() {
  const ranges = video.buffered;
  for (let i = 0; i < ranges.length; i++) {
    if (ranges.start(i) <= video.currentTime + 0.1 && video.currentTime <= ranges.end(i)) {
      return Math.max(0, ranges.end(i) - video.currentTime);
    }
  }
  return null;
}

function restartHls() {
  const reason = state.reason;
  stopHls();
  state.mode = "restarting"; // playHls() starts only from another mode
  playHls(reason);
}

function stopHls() {
  state.generation++;
  clearInterval(state.statsTimer);
  if (state.hls) state.hls.destroy();
  state.hls = null;
  state.media = [];
  state.native = false;
  video.removeAttribute("src");
  video.load();
}

function playWebrtc() {
  stopHls();
  state.mode = "webrtc";
  state.reason = "";
  state.notLiveSince = performance.now();
  label("WebRTC");
  player().startWebrtc();
}

function framesShown() {
  const quality = video.getVideoPlaybackQuality ? video.getVideoPlaybackQuality() : null;
  return quality ? quality.totalVideoFrames : 0;
}

function hlsTick() {
  if (state.mode !== "hls") return;
  const p = player();
  const frames = framesShown();
  const advancing = video.currentTime > state.lastTime && !video.paused;
  if (advancing && p.state !== "live") p.setState("live");
  const fps = Math.max(0, frames - state.lastFrames) / (STATS_MS / 1000);
  state.lastFrames = frames;
  state.lastTime = video.currentTime;
  setText("stat-resolution", video.videoWidth ? `${video.videoWidth}×${video.videoHeight}` : "–");
  setText("stat-fps", fps ? `${fps.toFixed(0)} fps` : "–");
  const hls = state.hls;
  const bitrate = mediaBitrate();
  state.bitrate = bitrate;
  setText("stat-bitrate", bitrate ? `${(bitrate / 1e6).toFixed(2)} Mbit/s` : "–");
  const ahead = bufferedAhead();
  setText("stat-loss", ahead !== null ? `${ahead.toFixed(1)} s` : "–");
  setText("stat-rtt", "–");
  setText("stat-jitter", hls && Number.isFinite(hls.latency) ? `${hls.latency.toFixed(1)} s` : "–");
  setText("stat-codec", state.native ? "H264 · HLS" : "H264 · LL-HLS");
}

// Give up on WebRTC when it shows no picture for FALLBACK_MS (a blocked UDP port never fails
// loudly: ICE just never connects), unless a person chose WebRTC or must enter the token.
// Not while the board does not answer at all (a restart, a reboot): HLS would not play either,
// and the page would stay on HLS, seconds behind, once the board is back.
function watch() {
  const p = player();
  if (!p || state.mode !== "webrtc") return;
  // "grid": cameras.js shows every camera's tile (and labels them); the big picture waits.
  if (p.state === "grid") { state.notLiveSince = performance.now(); return; }
  // Another module (recordings.js) may hand the video back to WebRTC by setting the mode.
  if ($("transport") && $("transport").dataset.transport !== "webrtc") label("WebRTC");
  if (p.state === "live" || p.state === "auth" || p.reachable === false) {
    state.notLiveSince = performance.now();
    return;
  }
  if (chosen() !== "webrtc" && performance.now() - state.notLiveSince > FALLBACK_MS) {
    playHls(`WebRTC did not connect within ${FALLBACK_MS / 1000} s`);
  }
}

function start() {
  const p = player();
  if (!p) { setTimeout(start, 50); return; } // device.js (a module too) sets it up
  label("WebRTC");
  const button = $("btn-transport");
  if (button) {
    button.addEventListener("click", () => {
      if (state.mode === "hls") {
        if (!webrtcSupport().ok) return; // disabled, and its title says why
        sessionStorage.setItem(CHOICE_KEY, "webrtc");
        playWebrtc();
      } else {
        sessionStorage.setItem(CHOICE_KEY, "hls");
        playHls("chosen by hand");
      }
    });
  }
  // No codec in common (406): asking again would be refused again, even if chosen by hand.
  window.addEventListener("ruseon:webrtc-unsupported", (event) => {
    if (chosen() === "webrtc") sessionStorage.removeItem(CHOICE_KEY);
    playHls(`the camera refused WebRTC: ${event.detail}`);
  });
  // This browser cannot do WebRTC at all (device.js would not even try).
  window.addEventListener("ruseon:webrtc-unavailable", (event) => playHls(event.detail));
  // The cameras grid (cameras.js) shows: HLS rests; a camera chosen: HLS plays that one.
  window.addEventListener("ruseon:grid", () => {
    if (state.mode !== "hls") return;
    stopHls();
    state.mode = "resting"; // neither "hls" (playHls starts again) nor "webrtc" (watch() waits)
  });
  window.addEventListener("ruseon:camera", () => {
    if (state.mode === "hls" || state.mode === "resting") restartHls();
  });
  // Logged in from the token dialog (device.js): play again, now with the cookie.
  window.addEventListener("ruseon:session", () => {
    if (state.mode === "hls" && player().state === "auth") restartHls();
  });
  const webrtc = webrtcSupport();
  if (!webrtc.ok) playHls(webrtc.reason); // a choice of WebRTC from before cannot hold
  else if (chosen() === "hls") playHls("chosen by hand");
  setInterval(watch, WATCH_MS);
}

start();
