"""Builds the aiohttp application: the device page, WHEP, the REST API and metrics.

Middleware order, outermost first: the Host allow-list (DNS rebinding: a foreign name is
refused before anything else), CORS (answers preflights and adds its headers to every answer,
errors included), problem details (turns every error into ``application/problem+json``), then
access control (web/access.py: every route's level is in access/policy.py, and the app does
not start with a route that is not there).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from ruseon_appliance.access.credentials import Credentials
from ruseon_appliance.access.hosts import HostAllowList
from ruseon_appliance.access.policy import unclassified_routes
from ruseon_appliance.cameras import Camera, CameraSet
from ruseon_appliance.web.access import SessionResource, access_middleware, host_middleware
from ruseon_appliance.web.api import DeviceApi
from ruseon_appliance.web.audio import AudioControlResource, audio_metrics
from ruseon_appliance.web.cameras import CamerasResource
from ruseon_appliance.web.controls import ControlsResource
from ruseon_appliance.web.cors import cors_middleware
from ruseon_appliance.web.event_stream import EventStreamResource
from ruseon_appliance.web.events import EventsResource, MotionControlResource
from ruseon_appliance.web.hls import HlsMetrics, HlsResource, MultivariantResource, Rendition
from ruseon_appliance.web.metrics import Families, WebMetrics
from ruseon_appliance.web.problem import ERROR_COUNTS, MAX_BODY_BYTES, problem_middleware
from ruseon_appliance.web.recordings import RecordingsResource
from ruseon_appliance.web.relay import RelayResource
from ruseon_appliance.web.snapshot import KeyframeSnapshot
from ruseon_appliance.web.whep import WhepResource

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from ruseon_appliance.capture.pipeline import CapturePipeline
    from ruseon_appliance.config import Config
    from ruseon_appliance.engine.engine import Engine
    from ruseon_appliance.events import EventBus
    from ruseon_appliance.hls import HlsStream
    from ruseon_appliance.recording import Recorder
    from ruseon_appliance.relay import RtpRelay

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"

WEB_METRICS: web.AppKey[WebMetrics] = web.AppKey("web_metrics", WebMetrics)
WHEP: web.AppKey[WhepResource] = web.AppKey("whep", WhepResource)
DEVICE_API: web.AppKey[DeviceApi] = web.AppKey("device_api", DeviceApi)
HLS: web.AppKey[HlsResource] = web.AppKey("hls", HlsResource)
CAMERAS: web.AppKey[CamerasResource] = web.AppKey("cameras", CamerasResource)
CREDENTIALS: web.AppKey[Credentials] = web.AppKey("credentials", Credentials)


async def _refuse_unclassified_routes(app: web.Application) -> None:
    """Start-up check: every route has its access level in access/policy.py."""
    missing = unclassified_routes(
        (route.method, route.resource.canonical)
        for route in app.router.routes() if route.resource is not None)
    if missing:
        raise RuntimeError("routes without an access level in access/policy.py: "
                           + ", ".join(sorted(set(missing))))


async def _device_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(
        STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"}
    )


def make_app(
    config: Config, engine: Engine, capture: CapturePipeline, *, started: float,
    relays: Sequence[RtpRelay] = (),
    hls: HlsStream | None = None,
    recorder: Recorder | None = None,
    cameras: CameraSet | None = None,
    credentials: Credentials | None = None,
    bus: EventBus | None = None,
) -> web.Application:
    """The web application for one engine and the cameras.

    ``started`` is the service's start time (``time.monotonic()``), for ``/api/status``'s uptime;
    ``relays`` get ``/relay/<name>.sdp`` and their part of the status and metrics.
    ``cameras`` get ``/whep/<camera>``, ``/snapshot/<camera>.jpg``, ``/hls/<camera>/`` (with an
    HLS stream), ``/api/camera/<camera>/controls`` (with controls), the playback API's
    ``?path=<camera>`` (with a recorder) and their part of status, metrics and health; the
    unnamed routes serve the default camera, whose pipeline ``capture`` is. Without ``cameras``,
    ``capture`` is the one camera, with ``hls`` and ``recorder`` as its parts (tests, bench).
    ``credentials`` (default: built from ``config.auth`` and ``config.state.dir``, generating the
    admin secret there on a first start) decide who may view and administer. ``bus`` (the
    appliance's bus) feeds ``/api/events/stream``.
    """
    if credentials is None:
        credentials = Credentials.from_config(config.auth, config.state.dir)
    max_body = config.http.max_offer_bytes
    app = web.Application(
        client_max_size=max_body,
        middlewares=[
            host_middleware(HostAllowList(config.http.hosts)),
            cors_middleware(config.http.cors_origins),
            problem_middleware,
            access_middleware(credentials, config.http.trusted_proxy_networks()),
        ],
    )
    app[CREDENTIALS] = credentials
    app.on_startup.append(_refuse_unclassified_routes)
    SessionResource(credentials).add_routes(app)
    app[ERROR_COUNTS] = {}
    app[MAX_BODY_BYTES] = max_body
    web_metrics = WebMetrics()
    app[WEB_METRICS] = web_metrics
    engine.add_listener(web_metrics.on_session_event)

    whep = WhepResource(
        engine,
        ice_servers=config.webrtc.ice_servers,
        max_body_bytes=max_body,
        metrics=web_metrics,
    )
    whep.add_routes(app)
    app[WHEP] = whep

    if cameras is None:
        alone = Camera(capture.camera, pipeline=capture)
        alone.hls, alone.recorder = hls, recorder
        cameras = CameraSet([alone])
    default = cameras.default
    api = DeviceApi(
        engine,
        default.pipeline,
        started=started,
        framerate=default.config.framerate,
        web_metrics=web_metrics,
        http_errors=app[ERROR_COUNTS],
        snapshot=KeyframeSnapshot(default.pipeline),
        max_viewers=config.webrtc.max_viewers,
    )
    api.add_routes(app)
    app[DEVICE_API] = api
    app[CAMERAS] = CamerasResource(cameras, engine, whep, api.snapshot)
    app[CAMERAS].add_routes(app, api)

    if relays:
        relay_resource = RelayResource(relays, default.pipeline, captures={
            r.name: (cameras.resolve(r.config.camera) or default).pipeline for r in relays})
        relay_resource.add_routes(app)
        api.status_sections["relays"] = relay_resource.status
        api.metrics_sections.append(relay_resource.metrics)

    _add_camera_routes(app, api, config, cameras, credentials)
    events = EventsResource({c.name: c.motion for c in cameras if c.motion is not None},
                            cameras.names, cameras.default.name)
    events.add_routes(app)
    stream = EventStreamResource(events.monitors, bus)
    stream.add_routes(app)
    api.status_sections["event_stream"] = stream.stats
    for camera in cameras:
        if camera.motion is not None:
            MotionControlResource(camera.motion, f"/api/camera/{camera.name}/motion"
                                  ).add_routes(app)
            if camera is cameras.default:
                MotionControlResource(camera.motion, "/api/camera/motion").add_routes(app)
    _add_audio_routes(app, api, cameras)
    if events.monitors:
        api.status_sections["motion"] = events.status
        api.metrics_sections.append(events.metrics)
    api.status_sections["access"] = credentials.stats
    api.metrics_sections.append(lambda: access_metrics(credentials))
    app.router.add_get("/", _device_page)
    app.router.add_static("/static/", STATIC_DIR, append_version=False)
    return app


def _renditions(camera: Camera, prefix: str) -> list[Rendition]:
    """The camera's HLS renditions as the multivariant playlist under ``prefix`` names them:
    the main stream's media playlist beside it, the sub-stream's under ``<camera>/sub/``."""
    def picture(pipeline: CapturePipeline) -> tuple[int, int]:
        info = pipeline.stream_info  # what the camera really sends, else what it was asked
        return (info.width, info.height) if info else (pipeline.camera.width,
                                                       pipeline.camera.height)

    main = camera.pipeline
    assert camera.hls is not None
    out = [Rendition("index.m3u8", camera.hls, lambda: picture(main),
                     lambda: main.camera.bitrate)]
    sub, sub_hls = camera.sub, camera.sub_hls
    if sub is not None and sub_hls is not None:
        uri = "sub/index.m3u8" if prefix != "/hls/" else f"{camera.name}/sub/index.m3u8"
        out.append(Rendition(uri, sub_hls, lambda: picture(sub), lambda: sub.camera.bitrate))
    return out


def _add_camera_routes(app: web.Application, api: DeviceApi, config: Config,
                       cameras: CameraSet, credentials: Credentials) -> None:
    """Every camera's HLS, controls and recordings routes; the default camera's also at the
    unnamed paths (``/hls/``, ``/api/camera/controls``, the playback API without ``?path=``)."""
    default = cameras.default
    token_required = not credentials.viewing_open
    hls_metrics = HlsMetrics()  # requests to every camera's HLS count together (board load)
    for camera in cameras:
        if camera.hls is None:
            continue
        prefixes = [f"/hls/{camera.name}/"] + (["/hls/"] if camera is default else [])
        for prefix in prefixes:
            # The multivariant playlist first: /hls/<camera>/{name} would take its name.
            MultivariantResource(_renditions(camera, prefix), token_required=token_required,
                                 prefix=prefix, metrics=hls_metrics).add_routes(app)
            resource = HlsResource(camera.hls, token_required=token_required, prefix=prefix,
                                   metrics=hls_metrics)
            resource.add_routes(app)
            if prefix == "/hls/":
                app[HLS] = resource
        if camera.sub_hls is not None:
            # The sub-stream's media playlist and files: /hls/<camera>/sub/ only (an unnamed
            # /hls/sub/ would be a camera named "sub").
            HlsResource(camera.sub_hls, token_required=token_required,
                        prefix=f"/hls/{camera.name}/sub/", metrics=hls_metrics).add_routes(app)
    if HLS in app:
        streams = {c.name: c.hls for c in cameras if c.hls is not None}
        sub_streams = {c.name: c.sub_hls for c in cameras if c.sub_hls is not None}
        default_hls = app[HLS]
        api.status_sections["hls"] = lambda: {
            **default_hls.status(), "cameras": {n: s.stats() for n, s in streams.items()},
            "sub_streams": {n: s.stats() for n, s in sub_streams.items()}}
        api.metrics_sections.append(default_hls.metrics_families)
    for camera in cameras:
        if camera.controls is None:
            continue
        ControlsResource(camera.controls, path=f"/api/camera/{camera.name}/controls"
                         ).add_routes(app)
        if camera is default:
            ControlsResource(camera.controls).add_routes(app)
    recorders = {c.name: c.recorder for c in cameras if c.recorder is not None}
    if default.recorder is not None:
        recordings = RecordingsResource(
            default.recorder, recorders=recorders, max_downloads=config.recording.max_downloads,
            max_downloads_per_address=config.recording.max_downloads_per_address)
        app.on_cleanup.append(recordings.close)
        recordings.add_routes(app)
        api.status_sections["recording"] = default.recorder.stats
        api.status_sections["recordings"] = lambda: {
            name: r.stats() for name, r in recorders.items()}
        api.status_sections["clock"] = default.recorder.clock.describe
        api.metrics_sections.append(recordings.metrics)
    api.metrics_sections.append(lambda: camera_parts_metrics(cameras))


def camera_parts_metrics(cameras: CameraSet) -> Iterator[Metric]:
    """Every camera's recorder and HLS stream figures, labelled ``camera``
    (``ruseon_camera_recording_*``, ``ruseon_camera_hls_*``, ``ruseon_camera_sub_hls_*`` for a
    sub-stream's rendition); the unlabelled
    ``ruseon_recording_*`` and ``ruseon_hls_stream_*`` are the default camera's, kept as
    aliases for existing dashboards."""
    out = Families()
    for camera in cameras:
        labels = {"camera": camera.name}
        if camera.recorder is not None:
            out.stats("ruseon_camera_recording", camera.recorder.stats(), "Recording by camera",
                      labels)
        if camera.hls is not None:
            out.stats("ruseon_camera_hls", {k: v for k, v in camera.hls.stats().items()
                                            if not k.startswith("blocking_")},
                      "HLS live window by camera", labels)
        if camera.sub_hls is not None:
            out.stats("ruseon_camera_sub_hls", {k: v for k, v in camera.sub_hls.stats().items()
                                                if not k.startswith("blocking_")},
                      "HLS live window of the sub-stream by camera", labels)
    return out.collect()


def access_metrics(credentials: Credentials) -> Iterator[Metric]:
    """``ruseon_auth_*``: failed and throttled authentications by protocol, login sessions."""
    out = Families()
    throttle = credentials.throttle
    failures = out.counter("ruseon_auth_failures_total",
                           "Wrong credentials presented (HTTP Bearer/login, RTSP, ONVIF).",
                           ["protocol"])
    throttled = out.counter(
        "ruseon_auth_throttled_total",
        "Requests refused (429) while their address waits after wrong credentials.",
        ["protocol"])
    for protocol in ("http", "rtsp", "onvif"):
        failures.add_metric([protocol], throttle.failures.get(protocol, 0))
        throttled.add_metric([protocol], throttle.throttled.get(protocol, 0))
    out.gauge("ruseon_auth_addresses_waiting",
              "Client addresses that must wait before their next credential.").add_metric(
        [], throttle.addresses_waiting())
    sessions = out.gauge("ruseon_auth_sessions", "Page login sessions by role.", ["role"])
    count = credentials.sessions.count()
    for role in ("viewer", "admin"):
        sessions.add_metric([role], count.get(role, 0))
    out.counter("ruseon_auth_secret_rotations_total",
                "Secret files that changed while running (their sessions ended).").add_metric(
        [], credentials.rotations)
    return out.collect()


def _add_audio_routes(app: web.Application, api: DeviceApi, cameras: CameraSet) -> None:
    """Each camera with sound: ``/api/camera/<name>/audio`` (and ``/api/camera/audio`` for the
    default camera), ``ruseon_audio_*`` in ``/metrics``."""
    pipelines = {c.name: c.audio for c in cameras if c.audio is not None}
    for camera in cameras:
        if camera.audio is not None:
            AudioControlResource(camera.audio, f"/api/camera/{camera.name}/audio"
                                 ).add_routes(app)
            if camera is cameras.default:
                AudioControlResource(camera.audio, "/api/camera/audio").add_routes(app)
    if pipelines:
        api.metrics_sections.append(lambda: audio_metrics(pipelines))
