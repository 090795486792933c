"""The cameras grid in Debian's Chromium: every camera plays at once in its tile (its sub-stream
where it has one, the size received on the tile), a camera that delivers nothing shows as down
on its tile, a click watches one large (the main stream), and /#<camera> deep links straight to
it."""

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
    running_server,
    save_screenshot,
    wait_for_element,
    wait_for_page,
)
from tests.tooling import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TILES_JS = """() => Array.from(document.querySelectorAll('.cam-tile')).map((t) => {
  const v = t.querySelector('video');
  const q = v && v.getVideoPlaybackQuality ? v.getVideoPlaybackQuality() : null;
  return {camera: t.dataset.camera, up: t.dataset.up, problem: t.querySelector('.cam-problem')
          .textContent, width: v ? v.videoWidth : 0, height: v ? v.videoHeight : 0,
          frames: q ? q.totalVideoFrames : 0, stream: t.dataset.stream,
          size: t.querySelector('.cam-size').textContent};
})"""


def cameras(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "api/cameras", timeout=10) as response:
        return {row["name"]: row for row in json.load(response)["cameras"]}


def get(server: Server, path: str) -> dict[str, Any]:
    """``path`` as JSON, asked as admin (the controls are admin's)."""
    request = urllib.request.Request(server.url + path,
                                     headers={"Authorization": f"Bearer {server.admin_secret()}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        document: dict[str, Any] = json.load(response)
        return document


def wait_for_tiles(page: Any, condition: str, predicate: Any) -> list[dict[str, Any]]:
    for _ in range(240):  # a bound for a broken run; nothing here measures time
        tiles: list[dict[str, Any]] = page.evaluate(TILES_JS)
        if predicate({t["camera"]: t for t in tiles}):
            return tiles
        page.wait_for_timeout(250)
    raise AssertionError(f"the grid never showed {condition}: {tiles}")


def test_grid_plays_every_camera_and_a_click_watches_one(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not in_browser_netns(request):
        return
    # "gate" is a network camera nobody answers for: down from the start, retried.
    args = ["--camera", "front=synthetic", "--camera", "side=synthetic",
            "--camera", f"gate=rtsp://127.0.0.1:{free_port()}/stream"]
    # 960x540: large enough for the default sub-stream (640x360), which the tiles play.
    size = {"RUSEON_CAMERA_WIDTH": "960", "RUSEON_CAMERA_HEIGHT": "540"}
    with running_server(tmp_path, extra_args=args, env=size) as server, chromium() as browser:
        page = browser.new_page()
        log_in(page, server)  # for Settings and Record below (the login: test_login_browser.py)
        page.goto(server.url)
        page.wait_for_function("window.ruseonCameras && window.ruseonCameras.open")
        first = wait_for_tiles(page, "both live cameras playing and gate down", lambda t: (
            t["front"]["frames"] > 30 and t["side"]["frames"] > 30 and t["gate"]["up"] == "false"))
        # At once: both tiles keep decoding while the other does.
        later = wait_for_tiles(page, "both tiles still advancing", lambda t: all(
            t[name]["frames"] > f["frames"] + 30 for f in first if (name := f["camera"]) != "gate"))
        # The synthetic cameras (960x540) have their default sub-stream (640x360): the tiles
        # play it and say so; the network camera without substream_url has only its main one.
        by_name = {t["camera"]: t for t in later}
        for name in ("front", "side"):
            tile = by_name[name]
            assert (tile["stream"], tile["width"], tile["height"]) == ("sub", 640, 360), tile
            assert tile["size"] == "640\u00d7360 \u00b7 sub", tile
        assert by_name["gate"]["stream"] == "main"
        assert "no frame from the rtsp source" in {t["camera"]: t for t in later}["gate"]["problem"]
        rows = cameras(server.url)
        assert rows["front"]["viewers"] == rows["side"]["viewers"] == 1
        # The label names what the tiles are (three cameras: each a live WebRTC viewer).
        assert page.evaluate("() => { const e = document.getElementById('transport');"
                             " return [e.textContent, e.dataset.reason]; }") == ["WebRTC", ""]
        save_screenshot(page, "browser-cameras-grid.png")
        # A link to a camera there is not keeps the grid, and its tiles their one session each
        # (a second openGrid started a new session per tile and never closed the first).
        page.evaluate("location.hash = '#nope'")
        page.wait_for_timeout(3000)  # room for any extra session to connect on loopback
        rows = cameras(server.url)
        assert rows["front"]["viewers"] == rows["side"]["viewers"] == 1, rows
        assert page.evaluate("window.ruseonCameras.open") is True

        page.click(".cam-tile[data-camera=side]")
        page.wait_for_function("location.hash === '#side' && window.ruseonCameras.open === false")
        big = wait_for_page(page, "side playing large", lambda s: s["state"] == "live"
                            and s["framesDecoded"] > 30)
        assert big["videoWidth"] == 960  # the main stream, not the tile's
        assert page.evaluate("window.ruseon.endpoint") == "/whep/side"
        save_screenshot(page, "browser-cameras-one.png")
        # Leaving the grid closed its tiles: no viewer place held for front any more.
        for _ in range(120):  # a bound for a broken run; nothing here measures time
            rows = cameras(server.url)
            if rows["front"]["viewers"] == 0 and rows["side"]["viewers"] == 1:
                break
            page.wait_for_timeout(250)
        assert (rows["front"]["viewers"], rows["side"]["viewers"]) == (0, 1), rows

        # The settings panel and the Record button act on the camera on screen.
        wait_for_element(page, "#btn-settings")
        page.click("#btn-settings")
        page.wait_for_selector("[data-control=brightness] input[type=range]")
        page.eval_on_selector("[data-control=brightness] input", """(el) => {
            el.value = "0.4"; el.dispatchEvent(new Event("change")); }""")
        page.wait_for_function("window.ruseonControls.controls.brightness.value > 0.39")
        assert get(server, "api/camera/side/controls")["controls"]["brightness"]["value"] \
            == pytest.approx(0.4)
        assert get(server, "api/camera/controls")["controls"]["brightness"]["value"] == 0
        page.click("#btn-record")
        page.wait_for_function("window.ruseonRecordings.state !== 'stopped'")
        assert get(server, "api/recording?path=side")["state"] != "stopped"
        assert get(server, "api/recording")["state"] == "stopped"  # the first camera's
        page.click("#btn-record")
        page.wait_for_function("window.ruseonRecordings.state === 'stopped'")

        deep = browser.new_page()
        deep.goto(server.url + "#front")
        wait_for_page(deep, "a deep link playing front", lambda s: s["state"] == "live"
                      and s["framesDecoded"] > 30)
        assert deep.evaluate("window.ruseon.endpoint") == "/whep/front"
        assert deep.evaluate("document.getElementById('camera-grid').hidden") is True
