"""The device page in Debian's Firefox ESR (headless, over WebDriver BiDi), against a real
``ruseon serve``, in the test's own network namespace (see :mod:`tests.e2e.browser_netns`).

Firefox here has no H.264 for WebRTC (the OpenH264 plugin is a download Firefox makes itself,
which no package carries): the page must see that from ``RTCRtpReceiver.getCapabilities``
before any offer, play LL-HLS at once, say why, and not offer the WebRTC switch. Where a
Firefox does list H.264 (a desktop with OpenH264) the page must use WebRTC: with the list
stubbed to say so, it offers, is refused once (the offer really has no H.264), and stays on
HLS without asking again.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.browser_netns import (
    in_browser_netns,
    record_browser_stats,
    running_server,
    save_screenshot,
)
from tests.e2e.engine_page import (
    assert_hls_stats_and_viewers,
    assert_moving_hls,
    assert_webrtc_not_offered,
    check_snapshot_grid,
    offers_refused,
    open_and_time_first_frame,
    page_state,
    print_first_frame,
    wait_state,
)
from tests.e2e.firefox_bidi import firefox, require_firefox
from tests.tooling import IN_CI, free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NO_H264 = "this browser has no H.264 for WebRTC"
# The page's old retry after a refusal was every 10 s: watch longer than that.
REFUSAL_WATCH_MS = 11_000
# Firefox's receiver capabilities with H.264 added, as a Firefox with OpenH264 lists them.
STUB_H264 = """
const original = RTCRtpReceiver.getCapabilities.bind(RTCRtpReceiver);
RTCRtpReceiver.getCapabilities = (kind) => {
  const caps = original(kind);
  if (kind !== 'video' || !caps) return caps;
  return {...caps, codecs: [{mimeType: 'video/H264', clockRate: 90000,
    sdpFmtpLine: 'level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f'},
    ...caps.codecs]};
};
sessionStorage.setItem('ruseon.transport', 'webrtc');
"""


@contextlib.contextmanager
def rtsp_client(url: str) -> Iterator[subprocess.Popen[bytes]]:
    """Debian's ffmpeg reading ``url`` over RTSP/TCP (copying, not decoding), as an NVR
    would; stopped on exit."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        if IN_CI:
            pytest.fail("ffmpeg is not installed (scripts/install-system-deps)")
        pytest.skip("ffmpeg is not installed")
    proc = subprocess.Popen([ffmpeg, "-nostdin", "-v", "error", "-rtsp_transport", "tcp",
                             "-i", url, "-c", "copy", "-f", "null", "-"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_firefox_plays_ll_hls_at_once_and_offers_no_webrtc(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """...and "Viewers" counts everyone: this page (HLS), an RTSP client and a relay."""
    require_firefox()
    if not in_browser_netns(request):
        print_first_frame("firefox")
        return
    rtsp_port = free_port()
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        sink.bind(("127.0.0.1", 0))  # the relay's media server (nobody reads it)
        args = ["--rtsp", f"127.0.0.1:{rtsp_port}",
                "--relay", f"rtp://127.0.0.1:{sink.getsockname()[1]}"]
        server = stack.enter_context(running_server(tmp_path, extra_args=args))
        page = stack.enter_context(firefox())
        first_frame_s = open_and_time_first_frame(page, server.url)
        print(f"firefox: first frame {first_frame_s:.2f} s after navigation (LL-HLS, hls.js)")
        state = assert_moving_hls(page, NO_H264)
        assert_webrtc_not_offered(state, NO_H264)
        stack.enter_context(rtsp_client(f"rtsp://127.0.0.1:{rtsp_port}/"))
        stats = assert_hls_stats_and_viewers(page, server, "firefox_hls_stats", rtsp=1,
                                             relays=1)
        if stats["viewerCounts"]["hls"] == 1:
            assert stats["stats"]["viewers"] == "3 (1 HLS · 1 RTSP · 1 relay)", stats["stats"]
        save_screenshot(page, "browser-firefox.png")

        # The switch cannot be used, and WebRTC chosen by hand earlier in the tab cannot
        # hold: HLS again, no offer, never "Offline"/"Not playing".
        page.evaluate("() => { document.getElementById('btn-transport').click(); "
                      "sessionStorage.setItem('ruseon.transport', 'webrtc'); }")
        page.reload()
        again = assert_moving_hls(page, NO_H264)
        assert again["stateText"] == "Live", again
        status = server.status()
        assert offers_refused(server) == 0 and status["viewers"]["count"] == 0, status["errors"]
        record_browser_stats("firefox", {"first_frame_s": round(first_frame_s, 3),
                                         "page": state, "stats": stats["stats"]})


def test_firefox_with_h264_listed_tries_webrtc_once_then_stays_on_hls(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The decision reads getCapabilities: H.264 listed (stubbed) and WebRTC chosen by hand,
    the page offers; the server refuses (no H.264 in the offer); the page plays HLS, says the
    camera refused WebRTC, and never asks again."""
    require_firefox()
    if not in_browser_netns(request):
        return
    with running_server(tmp_path) as server, firefox() as page:
        page.add_init_script(STUB_H264)
        page.goto(server.url)
        state = wait_state(page, "HLS after the refusal", lambda s: s["mode"] == "hls")
        reason = state["reason"]
        assert reason.startswith("the camera refused WebRTC: "), state
        assert_moving_hls(page, reason)
        page.wait_for_timeout(REFUSAL_WATCH_MS)
        later = page_state(page)
        assert offers_refused(server) == 1, server.status()["errors"]
        assert later["mode"] == "hls" and later["stateText"] == "Live", later
        assert_webrtc_not_offered(later, reason)


def test_firefox_grid_shows_snapshots_and_a_camera_plays_over_hls(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Several cameras: no H.264 for WebRTC, so the grid's tiles are refreshed snapshots, and a
    click plays that camera over LL-HLS (:func:`tests.e2e.engine_page.check_snapshot_grid`)."""
    require_firefox()
    if not in_browser_netns(request):
        return
    args = ["--camera", "front=synthetic", "--camera", "side=synthetic"]
    with running_server(tmp_path, extra_args=args) as server, firefox() as page:
        check_snapshot_grid(page, server, NO_H264, "browser-firefox-grid.png")
