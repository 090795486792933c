"""A real browser in the rig watching the device page, driven over classic W3C WebDriver: Safari
on a Mac through ``safaridriver`` (what only a Mac or an iPhone can confirm: Safari's WebRTC
H.264 and its native HLS), or any other WebDriver endpoint.

``safaridriver`` listens on the Mac's loopback only; the rig reaches it through an SSH tunnel
(``ssh -N -L 4444:127.0.0.1:4444 user@mac`` with ``safaridriver -p 4444`` running there, after
``safaridriver --enable`` once). The browser opens the device page at the address the Mac
sees (``--browser-url``, default ``--device``).

The harness reads the page the way its own end-to-end tests do (:data:`PAGE_JS`: the player's
state, the transport label and its reason, the frames the <video> presented and a coarse pixel
signature), through ``window.ruseon`` and ``window.ruseonHls``, the page's diagnostics.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

SAFARI: dict[str, Any] = {"browserName": "safari"}
COMMAND_TIMEOUT_S = 120.0  # a bound for a broken run, never a timing
# sessionStorage key the page keeps a transport chosen by hand in (web/static/hls-fallback.js).
CHOICE_KEY = "ruseon.transport"

# The page as a person sees it, and what the <video> decodes. ``frames`` counts frames the
# element presented (getVideoPlaybackQuality); ``signature`` is a coarse sum of the picture's
# pixels (drawn on a canvas), to tell a moving picture from a frozen one.
PAGE_JS = """() => {
  const v = document.getElementById('video');
  const q = v.getVideoPlaybackQuality ? v.getVideoPlaybackQuality() : null;
  const h = window.ruseonHls, p = window.ruseon;
  const text = (id) => { const e = document.getElementById(id); return e ? e.textContent : null; };
  const name = (id) => { const e = document.getElementById(id);
                         const dt = e ? e.previousElementSibling : null;
                         return dt ? dt.textContent : null; };
  const button = document.getElementById('btn-transport');
  let signature = null;
  if (v.videoWidth) {
    const c = document.createElement('canvas'); c.width = 64; c.height = 36;
    const g = c.getContext('2d'); g.drawImage(v, 0, 0, 64, 36);
    const d = g.getImageData(0, 0, 64, 36).data; signature = 0;
    for (let i = 0; i < d.length; i += 4) signature += d[i] * ((i / 4) % 7 + 1) + d[i + 1];
  }
  return {
    state: p ? p.state : null, transport: p ? p.transport : null,
    webrtc: p ? p.webrtc : null, viewers: p ? p.viewers : null,
    viewerCounts: p ? p.viewerCounts : null,
    mode: h ? h.mode : null, reason: h ? h.reason : null, native: !!(h && h.native),
    hlsjs: !!(h && h.hls), bandwidthEstimate: h && h.hls ? h.hls.bandwidthEstimate : null,
    mediaBitrate: h ? h.bitrate || null : null,
    label: text('transport'), labelReason: document.getElementById('transport').dataset.reason,
    stateText: text('state-text'), veilText: text('veil-text'),
    button: button ? {disabled: button.disabled, title: button.title} : null,
    stats: {bitrate: text('stat-bitrate'), jitter: text('stat-jitter'), loss: text('stat-loss'),
            viewers: text('stat-viewers'), fps: text('stat-fps'), codec: text('stat-codec'),
            jitterName: name('stat-jitter'), lossName: name('stat-loss')},
    currentTime: v.currentTime, paused: v.paused, videoWidth: v.videoWidth,
    videoHeight: v.videoHeight, userAgent: navigator.userAgent,
    frames: q ? q.totalVideoFrames : 0, signature,
  };
}"""


def call_source(source: str) -> str:
    """JS that evaluates ``source`` (a function's source, called with no argument, or an
    expression) and resolves to its value as JSON."""
    stripped = source.strip()
    if re.match(r"^(async\s*)?(\([^)]*\)|\w+)\s*=>|^(async\s+)?function\b", stripped):
        value = f"await ({stripped})()"
    else:
        value = f"await ({stripped})"
    return f"(async () => JSON.stringify({value}) ?? 'null')()"


class WebDriverError(RuntimeError):
    """An error answer from the WebDriver endpoint."""


class WebDriverSession:
    """One browser session over classic WebDriver (HTTP + JSON)."""

    def __init__(self, http: aiohttp.ClientSession, base: str) -> None:
        self._http = http
        self.base = base  # http://HOST:PORT/session/ID

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, driver_url: str,
                   capabilities: dict[str, Any]) -> WebDriverSession:
        """A new session (``capabilities`` as ``alwaysMatch``) with generous script/load
        timeouts."""
        root = driver_url.rstrip("/")
        created = await command(http, "POST", f"{root}/session",
                                {"capabilities": {"alwaysMatch": capabilities}})
        session = cls(http, f"{root}/session/{created['sessionId']}")
        bound = int(COMMAND_TIMEOUT_S * 1000)
        await session.command("POST", "/timeouts", {"script": bound, "pageLoad": bound})
        return session

    async def command(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One command on this session; its ``value``."""
        return await command(self._http, method, f"{self.base}{path}", body)

    async def navigate(self, url: str) -> None:
        """Open ``url`` (WebDriver waits for the load)."""
        await self.command("POST", "/url", {"url": url})

    async def evaluate(self, source: str) -> Any:
        """The value (as JSON) of a function's source (called) or of an expression."""
        script = ("const done = arguments[arguments.length - 1];"
                  f"{call_source(source)}.then(done, (e) => done(JSON.stringify("
                  "{__error: String(e && e.stack || e)})));")
        raw = await self.command("POST", "/execute/async", {"script": script, "args": []})
        value = json.loads(raw) if isinstance(raw, str) else raw
        if isinstance(value, dict) and "__error" in value:
            raise WebDriverError(f"script threw: {value['__error']}")
        return value

    async def close(self) -> None:
        """End the session (the browser window closes)."""
        await self.command("DELETE", "")


async def command(http: aiohttp.ClientSession, method: str, url: str,
                  body: dict[str, Any] | None = None) -> Any:
    """One WebDriver request; its ``value``, or :class:`WebDriverError` with the driver's
    words."""
    async with asyncio.timeout(COMMAND_TIMEOUT_S):
        async with http.request(method, url, json=body) as response:
            text = await response.text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise WebDriverError(f"{method} {url}: {response.status} {text[:500]!r}") from None
    if response.status != 200:
        value = data.get("value", {}) if isinstance(data, dict) else {}
        raise WebDriverError(f"{method} {url}: {response.status} {value.get('error')}: "
                             f"{str(value.get('message'))[:500]}")
    return data.get("value")


@dataclass
class PageWatch:
    """What the browser showed for one transport asked for."""

    asked: str  # "webrtc" (the page's default) or "hls" (chosen by hand, as the button does)
    first_frame_s: float | None = None
    first: dict[str, Any] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None

    @property
    def played(self) -> str:
        """What played: "webrtc", "native-hls", "hls.js" or "" (nothing)."""
        last = self.last
        if not last.get("frames"):
            return ""
        if last.get("transport") == "webrtc":
            return "webrtc"
        return "native-hls" if last.get("native") else "hls.js"

    def figures(self) -> dict[str, Any]:
        """For the report."""
        last = self.last
        return {
            "asked": self.asked, "played": self.played, "first_frame_s": self.first_frame_s,
            "label": last.get("label"), "reason": last.get("reason"),
            "state": last.get("stateText"), "size": [last.get("videoWidth"),
                                                     last.get("videoHeight")],
            "frames": [self.first.get("frames"), last.get("frames")],
            "current_time": [self.first.get("currentTime"), last.get("currentTime")],
            "picture_changed": self.picture_changed, "stats": last.get("stats"),
            "user_agent": last.get("userAgent"), "problem": self.problem,
        }

    @property
    def picture_changed(self) -> bool:
        return (self.first.get("signature") is not None
                and self.first.get("signature") != self.last.get("signature"))

    def moving(self, watch_s: float) -> bool:
        """Frames presented, time advancing and pixels changing over the watch."""
        advanced = (self.last.get("currentTime") or 0) - (self.first.get("currentTime") or 0)
        return (frames_presented(self.first, self.last) > 0 and advanced > watch_s / 2
                and self.picture_changed)


def frames_presented(first: dict[str, Any], last: dict[str, Any]) -> int:
    """Frames the <video> presented between two :data:`PAGE_JS` reads. WebKit starts its
    count (``totalVideoFrames``) again after a seek, such as hls.js's jump over a hole after a
    stall: a count that went back counts from 0."""
    before, after = first.get("frames") or 0, last.get("frames") or 0
    return int(after - before if after >= before else after)


async def watch_page(session: WebDriverSession, page_url: str, asked: str, *,
                     watch_s: float = 5.0, live_timeout_s: float = 60.0) -> PageWatch:
    """Open the page asking for ``asked`` ("webrtc": as a visitor opens it; "hls": chosen by
    hand first), time its first presented frame, wait for "Live", then watch ``watch_s``."""
    watch = PageWatch(asked)
    await session.navigate(page_url)
    await session.evaluate(f"() => {{ sessionStorage.setItem({json.dumps(CHOICE_KEY)}, "
                           f"{json.dumps(asked)}); return true; }}")
    opened = time.monotonic()
    await session.navigate(page_url)
    frames_js = ("() => { const q = document.getElementById('video').getVideoPlaybackQuality;"
                 " return q ? document.getElementById('video').getVideoPlaybackQuality()"
                 ".totalVideoFrames : 0; }")
    deadline = opened + live_timeout_s
    while True:
        if watch.first_frame_s is None and await session.evaluate(frames_js):
            watch.first_frame_s = time.monotonic() - opened
        state = await session.evaluate(PAGE_JS)
        if watch.first_frame_s is not None and state.get("state") == "live":
            break
        if time.monotonic() > deadline:
            watch.last = state
            watch.problem = (f"not live {live_timeout_s:.0f} s after opening: "
                             f"{state.get('stateText')}: {state.get('veilText')}")
            return watch
        await asyncio.sleep(0.1)
    watch.first = await session.evaluate(PAGE_JS)
    await asyncio.sleep(watch_s)
    watch.last = await session.evaluate(PAGE_JS)
    return watch
