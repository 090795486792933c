"""HTTP for HLS: ``GET /hls/index.m3u8`` (blocking reloads included), init segments, parts and
segments under ``/hls/``, with the caching headers a CDN or reverse proxy needs.

Caching: init segments, parts and segments never change under their name (names carry the
service's run id), so they are ``public, immutable`` for as long as the window keeps them. A
plain playlist request is cacheable for one second (and two more while a cache refreshes it);
a blocking reload is keyed by its query (``_HLS_msn``/``_HLS_part``), whose answer never changes
either, so a cache in front collapses every client waiting for the same part into one request to
the board.

Bad input is answered before it costs anything: names that are not ours are 404 without a file
system ever being looked at, long query strings 414, malformed or far-ahead ``_HLS_*`` values 400.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aiohttp import web

from ruseon_appliance.hls import HlsStream, TooManyWaiting, render
from ruseon_appliance.hls.playlist import MULTIVARIANT_NAME, Variant, render_multivariant
from ruseon_appliance.hls.window import Part
from ruseon_appliance.web.access import bearer_token, request_address
from ruseon_appliance.web.metrics import Families
from ruseon_appliance.web.problem import Problem

if TYPE_CHECKING:
    from prometheus_client.core import Metric

PLAYLIST_TYPE = "application/vnd.apple.mpegurl"
MEDIA_TYPE = "video/mp4"
# Longest query string a playlist request may carry (the token and the two _HLS_ numbers fit
# many times over); longer ones are refused before parsing.
MAX_QUERY_BYTES = 512
# Media sequence numbers and part numbers above this are not ours (and not worth parsing).
MAX_NUMBER_DIGITS = 12
# A requester counts as a client for this long after its last request.
CLIENT_WINDOW_S = 15.0
MAX_TRACKED_CLIENTS = 10_000
# Request rates are averaged over this many one-second buckets.
RATE_WINDOW_S = 10

# How much older than max-age a cache may hand out a plain playlist while it refreshes it.
PLAYLIST_STALE_S = 2

_NAME = re.compile(r"^(init|seg|part)-([0-9a-f]{8})-([0-9]{1,12})\.(mp4|m4s)$")
_NUMBER = re.compile(r"^[0-9]{1,12}$")
_KINDS = ("multivariant", "playlist", "blocking_playlist", "part", "segment", "init")
_NO_STORE = {"Cache-Control": "no-store"}


class RateMeter:
    """Events per second by kind over the last few seconds (one bucket per second)."""

    def __init__(self, seconds: int = RATE_WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self._buckets: deque[tuple[int, Counter[str]]] = deque()

    def add(self, kind: str) -> None:
        """Count one event now."""
        now = int(self.clock())
        if not self._buckets or self._buckets[-1][0] != now:
            self._buckets.append((now, Counter()))
            self._trim(now)
        self._buckets[-1][1][kind] += 1

    def _trim(self, now: int) -> None:
        while self._buckets and self._buckets[0][0] <= now - self.seconds:
            self._buckets.popleft()

    def rates(self) -> dict[str, float]:
        """Mean events per second of each kind over the window (complete seconds only)."""
        now = int(self.clock())
        self._trim(now)
        total: Counter[str] = Counter()
        for second, counts in self._buckets:
            if second < now:
                total.update(counts)
        return {kind: round(total[kind] / self.seconds, 3) for kind in _KINDS}


class HlsMetrics:
    """What the HLS routes count: requests by kind, rates, distinct recent requesters."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.requests: Counter[str] = Counter()
        self.bytes_sent = 0
        self.rates = RateMeter(clock=clock)
        self._clients: OrderedDict[tuple[str, str], float] = OrderedDict()

    def seen(self, request: web.Request, kind: str) -> None:
        """Count a request and remember who sent it (address and user agent: behind a NAT or a
        cache many viewers are one requester, which is what the board's load depends on)."""
        self.requests[kind] += 1
        self.rates.add(kind)
        key = (request_address(request), request.headers.get("User-Agent", "")[:120])
        self._clients[key] = self.clock()
        self._clients.move_to_end(key)
        while len(self._clients) > MAX_TRACKED_CLIENTS:
            self._clients.popitem(last=False)

    def clients(self) -> int:
        """Distinct requesters within the last :data:`CLIENT_WINDOW_S`."""
        horizon = self.clock() - CLIENT_WINDOW_S
        while self._clients:
            key, last = next(iter(self._clients.items()))
            if last >= horizon:
                break
            del self._clients[key]
        return len(self._clients)


def token_suffix(request: web.Request, token_required: bool) -> str:
    """``?token=…`` for the URIs of a playlist fetched with the token in its query (see
    :meth:`HlsResource._query_suffix`), else empty."""
    token = request.query.get("token")
    if token_required and token and bearer_token(request) is None:
        return "?token=" + quote(token, safe="")
    return ""


def _number(name: str, text: str) -> int:
    if not _NUMBER.match(text):
        raise Problem(400, f"{name} must be a non-negative integer of at most "
                      f"{MAX_NUMBER_DIGITS} digits", headers=_NO_STORE)
    return int(text)


class HlsResource:
    """The ``/hls/`` routes over one :class:`HlsStream`."""

    def __init__(self, stream: HlsStream, *, token_required: bool,
                 metrics: HlsMetrics | None = None, prefix: str = "/hls/") -> None:
        self.stream = stream
        # Where this stream is served: /hls/ (the first camera), /hls/<camera>/ (each camera).
        self.prefix = prefix
        self.token_required = token_required
        self.metrics = metrics or HlsMetrics()

    def add_routes(self, app: web.Application) -> None:
        """Register the routes (GET also answers HEAD)."""
        app.router.add_get(f"{self.prefix}index.m3u8", self.playlist)
        app.router.add_get(self.prefix + "{name}", self.media)

    # -- caching ----------------------------------------------------------------------------

    @property
    def media_max_age(self) -> int:
        """How long a part/segment/init stays in the window (and so is worth caching)."""
        window = self.stream.window
        return math.ceil(window.window_s + 2 * window.target_duration)

    def _query_suffix(self, request: web.Request) -> str:
        """Native players given ``?token=`` in the playlist URL need it on every URI in it.

        Only when the query token is what authenticated the request (no Bearer header: the
        auth middleware's rule), so the answer depends on exactly what a cache in front can key
        on (see docs/nginx-hls.conf)."""
        return token_suffix(request, self.token_required)

    def _cache_headers(self, cache_control: str) -> dict[str, str]:
        """``public`` lets shared caches store answers to authenticated requests (RFC 9111
        §3.5); with a token on, ``Vary: Authorization`` keeps them from handing such an answer
        to a request without that same header (an answer fetched with ``?token=`` is keyed by
        its URL anyway)."""
        headers = {"Cache-Control": cache_control}
        if self.token_required:
            headers["Vary"] = "Authorization"
        return headers

    # -- handlers ---------------------------------------------------------------------------

    async def playlist(self, request: web.Request) -> web.Response:
        """``GET /hls/index.m3u8[?_HLS_msn=M[&_HLS_part=P]]``."""
        if len(request.query_string) > MAX_QUERY_BYTES:
            self.metrics.seen(request, "playlist")
            raise Problem(414, f"the query string is longer than {MAX_QUERY_BYTES} bytes",
                          headers=_NO_STORE)
        query = request.query
        msn_text, part_text = query.get("_HLS_msn"), query.get("_HLS_part")
        blocking = msn_text is not None
        self.metrics.seen(request, "blocking_playlist" if blocking else "playlist")
        if part_text is not None and msn_text is None:
            raise Problem(400, "_HLS_part needs _HLS_msn", headers=_NO_STORE)
        stream, window = self.stream, self.stream.window
        await stream.fresh()
        hold = stream.hold_timeout_s
        # Refuse what is malformed or too far ahead at once, before holding anything.
        msn = part = None
        if msn_text is not None:
            msn = _number("_HLS_msn", msn_text)
            part = None if part_text is None else _number("_HLS_part", part_text)
            self._refuse_far_ahead(msn, part)
        # Right after start-up the window holds only parts: players that ignore them (ffmpeg,
        # older ones) would see an empty live playlist and give up, so wait for one segment.
        if not window.satisfies(window.first_msn, None) and not await self._wait(
            stream.wait_for_playlist(window.first_msn, None, hold)
        ):
            raise Problem(503, "no video has been segmented yet",
                          headers={"Retry-After": "1", **_NO_STORE})
        if msn is not None and not await self._wait(stream.wait_for_playlist(msn, part, hold)):
            raise Problem(503, f"segment {msn} part {part} did not arrive within {hold:.0f} s",
                          headers={"Retry-After": "1", **_NO_STORE})
        body = render(window, query=self._query_suffix(request))
        # A blocking answer is keyed by its query and stays right; a plain one changes with
        # every part, so caches may reuse it only briefly (one second is max-age's finest).
        # stale-while-revalidate lets a cache answer a crowd from the expired copy (at most
        # that much older) while one request refreshes it: a lock covers only missing entries.
        cache = (f"public, max-age={6 * window.target_duration}" if blocking
                 else f"public, max-age=1, stale-while-revalidate={PLAYLIST_STALE_S}")
        response = web.Response(
            text=body,
            content_type=PLAYLIST_TYPE,
            headers=self._cache_headers(cache),
        )
        self.metrics.bytes_sent += len(body)
        return response

    def _refuse_far_ahead(self, msn: int, part: int | None) -> None:
        """400 for requests the spec says to refuse rather than hold: ``_HLS_msn`` more than two
        past the newest segment, ``_HLS_part`` past the Advance Part Limit."""
        window = self.stream.window
        live = window.position
        if msn > live.msn + 2:
            raise Problem(400, f"_HLS_msn={msn} is beyond the live edge (segment {live.msn})",
                          headers=_NO_STORE)
        if part is None:
            return
        limit = math.ceil(3 / window.part_target_s) if window.part_target_s < 1 else 3
        ahead = part - (live.parts - 1) if msn == live.msn else part + 1
        if msn >= live.msn and ahead > limit:
            raise Problem(400, f"_HLS_part={part} is more than {limit} parts beyond the live "
                          f"edge (segment {live.msn} part {live.parts - 1})", headers=_NO_STORE)

    async def _wait(self, waiting: Any) -> Any:
        try:
            return await waiting
        except TooManyWaiting:
            raise Problem(503, f"too many requests are waiting for the live edge "
                          f"({self.stream.max_waiting})",
                          headers={"Retry-After": "1", **_NO_STORE}) from None

    async def media(self, request: web.Request) -> web.Response:
        """``GET /hls/init-RUN-G.mp4``, ``/hls/part-RUN-N.m4s``, ``/hls/seg-RUN-MSN.m4s``."""
        match = _NAME.match(request.match_info["name"])
        window = self.stream.window
        if match is None or match.group(2) != window.run_id:
            raise Problem(404, "no such HLS file", headers=_NO_STORE)
        kind, number = match.group(1), int(match.group(3))
        self.metrics.seen(request, kind)
        await self.stream.fresh()
        data: bytes | memoryview | None
        if kind == "init" and match.group(4) == "mp4":
            data = window.init(number)
        elif kind == "seg" and match.group(4) == "m4s":
            data = window.segment_content(number)
        elif kind == "part" and match.group(4) == "m4s":
            part: Part | None = window.part(number)
            if part is None and number == window.next_part_number:
                # The preload hint names this part before it exists: hold the request.
                part = await self._wait(
                    self.stream.wait_for_part(number, self.stream.hold_timeout_s))
                if part is None:
                    raise Problem(503, f"part {number} did not arrive in time",
                                  headers={"Retry-After": "1", **_NO_STORE})
            data = window.part_content(number) if part is not None else None
        else:
            data = None
        if data is None:
            raise Problem(404, "no such HLS file (not in the live window)", headers=_NO_STORE)
        self.metrics.bytes_sent += len(data)
        return web.Response(
            body=data,  # the window's bytes (or those put together for the last requests)
            content_type=MEDIA_TYPE,
            headers=self._cache_headers(f"public, max-age={self.media_max_age}, immutable"),
        )

    # -- reporting --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The ``hls`` section of ``/api/status``."""
        return {
            "clients": self.metrics.clients(),
            "requests": dict(self.metrics.requests),
            "request_rates": self.metrics.rates.rates(),
            "bytes_sent": self.metrics.bytes_sent,
            "stream": self.stream.stats(),
        }

    def metrics_families(self) -> Iterator[Metric]:
        """The HLS families for ``/metrics``."""
        out = Families()
        stats = self.stream.stats()
        out.gauge("ruseon_hls_clients",
                  f"Distinct HLS requesters in the last {CLIENT_WINDOW_S:.0f} s.").add_metric(
            [], self.metrics.clients())
        requests = out.counter("ruseon_hls_requests_total", "HLS requests, by kind.", ["kind"])
        for kind in _KINDS:
            requests.add_metric([kind], self.metrics.requests[kind])
        rates = out.gauge("ruseon_hls_request_rate",
                          f"HLS requests per second over the last {RATE_WINDOW_S} s, by kind.",
                          ["kind"])
        for kind, rate in self.metrics.rates.rates().items():
            rates.add_metric([kind], rate)
        out.counter("ruseon_hls_sent_bytes_total", "HLS response bytes.").add_metric(
            [], self.metrics.bytes_sent)
        out.gauge("ruseon_hls_blocking_outstanding",
                  "Blocking playlist reloads and hinted part requests being held.").add_metric(
            [], stats["blocking_waiting"])
        out.counter("ruseon_hls_blocking_refused_total",
                    "Blocking requests refused because too many were held.").add_metric(
            [], stats["blocking_refused"])
        out.counter("ruseon_hls_blocking_timed_out_total",
                    "Blocking requests that the live edge did not satisfy in time.").add_metric(
            [], stats["blocking_timed_out"])
        out.stats("ruseon_hls_stream", {k: v for k, v in stats.items()
                                        if not k.startswith("blocking_")}, "HLS live window")
        return out.collect()


@dataclass(frozen=True, slots=True)
class Rendition:
    """One of a camera's renditions for the multivariant playlist: its media playlist's URI
    (relative to the multivariant playlist), its stream, and where its picture size and
    configured bitrate come from (the camera's, read per request: they follow the controls)."""

    uri: str
    stream: HlsStream
    size: Callable[[], tuple[int, int]]
    bitrate: Callable[[], int]

    def variant(self) -> Variant | None:
        """The playlist entry, None while the stream has no complete segment (no codec yet)."""
        codec = self.stream.codec
        rates = self.stream.bit_rates()
        if codec is None or rates is None:
            return None
        peak, average = rates
        configured = self.bitrate()
        width, height = self.size()
        # BANDWIDTH must not be under any segment's rate; the encoder's target is a floor so a
        # quiet scene at start-up does not make the main rendition look like the small one.
        return Variant(uri=self.uri, bandwidth=max(peak, configured),
                       average_bandwidth=max(1, min(average, max(peak, configured))),
                       codecs=codec, width=width, height=height,
                       frame_rate=float(self.stream.framerate))


class MultivariantResource:
    """``GET <prefix>multivariant.m3u8``: a camera's renditions (main first, then the
    sub-stream where the camera has one) for players that switch by bandwidth (hls.js, Safari).

    The media playlists stay where they were (``<prefix>index.m3u8`` is the main one), so
    players given that URL go on playing the main stream alone."""

    def __init__(self, renditions: Sequence[Rendition], *, token_required: bool, prefix: str,
                 metrics: HlsMetrics | None = None) -> None:
        if not renditions:
            raise ValueError("at least one rendition")
        self.renditions = list(renditions)
        self.token_required = token_required
        self.prefix = prefix
        self.metrics = metrics or HlsMetrics()

    @property
    def path(self) -> str:
        """Where the multivariant playlist is served."""
        return self.prefix + MULTIVARIANT_NAME

    def add_routes(self, app: web.Application) -> None:
        """Register the route (before the media routes under the same prefix)."""
        app.router.add_get(self.path, self.playlist)

    async def playlist(self, request: web.Request) -> web.Response:
        """The multivariant playlist; held (like a first media playlist request) until the
        renditions have a complete segment, since their codec and bit rate come from it."""
        self.metrics.seen(request, "multivariant")
        if len(request.query_string) > MAX_QUERY_BYTES:
            raise Problem(414, f"the query string is longer than {MAX_QUERY_BYTES} bytes",
                          headers=_NO_STORE)
        if "_HLS_msn" in request.query or "_HLS_part" in request.query:
            raise Problem(400, "blocking reloads (_HLS_msn, _HLS_part) are for the media "
                          "playlists, not the multivariant one", headers=_NO_STORE)
        await asyncio.gather(*(r.stream.fresh() for r in self.renditions))
        try:
            await asyncio.gather(*(
                r.stream.wait_for_playlist(r.stream.window.first_msn, None,
                                           r.stream.hold_timeout_s)
                for r in self.renditions if r.variant() is None))
        except TooManyWaiting:
            raise Problem(503, "too many requests are waiting for the live edge",
                          headers={"Retry-After": "1", **_NO_STORE}) from None
        variants = [v for v in (r.variant() for r in self.renditions) if v is not None]
        if not variants:
            raise Problem(503, "no video has been segmented yet",
                          headers={"Retry-After": "1", **_NO_STORE})
        body = render_multivariant(variants, query=token_suffix(request, self.token_required))
        headers = {"Cache-Control": f"public, max-age=1, stale-while-revalidate={PLAYLIST_STALE_S}"}
        if self.token_required:
            headers["Vary"] = "Authorization"
        self.metrics.bytes_sent += len(body)
        return web.Response(text=body, content_type=PLAYLIST_TYPE, headers=headers)
