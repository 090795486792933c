// Camera settings on the device page: a panel built from GET /api/camera/controls (whatever the
// source has: exposure, gain, white balance, brightness..., flips, bitrate, frame rate, size).
// A change is PATCHed at once (sliders when released); controls marked "restarts" restart the
// camera source, which viewers ride through (the picture pauses for a moment). "Reset" sends null,
// which returns a control to the config file's value. This module owns the Settings button and
// the panel; index.html only loads it. The controls are admin's: the panel opens once the page
// is logged in as admin (session.js asks for the secret the first time).
import { $, iconButton, player, toast } from "./page.js";
import { adminFetch, session } from "./session.js";

// Error details from the server: on screen a little longer than the page's usual toast.
const TOAST_MS = 3000;

// The controls of the camera on screen (cameras.js: /#<camera>); the first camera's otherwise.
function controlsUrl() {
  const p = player();
  return p && p.camera ? `/api/camera/${encodeURIComponent(p.camera)}/controls` : "/api/camera/controls";
}
const settings = { controls: {}, unsupported: [], source: "", error: null, open: false };
window.ruseonControls = settings; // for diagnostics and the end-to-end tests

const LABELS = {
  exposure_us: "Exposure", analogue_gain: "Gain", awb: "White balance", brightness: "Brightness",
  contrast: "Contrast", saturation: "Saturation", sharpness: "Sharpness", hflip: "Mirror",
  vflip: "Flip vertically", bitrate: "Bitrate", framerate: "Frame rate", resolution: "Resolution",
};

/** The controls, from the server; false when the person cancelled the admin dialog. */
async function load() {
  const resp = await adminFetch(controlsUrl(), { cache: "no-store" });
  if (!resp) return false;
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(data.detail || `HTTP ${resp.status}`);
  settings.controls = data.controls;
  settings.unsupported = data.unsupported;
  settings.source = data.source;
  return true;
}

async function change(name, value) {
  const resp = await adminFetch(controlsUrl(), {
    method: "PATCH",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ [name]: value }),
  });
  if (!resp) { render(); return; } // not changed: the inputs show the values again
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    settings.error = data.detail || `HTTP ${resp.status}`;
    toast(settings.error, TOAST_MS);
  } else {
    settings.error = null;
    settings.controls = data.controls;
    if (data.restarted) toast("Camera restarted with the new setting", TOAST_MS);
  }
  render();
}

function field(name, spec) {
  const row = document.createElement("div");
  row.className = "ctl-row";
  row.dataset.control = name;
  const label = document.createElement("label");
  label.htmlFor = `ctl-${name}`;
  label.textContent = LABELS[name] || name;
  if (!spec.live) {
    const tag = document.createElement("span");
    tag.className = "ctl-restart";
    tag.textContent = "restarts";
    tag.title = "Applying this restarts the camera source";
    label.append(" ", tag);
  }
  let input;
  if (spec.type === "bool") {
    input = document.createElement("input");
    input.type = "checkbox";
    input.checked = spec.value;
    input.addEventListener("change", () => change(name, input.checked));
  } else if (spec.type === "enum") {
    input = document.createElement("select");
    for (const choice of spec.choices) input.add(new Option(choice, choice, false, choice === spec.value));
    input.addEventListener("change", () => change(name, input.value));
  } else {
    input = document.createElement("input");
    const wide = spec.max - spec.min > 1000;
    input.type = wide ? "number" : "range";
    input.min = spec.min;
    input.max = spec.max;
    input.step = spec.type === "int" ? 1 : (spec.max - spec.min) / 100;
    input.value = spec.value;
    const shown = document.createElement("output");
    shown.textContent = `${spec.value}${spec.unit ? " " + spec.unit : ""}`;
    input.addEventListener("input", () => { shown.textContent = input.value; });
    input.addEventListener("change", () => {
      const v = spec.type === "int" ? Math.round(Number(input.value)) : Number(input.value);
      change(name, v);
    });
    row.append(label, input, shown);
  }
  input.id = `ctl-${name}`;
  if (!row.contains(input)) row.append(label, input, document.createElement("span"));
  const reset = document.createElement("button");
  reset.type = "button";
  reset.className = "ctl-reset";
  reset.textContent = "Reset";
  reset.title = `Back to the config's value (${spec.default})`;
  reset.disabled = spec.value === spec.default;
  reset.addEventListener("click", () => change(name, null));
  row.append(reset);
  return row;
}

function render() {
  const body = $("ctl-body");
  if (!body) return;
  body.replaceChildren();
  if (settings.error) {
    const p = document.createElement("p");
    p.className = "ctl-error";
    p.textContent = settings.error;
    body.append(p);
  }
  for (const [name, spec] of Object.entries(settings.controls)) body.append(field(name, spec));
  if (!Object.keys(settings.controls).length) {
    const p = document.createElement("p");
    p.textContent = `The ${settings.source || "camera"} source has no adjustable controls.`;
    body.append(p);
  }
}

function show(open) {
  settings.open = open;
  $("ctl-panel").hidden = !open;
  $("btn-settings").setAttribute("aria-pressed", String(open));
}

async function toggle() {
  if (settings.open) { show(false); return; }
  try {
    if (!(await load())) return; // the admin dialog was cancelled: the panel stays closed
    settings.error = null;
  } catch (err) {
    settings.error = `Settings unavailable: ${err.message}`;
  }
  show(true);
  render();
}

function install() {
  const stage = $("stage");
  const footer = document.querySelector(".bar-bottom");
  if (!stage || !footer) return;
  const button = iconButton("btn-settings", "Camera settings",
    '<path d="M4 6h10M18 6h2M4 12h4M12 12h8M4 18h12M20 18h0"/><circle cx="16" cy="6" r="2"/>'
    + '<circle cx="10" cy="12" r="2"/><circle cx="18" cy="18" r="2"/>', "Settings");
  button.setAttribute("aria-pressed", "false");
  footer.insertBefore(button, $("btn-fullscreen"));
  const panel = document.createElement("section");
  panel.id = "ctl-panel";
  panel.className = "ctl-panel";
  panel.hidden = true;
  panel.setAttribute("aria-label", "Camera settings");
  panel.innerHTML = '<h2>Camera</h2><div id="ctl-body"></div>';
  stage.append(panel);
  button.addEventListener("click", toggle);
  // Logged out (or the session ended): the panel showed what only admin may see.
  window.addEventListener("ruseon:session", () => { if (session.role !== "admin") show(false); });
}

install();
