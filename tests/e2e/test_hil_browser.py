"""The HIL harness's browser check (``python -m hil run --webdriver URL``), which drives Safari
on a Mac through ``safaridriver`` when one is in the rig. No Mac here: the same classic
WebDriver protocol is spoken by Debian's ``WebKitWebDriver`` (MiniBrowser), so the check runs
against it and a real ``ruseon serve`` in the test's own network namespace. It must pass what
WebKitGTK shows (LL-HLS through hls.js, moving) when nothing in particular is expected, and
fail, saying why, when Safari's expectations (WebRTC, native HLS) are applied to it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hil.battery import CHECKS
from tests.e2e.browser_netns import REPO, in_browser_netns, running_server
from tests.e2e.webkit_driver import CAPABILITIES, require_webkit, webkit_webdriver

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def hil_browser_check(device: str, webdriver: str, report: Path, *expect: str) -> tuple[
        int, dict[str, Any]]:
    """``python -m hil run`` with only the browser check; its exit status and the check's
    result from the JSON report."""
    skip = [name for name in CHECKS if name != "browser"]
    command = [sys.executable, "-m", "hil", "run", "--device", device, "--quiet",
               "--webdriver", webdriver, "--webdriver-capabilities", json.dumps(CAPABILITIES),
               "--browser-watch", "4", "--report", str(report), "--skip", *skip,
               "--browser-expect", *expect]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240,
                          check=False)
    assert report.exists(), (done.stdout[-3000:], done.stderr[-3000:])
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    return done.returncode, checks["browser"]


def test_hil_browser_check_drives_a_webdriver_browser_and_judges_what_played(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    require_webkit()
    if not in_browser_netns(request):
        return
    with running_server(tmp_path / "state") as server, webkit_webdriver() as (driver, _):
        device = server.url.rstrip("/")
        status, result = hil_browser_check(device, driver, tmp_path / "any.json")
        assert status == 0 and result["verdict"] == "pass", result
        webrtc, hls = result["figures"]["watches"]
        # As a visitor opens it: no WebRTC in this browser, LL-HLS through hls.js, moving.
        assert webrtc["asked"] == "webrtc" and webrtc["played"] == "hls.js", webrtc
        assert webrtc["reason"] == "this browser has no WebRTC" and webrtc["picture_changed"]
        assert webrtc["frames"][1] > webrtc["frames"][0] and webrtc["state"] == "Live", webrtc
        assert webrtc["first_frame_s"] > 0 and "AppleWebKit" in webrtc["user_agent"], webrtc
        # HLS chosen by hand: hls.js again (no native HLS in Debian's WebKitGTK).
        assert hls["asked"] == "hls" and hls["played"] == "hls.js" and hls["picture_changed"]
        assert result["reason"].startswith("hls.js first frame "), result["reason"]
        assert result["figures"]["device_viewers_during_hls"]["hls"] >= 1, result["figures"]

        # What a Mac's Safari must show, asked of this browser: a failure that says why.
        status, result = hil_browser_check(device, driver, tmp_path / "safari.json",
                                           "webrtc", "native-hls")
        assert status == 1 and result["verdict"] == "fail", result
        # (A picture that stalled meanwhile would be named before these.)
        assert result["reason"].endswith(
            "WebRTC expected, the page played hls.js (this browser has no WebRTC); "
            "native HLS expected, the page played hls.js"), result["reason"]
