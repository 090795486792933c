"""The device page in Debian's Chromium with a camera that cannot run (issue 24): the service is
up, and the picture area says why the camera is down (here ``camera.source = picamera`` on a
machine without picamera2) instead of waiting silently or showing a test picture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser_netns import (
    chromium,
    in_browser_netns,
    poll_page,
    running_server,
    save_screenshot,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

VEIL_JS = """() => ({text: document.getElementById('veil-text').textContent,
  camera: document.getElementById('stage').dataset.camera || '',
  state: document.getElementById('stage').dataset.state || ''})"""


def test_the_page_says_why_the_camera_is_down(request: pytest.FixtureRequest,
                                              tmp_path: Path) -> None:
    if not in_browser_netns(request):
        return
    import importlib.util

    if importlib.util.find_spec("picamera2") is not None:
        pytest.skip("this machine has picamera2: the source would run")
    with running_server(tmp_path, extra_args=["--camera", "cam=picamera"]) as server, \
            chromium() as browser:
        page = browser.new_page()
        page.goto(server.url)

        def read(page: Any) -> dict[str, Any]:
            result: dict[str, Any] = page.evaluate(VEIL_JS)
            return result

        shown = poll_page(page, read, "the camera's problem on the picture", lambda v: (
            v["camera"] == "down" and "The camera is down" in v["text"]
            and "python3-picamera2" in v["text"]))
        assert shown["state"] != "live"
        # The offer's 503 carries the same reason (the page shows it while it retries).
        offered = poll_page(page, read, "the offer's refusal with the reason", lambda v: (
            v["state"] == "busy" and "python3-picamera2" in v["text"]))
        assert "Retrying" in offered["text"]
        save_screenshot(page, "browser-camera-down.png")
