"""The page's motion tools in Chromium, on a phone-sized screen: a file camera replays a libx264
clip with an object crossing for 3 s (every 20 s, the clip loops), ``[recording] mode =
"motion"`` records it. The event comes by the event stream (``/api/events/stream``): the
indicator shows on the picture while it lasts and the timeline's mark arrives from the stream;
the Motion panel lists it with its snapshot and a click plays it from the pre-roll; the tuner's
slider changes the sensitivity (read back over the API); a zone drawn on the picture is saved,
and read back (over the API and in the page) after a restart of the service."""

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
    page_diagnostics,
    running_server,
    save_screenshot,
    wait_for_element,
    wait_for_page,
)
from tests.e2e.test_recording_page import playback
from tests.motion.test_appliance import H, W, write_clip

pytestmark = pytest.mark.slow

PREROLL_S = 2.0
PHONE = {"width": 390, "height": 844}
# Where the zone's corners are clicked, as shares of the picture.
CORNERS = [(0.1, 0.1), (0.5, 0.1), (0.5, 0.6), (0.1, 0.6)]


def motion_settings(server: Server) -> dict[str, Any]:
    request = urllib.request.Request(server.url + "api/camera/porch/motion", headers={
        "Authorization": f"Bearer {server.admin_secret()}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        document: dict[str, Any] = json.load(response)
        return document


def wait(page: Any, condition: str, what: str, server: Server, timeout: int = 90_000) -> None:
    try:
        page.wait_for_function(condition, timeout=timeout)
    except Exception as exc:
        raise AssertionError(f"{what}: {exc}; {page_diagnostics(page)}; "
                             f"motion {page.evaluate('() => window.ruseonMotion')}; "
                             f"status {server.status().get('event_stream')}") from exc


def test_motion_tools_on_a_phone(request: pytest.FixtureRequest, tmp_path: Path) -> None:
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
    state = tmp_path / "state"
    with chromium() as browser:
        with running_server(state, extra_args=args) as server:
            page = browser.new_page(viewport=PHONE)
            log_in(page, server)
            page.goto(server.url)
            wait_for_page(page, "live", lambda s: s["state"] == "live" and s["framesDecoded"] > 0)
            wait_for_element(page, "#btn-motion")
            page.click("#btn-motion")
            wait(page, "() => window.ruseonMotion.stream === 'open' && "
                       "window.ruseonMotion.settings", "the stream open and the tuner loaded",
                 server, 30_000)
            assert page.is_visible("#mo-tuner") and not page.is_visible("#admin-dialog")

            # The event as it happens: the indicator on the picture, the mark from the stream.
            wait(page, "() => !document.getElementById('motion-indicator').hidden",
                 "the motion indicator", server)
            wait(page, "() => window.ruseonRecordings.fromStream > 0 && "
                       "window.ruseonMotionMarks().length > 0",
                 "a mark from the stream", server, 10_000)
            save_screenshot(page, "browser-motion-indicator-phone.png")
            # It ends; the panel's list shows it, with its snapshot loaded.
            wait(page, "() => document.getElementById('motion-indicator').hidden && "
                       "[...document.querySelectorAll('#mo-list .mo-event')].some((b) => "
                       "b.querySelector('img') && b.querySelector('img').naturalWidth > 0 && "
                       "!b.textContent.includes('now'))",
                 "the ended event in the list with its snapshot", server, 60_000)
            event = page.evaluate("() => window.ruseonMotion.events.find((e) => e.end !== null)")
            assert event["snapshot"] == f"/api/events/{event['id']}/snapshot.jpg"
            assert 2.4 <= event["end"] - event["start"] <= 3.6, event  # the 3 s crossing
            assert page.evaluate("() => window.ruseonMotion.streamEvents") >= 2

            # The slider: the sensitivity changes on the board, and the meter's threshold too.
            threshold = page.evaluate("() => window.ruseonMotion.meters.porch.threshold")
            page.eval_on_selector("#mo-sensitivity", """(el) => {
                el.value = "80"; el.dispatchEvent(new Event("input"));
                el.dispatchEvent(new Event("change")); }""")
            wait(page, "() => window.ruseonMotion.settings.sensitivity === 80",
                 "sensitivity 80", server, 10_000)
            assert motion_settings(server)["sensitivity"] == 80
            wait(page, f"() => window.ruseonMotion.meters.porch.threshold < {threshold}",
                 "a lower threshold on the meter", server, 10_000)
            assert "motion from" in page.inner_text("#mo-meter-label")
            save_screenshot(page, "browser-motion-panel-phone.png")

            # A click on the listed event plays it from the pre-roll (once the post-roll is
            # over and the recording closed).
            page.wait_for_function("() => window.ruseonRecordings.state === 'stopped'",
                                   timeout=30_000)
            page.click(f"#mo-list .mo-event[data-event='{event['id']}']")
            page.wait_for_function(
                "() => { const r = window.ruseonRecordings; const v = document.getElementById"
                "('video'); return r.error || (r.playing && v.currentTime > 0.5); }",
                timeout=60_000)
            played = playback(page)
            assert played["error"] is None and played["playing"], played
            start_ms = event["start"] * 1000
            assert played["clipStart"] <= start_ms - 1000, (played, event)
            assert played["clipStart"] >= start_ms - PREROLL_S * 1000 - 2500, (played, event)
            page.click("#btn-live")
            wait_for_page(page, "live again", lambda s: s["state"] == "live")

            # The zone editor: four corners clicked on the picture, an exclusion, saved.
            page.click("#btn-motion")
            page.click("#mo-zones")
            wait_for_element(page, "#mo-zone-svg")
            box = page.eval_on_selector("#mo-zone-svg", "(el) => { const b = "
                                        "el.getBoundingClientRect(); return [b.left, b.top, "
                                        "b.width, b.height]; }")
            video = page.eval_on_selector("#video", "(v) => [v.videoWidth, v.videoHeight]")
            # The editor lies on the picture itself (not the letterbox around it).
            assert abs(box[2] / box[3] - video[0] / video[1]) < 0.02, (box, video)
            page.click("#mo-mode")  # Include -> Exclude
            for x, y in CORNERS:
                page.mouse.click(box[0] + x * box[2], box[1] + y * box[3])
            page.click("#mo-finish")
            save_screenshot(page, "browser-motion-zone-phone.png")
            page.click("#mo-save")
            wait(page, "() => window.ruseonMotion.editor === null && "
                       "window.ruseonMotion.settings.zones.length === 1",
                 "the zone saved", server, 10_000)
            zones = motion_settings(server)["zones"]
            assert len(zones) == 1 and zones[0]["include"] is False, zones
            for (x, y), (zx, zy) in zip(CORNERS, zones[0]["points"], strict=True):
                assert abs(x - zx) < 0.02 and abs(y - zy) < 0.02, zones

        # A restart of the service: the zone and the sensitivity are the saved ones, and the
        # page shows them (on a desktop-sized screen this time).
        with running_server(state, extra_args=args) as server:
            after = motion_settings(server)
            assert after["zones"] == zones and after["sensitivity"] == 80, after
            assert after["saved"] == ["sensitivity", "zones"]
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            log_in(page, server)
            page.goto(server.url)
            wait_for_element(page, "#btn-motion")
            page.click("#btn-motion")
            wait(page, "() => window.ruseonMotion.settings && "
                       "window.ruseonMotion.settings.zones.length === 1 && "
                       "document.querySelectorAll('#mo-list .mo-event').length > 0",
                 "the saved zone and the kept event after the restart", server, 30_000)
            assert page.inner_text("#mo-zones-info") == "1 zone"
            page.click("#mo-zones")
            page.wait_for_selector("#mo-zone-svg polygon.mo-exclude")
            save_screenshot(page, "browser-motion-zone-desktop.png")
