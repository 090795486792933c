"""HLS in a real browser: hls.js (vendored) in Debian's Chromium plays ``/hls/index.m3u8`` through
the device page, and the page falls back to HLS by itself when UDP to the WebRTC port is dropped
(nftables, in the test's own network namespace), then back to WebRTC once it is not.

Each test re-runs itself in a fresh namespace (see :mod:`tests.e2e.browser_netns`).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser_netns import (
    chromium,
    in_browser_netns,
    log_in,
    page_stats,
    poll_page,
    record_browser_stats,
    running_server,
    save_screenshot,
    viewing_needs_a_credential,
    wait_for_page,
)
from tests.tooling import require_tool

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TOKEN = "hls-test-viewer-token"
BLOCK_TABLE = "ruseon_hls_block"
# The page gives WebRTC 5 s (hls-fallback.js FALLBACK_MS); the issue asks for HLS within 10 s.
FALLBACK_DEADLINE_S = 10.0

# What the page reports about HLS playback (the <video> element, whatever feeds it).
HLS_STATS_JS = """() => {
  const v = document.getElementById('video');
  const q = v.getVideoPlaybackQuality ? v.getVideoPlaybackQuality() : null;
  const h = window.ruseonHls;
  return {state: window.ruseon ? window.ruseon.state : null,
          transport: window.ruseon ? window.ruseon.transport : null,
          mode: h ? h.mode : null, reason: h ? h.reason : null,
          hlsjs: !!(h && h.hls), native: !!(h && h.native),
          label: document.getElementById('transport').textContent,
          currentTime: v.currentTime, paused: v.paused,
          videoWidth: v.videoWidth, videoHeight: v.videoHeight,
          frames: q ? q.totalVideoFrames : 0, dropped: q ? q.droppedVideoFrames : 0,
          latency: h && h.hls && Number.isFinite(h.hls.latency) ? h.hls.latency : null};
}"""


HLSJS_SCRIPTS = "document.querySelectorAll('script[src$=\"/hls.min.js\"]').length"
# Counts hls.js instances made and not yet destroyed (the vendored UMD build sets window.Hls).
COUNT_HLSJS_INSTANCES_JS = """
window.__hlsMade = 0; window.__hlsLive = 0;
(() => {
  let counted;
  Object.defineProperty(window, 'Hls', {configurable: true, get: () => counted, set: (Hls) => {
    counted = class extends Hls {
      constructor(...args) { super(...args); window.__hlsMade++; window.__hlsLive++; }
      destroy() { window.__hlsLive--; return super.destroy(); }
    };
  }});
})();"""


def hls_stats(page: Any) -> dict[str, Any]:
    """The page's HLS playback figures."""
    stats: dict[str, Any] = page.evaluate(HLS_STATS_JS)
    return stats


def wait_hls(page: Any, condition: str, predicate: Any, timeout_s: float = 60) -> dict[str, Any]:
    """Poll :func:`hls_stats` until ``predicate``; the timeout only keeps a broken run from
    hanging."""
    return poll_page(page, hls_stats, condition, predicate, timeout_s)


def assert_plays_hls(page: Any) -> dict[str, Any]:
    """Frames decoded and currentTime advancing, over HLS, labelled as such."""
    first = wait_hls(page, "HLS playing with frames decoded",
                     lambda s: s["mode"] == "hls" and s["state"] == "live" and s["frames"] > 10)
    page.wait_for_timeout(2000)
    later = hls_stats(page)
    assert later["currentTime"] > first["currentTime"], (first, later)
    assert later["frames"] > first["frames"], (first, later)
    assert later["videoWidth"] > 0 and later["label"] == "LL-HLS", later
    return later


@contextlib.contextmanager
def udp_blocked_to(port: int) -> Iterator[None]:
    """Drop every UDP datagram to ``port`` in this (private) namespace; removed on exit."""
    nft = require_tool("nft", "apt-get install nftables")
    commands = [
        [nft, "add", "table", "inet", BLOCK_TABLE],
        [nft, "add", "chain", "inet", BLOCK_TABLE, "out",
         "{ type filter hook output priority 0 ; }"],
        [nft, "add", "rule", "inet", BLOCK_TABLE, "out", "udp", "dport", str(port),
         "counter", "drop"],
    ]
    for command in commands:
        subprocess.run(command, check=True, capture_output=True, text=True)
    try:
        yield
    finally:
        subprocess.run([nft, "delete", "table", "inet", BLOCK_TABLE], check=False,
                       capture_output=True)


def test_hlsjs_plays_the_playlist_with_the_login_cookie(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """hls.js (chosen by hand on the page) plays /hls/index.m3u8 where viewing needs the viewer
    token: the page's login cookie goes with hls.js's requests by itself."""
    if not in_browser_netns(request):
        return
    args = viewing_needs_a_credential(tmp_path, TOKEN)
    with running_server(tmp_path, extra_args=args) as server, chromium() as browser:
        page = browser.new_page()
        log_in(page, server, TOKEN)
        page.add_init_script(
            "sessionStorage.setItem('ruseon.transport', 'hls');" + COUNT_HLSJS_INSTANCES_JS
        )
        # hls.js is slow to arrive, and the person switches HLS -> WebRTC -> HLS meanwhile;
        # then the playlist fails (the board starting up) until hls.js has given up on it.
        script: list[Any] = []
        page.route("**/static/vendor/hls.min.js", lambda route: script.append(route))
        page.route("**/hls/index.m3u8*", lambda route: route.fulfill(
            status=503, headers={"Retry-After": "1"}, body="starting"))
        page.goto(server.url, wait_until="domcontentloaded")  # "load" waits for hls.js
        page.wait_for_function(f"{HLSJS_SCRIPTS} > 0")
        page.click("#btn-transport")  # to WebRTC
        page.click("#btn-transport")  # back to HLS, hls.js still loading
        page.wait_for_timeout(500)  # a second copy of the script would be requested by now
        wait_hls(page, "the hls.js request", lambda _: bool(script))
        for held in script:
            held.continue_()
        wait_hls(page, "hls.js giving up on the playlist",
                 lambda s: s["state"] == "reconnecting" and s["mode"] == "hls")
        page.unroute("**/hls/index.m3u8*")
        stats = assert_plays_hls(page)
        assert stats["hlsjs"] and not stats["native"], stats
        made, live = page.evaluate("[window.__hlsMade, window.__hlsLive]")
        assert live == 1 and made >= 2, (made, live)  # one playing; the failed one destroyed
        assert page.evaluate(HLSJS_SCRIPTS) == 1
        status = server.status()
        assert status["hls"]["clients"] >= 1, status["hls"]
        assert status["hls"]["requests"].get("part", 0) > 0, status["hls"]
        # No WebRTC session was opened: the page chose HLS before connecting.
        assert status["viewers"]["count"] == 0, status["viewers"]
        record_browser_stats("hlsjs", {"page": stats, "server_hls": status["hls"]})
        save_screenshot(page, "browser-hls.png")


def test_page_falls_back_to_hls_when_udp_is_blocked_and_back_after(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if not in_browser_netns(request):
        return
    with running_server(tmp_path) as server, chromium() as browser:
        page = browser.new_page()
        with udp_blocked_to(server.rtc_port):
            opened = time.monotonic()
            page.goto(server.url)
            switched = wait_hls(page, "the switch to HLS", lambda s: s["mode"] == "hls",
                                timeout_s=60)
            switch_s = time.monotonic() - opened
            stats = assert_plays_hls(page)
            playing_s = time.monotonic() - opened
            assert "WebRTC did not connect" in switched["reason"], switched
            save_screenshot(page, "browser-hls-fallback.png")
        record_browser_stats("hls_fallback", {
            "open_to_switch_s": round(switch_s, 3), "open_to_hls_playing_s": round(playing_s, 3),
            "page": stats,
        })
        # The page's own timer decides (5 s); the bound is 10 s.
        assert switch_s <= FALLBACK_DEADLINE_S, switch_s
        # Rule gone, page reloaded: WebRTC plays again.
        page.reload()
        stats_rtc = wait_for_page(page, "WebRTC live again",
                                  lambda s: s["state"] == "live" and s["framesDecoded"] > 10)
        assert stats_rtc["codec"] == "video/H264"
        assert hls_stats(page)["label"] == "WebRTC"
        assert page_stats(page)["framesDecoded"] > 10


def test_page_goes_to_hls_at_once_without_h264_for_webrtc_or_on_406(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A browser whose WebRTC lists no H.264 (Firefox without OpenH264) and a /whep that answers
    406 both switch to HLS without waiting for the WebRTC timeout."""
    if not in_browser_netns(request):
        return
    with running_server(tmp_path) as server, chromium() as browser:
        no_h264 = browser.new_page()
        no_h264.add_init_script("""(() => {
          const original = RTCRtpReceiver.getCapabilities.bind(RTCRtpReceiver);
          RTCRtpReceiver.getCapabilities = (kind) => {
            const caps = original(kind);
            if (kind !== 'video' || !caps) return caps;
            return {...caps, codecs: caps.codecs.filter(
              (c) => c.mimeType.toLowerCase() !== 'video/h264')};
          };
        })();""")
        no_h264.goto(server.url)
        stats = assert_plays_hls(no_h264)
        assert stats["reason"] == "this browser has no H.264 for WebRTC", stats
        no_h264.close()

        refused = browser.new_page()
        refused.route("**/whep", lambda route: route.fulfill(
            status=406, content_type="application/problem+json",
            body='{"status": 406, "detail": "no common codec"}'))
        refused.goto(server.url)
        stats = assert_plays_hls(refused)
        assert stats["reason"].startswith("the camera refused WebRTC"), stats
        assert server.status()["viewers"]["count"] == 0
