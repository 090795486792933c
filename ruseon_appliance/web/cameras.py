"""Per-camera routes: ``POST /whep/<camera>``, ``/snapshot/<camera>.jpg``, ``/api/cameras``,
the ``cameras`` part of ``/api/status``, ``/metrics`` labelled by camera, and which cameras are
down for ``/healthz``.

A camera's stream is chosen by name, ``main`` (the default) or ``sub`` (its sub-stream):
``POST /whep/<camera>/sub``, ``/whep/<camera>?stream=sub``, ``/whep?stream=sub`` (the default
camera's), ``/snapshot/<camera>.jpg?stream=sub`` and ``/snapshot.jpg?stream=sub``. An unknown
stream, or ``sub`` of a camera without one, is a 404 saying so.

``/whep`` and ``/snapshot.jpg`` stay the first camera's. An unknown name is a 404 that lists the
names there are. The engine is handed the camera's pipeline as the session's feed; it never
sees the name (sessions are mapped back to cameras by their ``feed``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web

from ruseon_appliance.web.api import DeviceApi, snapshot_response
from ruseon_appliance.web.metrics import Families
from ruseon_appliance.web.problem import Problem
from ruseon_appliance.web.snapshot import KeyframeSnapshot
from ruseon_appliance.web.whep import ENDPOINT_METHODS, SDP, WhepResource

# Per-camera families from each camera's status row: (name, help, row key); a name ending in
# _total is a counter.
_FIGURES = (
    ("ruseon_camera_viewers", "Live WHEP viewers by camera (both streams).", "viewers"),
    ("ruseon_camera_start_failures_total",
     "Failed starts of the camera's source (each is retried).", "start_failures"),
)
# Per-stream families (labels camera and stream="main"|"sub"): the figures of each of a
# camera's streams; {stream="main"} is what these families held before sub-streams.
_STREAM_FIGURES = (
    ("ruseon_camera_frames_captured_total", "Access units from the camera.", "frames_in"),
    ("ruseon_camera_frames_dropped_total", "Access units dropped before the ring.",
     "frames_dropped"),
    ("ruseon_camera_fps", "Measured frame rate.", "fps"),
    ("ruseon_camera_bitrate_bps", "Measured bit rate.", "bitrate"),
    ("ruseon_camera_keyframe_age_seconds", "Age of the newest keyframe.", "keyframe_age_s"),
)

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from ruseon_appliance.cameras import Camera, CameraSet
    from ruseon_appliance.capture.pipeline import CapturePipeline
    from ruseon_appliance.engine.engine import Engine

STREAMS = ("main", "sub")


class CamerasResource:
    """The routes and figures that name a camera."""

    def __init__(self, cameras: CameraSet, engine: Engine, whep: WhepResource,
                 default_snapshot: KeyframeSnapshot) -> None:
        self.cameras = cameras
        self.engine = engine
        self.whep = whep
        # The first camera's snapshot is the one /snapshot.jpg already caches.
        self._snapshots = {(cameras.default.name, "main"): default_snapshot}
        whep.camera_problem = self._problem_of
        whep.choose_feed = self._default_feed
        whep.audio_of = self._audio_of

    def _problem_of(self, feed: object) -> str | None:
        camera = self.cameras.default if feed is None else self.cameras.of_feed(feed)
        if camera is None:
            return None
        if camera.sub is not None and feed is camera.sub:
            return camera.sub_problem()
        return camera.problem()

    def _audio_of(self, feed: object) -> object:
        """The sound a viewer of ``feed`` gets (either stream of a camera has the camera's)."""
        camera = self.cameras.default if feed is None else self.cameras.of_feed(feed)
        return None if camera is None else camera.audio

    def feed(self, camera: Camera, stream: str) -> CapturePipeline:
        """``camera``'s pipeline of ``stream``, or a 404 saying why there is none."""
        if stream not in STREAMS:
            raise Problem(404, f"there is no stream {stream!r}; a camera's streams are "
                               + ", ".join(STREAMS))
        pipeline = camera.stream(stream)
        if pipeline is None:
            raise Problem(404, f"camera {camera.name!r} has no sub-stream: {camera.sub_reason}")
        return pipeline

    def _default_feed(self, stream: str) -> CapturePipeline | None:
        """``/whep?stream=``: None (the engine's default) for main, else the default
        camera's sub-stream."""
        pipeline = self.feed(self.cameras.default, stream)
        return None if stream == "main" else pipeline

    def add_routes(self, app: web.Application, api: DeviceApi) -> None:
        """Register the routes and this resource's parts of status, metrics and health."""
        app.router.add_route("OPTIONS", "/whep/{camera}", self.options_endpoint)
        app.router.add_route("POST", "/whep/{camera}", self.post_offer)
        app.router.add_route("*", "/whep/{camera}", self.endpoint_not_allowed)
        app.router.add_route("OPTIONS", "/whep/{camera}/{stream}", self.options_endpoint)
        app.router.add_route("POST", "/whep/{camera}/{stream}", self.post_offer)
        app.router.add_route("*", "/whep/{camera}/{stream}", self.endpoint_not_allowed)
        app.router.add_get("/snapshot/{camera}.jpg", self.snapshot_jpeg)
        api.stream_snapshot = self._default_snapshot
        app.router.add_get("/api/cameras", self.list_cameras)
        api.status_sections["cameras"] = self.status
        api.metrics_sections.append(self.metrics)
        api.cameras_down = lambda: (len(self.cameras), self.cameras.down())

    def add_fallback_routes(self, app: web.Application) -> None:
        """After every camera's own HLS and controls routes: an unknown camera there is the
        same 404 listing the names as on ``/whep/<camera>`` (not aiohttp's bare 'Not Found').
        Registered last because aiohttp takes the first route that matches."""
        app.router.add_get("/hls/{camera}/{tail:.*}", self.not_here)
        app.router.add_get("/api/camera/{camera}/controls", self.not_here)
        app.router.add_patch("/api/camera/{camera}/controls", self.not_here)

    async def not_here(self, request: web.Request) -> web.Response:
        """404: no such camera (listing the names), or nothing at this path for a known one."""
        camera = self.camera(request)
        raise Problem(404, f"camera {camera.name!r} has nothing at {request.path}")

    def camera(self, request: web.Request) -> Camera:
        """The camera the path names, or a 404 listing the names there are."""
        name = request.match_info["camera"]
        camera = self.cameras.get(name)
        if camera is None:
            raise Problem(404, f"there is no camera named {name!r}; the cameras are "
                               + ", ".join(self.cameras.names))
        return camera

    def _requested_stream(self, request: web.Request) -> str:
        """The stream a request names: ``/whep/<camera>/<stream>`` or ``?stream=``."""
        return request.match_info.get("stream") or request.query.get("stream", "main")

    async def options_endpoint(self, request: web.Request) -> web.Response:
        """What a camera's WHEP endpoint accepts."""
        self.feed(self.camera(request), self._requested_stream(request))
        return web.Response(status=204, headers={"Allow": ENDPOINT_METHODS, "Accept-Post": SDP})

    async def endpoint_not_allowed(self, request: web.Request) -> web.Response:
        """Anything but POST/OPTIONS on a camera's WHEP endpoint: 405 with ``Allow``."""
        self.feed(self.camera(request), self._requested_stream(request))
        raise Problem(405, f"{request.method} is not allowed on {request.path}; POST an SDP offer",
                      headers={"Allow": ENDPOINT_METHODS, "Accept-Post": SDP})

    async def post_offer(self, request: web.Request) -> web.Response:
        """``POST /whep/<camera>`` (``/whep/<camera>/sub``, ``?stream=sub``): a viewer session
        of that camera's stream."""
        feed = self.feed(self.camera(request), self._requested_stream(request))
        return await self.whep.answer_offer(request, feed=feed)

    async def snapshot_jpeg(self, request: web.Request) -> web.Response:
        """``GET /snapshot/<camera>.jpg`` (``?stream=sub``): that stream's newest keyframe as
        a JPEG."""
        return await self._snapshot(self.camera(request), request.query.get("stream", "main"))

    async def _default_snapshot(self, stream: str) -> web.Response:
        return await self._snapshot(self.cameras.default, stream)

    async def _snapshot(self, camera: Camera, stream: str) -> web.Response:
        pipeline = self.feed(camera, stream)
        snapshot = self._snapshots.get((camera.name, stream))
        if snapshot is None:
            snapshot = self._snapshots[camera.name, stream] = KeyframeSnapshot(pipeline)
        return await snapshot_response(snapshot)

    def _viewers(self) -> Counter[tuple[str, str]]:
        """Live sessions by (camera, stream)."""
        counts: Counter[tuple[str, str]] = Counter()
        for session in self.engine.sessions.values():
            feed = getattr(session, "feed", None)
            camera = self.cameras.of_feed(feed)
            if camera is not None:
                counts[camera.name, self.cameras.stream_of_feed(feed)] += 1
        return counts

    def status(self) -> list[dict[str, object]]:
        """Every camera with its figures, in configured order (``/api/status`` ``cameras``)."""
        viewers = self._viewers()
        rows = []
        for camera in self.cameras:
            row = camera.status(viewers[camera.name, "main"] + viewers[camera.name, "sub"])
            substream = row["substream"]
            if isinstance(substream, dict) and substream.get("enabled"):
                substream["viewers"] = viewers[camera.name, "sub"]
            rows.append(row)
        return rows

    async def list_cameras(self, request: web.Request) -> web.Response:
        """``GET /api/cameras``: the same list, for the page's grid."""
        return web.json_response({"cameras": self.status()},
                                 headers={"Cache-Control": "no-store"})

    def metrics(self) -> Iterator[Metric]:
        """Per-camera families, labelled ``camera="<name>"``."""
        out = Families()
        up = out.gauge("ruseon_camera_up", "1 while the camera delivers frames.", ["camera"])
        figures = [(out.family(name, help_text, ["camera"]), key)
                   for name, help_text, key in _FIGURES]
        per_stream = [(out.family(name, help_text, ["camera", "stream"]), key)
                      for name, help_text, key in _STREAM_FIGURES]
        stream_up = out.gauge("ruseon_camera_stream_up",
                              "1 while the camera's stream delivers frames.", ["camera", "stream"])
        stream_viewers = out.gauge("ruseon_camera_stream_viewers",
                                   "Live WHEP viewers by camera and stream.", ["camera", "stream"])
        viewers = self._viewers()
        for row in self.status():
            camera = str(row["name"])
            up.add_metric([camera], int(bool(row["up"])))
            for family, key in figures:
                value = row[key]
                if value is None or isinstance(value, int | float):
                    family.add_metric([camera], float(value or 0))
            streams: list[tuple[str, dict[str, object]]] = [("main", row)]
            substream = row["substream"]
            if isinstance(substream, dict) and substream.get("enabled"):
                streams.append(("sub", substream))
            for stream, figures_of in streams:
                stream_up.add_metric([camera, stream], int(bool(figures_of["up"])))
                stream_viewers.add_metric([camera, stream], viewers[camera, stream])
                for family, key in per_stream:
                    value = figures_of.get(key)
                    if value is None or isinstance(value, int | float):
                        family.add_metric([camera, stream], float(value or 0))
        return out.collect()
