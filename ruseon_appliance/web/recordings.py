"""The playback API (shaped like mediamtx's playback server) and recording control.

- ``GET /recordings/list[?start=&end=]`` → ``[{"start": RFC 3339, "duration": s, "url": ...}]``
- ``GET /recordings/get?start=<RFC 3339>&duration=<s>[&format=mp4|fmp4]`` → the clip, streamed
- ``DELETE /recordings?start=&duration=`` → deletes that range (never the segment being written)
- ``GET /api/recording``, ``POST /api/recording/start[?preroll=s]``, ``POST /api/recording/stop``

``path`` (mediamtx's stream name) names the camera when there are several (``?path=<camera>``;
left out: the first camera); with one camera it is accepted and ignored, as it always was.
Every route needs the token when auth is on (the app's auth middleware).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import datetime as dt
import math
import re
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ruseon_appliance.recording import ClipError, Recorder, plan_clip, rfc3339
from ruseon_appliance.web.metrics import Families
from ruseon_appliance.web.problem import Problem

if TYPE_CHECKING:
    from prometheus_client.core import Metric

# Longest clip one request may ask for (a plan holds a small record per frame).
MAX_CLIP_S = 3600.0
# Query values longer than this are not times or numbers.
MAX_PARAM_CHARS = 64
_PATH_NAME = re.compile(r"[A-Za-z0-9_.~-]{0,64}")


def parse_time(name: str, text: str | None) -> int:
    """An RFC 3339 time with a zone (``Z`` or ``+hh:mm``) as UTC µs; Problem 400 otherwise."""
    if text is None or text == "":
        raise Problem(400, f"{name} is required: an RFC 3339 time such as 2026-11-30T20:45:00Z")
    if len(text) > MAX_PARAM_CHARS:
        raise Problem(400, f"{name} is too long to be an RFC 3339 time")
    # A '+' in a query string arrives as a space unless the client encoded it.
    value = text.strip().replace(" ", "+")
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise Problem(400, f"{name} = {text!r} is not an RFC 3339 time "
                           "(e.g. 2026-11-30T20:45:00Z)") from None
    if when.tzinfo is None:
        raise Problem(400, f"{name} = {text!r} has no time zone: add Z or an offset")
    try:
        seconds = when.timestamp()
    except (OverflowError, OSError, ValueError):
        raise Problem(400, f"{name} = {text!r} is out of range") from None
    return round(seconds * 1_000_000)


def parse_seconds(name: str, text: str | None, *, maximum: float,
                  allow_zero: bool = False) -> float:
    """A positive (or, with ``allow_zero``, zero), finite number of seconds up to ``maximum``;
    Problem 400 otherwise."""
    if text is None or text == "":
        raise Problem(400, f"{name} is required: seconds, e.g. 30 or 2.5")
    if len(text) > MAX_PARAM_CHARS:
        raise Problem(400, f"{name} is too long to be a number of seconds")
    try:
        value = float(text)
    except ValueError:
        raise Problem(400, f"{name} = {text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        least = "0 seconds or more" if allow_zero else "more than 0 seconds"
        raise Problem(400, f"{name} = {text!r} must be {least}")
    if value > maximum:
        raise Problem(400, f"{name} = {text!r} is too long: at most {maximum:g} seconds")
    return value


def _check_path(request: web.Request) -> None:
    path = request.query.get("path")
    if path is not None and not _PATH_NAME.fullmatch(path):
        raise Problem(400, "path must be a stream name (letters, digits, _ . ~ -); "
                           "left out, it means the first camera")


def _recorded_ranges(recorder: Recorder, start: int | None, end: int | None, *,
                events: bool) -> list[tuple[int, int, bool]]:
        """The recorded ranges clipped to [start, end), and with ``events`` to the motion
        events' windows (their pre- and post-roll) within them."""
        out: list[tuple[int, int, bool]] = []
        for lo, hi, uncertain in recorder.archive.timed_ranges(recorder.current_segment()):
            if start is not None:
                lo = max(lo, start)
            if end is not None:
                hi = min(hi, end)
            if hi <= lo:
                continue
            if events and recorder.event_windows is not None:
                out.extend((a, b, uncertain) for a, b in recorder.event_windows(lo, hi))
            else:
                out.append((lo, hi, uncertain))
        return out


class RecordingsResource:
    """HTTP handlers over one :class:`Recorder`."""

    def __init__(self, recorder: Recorder, *,
                 recorders: Mapping[str, Recorder] | None = None, max_downloads: int = 4,
                 max_downloads_per_address: int = 2) -> None:
        self.recorder = recorder
        self.max_downloads = max_downloads
        self.max_downloads_per_address = max_downloads_per_address
        self._downloads: collections.Counter[str] = collections.Counter()
        self.downloads_refused = 0
        # Planning and file reads of clips: their own threads, not the default executor that
        # snapshots and picamera2 calls share (an hour's clip must not hold those up).
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_downloads, thread_name_prefix="recordings-get")
        # Every camera's recorder by name when there are several (``recorder`` is the first's).
        self.recorders: Mapping[str, Recorder] = recorders or {}

    async def close(self, _app: web.Application | None = None) -> None:
        """Stop the download threads (at the app's cleanup)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _admit(self, request: web.Request) -> str:
        """Count a download in, or refuse it with 503 + Retry-After beyond the limits."""
        address = request.remote or ""
        total = sum(self._downloads.values())
        if total >= self.max_downloads or (
                self._downloads[address] >= self.max_downloads_per_address):
            self.downloads_refused += 1
            which = ("from this address" if total < self.max_downloads else "in total")
            raise Problem(503, f"too many clip downloads at once {which} "
                               f"(at most {self.max_downloads_per_address} per address, "
                               f"{self.max_downloads} in total); try again shortly",
                          headers={"Retry-After": "5"})
        self._downloads[address] += 1
        return address

    def _release(self, address: str) -> None:
        self._downloads[address] -= 1
        if self._downloads[address] <= 0:
            del self._downloads[address]

    def _recorder(self, request: web.Request) -> Recorder:
        """The recorder of the camera ``?path=`` names, else the default camera's."""
        _check_path(request)
        path = request.query.get("path")
        if path is None:
            return self.recorder
        recorder = self.recorders.get(path)
        if recorder is None:
            raise Problem(404, f"there is no camera named {path!r}; the cameras are "
                               + ", ".join(self.recorders))
        return recorder

    def add_routes(self, app: web.Application) -> None:
        """Register the playback and control routes."""
        app.router.add_get("/recordings/list", self.list)
        app.router.add_get("/recordings/get", self.get)
        app.router.add_delete("/recordings", self.delete)
        app.router.add_get("/api/recording", self.status)
        app.router.add_post("/api/recording/start", self.start)
        app.router.add_post("/api/recording/stop", self.stop)

    async def list(self, request: web.Request) -> web.Response:
        """``GET /recordings/list``: continuous recorded ranges, oldest first."""
        recorder = self._recorder(request)
        start = parse_time("start", request.query["start"]) if "start" in request.query else None
        end = parse_time("end", request.query["end"]) if "end" in request.query else None
        events = request.query.get("events", "")
        if events not in ("", "motion"):
            raise Problem(400, f"events = {events[:20]!r} is not valid: motion (only the "
                               "ranges that hold a motion event) or leave it out")
        windows = recorder.event_windows
        if events and windows is None:
            raise Problem(404, "this camera does not detect motion (motion = false)")
        out: list[dict[str, Any]] = []
        for lo, hi, uncertain in _recorded_ranges(recorder, start, end, events=bool(events)):
            seconds = (hi - lo) / 1e6
            query = urllib.parse.urlencode({"start": rfc3339(lo), "duration": f"{seconds:.6f}",
                                            **({"path": request.query["path"]}
                                               if "path" in request.query else {})})
            out.append({"start": rfc3339(lo), "duration": round(seconds, 6),
                        "url": f"/recordings/get?{query}",
                        # Recorded while the clock was not known to be right: in order, but
                        # its time of day may be wrong.
                        **({"time_uncertain": True} if uncertain else {})})
        return web.json_response(out, headers={"Cache-Control": "no-store"})

    async def get(self, request: web.Request) -> web.StreamResponse:
        """``GET /recordings/get``: the clip as progressive MP4 (default) or fMP4, streamed."""
        recorder = self._recorder(request)
        start = parse_time("start", request.query.get("start"))
        seconds = parse_seconds("duration", request.query.get("duration"), maximum=MAX_CLIP_S)
        fmt = request.query.get("format", "mp4")
        if fmt not in ("mp4", "fmp4"):
            raise Problem(400, f"format = {fmt[:20]!r} is not valid: mp4 or fmp4")
        end = start + round(seconds * 1_000_000)
        # Every segment starts with an IDR, so the one holding `start` holds the IDR before it.
        segments = recorder.archive.overlapping(start, end, recorder.current_segment())
        if not segments:
            raise Problem(404, "nothing is recorded in that range")
        address = self._admit(request)
        try:
            return await self._send_clip(request, segments, start, end, fmt)
        finally:
            self._release(address)

    async def _send_clip(self, request: web.Request, segments: Sequence[Any], start: int,
                         end: int, fmt: str) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        try:
            clip = await loop.run_in_executor(self._executor, plan_clip, segments, start, end,
                                              fmt)
        except ClipError as exc:
            raise Problem(exc.status, exc.reason) from None
        try:
            stamp = rfc3339(clip.start_us).replace(":", "-")
            response = web.StreamResponse(headers={
                "Content-Type": clip.content_type,
                "Content-Disposition": f'inline; filename="ruseon-{stamp}.mp4"',
                "Cache-Control": "no-store",
                "X-Clip-Start": rfc3339(clip.start_us),
                "X-Clip-Duration": f"{clip.duration_us / 1e6:.6f}",
                "X-Clip-Frames": str(clip.frames),
                "X-Clip-Codecs": clip.codecs,
            })
            response.content_length = clip.content_length
            await response.prepare(request)
            if request.method == "HEAD":
                return response
            chunks = clip.read()
            while True:
                data = await loop.run_in_executor(self._executor, next, chunks, None)
                if data is None:
                    break
                await response.write(data)
            await response.write_eof()
            return response
        except OSError:
            # The length was promised: closing early makes the client see an incomplete file
            # rather than a short one that looks whole.
            if request.transport is not None:
                request.transport.close()
            return response
        finally:
            clip.close()

    async def delete(self, request: web.Request) -> web.Response:
        """``DELETE /recordings?start=&duration=``: delete that range from closed segments."""
        recorder = self._recorder(request)
        start = parse_time("start", request.query.get("start"))
        seconds = parse_seconds("duration", request.query.get("duration"),
                                maximum=100 * 365 * 86400)
        result = await recorder.delete_range(start, start + round(seconds * 1_000_000))

        def describe(segments: list[Any]) -> list[dict[str, Any]]:
            return [{"start": rfc3339(s.start_us), "duration": s.duration_us / 1e6,
                     "bytes": s.size} for s in segments]

        return web.json_response({
            "deleted": describe(result["deleted"]),
            "trimmed": describe(result["trimmed"]),
            "kept": [{"start": rfc3339(s.start_us), "duration": s.duration_us / 1e6,
                      "why": "being written" if s.open else "could not be cut"}
                     for s in result["kept"]],
        })

    def metrics(self) -> Iterator[Metric]:
        """The recorder's numbers as ``ruseon_recording_*`` families for ``/metrics``."""
        out = Families()
        out.stats("ruseon_recording", {**self.recorder.stats(),
                                       "downloads": sum(self._downloads.values()),
                                       "downloads_refused_total": self.downloads_refused},
                  "Recording")
        out.stats("ruseon_clock", self.recorder.clock.metrics(), "Wall clock")
        return out.collect()

    async def status(self, request: web.Request) -> web.Response:
        """``GET /api/recording``."""
        recorder = self._recorder(request)
        return web.json_response({**recorder.stats(), "clock": recorder.clock.describe()},
                                 headers={"Cache-Control": "no-store"})

    async def start(self, request: web.Request) -> web.Response:
        """``POST /api/recording/start[?preroll=seconds]``."""
        recorder = self._recorder(request)
        preroll = None
        if "preroll" in request.query:
            preroll = parse_seconds("preroll", request.query["preroll"], maximum=60,
                                    allow_zero=True)
        started = recorder.begin(preroll)
        if not started and not recorder.active:
            # A stop is still closing the last recording (fsync, rename).
            raise Problem(409, "the last recording is still being closed; try again in a moment",
                          headers={"Retry-After": "1"})
        return web.json_response({"started": started, **recorder.stats()})

    async def stop(self, request: web.Request) -> web.Response:
        """``POST /api/recording/stop``."""
        recorder = self._recorder(request)
        stopped = await recorder.end()
        return web.json_response({"stopped": stopped, **recorder.stats()})
