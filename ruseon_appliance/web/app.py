"""Builds the aiohttp application: the device page, WHEP, the REST API and metrics.

Middleware order, outermost first: CORS (answers preflights before anything else and adds its
headers to every answer, errors included), problem details (turns every error into
``application/problem+json``), then Bearer authentication.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from ruseon_appliance.cameras import Camera, CameraSet
from ruseon_appliance.web.api import DeviceApi
from ruseon_appliance.web.auth import auth_middleware
from ruseon_appliance.web.cameras import CamerasResource
from ruseon_appliance.web.cors import cors_middleware
from ruseon_appliance.web.hls import HlsResource
from ruseon_appliance.web.metrics import WebMetrics
from ruseon_appliance.web.problem import ERROR_COUNTS, MAX_BODY_BYTES, problem_middleware
from ruseon_appliance.web.recordings import RecordingsResource
from ruseon_appliance.web.relay import RelayResource
from ruseon_appliance.web.snapshot import KeyframeSnapshot
from ruseon_appliance.web.whep import WhepResource

if TYPE_CHECKING:
    from ruseon_appliance.capture.pipeline import CapturePipeline
    from ruseon_appliance.config import Config
    from ruseon_appliance.engine.engine import Engine
    from ruseon_appliance.hls import HlsStream
    from ruseon_appliance.recording import Recorder
    from ruseon_appliance.relay import RtpRelay

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"

# Everything but the page itself, its static files and the health probe needs the token.
_OPEN_PATHS = frozenset({"/", "/healthz", "/favicon.ico"})

WEB_METRICS: web.AppKey[WebMetrics] = web.AppKey("web_metrics", WebMetrics)
WHEP: web.AppKey[WhepResource] = web.AppKey("whep", WhepResource)
DEVICE_API: web.AppKey[DeviceApi] = web.AppKey("device_api", DeviceApi)
HLS: web.AppKey[HlsResource] = web.AppKey("hls", HlsResource)
CAMERAS: web.AppKey[CamerasResource] = web.AppKey("cameras", CamerasResource)


def needs_token(request: web.Request) -> bool:
    """True for WHEP, the API, the snapshot and metrics; False for the page and ``/healthz``."""
    path = request.path
    return path not in _OPEN_PATHS and not path.startswith("/static/")


def token_in_query(request: web.Request) -> bool:
    """Only HLS takes ``?token=``: native players (Safari) cannot add a header to the requests
    they make for the playlist's parts."""
    return request.path.startswith("/hls/")


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
    recorders: Mapping[str, Recorder] | None = None,
) -> web.Application:
    """The web application for one engine and one capture pipeline.

    ``started`` is the service's start time (``time.monotonic()``), for ``/api/status``'s uptime;
    ``relays`` get ``/relay/<name>.sdp`` and their part of the status and metrics; ``hls``, when
    given, is served under ``/hls/``.
    ``recorder`` adds the playback API and recording control (web/recordings.py).
    ``recorders`` (by camera name, with several cameras) are chosen with ``?path=<camera>``.
    ``cameras`` (default: ``capture`` alone) get ``/whep/<camera>``, ``/snapshot/<camera>.jpg``
    and their part of status, metrics and health; ``capture`` is the first of them.
    """
    token = config.auth.resolve_token()
    max_body = config.http.max_offer_bytes
    app = web.Application(
        client_max_size=max_body,
        middlewares=[
            cors_middleware(config.http.cors_origins),
            problem_middleware,
            auth_middleware(token, needs_token, token_in_query),
        ],
    )
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

    api = DeviceApi(
        engine,
        capture,
        started=started,
        framerate=config.camera.framerate,
        web_metrics=web_metrics,
        http_errors=app[ERROR_COUNTS],
        snapshot=KeyframeSnapshot(capture),
        max_viewers=config.webrtc.max_viewers,
    )
    api.add_routes(app)
    app[DEVICE_API] = api
    if cameras is None:
        cameras = CameraSet([Camera(capture.camera, pipeline=capture)])
    app[CAMERAS] = CamerasResource(cameras, engine, whep, api.snapshot)
    app[CAMERAS].add_routes(app, api)

    if relays:
        relay_resource = RelayResource(relays, capture, captures={
            r.name: (cameras.get(r.config.camera) or cameras.first).pipeline for r in relays})
        relay_resource.add_routes(app)
        api.status_sections["relays"] = relay_resource.status
        api.metrics_sections.append(relay_resource.metrics)

    if hls is not None:
        hls_resource = HlsResource(hls, token_required=bool(token))
        hls_resource.add_routes(app)
        api.status_sections["hls"] = hls_resource.status
        api.metrics_sections.append(hls_resource.metrics_text)
        app[HLS] = hls_resource

    if recorder is not None:
        recordings = RecordingsResource(
            recorder, recorders=recorders, max_downloads=config.recording.max_downloads,
            max_downloads_per_address=config.recording.max_downloads_per_address)
        app.on_cleanup.append(recordings.close)
        if recorders and len(recorders) > 1:
            api.status_sections["recordings"] = lambda: {
                name: r.stats() for name, r in recorders.items()}
        recordings.add_routes(app)
        api.status_sections["recording"] = recorder.stats
        api.status_sections["clock"] = recorder.clock.describe
        api.metrics_sections.append(recordings.metrics)

    app.router.add_get("/", _device_page)
    app.router.add_static("/static/", STATIC_DIR, append_version=False)
    return app
