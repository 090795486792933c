// The page's login session: what this browser may do on the camera. GET /api/session says it
// ({role: "none" | "viewer" | "admin", viewing: "open" | "credential", https}); POST /api/session
// with the admin secret (or the viewer token) logs in and sets an HttpOnly, SameSite=Strict cookie
// that every request of the page then carries by itself (fetch, hls.js, <video src>, downloads);
// DELETE /api/session logs out. The page never holds a secret itself.
//
// Admin actions (Settings, Record/Stop, Delete) go through adminFetch(): it asks for the admin
// secret once, in the admin dialog (index.html), then relies on the cookie. This module also owns
// the Logout button and the note that says viewing is open on the LAN.
import { $, toast } from "./page.js";

export const session = { role: "none", viewing: "open", https: false };
window.ruseonSession = session; // for diagnostics and the end-to-end tests

/** Ask the server who this page is; "ruseon:session" fires when the answer changes anything. */
export async function refreshSession() {
  try {
    const response = await fetch("/api/session", { cache: "no-store" });
    if (response.ok) update(await response.json());
  } catch {
    // The service may be restarting: what we knew still holds until an answer says otherwise.
  }
}
const first = refreshSession();

function update(fields) {
  const before = JSON.stringify(session);
  Object.assign(session, fields);
  $("btn-logout").hidden = session.role === "none";
  $("access-note").hidden = session.viewing !== "open";
  if (JSON.stringify(session) !== before) {
    window.dispatchEvent(new CustomEvent("ruseon:session", { detail: { ...session } }));
  }
}

// Why POST /api/session did not log in, for the dialog.
async function refusal(response, retryAfter) {
  if (response.status === 401) return "That secret is not valid.";
  if (response.status === 429) return `Too many wrong secrets from this address: try again in ${retryAfter} s.`;
  try {
    const problem = await response.json();
    return problem.detail || problem.title || `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

/**
 * Log in with `secret` (the admin secret or the viewer token). Resolves to {role} ("admin" or
 * "viewer") when the server took it, else to {role: null, message, retryAfter} saying why not.
 */
export async function login(secret) {
  let response;
  try {
    response = await fetch("/api/session", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ secret }),
      cache: "no-store",
    });
  } catch {
    return { role: null, message: "The camera is not reachable. Try again.", retryAfter: 0 };
  }
  if (!response.ok) {
    const retryAfter = response.status === 429 ? Number(response.headers.get("Retry-After")) || 60 : 0;
    return { role: null, message: await refusal(response, retryAfter), retryAfter };
  }
  const { role } = await response.json();
  update({ role });
  return { role };
}

/** Log out: the server forgets the session and clears the cookie (throws when it did not). */
export async function logout() {
  const response = await fetch("/api/session", { method: "DELETE", cache: "no-store" });
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  update({ role: "none" });
}

// ---------------------------------------------------------------------------------------------
// The admin dialog: asked once, then the cookie counts

const dialog = $("admin-dialog");
let asking = null; // {promise, resolve} while the dialog is open: every caller waits for it

function showError(text) {
  const el = $("admin-error");
  el.textContent = text;
  el.hidden = !text;
}

function finish(ok) {
  if (dialog.open) dialog.close();
  const { resolve } = asking;
  asking = null;
  resolve(ok);
}

/** Resolves true once this page is admin, asking for the secret when it is not yet; false when
 * the person cancels. `hint` replaces the dialog's first error line (e.g. the session ended). */
export async function ensureAdmin(hint = "") {
  await first;
  if (session.role === "admin") return true;
  if (asking) return asking.promise;
  let resolve;
  const promise = new Promise((r) => { resolve = r; });
  asking = { promise, resolve };
  $("admin-input").value = "";
  showError(hint);
  dialog.showModal();
  return promise;
}

$("admin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const secret = $("admin-input").value.trim();
  if (!secret || !asking) return;
  const submit = $("admin-submit");
  submit.disabled = true;
  const result = await login(secret);
  submit.disabled = false;
  if (result.role === "admin") { finish(true); return; }
  $("admin-input").select();
  if (result.role === "viewer") {
    showError("That is the viewer token: this needs the admin secret.");
  } else {
    showError(result.message);
    if (result.retryAfter) { // no use trying before the server listens again
      submit.disabled = true;
      setTimeout(() => { submit.disabled = false; }, result.retryAfter * 1000);
    }
  }
});
$("admin-cancel").addEventListener("click", () => { if (asking) finish(false); });
dialog.addEventListener("cancel", (event) => { // Escape
  event.preventDefault();
  if (asking) finish(false);
});

/**
 * fetch() for an admin route: asks for the admin secret first when this page is not admin, and
 * once more when the server no longer takes the session (the secret was rotated, the camera
 * restarted). Resolves to the Response, or null when the person cancelled the dialog.
 */
export async function adminFetch(url, options = {}) {
  if (!(await ensureAdmin())) return null;
  const response = await fetch(url, options);
  if (response.status !== 401 && response.status !== 403) return response;
  await refreshSession();
  if (session.role === "admin") return response; // refused for another reason: say that
  if (!(await ensureAdmin("The admin session has ended: enter the secret again."))) return null;
  return fetch(url, options);
}

$("btn-logout").addEventListener("click", async () => {
  try {
    await logout();
    toast("Logged out");
  } catch (error) {
    // Still logged in on the camera: say so rather than pretend.
    toast(`Not logged out: ${error instanceof TypeError ? "the camera is not reachable" : error.message}`);
  }
});
