"""Recordings and Settings on the device page in Firefox ESR and WebKitGTK, which play the live
picture over LL-HLS (test_firefox.py, test_webkit.py), against a real ``ruseon serve`` in the
test's own network namespace, driven by real mouse and keyboard input (WebDriver actions):

- a click on the timeline plays that moment of the recording in the page's <video> (Media
  Source Extensions), the picture moves; Download saves an MP4 of it that ffprobe reads;
  "Live" goes back to a moving LL-HLS picture, not to an offer the browser cannot make;
- Stop asks for the admin secret in the page's dialog (a wrong one is refused there), a drag
  over the timeline and Delete (its confirm accepted) removes that range, Record asks nothing;
- Settings asks for the admin secret, then a slider changes the camera, and a size change
  (which restarts the source) keeps the HLS picture playing at the new size.

Chromium's side of the same: test_recording_page.py, test_controls_browser.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser_netns import (
    Server,
    in_browser_netns,
    poll_page,
    running_server,
    save_screenshot,
)
from tests.e2e.engine_page import (
    DOWN,
    UP,
    assert_moving_hls,
    centre,
    click,
    move,
    offers_refused,
    page_state,
    pointer,
    type_text,
    visible,
)
from tests.e2e.firefox_bidi import firefox, require_firefox
from tests.e2e.webkit_driver import require_webkit, webkit
from tests.tooling import IN_CI

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Each engine: what checks it is installed, what starts it, why the page plays HLS there.
ENGINES: dict[str, tuple[Callable[[], None], Callable[[], AbstractContextManager[Any]], str]] = {
    "firefox": (require_firefox, firefox, "this browser has no H.264 for WebRTC"),
    "webkit": (require_webkit, webkit, "this browser has no WebRTC"),
}

RECORDINGS_JS = """() => {
  const r = window.ruseonRecordings; const v = document.getElementById('video');
  const q = v.getVideoPlaybackQuality ? v.getVideoPlaybackQuality() : null;
  return {ranges: r ? r.ranges : [], state: r ? r.state : null, held: r ? r.held : false,
          renders: r ? r.renders : 0, from: r ? r.from : 0, to: r ? r.to : 0,
          playing: !!(r && r.playing), clipStart: r && r.playing ? r.playing.clipStart : null,
          error: r ? r.error || (v.error ? String(v.error.code) : null) : null,
          time: v.currentTime, width: v.videoWidth, frames: q ? q.totalVideoFrames : 0,
          transport: window.ruseon.transport, state_: window.ruseon.state,
          stateText: document.getElementById('state-text').textContent,
          codec: document.getElementById('stat-codec').textContent}; }"""

# A click this far into the newest range plays from the keyframe at or before it (the GOP is
# 2 s), to the end of that range as the page's list had it at the click: an open range grows
# only by what the recorder made durable (every 5 s), so it may end a few seconds after the
# click however long ago recording began. What the test then watches of that clip is about 8 s
# of media: 1.5 s to start, 1.5 s moving, a hole 1 s ahead and 1.5 s long (cut up to the next
# keyframe, up to 2 s on), 0.5 s past it, and the keyframe after it; and the clip plays on
# meanwhile while the test reads the page (pixel signatures, a screenshot), slower on a
# loaded machine. So the range must hold 12 s after the click before the test clicks.
CLICK_INTO_RANGE_MS = 2500
RECORDED_AFTER_CLICK_MS = 12000
GOP_S = 2.0

# Where on the timeline a time is (viewport x, y), by the page's own scale.
POINT_JS = """() => { const r = window.ruseonRecordings;
  const box = document.getElementById('rec-track').getBoundingClientRect();
  return [box.left, box.width, box.top + box.height / 2, r.from, r.to]; }"""


def recordings(page: Any) -> dict[str, Any]:
    state: dict[str, Any] = page.evaluate(RECORDINGS_JS)
    return state


def point(page: Any, t: float) -> tuple[float, float]:
    left, width, y, start, end = page.evaluate(POINT_JS)
    return left + width * (t - start) / (end - start), y


def hover_track(page: Any) -> None:
    """Rest the mouse on the timeline: its window then holds still across a render (the list
    refreshes every 5 s), so the times computed here are the ones a click selects."""
    x, y = centre(page, "#rec-track")
    pointer(page, move(x, y))
    held = poll_page(page, recordings, "the timeline held under the pointer", lambda r: r["held"])
    poll_page(page, recordings, "a render while held",
              lambda r: r["renders"] > held["renders"], timeout_s=15)
    assert recordings(page)["to"] == held["to"]


def admin_dialog_open(page: Any) -> bool:
    return bool(page.evaluate("() => document.getElementById('admin-dialog').open"))


def log_in_in_dialog(page: Any, server: Server) -> None:
    """The admin dialog is open: a wrong secret is refused in it, then the right one."""
    assert admin_dialog_open(page)
    click(page, "#admin-input")
    type_text(page, server.admin_secret()[::-1])
    click(page, "#admin-submit")
    refused = poll_page(page, lambda p: p.evaluate(
        "() => { const e = document.getElementById('admin-error');"
        " return {hidden: e.hidden, text: e.textContent}; }"), "the refusal in the dialog",
        lambda e: not e["hidden"])
    assert refused["text"] == "That secret is not valid.", refused
    assert admin_dialog_open(page)
    page.evaluate("() => { document.getElementById('admin-input').value = ''; }")
    click(page, "#admin-input")
    type_text(page, server.admin_secret())
    click(page, "#admin-submit")
    poll_page(page, lambda p: {"open": admin_dialog_open(p)}, "the dialog closed",
              lambda d: not d["open"])


def downloaded(folder: Path, timeout_s: float = 60) -> Path:
    """The one finished .mp4 in ``folder`` (the browsers write a partial file first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        names = sorted(folder.iterdir())
        done = [p for p in names if p.suffix == ".mp4"]
        partial = [p for p in names if p.suffix in (".part", ".download") or p.name.startswith(".")]
        if done and not partial and done[0].stat().st_size > 0:
            assert len(done) == 1, names
            return done[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no finished download in {folder}: {names}")
        time.sleep(0.25)


def probe(path: Path) -> dict[str, Any]:
    """ffprobe's view of ``path``: the video stream and the duration."""
    ffprobe = shutil.which("ffprobe")
    if ffprobe is None:
        if IN_CI:
            pytest.fail("ffprobe is not installed (scripts/install-system-deps: ffmpeg)")
        pytest.skip("ffprobe is not installed")
    out = subprocess.run([ffprobe, "-v", "error", "-count_frames", "-show_entries",
                          "stream=codec_name,width,height,nb_read_frames:format=duration",
                          "-of", "json", str(path)], capture_output=True, text=True, check=True,
                         timeout=60)
    data: dict[str, Any] = json.loads(out.stdout)
    return data


@pytest.fixture(params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    ENGINES[name][0]()
    return name


def test_recordings_play_download_and_delete_from_the_timeline(
        request: pytest.FixtureRequest, tmp_path: Path, engine: str) -> None:
    if not in_browser_netns(request):
        return
    reason = ENGINES[engine][2]
    args = ["--record-dir", str(tmp_path / "recordings")]
    with running_server(tmp_path / "state", extra_args=args) as server, \
            ENGINES[engine][1]() as page:
        page.goto(server.url)
        assert_moving_hls(page, reason)
        poll_page(page, recordings, "a recording range on the timeline",
                  lambda r: r["ranges"], timeout_s=90)
        assert recordings(page)["state"] == "recording"

        # A click 2.5 s into the range plays it here, from the keyframe at or before it, once
        # the page's own list (what the click plays to the end of) holds enough after it.
        hover_track(page)
        poll_page(page, recordings, "a recording range long enough to play",
                  lambda r: r["ranges"][-1]["end"] - r["ranges"][-1]["start"]
                  > CLICK_INTO_RANGE_MS + RECORDED_AFTER_CLICK_MS, timeout_s=90)
        wanted = recordings(page)["ranges"][-1]["start"] + CLICK_INTO_RANGE_MS
        x, y = point(page, wanted)
        pointer(page, move(x, y), DOWN, UP)
        first = poll_page(page, recordings, "the recording playing",
                          lambda r: r["error"] or (r["playing"] and r["time"] > 1.5
                                                   and r["frames"] > 10))
        assert first["error"] is None, first
        assert first["transport"] == "playback" and first["state_"] == "playback", first
        assert first["stateText"] == "Recording" and first["width"] > 0, first
        assert wanted - 3000 <= first["clipStart"] <= wanted + 500, first
        before = page_state(page)
        page.wait_for_timeout(1500)
        later, moved = recordings(page), page_state(page)
        assert later["time"] > first["time"] + 0.5 and later["frames"] > first["frames"], later
        assert moved["signature"] != before["signature"], "the recording's picture did not move"
        assert later["codec"] == "H264 \u00b7 recording", later
        # The label says a recording plays (not the LL-HLS that rests meanwhile).
        assert (moved["label"], moved["labelReason"]) == ("Recording", ""), moved
        assert visible(page, "#btn-live") and visible(page, "#btn-download")
        save_screenshot(page, f"browser-{engine}-recording-playback.png")

        # A hole in what is buffered (removed from the SourceBuffer, as WebKitGTK's MSE leaves
        # some by itself) 1 s ahead: playback stalls at its edge, then jumps it and goes on.
        # (Only where a keyframe follows it in the clip: else there is nothing to jump to.)
        hole = page.evaluate(f"""() => {{ const v = document.getElementById('video');
          const sb = window.ruseonRecordings.sourceBuffer; const from = v.currentTime + 1;
          const end = v.buffered.length ? v.buffered.end(v.buffered.length - 1) : 0;
          const hole = [from, from + 1.5, window.ruseonRecordings.holesSkipped, end];
          if (end < from + 1.5 + {GOP_S} + 0.5) return hole;
          return new Promise((done) => {{
            sb.addEventListener('updateend', () => done(hole), {{once: true}});
            sb.remove(from, from + 1.5); }}); }}""")
        assert hole[3] >= hole[1] + GOP_S + 0.5, f"the clip ends too soon for a hole: {hole}"
        jumped = poll_page(page, recordings, "playback past the hole",
                           lambda r: r["error"] or r["time"] > hole[1] + 0.5)
        assert jumped["error"] is None and page.evaluate(
            "() => window.ruseonRecordings.holesSkipped") > hole[2], (hole, jumped)

        # Download: an MP4 of the window playing, saved by the browser itself.
        click(page, "#btn-download")
        clip = downloaded(page.downloads)
        assert clip.name.startswith("ruseon-"), clip
        info = probe(clip)
        stream = info["streams"][0]
        assert stream["codec_name"] == "h264" and stream["width"] > 0, info
        assert int(stream["nb_read_frames"]) > 30 and float(info["format"]["duration"]) > 1, info

        # Back to live: LL-HLS again (this browser cannot make an offer), moving.
        click(page, "#btn-live")
        live = assert_moving_hls(page, reason)
        assert live["transport"] == "hls" and not visible(page, "#btn-live"), live

        # Stop is admin's: the page's dialog asks (a wrong secret is refused there).
        click(page, "#btn-record")
        poll_page(page, lambda p: {"open": admin_dialog_open(p)}, "the admin dialog",
                  lambda d: d["open"])
        assert recordings(page)["state"] == "recording"
        log_in_in_dialog(page, server)
        poll_page(page, recordings, "recording stopped", lambda r: r["state"] == "stopped",
                  timeout_s=30)

        # A drag over the first half of the last range, then Delete (its confirm accepted).
        hover_track(page)
        last = recordings(page)["ranges"][-1]
        middle = (last["start"] + last["end"]) / 2
        x0, y = point(page, last["start"] - 1000)
        x1, _ = point(page, middle)
        pointer(page, move(x0, y), DOWN, *(move(x0 + (x1 - x0) * i / 8, y) for i in range(1, 9)),
                UP)
        poll_page(page, lambda p: {"shown": visible(p, "#btn-delete")}, "the Delete button",
                  lambda d: d["shown"])
        click(page, "#btn-delete")
        after = poll_page(page, recordings, f"the first half deleted (dialogs: {page.prompts})",
                          lambda r: r["ranges"] and r["ranges"][-1]["start"] > last["start"] + 1000)
        assert page.prompts and page.prompts[-1].startswith("Delete the recording from "), \
            page.prompts
        cut = after["ranges"][-1]
        # Cut at the first IDR at or after the selection's end (the GOP is 2 s).
        assert middle - 1000 <= cut["start"] <= middle + 3000, (last, cut)
        assert cut["end"] >= last["end"] - 5, (last, cut)
        assert not admin_dialog_open(page)  # asked once only
        assert_moving_hls(page, reason)

        click(page, "#btn-record")
        poll_page(page, recordings, "recording again", lambda r: r["state"] == "recording",
                  timeout_s=30)
        assert not admin_dialog_open(page)
        assert offers_refused(server) == 0 and server.status()["viewers"]["count"] == 0


def controls(server: Server) -> dict[str, Any]:
    request = urllib.request.Request(server.url + "api/camera/controls",
                                     headers={"Authorization": f"Bearer {server.admin_secret()}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        data: dict[str, Any] = json.load(response)["controls"]
        return data


def test_settings_ask_for_the_admin_secret_and_change_the_camera(
        request: pytest.FixtureRequest, tmp_path: Path, engine: str) -> None:
    if not in_browser_netns(request):
        return
    reason = ENGINES[engine][2]
    with running_server(tmp_path) as server, ENGINES[engine][1]() as page:
        page.goto(server.url)
        assert_moving_hls(page, reason)
        click(page, "#btn-settings")
        poll_page(page, lambda p: {"open": admin_dialog_open(p)}, "the admin dialog",
                  lambda d: d["open"])
        assert not visible(page, "#ctl-panel")
        log_in_in_dialog(page, server)
        poll_page(page, lambda p: {"shown": visible(p, "[data-control=brightness] input")},
                  "the settings panel", lambda d: d["shown"])
        assert visible(page, "[data-control=resolution] .ctl-restart")
        save_screenshot(page, f"browser-{engine}-settings.png")

        page.evaluate("""() => {
          const el = document.querySelector('[data-control=brightness] input');
          el.value = '0.4'; el.dispatchEvent(new Event('change')); }""")
        poll_page(page, lambda p: {"value": p.evaluate(
            "() => window.ruseonControls.controls.brightness.value")}, "brightness 0.4",
            lambda d: d["value"] > 0.39)
        assert controls(server)["brightness"]["value"] == pytest.approx(0.4)

        # A new size restarts the source: the HLS picture plays on, at that size.
        page.evaluate("""() => {
          const el = document.querySelector('[data-control=resolution] select');
          el.value = '640x480'; el.dispatchEvent(new Event('change')); }""")
        poll_page(page, page_state, "the new size on the page",
                  lambda s: (s["videoWidth"], s["videoHeight"]) == (640, 480)
                  and s["state"] == "live", timeout_s=90)
        assert_moving_hls(page, reason)
        assert controls(server)["resolution"]["value"] == "640x480"
        click(page, "#btn-settings")  # closes; opening again asks nothing
        click(page, "#btn-settings")
        poll_page(page, lambda p: {"shown": visible(p, "[data-control=brightness] input")},
                  "the settings panel again", lambda d: d["shown"])
        assert not admin_dialog_open(page)
