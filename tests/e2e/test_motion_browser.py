"""Motion on the device page (Chromium): a file camera replays a libx264 clip with an object
crossing for 3 s, ``[recording] mode = "motion"`` records it with its pre-roll; the event's
mark appears on the timeline, and a click on the mark plays the recording from the pre-roll
before the event."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.browser_netns import (
    chromium,
    in_browser_netns,
    page_diagnostics,
    running_server,
    save_screenshot,
    wait_for_page,
)
from tests.e2e.test_recording_page import click_to_play, hover_track
from tests.motion.test_appliance import H, W, write_clip

pytestmark = pytest.mark.slow

PREROLL_S = 2.0


def test_a_motion_mark_on_the_timeline_plays_from_the_preroll(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not in_browser_netns(request):
        return
    clip = tmp_path / "crossing.h264"
    write_clip(clip)
    config = tmp_path / "ruseon.toml"
    config.write_text(
        f'[[camera]]\nname = "porch"\nsource = "file:{clip}"\nwidth = {W}\nheight = {H}\n'
        'keyframe_interval = 30\nmotion_off_delay_s = 1.0\n\n'
        f'[recording]\nmode = "motion"\npreroll_s = {PREROLL_S}\npostroll_s = 2.0\n')
    args = ["--config", str(config), "--camera", f"porch=file:{clip}"]
    with running_server(tmp_path / "state", extra_args=args) as server, chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(server.url)
        wait_for_page(page, "live", lambda s: s["state"] == "live" and s["framesDecoded"] > 0)
        try:
            page.wait_for_function(
                "() => window.ruseonMotionMarks && window.ruseonMotionMarks().some("
                "(e) => !e.lasting) && document.querySelectorAll('#rec-events > div').length"
                " && window.ruseonRecordings.ranges.length", timeout=90_000)
        except Exception as exc:
            raise AssertionError(f"no motion mark on the timeline: {exc}; "
                                 f"{page_diagnostics(page)}; status {server.status()}") from exc
        mark = page.evaluate("() => window.ruseonMotionMarks().find((e) => !e.lasting)")
        assert 2400 <= mark["end"] - mark["start"] <= 3600, mark  # the 3 s crossing
        title = page.evaluate("() => document.querySelector('#rec-events > div').title")
        assert title.startswith("motion "), title
        page.wait_for_function("() => window.ruseonRecordings.state === 'stopped'",
                               timeout=30_000)  # the post-roll is over
        hover_track(page)
        state = click_to_play(page, mark["start"] + 500, 0.5)
        assert state["error"] is None and state["playing"], state
        # From the pre-roll: the clip starts before the event (an IDR at or before
        # start - preroll; the recording holds nothing earlier), not at the clicked moment.
        assert state["clipStart"] <= mark["start"] - 1000, (state, mark)
        assert state["clipStart"] >= mark["start"] - PREROLL_S * 1000 - 2500, (state, mark)
        save_screenshot(page, "browser-motion-mark.png")
