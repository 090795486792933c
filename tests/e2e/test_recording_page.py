"""The device page's recordings: Chromium plays a moment picked on the timeline in the same
<video>, goes back to live, and the record button stops and restarts recording."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser_netns import (
    chromium,
    in_browser_netns,
    page_diagnostics,
    running_server,
    save_screenshot,
    wait_for_page,
)

PLAYBACK_JS = """() => {
  const v = document.getElementById('video'); const r = window.ruseonRecordings;
  return {playing: !!r.playing, error: r.error || (v.error ? String(v.error.code) : null),
          time: v.currentTime, width: v.videoWidth, state: window.ruseon.state,
          transport: window.ruseon.transport, clipStart: r.playing ? r.playing.clipStart : null,
          frames: v.getVideoPlaybackQuality().totalVideoFrames}; }"""

# Where on the timeline a time is (client x, y), computed by the page's own scale.
POINT_JS = """(t) => { const r = window.ruseonRecordings;
  const box = document.getElementById('rec-track').getBoundingClientRect();
  return [box.left + box.width * (t - r.from) / (r.to - r.from), box.top + box.height / 2]; }"""


def playback(page: Any) -> dict[str, Any]:
    state: dict[str, Any] = page.evaluate(PLAYBACK_JS)
    return state


def test_timeline_plays_a_recording_in_the_page_then_live_again(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not in_browser_netns(request):
        return
    record_dir = tmp_path / "recordings"
    # A clock the system never calls synchronized (its flag file is not there): the ranges
    # are "time uncertain", and the timeline marks them.
    config = tmp_path / "ruseon.toml"
    config.write_text(f'[recording]\nclock_sync_file = "{tmp_path / "no-sync-flag"}"\n')
    args = ["--record-dir", str(record_dir), "--config", str(config)]
    with running_server(tmp_path / "state", extra_args=args) as server, chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(server.url)
        wait_for_page(page, "live", lambda s: s["state"] == "live" and s["framesDecoded"] > 0)
        try:
            page.wait_for_function(
                # recordings.js may still be loading when the picture is already live.
                "() => { const r = window.ruseonRecordings && window.ruseonRecordings.ranges;"
                " return r && r.length > 0 && r[r.length - 1].end - r[r.length - 1].start > 5000;"
                " }", timeout=90_000)
        except Exception as exc:
            raise AssertionError(f"no 5 s recording range on the timeline: {exc}; "
                                 f"{page_diagnostics(page)}; status {server.status()}") from exc
        assert page.evaluate("() => window.ruseonRecordings.state") == "recording"
        marked = page.evaluate("() => [...document.querySelectorAll('#rec-ranges > div')]"
                               ".map((d) => [d.className, d.title])")
        assert marked and all(cls == "uncertain" and "time uncertain" in title
                              for cls, title in marked), marked
        start = page.evaluate("() => window.ruseonRecordings.ranges.at(-1).start")
        wanted = start + 2500
        x, y = page.evaluate(POINT_JS, wanted)
        page.mouse.click(x, y)
        page.wait_for_function(
            "() => { const r = window.ruseonRecordings; const v = document.getElementById('video');"
            " return r.error || (r.playing && v.currentTime > 1.5); }", timeout=60_000)
        state = playback(page)
        assert state["error"] is None, state
        assert state["playing"] and state["state"] == "playback"
        assert state["transport"] == "playback"
        assert state["width"] > 0 and state["frames"] > 10
        # The clip starts at the IDR at or before the moment clicked (the source's GOP is 2 s);
        # the pixel grid makes the clicked moment approximate to a few hundred ms.
        assert wanted - 3000 <= state["clipStart"] <= wanted + 500, state
        assert page.is_visible("#btn-live") and page.is_visible("#btn-download")
        page.wait_for_function(
            "document.getElementById('stat-codec').textContent === 'H264 \u00b7 recording'")
        save_screenshot(page, "browser-recording-playback.png")

        page.click("#btn-live")
        wait_for_page(page, "live again", lambda s: s["state"] == "live" and s["framesDecoded"] > 0)
        assert playback(page)["transport"] == "webrtc"
        assert not page.is_visible("#btn-live")

        page.click("#btn-record")  # continuous recording on: the button stops it
        page.wait_for_function("() => window.ruseonRecordings.state === 'stopped'",
                               timeout=30_000)
        page.click("#btn-record")
        page.wait_for_function("() => window.ruseonRecordings.state === 'recording'",
                               timeout=30_000)
        status = server.status()["recording"]
        assert status["state"] == "recording" and status["bytes_on_disk"] > 0

        phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
        phone.goto(server.url)
        phone.wait_for_function("() => window.ruseonRecordings && "
                                "window.ruseonRecordings.ranges.length > 0", timeout=30_000)
        box = phone.locator("#rec-track").bounding_box()
        assert box is not None and 300 <= box["width"] <= 390
        save_screenshot(phone, "browser-recording-phone.png")
