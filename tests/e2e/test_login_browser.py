"""The device page's login in Debian's Chromium, against ``ruseon serve`` as a freshly flashed
board runs it (no token configured: the admin secret is the one generated in the state dir).
Viewing needs nothing; Settings asks for the admin secret, says so when it is wrong, and a
control change works once it is right; after Log out the page is nobody again, and the server
refuses what the cookie allowed before. Then wrong secrets in a row reach the throttle, and the
dialog shows the wait."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser_netns import (
    chromium,
    in_browser_netns,
    running_server,
    save_screenshot,
    wait_for_element,
    wait_for_page,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# A PATCH from the page's own context, with whatever credential the browser holds (its cookie).
PATCH_JS = """(value) => fetch('/api/camera/controls', {method: 'PATCH',
  headers: {'Content-Type': 'application/json'}, body: JSON.stringify({brightness: value})})
  .then((r) => r.status)"""
SESSION_JS = "() => fetch('/api/session').then((r) => r.json())"


def controls(url: str, secret: str) -> dict[str, Any]:
    request = urllib.request.Request(url + "api/camera/controls",
                                     headers={"Authorization": f"Bearer {secret}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        data: dict[str, Any] = json.load(response)["controls"]
        return data


def dialog_error(page: Any) -> str:
    """The refusal the admin dialog shows, once it shows one."""
    page.wait_for_selector("#admin-error", state="visible")
    text: str = page.text_content("#admin-error")
    return text


def test_viewing_is_open_and_settings_ask_for_the_admin_secret_once(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not in_browser_netns(request):
        return
    with running_server(tmp_path) as server, chromium() as browser:
        secret = server.admin_secret()  # no --token: the file the first start generated
        assert len(secret) >= 22  # >= 128 bits however it is spelled
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(server.url)
        # No credential of any kind: the picture plays, and the page says who may watch.
        wait_for_page(page, "live without a credential",
                      lambda s: s["state"] == "live" and s["framesDecoded"] > 30)
        wait_for_element(page, "#access-note")
        assert page.text_content("#access-note") == "Anyone on this network can watch."
        session = page.evaluate(SESSION_JS)
        assert (session["role"], session["viewing"], session["https"]) == ("none", "open", False)
        assert not page.is_visible("#btn-logout")
        assert page.evaluate(PATCH_JS, 0.2) == 401  # the server's own refusal, for comparison
        before = controls(server.url, secret)["brightness"]["value"]

        wait_for_element(page, "#btn-settings")
        page.click("#btn-settings")
        page.wait_for_selector("#admin-dialog[open]")
        assert "sudo ruseon admin-secret" in page.text_content("#admin-dialog")
        assert not page.is_visible("#ctl-panel")
        page.fill("#admin-input", secret[::-1])
        page.click("#admin-submit")
        assert dialog_error(page) == "That secret is not valid."
        assert page.is_visible("#admin-dialog") and not page.is_visible("#ctl-panel")
        save_screenshot(page, "browser-admin-wrong-secret.png")

        page.fill("#admin-input", secret)
        page.click("#admin-submit")
        page.wait_for_selector("[data-control=brightness] input[type=range]")
        assert not page.is_visible("#admin-dialog")
        # The cookie holds the login, out of the page's reach (HttpOnly), for this site only.
        cookie, = (c for c in page.context.cookies() if c["name"] == "ruseon_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie
        assert "ruseon_session" not in page.evaluate("document.cookie")
        assert secret not in json.dumps(page.evaluate("({...sessionStorage, ...localStorage})"))
        assert page.evaluate(SESSION_JS)["role"] == "admin"
        assert page.is_visible("#btn-logout")

        value = 0.4 if before != pytest.approx(0.4) else 0.6
        page.eval_on_selector("[data-control=brightness] input", """(el, v) => {
            el.value = String(v); el.dispatchEvent(new Event("change")); }""", value)
        page.wait_for_function("(v) => Math.abs(window.ruseonControls.controls.brightness.value"
                               " - v) < 0.01", arg=value)
        assert controls(server.url, secret)["brightness"]["value"] == pytest.approx(value)
        # Asked once: closing and opening the panel again needs no secret.
        page.click("#btn-settings")
        page.click("#btn-settings")
        page.wait_for_selector("[data-control=brightness] input[type=range]")
        assert not page.is_visible("#admin-dialog")
        save_screenshot(page, "browser-admin-settings.png")

        page.click("#btn-logout")
        page.wait_for_selector("#btn-logout", state="hidden")
        assert not page.is_visible("#ctl-panel")
        assert page.evaluate("() => window.ruseonSession.role") == "none"
        assert page.evaluate(SESSION_JS)["role"] == "none"
        assert page.evaluate(PATCH_JS, 0.1) == 401
        # The server forgot the session too: the old cookie, put back, counts for nothing.
        page.context.add_cookies([{key: cookie[key] for key in (
            "name", "value", "domain", "path", "httpOnly", "sameSite")}])
        assert page.evaluate(SESSION_JS)["role"] == "none"
        assert page.evaluate(PATCH_JS, 0.1) == 401
        assert controls(server.url, secret)["brightness"]["value"] == pytest.approx(value)
        wait_for_page(page, "still live after Log out", lambda s: s["state"] == "live")

        # Wrong secrets in a row: the server throttles this address, and the dialog says how long.
        page.click("#btn-settings")
        page.wait_for_selector("#admin-dialog[open]")
        statuses = []
        for attempt in range(30):
            page.fill("#admin-input", f"not-the-secret-{attempt}")
            with page.expect_response(lambda r: r.url.endswith("/api/session")
                                      and r.request.method == "POST") as answer:
                page.click("#admin-submit")  # waits until Unlock is enabled again
            statuses.append(answer.value.status)
            if statuses[-1] != 401:
                break
        assert statuses[-1] == 429 and set(statuses[:-1]) == {401}, statuses
        wait = answer.value.headers["retry-after"]
        page.wait_for_function("document.getElementById('admin-error').textContent"
                               ".startsWith('Too many')")
        assert dialog_error(page) == ("Too many wrong secrets from this address: "
                                      f"try again in {wait} s.")
        assert page.is_disabled("#admin-submit")  # until the wait is over
        save_screenshot(page, "browser-admin-throttled.png")
