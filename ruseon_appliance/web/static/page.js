// What the device page's modules share: element lookup, the player device.js sets up, the access
// token and its Authorization header, the toast, and saving a file. device.js, hls-fallback.js,
// recordings.js, controls.js and cameras.js import it (ES modules, like the rest of the page), so
// there is one toast with one timer and one place that knows where the token is kept.

const TOKEN_KEY = "ruseon.token";
const TOAST_MS = 2500;

/** The element with this id (null when there is none). */
export const $ = (id) => document.getElementById(id);

/** The player device.js sets up (window.ruseon); undefined until device.js has run. */
export function player() { return window.ruseon; }

/** The access token entered in this tab, or "" (kept per tab: gone when the tab closes). */
export function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

/** Keep `value` as this tab's access token. */
export function saveToken(value) { sessionStorage.setItem(TOKEN_KEY, value); }

/** `extra` request headers plus `Authorization: Bearer <token>` when there is a token. */
export function authHeaders(extra = {}) {
  const t = token();
  return t ? { ...extra, Authorization: `Bearer ${t}` } : { ...extra };
}

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
