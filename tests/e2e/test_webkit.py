"""The device page in WebKitGTK (Debian's MiniBrowser under Xvfb, driven by WebKitWebDriver),
against a real ``ruseon serve``, in the test's own network namespace (see
:mod:`tests.e2e.browser_netns`).

Debian's WebKitGTK has no ``RTCPeerConnection`` and no native HLS: the page must play LL-HLS
through hls.js at once, say "this browser has no WebRTC" (not "no H.264"), not offer the
WebRTC switch, and never call the camera unreachable for what the browser lacks, also when
WebRTC was chosen by hand or something asks for it again (recordings' "back to live").
"""

from __future__ import annotations

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
)
from tests.e2e.webkit_driver import require_webkit, webkit

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NO_WEBRTC = "this browser has no WebRTC"


def not_reconnecting(state: dict[str, object]) -> None:
    """Nothing on the page says the camera is unreachable."""
    assert state["state"] != "reconnecting" and state["stateText"] != "Reconnecting", state
    assert "not reachable" not in str(state["veilText"]), state


def test_webkit_plays_ll_hls_and_says_it_has_no_webrtc(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    require_webkit()
    if not in_browser_netns(request):
        print_first_frame("webkit")
        return
    with running_server(tmp_path) as server, webkit() as page:
        first_frame_s = open_and_time_first_frame(page, server.url)
        print(f"webkit: first frame {first_frame_s:.2f} s after navigation (LL-HLS, hls.js)")
        state = assert_moving_hls(page, NO_WEBRTC)
        assert_webrtc_not_offered(state, NO_WEBRTC)
        not_reconnecting(state)
        stats = assert_hls_stats_and_viewers(page, server, "webkit_hls_stats")
        save_screenshot(page, "browser-webkit.png")

        # Asked for WebRTC again (the disabled switch, recordings' "back to live"): still
        # HLS, never "Reconnecting — the camera is not reachable".
        page.evaluate("() => { document.getElementById('btn-transport').click(); "
                      "window.ruseon.startWebrtc(); }")
        page.wait_for_timeout(1500)
        asked = page_state(page)
        not_reconnecting(asked)
        assert asked["mode"] == asked["transport"] == "hls" and asked["state"] == "live", asked

        # WebRTC chosen by hand earlier in the tab: it cannot hold in this browser.
        page.evaluate("() => sessionStorage.setItem('ruseon.transport', 'webrtc')")
        page.reload()
        again = assert_moving_hls(page, NO_WEBRTC)
        not_reconnecting(again)
        assert offers_refused(server) == 0 and server.status()["viewers"]["count"] == 0
        record_browser_stats("webkit", {"first_frame_s": round(first_frame_s, 3),
                                        "page": state, "stats": stats["stats"]})


def test_webkit_grid_shows_snapshots_and_a_camera_plays_over_hls(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Several cameras: the grid's tiles are refreshed snapshots (a live tile is a WHEP viewer,
    which this browser cannot be); a click plays that camera over LL-HLS; back to the grid,
    HLS rests (:func:`tests.e2e.engine_page.check_snapshot_grid`)."""
    require_webkit()
    if not in_browser_netns(request):
        return
    args = ["--camera", "front=synthetic", "--camera", "side=synthetic"]
    with running_server(tmp_path, extra_args=args) as server, webkit() as page:
        check_snapshot_grid(page, server, NO_WEBRTC, "browser-webkit-grid.png")
