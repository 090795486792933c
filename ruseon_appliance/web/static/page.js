// What the device page's modules share: element lookup, the player device.js sets up, the toast,
// and saving a file. device.js, hls-fallback.js, recordings.js, controls.js, cameras.js and
// session.js import it (ES modules, like the rest of the page), so there is one toast with one
// timer. Credentials are session.js's: the page logs in once and the cookie does the rest.

const TOAST_MS = 2500;

/** The element with this id (null when there is none). */
export const $ = (id) => document.getElementById(id);

/** The player device.js sets up (window.ruseon); undefined until device.js has run. */
export function player() { return window.ruseon; }

/** Show `text` in the page's toast for `ms` milliseconds (a newer toast replaces it). */
export function toast(text, ms = TOAST_MS) {
  const el = $("toast");
  if (!el) return;
  el.textContent = text;
  el.classList.add("show");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => el.classList.remove("show"), ms);
}

/** Set the text of the element with this id, if the page has it. */
export function setText(id, text) {
  const el = $(id);
  if (el) el.textContent = text;
}

/** Have the browser save `href` (a URL it may fetch by itself) as a file named `name`. */
export function saveUrl(href, name) {
  const a = document.createElement("a");
  a.href = href;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
}

/** Have the browser save `blob` as a file named `name`. */
export function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  saveUrl(url, name);
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

/** A footer button like index.html's own (`.icon-btn`): `icon` is its SVG's inner markup. */
export function iconButton(id, title, icon, label) {
  const button = document.createElement("button");
  button.id = id;
  button.type = "button";
  button.className = "icon-btn";
  button.title = title;
  button.innerHTML = `<svg viewBox="0 0 24 24" aria-hidden="true">${icon}</svg><span class="label"></span>`;
  button.querySelector(".label").textContent = label;
  return button;
}
