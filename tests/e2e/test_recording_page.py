"""The device page's recordings: Chromium plays a moment picked on the timeline in the same
<video>, goes back to live, the record button stops recording (asking for the admin secret in
the page's dialog, once), Delete removes a range dragged on the timeline, and the record button
starts recording again."""

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


def hover_track(page: Any) -> None:
    """Rest the pointer on the timeline's track, and see its window hold still there: the
    window's end stays put across a render (the list refreshes every 5 s)."""
    x, y = page.evaluate("() => { const b = document.getElementById('rec-track')"
                         ".getBoundingClientRect(); return [b.left + b.width / 2,"
                         " b.top + b.height / 2]; }")
    page.mouse.move(x, y)
    page.wait_for_function("() => window.ruseonRecordings.held")
    held, renders = page.evaluate("() => [window.ruseonRecordings.to,"
                                  " window.ruseonRecordings.renders]")
    page.wait_for_function("(n) => window.ruseonRecordings.renders > n", arg=renders,
                           timeout=15_000)
    assert page.evaluate("() => window.ruseonRecordings.to") == held


def playback(page: Any) -> dict[str, Any]:
    state: dict[str, Any] = page.evaluate(PLAYBACK_JS)
    return state


def click_to_play(page: Any, t: float, played_s: float) -> dict[str, Any]:
    """Click the timeline at ``t`` (ms since the epoch) and wait until the recording has played
    ``played_s`` (or failed); its playback state then."""
    x, y = page.evaluate(POINT_JS, t)
    page.mouse.click(x, y)
    page.wait_for_function(
        "(s) => { const r = window.ruseonRecordings; const v = document.getElementById('video');"
        " return r.error || (r.playing && v.currentTime > s); }", arg=played_s, timeout=60_000)
    return playback(page)


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
        hover_track(page)
        start = page.evaluate("() => window.ruseonRecordings.ranges.at(-1).start")
        wanted = start + 2500
        state = click_to_play(page, wanted, 1.5)
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
        # The label says a recording plays, not the WebRTC that rests meanwhile.
        assert page.text_content("#transport") == "Recording"
        save_screenshot(page, "browser-recording-playback.png")

        page.click("#btn-live")
        wait_for_page(page, "live again", lambda s: s["state"] == "live" and s["framesDecoded"] > 0)
        assert playback(page)["transport"] == "webrtc"
        page.wait_for_function("document.getElementById('transport').textContent === 'WebRTC'")
        assert not page.is_visible("#btn-live")

        # Record/Stop and Delete are admin's: the first of them asks for the secret, in the
        # page's dialog; the others rely on the login.
        page.click("#btn-record")  # continuous recording on: the button stops it
        page.wait_for_selector("#admin-dialog[open]")
        assert page.evaluate("() => window.ruseonRecordings.state") == "recording"
        page.fill("#admin-input", server.admin_secret())
        page.click("#admin-submit")
        page.wait_for_function("() => window.ruseonRecordings.state === 'stopped'",
                               timeout=30_000)

        # Drag across the first half of the last range (it plays), then Delete it.
        # The pointer rests on the track first: the window holds still under it, so the
        # times computed here are the ones the drag selects (it follows "now" otherwise, and
        # a list refresh between computing and dragging moved the selection by seconds).
        hover_track(page)
        before = page.evaluate("() => window.ruseonRecordings.ranges.at(-1)")
        middle = (before["start"] + before["end"]) / 2
        x0, y = page.evaluate(POINT_JS, before["start"] - 1000)
        x1, _ = page.evaluate(POINT_JS, middle)
        page.mouse.move(x0, y)
        page.mouse.down()
        page.mouse.move(x1, y, steps=8)
        page.mouse.up()
        page.wait_for_selector("#btn-delete", state="visible")
        asked: list[str] = []
        page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
        page.click("#btn-delete")
        page.wait_for_function(
            "(start) => { const r = window.ruseonRecordings.ranges;"
            " return r.length > 0 && r.at(-1).start > start + 1000; }", arg=before["start"])
        assert asked and asked[0].startswith("Delete the recording from "), asked
        after = page.evaluate("() => window.ruseonRecordings.ranges.at(-1)")
        # Cut at the first IDR at or after the selection's end (the GOP is 2 s; the selection's
        # end is the pixel nearest the middle); what came after it stays (the stop may still
        # have been writing the last seconds when `before` was read, so the end only grows; the
        # list's durations are rounded to the millisecond).
        assert middle - 1000 <= after["start"] <= middle + 3000, (before, after)
        assert after["end"] >= before["end"] - 5, (before, after)
        assert not page.is_visible("#admin-dialog")  # asked once only
        wait_for_page(page, "live after the delete", lambda s: s["state"] == "live")

        page.click("#btn-record")
        page.wait_for_function("() => window.ruseonRecordings.state === 'recording'",
                               timeout=30_000)
        assert not page.is_visible("#admin-dialog")
        status = server.status()["recording"]
        assert status["state"] == "recording" and status["bytes_on_disk"] > 0

        phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
        phone.goto(server.url)
        phone.wait_for_function("() => window.ruseonRecordings && "
                                "window.ruseonRecordings.ranges.length > 0", timeout=30_000)
        box = phone.locator("#rec-track").bounding_box()
        assert box is not None and 300 <= box["width"] <= 390
        save_screenshot(phone, "browser-recording-phone.png")


def test_a_range_still_being_recorded_plays_on_past_the_end_it_had_at_the_click(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not in_browser_netns(request):
        return
    args = ["--record-dir", str(tmp_path / "recordings")]
    with running_server(tmp_path / "state", extra_args=args) as server, chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(server.url)
        wait_for_page(page, "live", lambda s: s["state"] == "live" and s["framesDecoded"] > 0)
        page.wait_for_function(
            "() => { const r = window.ruseonRecordings && window.ruseonRecordings.ranges;"
            " return r && r.length > 0 && r[r.length - 1].end - r[r.length - 1].start > 5000;"
            " }", timeout=90_000)
        hover_track(page)
        # A click 1.5 s before the range's end (or the held window's, which the list's refreshes
        # go past): a clip of a few seconds, from the keyframe at or before it.
        near_end = page.evaluate("() => { const r = window.ruseonRecordings;"
                                 " return Math.min(r.ranges.at(-1).end, r.to) - 1500; }")
        first = click_to_play(page, near_end, 0.5)
        assert first["error"] is None and first["playing"], first
        # The end of the range as the page had it at the click: played to it, and on (the page
        # takes the next window of the range, grown since).
        end = page.evaluate("() => window.ruseonRecordings.playing.rangeEnd")
        assert end - near_end < 10_000, (end, near_end)
        page.wait_for_function(
            "(end) => { const r = window.ruseonRecordings;"
            " const v = document.getElementById('video'); return r.error || !r.playing"
            " || r.playing.clipStart + v.currentTime * 1000 > end + 3000; }",
            arg=end, timeout=60_000)
        later = playback(page)
        assert later["error"] is None and later["playing"], later
        assert later["state"] == "playback" and later["clipStart"] > first["clipStart"], later
        assert later["clipStart"] + later["time"] * 1000 > end + 3000, (end, later)
