"""What the device page shows in any engine (Chromium through Playwright, Firefox over BiDi,
WebKit over WebDriver): one JS read of the player, the transport label and the stats panel,
and the checks the Firefox and WebKit tests share (a moving picture, stats that mean what they
say, the viewer count). Each works with any object that has ``evaluate`` and
``wait_for_timeout`` (see :mod:`tests.e2e.firefox_bidi`, :mod:`tests.e2e.webkit_driver`).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from hil.browser import PAGE_JS, frames_presented
from tests.e2e.browser_netns import (
    ARTIFACTS,
    Server,
    poll_page,
    record_browser_stats,
    save_screenshot,
)

NO_FIGURE = "\u2013"  # the page's en dash for a figure it does not have

def page_state(page: Any) -> dict[str, Any]:
    """:data:`PAGE_JS` on ``page``."""
    state: dict[str, Any] = page.evaluate(PAGE_JS)
    return state


def wait_state(page: Any, condition: str, predicate: Any, timeout_s: float = 60) -> dict[str, Any]:
    """Poll :func:`page_state` until ``predicate``; the timeout only bounds a broken run."""
    return poll_page(page, page_state, condition, predicate, timeout_s)


def open_and_time_first_frame(page: Any, url: str) -> float:
    """Navigate to ``url`` and return the seconds until the first presented frame (polled
    every 100 ms: a measurement to print and note, never asserted)."""
    opened = time.monotonic()
    page.goto(url)
    deadline = opened + 90
    while page.evaluate("() => { const q = document.getElementById('video')"
                        ".getVideoPlaybackQuality(); return q ? q.totalVideoFrames : 0; }") == 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"no frame within 90 s: {page_state(page)}")
        page.wait_for_timeout(100)
    return time.monotonic() - opened


def print_first_frame(key: str) -> None:
    """Print the first-frame time the test's run in its namespace recorded under ``key`` in
    artifacts/browser-stats.json (that run's own output is kept only when it fails)."""
    figures = json.loads((ARTIFACTS / "browser-stats.json").read_text())[key]
    print(f"{key}: first frame {figures['first_frame_s']:.2f} s after navigation "
          f"({figures['page']['label']}: {figures['page']['reason']})")


def assert_moving_hls(page: Any, reason: str) -> dict[str, Any]:
    """LL-HLS through hls.js, live, labelled with ``reason``, and a moving picture: currentTime
    advances, frames are presented and the pixels change."""
    first = wait_state(page, "HLS live with frames",
                       lambda s: s["mode"] == "hls" and s["state"] == "live" and s["frames"] > 10
                       and s["signature"] is not None)
    page.wait_for_timeout(2000)

    def moved(later: dict[str, Any]) -> bool:
        # WebKit counts frames from 0 again after a seek (hls.js jumping a hole after a
        # stall): then time and pixels judge alone.
        reset = later["frames"] < first["frames"]
        return (later["currentTime"] > first["currentTime"] + 1
                and frames_presented(first, later) > (0 if reset else 10)
                and later["signature"] != first["signature"])

    # Ten more frames presented, not ten in two seconds: a browser starved of CPU (WebKit's
    # software decoder on CI's loaded clean run presented 4 frames in 3 s of media) still
    # plays, only slower; the bound is liveness.
    later = page_state(page)
    if not moved(later):
        later = wait_state(page, "ten more frames, time and pixels moving", moved, 60)
    assert later["hlsjs"] and later["videoWidth"] > 0, later
    assert later["label"] == "LL-HLS" and later["reason"] == reason, later
    assert later["labelReason"] == reason, later  # shown beside the label (device.css)
    assert later["stateText"] == "Live", later
    return later


def assert_webrtc_not_offered(state: dict[str, Any], reason: str) -> None:
    """The switch to WebRTC is off and says why; the page knows WebRTC is unavailable."""
    assert state["webrtc"] == {"ok": False, "reason": reason}, state["webrtc"]
    assert state["button"]["disabled"], state["button"]
    assert state["button"]["title"] == f"WebRTC is not available: {reason}", state["button"]


def mbit(text: str) -> float:
    """``"1.23 Mbit/s"`` as bit/s."""
    match = re.fullmatch(r"([0-9.]+) Mbit/s", text)
    assert match, f"not a bitrate: {text!r}"
    return float(match.group(1)) * 1e6


def viewers_text(counts: dict[str, int]) -> str:
    """What "Viewers" must say for these counts: the total, then each way that has anyone
    (just the number when everyone is on WebRTC)."""
    total = sum(counts.values())
    if total == counts["webrtc"]:
        return str(total)
    names = {"webrtc": "WebRTC", "hls": "HLS", "rtsp": "RTSP",
             "relays": "relay" if counts["relays"] == 1 else "relays"}
    parts = [f"{counts[key]} {name}" for key, name in names.items() if counts[key]]
    return f"{total} ({' · '.join(parts)})"


def assert_hls_stats_and_viewers(page: Any, server: Server, key: str, *, rtsp: int = 0,
                                 relays: int = 0) -> dict[str, Any]:
    """On HLS: "Bitrate" is the stream's (near what the encoder makes, not hls.js's download
    estimate), the latency is named "Live latency" and the buffer "Buffer", and "Viewers"
    counts this page (an HLS client), and the ``rtsp`` RTSP clients and ``relays`` relays the
    test runs, as /api/status does. The figures go to artifacts/browser-stats.json under
    ``key``."""
    state = wait_state(page, "a media bitrate and every viewer in the stats",
                       lambda s: s["stats"]["bitrate"] not in (None, NO_FIGURE)
                       and (s["viewerCounts"] or {}).get("hls", 0) >= 1
                       and s["viewerCounts"].get("rtsp") == rtsp
                       and s["viewerCounts"].get("relays") == relays)
    status = server.status()
    source_bps = status["source"]["bitrate"]
    shown_bps = mbit(state["stats"]["bitrate"])
    # The bytes of the media per second of media against the encoder's own measure: the same
    # stream, so within a factor of two (the download estimate was 10-30 times it here).
    assert source_bps / 2 < shown_bps < source_bps * 2, (shown_bps, source_bps, state)
    stats = state["stats"]
    assert stats["jitterName"] == "Live latency", stats
    assert re.fullmatch(r"[0-9.]+ s", stats["jitter"]), stats
    assert stats["lossName"] == "Buffer", stats
    assert re.fullmatch(r"[0-9.]+ s", stats["loss"]) or stats["loss"] == NO_FIGURE, stats
    counts = state["viewerCounts"]
    by = status["viewers"]["by_transport"]
    assert counts["webrtc"] == by["webrtc"] == status["viewers"]["count"] == 0, (counts, by)
    assert counts["hls"] >= 1 and by["hls"] >= 1 and status["hls"]["clients"] >= 1, (counts, by)
    assert by["rtsp"] == rtsp and by["relays"] == relays, by
    if rtsp:
        assert status["rtsp"]["playing"] == rtsp, status["rtsp"]
    assert stats["viewers"] == viewers_text(counts), stats
    assert state["viewers"] == sum(counts.values()), state
    record_browser_stats(key, {
        "shown_bitrate_bps": shown_bps, "source_bitrate_bps": source_bps,
        "hlsjs_bandwidth_estimate_bps": state["bandwidthEstimate"],
        "live_latency": stats["jitter"], "buffer": stats["loss"], "viewers": stats["viewers"],
    })
    return state


def offers_refused(server: Server) -> int:
    """How many WHEP offers the server refused so far (all reasons)."""
    return sum(server.status()["errors"]["offers_refused"].values())


# Real input, as WebDriver actions (the same JSON in BiDi and classic WebDriver): the page
# gets the pointer and key events a person's mouse and keyboard make.
MOUSE = {"type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"}}
DOWN = {"type": "pointerDown", "button": 0}
UP = {"type": "pointerUp", "button": 0}


def move(x: float, y: float) -> dict[str, Any]:
    """A pointer move to viewport (CSS pixel) coordinates."""
    return {"type": "pointerMove", "x": round(x), "y": round(y), "origin": "viewport",
            "duration": 0}


def pointer(page: Any, *steps: dict[str, Any]) -> None:
    """Move, press and release the mouse: ``steps`` from :func:`move`, DOWN, UP."""
    page.perform([{**MOUSE, "actions": list(steps)}])


def centre(page: Any, selector: str) -> tuple[float, float]:
    """Where the element is on screen (scrolled into view first); it must be visible."""
    box = page.evaluate(f"""() => {{ const e = document.querySelector({json.dumps(selector)});
      if (!e) return null; e.scrollIntoView({{block: 'center'}});
      const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; }}""")
    assert box is not None, f"no {selector} on the page"
    left, top, width, height = box
    assert width > 0 and height > 0, f"{selector} is not visible: {box}"
    return left + width / 2, top + height / 2


def click(page: Any, selector: str) -> None:
    """A mouse click in the middle of the element."""
    x, y = centre(page, selector)
    pointer(page, move(x, y), DOWN, UP)


def type_text(page: Any, text: str) -> None:
    """Type ``text`` on the keyboard (into whatever has the focus)."""
    keys: list[dict[str, Any]] = []
    for char in text:
        keys += [{"type": "keyDown", "value": char}, {"type": "keyUp", "value": char}]
    page.perform([{"type": "key", "id": "keyboard", "actions": keys}])


def visible(page: Any, selector: str) -> bool:
    """The element is there and takes space on the page (not hidden, not display: none)."""
    return bool(page.evaluate(f"""() => {{ const e = document.querySelector(
      {json.dumps(selector)}); return !!e && e.getClientRects().length > 0; }}"""))


GRID_JS = """() => {
  const g = window.ruseonCameras;
  return {open: !!(g && g.open), mode: g ? g.mode : null,
          tiles: g ? Array.from(g.tiles.values()).map((t) => ({
            camera: t.camera, frames: t.frames, tag: t.media.tagName,
            width: t.media.naturalWidth || 0, live: !!t.client})) : []};
}"""


def check_snapshot_grid(page: Any, server: Server, reason: str, screenshot: str) -> None:
    """Two cameras ("front", "side") in a browser without (usable) WebRTC: the grid's tiles
    are refreshed snapshots, the label says so and why; a click on "side" plays it over
    LL-HLS, moving, never "Reconnecting"; back to the grid, HLS rests; no offer was made."""
    page.goto(server.url)
    first = poll_page(page, lambda p: p.evaluate(GRID_JS), "the grid with snapshots",
                      lambda g: g["open"] and len(g["tiles"]) == 2
                      and all(t["width"] > 0 for t in g["tiles"]))
    assert first["mode"] == "snapshot", first
    assert all(t["tag"] == "IMG" and not t["live"] for t in first["tiles"]), first
    # The label says what the tiles are, not the resting big picture's transport.
    shown = page_state(page)
    assert (shown["label"], shown["labelReason"]) == ("Snapshots", reason), shown
    assert shown["stateText"] == "Cameras", shown
    poll_page(page, lambda p: p.evaluate(GRID_JS), "every snapshot refreshed", lambda g: all(
        t["frames"] > f["frames"] for t, f in zip(g["tiles"], first["tiles"], strict=True)))
    save_screenshot(page, screenshot)

    click(page, '.cam-tile[data-camera="side"]')
    playing = assert_moving_hls(page, reason)
    url = page.evaluate("() => window.ruseonHls.hls.url")
    assert url.endswith("/hls/side/index.m3u8"), url
    assert playing["state"] != "reconnecting" and "not reachable" not in playing["veilText"]

    click(page, "#btn-cameras")
    rested = poll_page(page, page_state, "HLS resting behind the grid",
                       lambda s: s["mode"] == "resting" and not s["hlsjs"])
    assert rested["state"] == "grid", rested
    assert (rested["label"], rested["labelReason"]) == ("Snapshots", reason), rested
    assert offers_refused(server) == 0 and server.status()["viewers"]["count"] == 0
