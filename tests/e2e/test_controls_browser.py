"""The settings panel in Debian's Chromium: it lists the source's controls, a slider changes the
camera, and a restart-requiring control (the resolution) keeps the page playing: the same
connection decodes the new size. The page is logged in as admin beforehand (the login itself:
test_login_browser.py)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser_netns import (
    Server,
    chromium,
    in_browser_netns,
    log_in,
    page_stats,
    running_server,
    save_screenshot,
    wait_for_element,
    wait_for_page,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def controls(server: Server) -> dict[str, Any]:
    request = urllib.request.Request(server.url + "api/camera/controls",
                                     headers={"Authorization": f"Bearer {server.admin_secret()}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        data: dict[str, Any] = json.load(response)["controls"]
        return data


def test_settings_panel_changes_the_camera_and_playback_survives_a_restart(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not in_browser_netns(request):
        return
    with running_server(tmp_path) as server, chromium() as browser:
        page = browser.new_page()
        log_in(page, server)
        page.goto(server.url)
        first = wait_for_page(page, "live", lambda s: s["state"] == "live"
                              and s["framesDecoded"] > 30)
        # controls.js adds the button when it runs, before "load"; if it never ran (its request
        # failed, or it threw), say so rather than time out on a click.
        wait_for_element(page, "#btn-settings")
        page.click("#btn-settings")
        page.wait_for_selector("[data-control=brightness] input[type=range]")
        assert not page.is_visible("#admin-dialog")  # logged in already: nothing to ask
        assert page.is_visible("[data-control=resolution] .ctl-restart")
        save_screenshot(page, "browser-settings-panel.png")

        page.eval_on_selector("[data-control=brightness] input", """(el) => {
            el.value = "0.4"; el.dispatchEvent(new Event("change")); }""")
        page.wait_for_function("window.ruseonControls.controls.brightness.value > 0.39")
        assert controls(server)["brightness"]["value"] == pytest.approx(0.4)

        page.select_option("[data-control=resolution] select", "640x480")
        page.wait_for_function("window.ruseonControls.controls.resolution.value === '640x480'")
        after = wait_for_page(page, "the new size decoded on the same connection",
                              lambda s: s["videoWidth"] == 640 and s["state"] == "live")
        more = after["framesDecoded"] + 30
        final = wait_for_page(page, "30 more frames", lambda s: s["framesDecoded"] > more)
        assert final["generation"] == first["generation"], "the page had to reconnect"
        assert page_stats(page)["videoHeight"] == 480
        assert controls(server)["resolution"]["value"] == "640x480"
