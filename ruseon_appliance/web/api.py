"""The REST API: ``/api/status``, ``/healthz``, ``/snapshot.jpg`` and ``/metrics``."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ruseon_appliance import __version__, build_info
from ruseon_appliance.access.policy import Role
from ruseon_appliance.capture.liveness import stale_after_s
from ruseon_appliance.web import metrics
from ruseon_appliance.web.access import request_role
from ruseon_appliance.web.problem import Problem
from ruseon_appliance.web.snapshot import KeyframeSnapshot, SnapshotError

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from ruseon_appliance.capture.pipeline import CapturePipeline
    from ruseon_appliance.engine.engine import Engine



def _jsonable(value: Any) -> Any:
    """Stats dicts may hold dataclasses, tuples, bytes or non-str keys; JSON takes none of them."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# The parts of /api/status a viewer gets (each filtered further by viewer_status); every other
# section, including any added later, is admin-only by default.
VIEWER_SECTIONS = frozenset({"device", "uptime_s", "source", "webrtc", "viewers", "cameras",
                             "hls", "recording", "recordings", "clock", "access"})


def viewer_status(document: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` as a viewer may see it (see :meth:`DeviceApi.status`)."""
    out = {key: value for key, value in document.items() if key in VIEWER_SECTIONS}
    if "viewers" in out:
        out["viewers"] = {key: out["viewers"].get(key) for key in ("count", "by_transport")
                          if key in out["viewers"]}
    if "webrtc" in out:
        out["webrtc"] = {key: out["webrtc"].get(key)
                         for key in ("fingerprint", "udp_port", "max_viewers")}
    if "access" in out:
        out["access"] = {"viewing": out["access"].get("viewing")}
    return out


def audience(document: Mapping[str, Any]) -> dict[str, int]:
    """Everyone watching, by how (counts only: a viewer may see them): WebRTC sessions, HLS
    clients (an address + user agent seen in the last few seconds), RTSP sessions playing, and
    relays sending (each one media server; whoever watches behind it is not counted here)."""
    hls = document.get("hls") or {}
    rtsp = document.get("rtsp") or {}
    relays = document.get("relays") or []
    return {
        "webrtc": int(document["viewers"]["count"]),
        "hls": int(hls.get("clients") or 0),
        "rtsp": int(rtsp.get("playing") or 0),
        "relays": sum(1 for relay in relays if relay.get("state") == "sending"),
    }


class DeviceApi:
    """Handlers for the device's status, health, snapshot and metrics."""

    def __init__(
        self,
        engine: Engine,
        capture: CapturePipeline,
        *,
        started: float,
        framerate: int,
        web_metrics: metrics.WebMetrics,
        http_errors: dict[int, int],
        snapshot: KeyframeSnapshot,
        max_viewers: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.capture = capture
        self.started = started
        self.framerate = framerate
        self.web_metrics = web_metrics
        self.http_errors = http_errors
        self.snapshot = snapshot
        self.max_viewers = max_viewers
        self.clock = clock
        # Other rooms' parts of the status document and the metrics (e.g. the relays), added by
        # make_app: a section name -> its JSON data, and functions yielding metric families.
        self.status_sections: dict[str, Callable[[], Any]] = {}
        self.metrics_sections: list[metrics.Section] = []
        # This app's metrics: the core families and the sections (this object's collect()),
        # the process collectors; more collectors (each yielding its families) may be
        # registered, and families of one name are joined.
        self.registry = metrics.MetricsRegistry()
        self.registry.register(self)
        metrics.process_collectors(self.registry)
        # ``() -> (how many, [(name, why down), ...])`` (web/cameras.py): /healthz then
        # reports which are down, 503 only when every one is (200 "degraded" otherwise).
        self.cameras_down: Callable[[], tuple[int, list[tuple[str, str]]]] | None = None
        # ``async (stream) -> response``: the default camera's snapshot of that stream
        # (web/cameras.py); None: only the main one.
        self.stream_snapshot: Callable[[str], Awaitable[web.Response]] | None = None

    def add_routes(self, app: web.Application) -> None:
        """Register the API routes (GET also answers HEAD)."""
        app.router.add_get("/api/status", self.status)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/snapshot.jpg", self.snapshot_jpeg)
        app.router.add_get("/metrics", self.metrics)

    def status_document(self) -> dict[str, Any]:
        """Everything ``/api/status`` reports, as plain JSON data."""
        stats = dict(self.capture.stats())
        info = self.capture.stream_info
        sessions = list(self.engine.sessions.values())
        document: dict[str, Any] = _jsonable(
            {
                "device": {"hostname": socket.gethostname(), "software": "ruseon",
                           "version": __version__},
                "uptime_s": round(self.clock() - self.started, 3),
                "source": {
                    "kind": self.capture.source_kind,
                    "width": info.width if info else stats.get("width"),
                    "height": info.height if info else stats.get("height"),
                    "profile_level_id": info.profile_level_id if info else None,
                    "profile": stats.get("profile"),
                    "level": stats.get("level"),
                    "fps": stats.get("fps"),
                    "bitrate": stats.get("bitrate"),
                    "keyframe_age_s": stats.get("keyframe_age_s"),
                    "stats": stats,
                },
                "webrtc": {
                    "fingerprint": self.engine.fingerprint,
                    "udp_port": self.engine.udp_port,
                    "max_viewers": self.max_viewers,
                    "stats": self.engine.stats(),
                },
                "viewers": {
                    "count": len(sessions),
                    "sessions": [
                        {"id": s.id, "state": s.state,
                         "age_s": round(self.clock() - s.created_monotonic, 3),
                         "stats": s.stats()}
                        for s in sessions
                    ],
                },
                "errors": {
                    "http": {str(k): v for k, v in sorted(self.http_errors.items())},
                    "offers_refused": dict(self.web_metrics.offers_refused),
                },
                # The image's commit and locked wheels (admin only: not in VIEWER_SECTIONS).
                "build": build_info.read_build_info(),
            }
        )
        for name, section in self.status_sections.items():
            document[name] = _jsonable(section())
        document["viewers"]["by_transport"] = audience(document)
        return document

    async def status(self, request: web.Request) -> web.Response:
        """``GET /api/status``: everything for admin; for anyone else only what the page shows
        a viewer (counts, the camera, the recording state), never session ids, addresses,
        relay targets or integration settings."""
        document = self.status_document()
        role = request_role(request)
        if role < Role.ADMIN:
            document = viewer_status(document)
        document.setdefault("access", {})["role"] = role.name.lower()
        return web.json_response(document, headers={"Cache-Control": "no-store"})

    def health_problem(self) -> str | None:
        """Why the device is unhealthy, or None when frames flow and the engine is up."""
        if not self.engine.udp_port:
            return "the WebRTC engine is not listening"
        last = self.capture.last_frame_monotonic
        if last is None:
            return f"no frame from the {self.capture.source_kind} source yet"
        limit = stale_after_s(self.framerate)
        age = time.monotonic() - last
        if age > limit:
            return f"no frame from the {self.capture.source_kind} source for {age:.1f} s"
        return None

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``: 200 ``ok``, or 503 with the reason."""
        if self.cameras_down is not None and self.engine.udp_port:
            total, down = self.cameras_down()
            listed = "; ".join(f"{name}: {why}" for name, why in down)
            if down and len(down) == total:
                # One camera: its own words ("no camera detected (probed: ...)").
                detail = down[0][1] if total == 1 else f"every camera is down: {listed}"
                raise Problem(503, detail, headers={"Retry-After": "1"})
            text = f"degraded: {len(down)} of {total} cameras down: {listed}\n" if down else "ok\n"
            return web.Response(text=text, headers={"Cache-Control": "no-store"})
        reason = self.health_problem()
        if reason is not None:
            raise Problem(503, reason, headers={"Retry-After": "1"})
        return web.Response(text="ok\n", headers={"Cache-Control": "no-store"})

    async def snapshot_jpeg(self, request: web.Request) -> web.Response:
        """``GET /snapshot.jpg``: the newest keyframe as a JPEG (``?stream=sub``: of the
        default camera's sub-stream, through :attr:`stream_snapshot`)."""
        stream = request.query.get("stream", "main")
        if stream != "main" or self.stream_snapshot is not None:
            if self.stream_snapshot is None:
                raise Problem(404, f"there is no stream {stream!r} here; the stream is main")
            return await self.stream_snapshot(stream)
        return await snapshot_response(self.snapshot)

    def collect(self) -> Iterator[Metric]:
        """The core families and every section's, for :attr:`registry`."""
        yield from metrics.core_families(
            self.web_metrics,
            sessions=list(self.engine.sessions.values()),
            engine_stats=self.engine.stats(),
            capture_stats=self.capture.stats(),
            http_errors=self.http_errors,
        )
        for section in self.metrics_sections:
            yield from section()

    async def metrics(self, request: web.Request) -> web.Response:
        """``GET /metrics`` in the Prometheus text format."""
        response = web.Response(body=self.registry.text().encode())
        response.headers["Content-Type"] = metrics.CONTENT_TYPE
        return response


async def snapshot_response(snapshot: KeyframeSnapshot) -> web.Response:
    """The newest keyframe of ``snapshot``'s camera as a JPEG answer (503 while none)."""
    try:
        shot = await snapshot.latest()
    except SnapshotError as exc:
        raise Problem(503, str(exc), headers={"Retry-After": "1"}) from None
    if shot is None:
        raise Problem(503, "no keyframe captured yet", headers={"Retry-After": "1"})
    return web.Response(
        body=shot.jpeg,
        content_type="image/jpeg",
        headers={
            "Cache-Control": "no-store",
            "ETag": f'"kf-{shot.keyframe_seq}"',
            "X-Capture-Time-Us": str(shot.capture_time_us),
        },
    )
