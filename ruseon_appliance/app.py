"""The composition root: builds source → ring → engine → web once and owns their lifecycle.

Nothing else creates long-lived objects or reads the configuration. Start-up order matters for
systemd: ``READY=1`` is sent only once HTTP is listening, the engine is up and the first frame is
in the ring, so ``systemctl start`` returning means the camera page works.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .access.credentials import Credentials
from .cameras import Camera
from .cameras.assembly import assemble_cameras
from .cameras.camera import STUCK_S
from .cameras.layout import camera_dir, migrate_top_level
from .capture.pipeline import CapturePipeline
from .capture.sources.base import SourceUnavailable
from .clock import WallClock
from .config import Config, ConfigError
from .engine.engine import (
    GOP_CATCH_UP_MAX_S,
    Engine,
    default_advertise,
)
from .events import Event, EventBus, session_listener
from .heap import release_free_heap
from .listening import bind_every_host
from .relay import RtpRelay
from .rtsp import RtspServer, RtspSource
from .rtsp.server import METRICS as RTSP_METRICS
from .shutdown import StopSignals, bounded, until_stopped
from .stream.fanout import Fanout
from .systemd_integration import SystemdNotifier
from .web import https_certificate
from .web.app import CAMERAS, DEVICE_API, make_app
from .web.https_certificate import HttpsCertificate
from .web.metrics import Families
from .web.snapshot import KeyframeSnapshot
from .webhooks import WebhookSender

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from .mqtt import HomeAssistantMqtt
    from .mqtt.publisher import SnapshotSource
    from .onvif import DiscoveryResponder, OnvifDevice

log = logging.getLogger("ruseon")

# How long start-up waits for the camera's first frame before giving up (a Pi camera takes ~1 s).
FIRST_FRAME_TIMEOUT_S = 20.0
# The collector's thresholds once started (CPython's default: 700, 10, 10). A running
# appliance allocates per frame and per request (1500 frames/s at 50 cameras), and most of it
# dies young by reference counting: with 700, 50 file cameras, 30 WHEP, 30 LL-HLS clients and
# REST (bench/seedload.py) spent 1.17 s per minute in 1,700 collections (each young one
# walking what still lives) and POST->201 p95 was 42 ms; with 50,000: 43 ms per minute in 6
# (about 7 ms each, below a frame interval), p95 39 ms, RSS the same (331 MiB).
GC_THRESHOLDS = (50_000, 20, 20)
# Graceful shutdown budget; then the process ends anyway SHUTDOWN_HARD_S after the signal
# (systemd's TimeoutStopSec in the unit is larger, so our own log says what was stuck).
SHUTDOWN_TIMEOUT_S = 10.0
SHUTDOWN_HARD_S = 15.0
# How long a start-up cancelled by a signal may take to unwind before the stop begins.
START_CANCEL_GRACE_S = 2.0
# How often STATUS= is refreshed for `systemctl status`.
STATUS_INTERVAL_S = 5.0


class Appliance:
    """The running appliance: a capture pipeline per camera, one engine, one web server."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.notifier = SystemdNotifier.from_environment()
        # Whether the wall clock is right, and its steps (the archive's times depend on it).
        rec = config.recording
        self.clock = WallClock(Path(rec.clock_sync_file) if rec.clock_sync_file else None)
        # Events (viewer joined/left, camera stalled/recovered, recording) for MQTT and webhooks.
        self.events = EventBus()
        # Every camera with its own controls, recorder, HLS stream and watchers, all built the
        # same way. A camera whose source cannot run (missing, unplugged, a library not
        # installed) is reported and retried; it never stops start-up: a service that fails to
        # start is restarted until systemd's start limit gives up on the board.
        self.cameras = assemble_cameras(config, clock=self.clock, events=self.events)
        for camera in self.cameras:
            assert camera.controls is not None
            camera.controls.on_change = (lambda changed, restarted, cam=camera:
                                         self._controls_changed(cam, changed, restarted))
        self.engine: Engine | None = None
        self.relays: list[RtpRelay] = []
        # The relays' fan-outs (by camera) when the engine has none (send_path = "aiortc").
        self._relay_fanouts: dict[str, Fanout] = {}
        self.rtsp: RtspServer | None = None
        self._runner: web.AppRunner | None = None
        # The HTTP server's certificate, with http.tls = "self-signed" or tls_cert / tls_key.
        self.https: HttpsCertificate | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.started = time.monotonic()  # uptime: a wall-clock step must not move it
        self.webhooks = [WebhookSender(hook) for hook in config.webhook]
        self.mqtt: HomeAssistantMqtt | None = None
        self.onvif: OnvifDevice | None = None
        self.discovery: DiscoveryResponder | None = None

    @property
    def capture(self) -> CapturePipeline:
        """The default camera's pipeline (what the unnamed routes serve)."""
        return self.cameras.default.pipeline

    async def start(self) -> None:
        """Start everything; returns once the appliance serves video."""
        config = self.config
        state_dir = Path(config.state.dir)
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        passed = self.notifier.passed_sockets()
        # Before anything listens: the admin secret exists (generated on a first start).
        self.credentials = Credentials.from_config(config.auth, state_dir)
        if config.auth.resolve_token() and self.credentials.viewing_open:
            log.info("access: viewing is open on the LAN; [auth] token is the admin secret "
                     "(set auth.viewing = \"credential\" to require a credential for viewing)")

        # The single-camera layout's archive and controls file, into the folders of the camera
        # that made them (the first listed), once; then every camera's folders exist.
        try:
            await asyncio.to_thread(
                migrate_top_level, config.recording.directory(config.state.dir), state_dir,
                next(iter(self.cameras)).name)
        except OSError as exc:  # an archive disk that is read-only or gone: the recorders say so
            log.warning("could not move the single-camera layout's files: %s", exc,
                        extra={"EVENT": "layout_migration_failed"})
        for camera in self.cameras:
            camera_dir(state_dir, camera.name).mkdir(parents=True, exist_ok=True, mode=0o700)
        # Controls restored, then sources, recorders and HLS streams; a failing source is
        # per camera, reported and retried.
        await self.cameras.start()
        self.engine = Engine(
            config.webrtc,
            state_dir,
            self.capture,
            udp_socket=passed.get("rtc"),
            max_offer_bytes=config.http.max_offer_bytes,
        )
        await self.engine.start()
        await self._start_relays()
        await self._start_rtsp()

        self.engine.add_listener(session_listener(self.events, lambda: len(self.engine.sessions)
                                                  if self.engine else 0))

        app = make_app(config, self.engine, self.capture, started=self.started,
                       relays=self.relays, cameras=self.cameras, credentials=self.credentials,
                       bus=self.events)
        app[DEVICE_API].status_sections["integrations"] = self._integrations_status
        app[DEVICE_API].status_sections["https"] = self._https_status
        app[DEVICE_API].metrics_sections.append(self._integrations_metrics)
        if self.rtsp is not None:
            app[DEVICE_API].status_sections["rtsp"] = self.rtsp.stats
            app[DEVICE_API].metrics_sections.append(self._rtsp_metrics)
        self._add_onvif(app)
        app[CAMERAS].add_fallback_routes(app)  # last: after every camera's own routes
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        tls = await self._tls_context()
        if "http" in passed:
            await web.SockSite(self._runner, passed["http"], ssl_context=tls).start()
        else:
            runner = self._runner

            async def bind(host: str, port: int) -> int:
                site = web.TCPSite(runner, host, port, ssl_context=tls)
                await site.start()
                return int(runner.addresses[-1][1])

            await bind_every_host(config.http.listen, "http.listen", bind)
        await self._start_onvif_discovery()
        await self._start_integrations()

        # READY=1 once the page can show the picture, or say why it cannot: no camera sent a
        # frame within the timeout, or none could even start (then there is nothing to wait
        # for). Either way the service stays up, reports the camera and keeps trying.
        if any(c.error is None for c in self.cameras) and not await \
                self.cameras.wait_first_frame(FIRST_FRAME_TIMEOUT_S):
            log.warning("no frame from any camera within %.0f s; serving without one: %s",
                        FIRST_FRAME_TIMEOUT_S,
                        "; ".join(f"{name}: {why}" for name, why in self.cameras.down()),
                        extra={"EVENT": "no_camera"})
        for name, why in self.cameras.down():
            log.warning("camera %s is down: %s", name, why,
                        extra={"EVENT": "camera_down", "CAMERA": name})
        self.notifier.ready()
        # What start-up made (modules, classes, functions, configuration: ~200k objects) lives
        # as long as the process: out of the collector's generations with it (gc.freeze), so a
        # full collection walks only what came after (GC pauses, issue 31).
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        # Start-up's temporaries (imports, certificate, sources' set-up) are freed by now; glibc
        # keeps their pages until trimmed (~1 MiB of RSS, issue 19).
        release_free_heap()
        # The watchdog guards the process, not the picture: it is fed while the event loop
        # turns, and withheld only when a camera's stop or start hangs (a driver thread that
        # only a new process frees). A missing, unplugged or silent camera is the cameras'
        # own business (cameras/camera.py: probed and restarted with back-off, reported on
        # /healthz, the page and MQTT): restarting the service for it would not bring it back,
        # would cut every viewer, and every ~20 s would soon exhaust StartLimitBurst, after
        # which the board stays down until someone power-cycles it.
        def healthy() -> bool:
            stuck = self.cameras.stuck()
            if stuck:
                log.error("camera %s: its source's stop or start has hung for over %.0f s; "
                          "only a restart of the service frees it", ", ".join(stuck), STUCK_S,
                          extra={"EVENT": "camera_stuck"})
            return not stuck

        self._tasks.append(asyncio.create_task(self.notifier.watchdog_loop(healthy)))
        self._tasks.append(asyncio.create_task(self._status_loop()))
        self._tasks.append(asyncio.create_task(self.credentials.watch()))
        urls = self.urls()
        log.info(
            "ready: open %s",
            urls[0],
            extra={"EVENT": "ready", "URL": " ".join(urls), "FINGERPRINT": self.engine.fingerprint},
        )

    async def _start_relays(self) -> None:
        """One :class:`RtpRelay` per ``[[relay]]`` (of its ``camera``, default the default camera),
        consumers of the engine's fan-out of that camera (or of one of their own on the aiortc
        send path), so each frame is still packetized once."""
        if not self.config.relay:
            return
        assert self.engine is not None
        for relay_config in self.config.relay:
            cam = self.cameras.resolve(relay_config.camera) or self.cameras.default
            camera, feed = cam.config, cam.pipeline
            fanout = self._consumer_fanout(cam)
            relay = RtpRelay(relay_config, feed, fanout, framerate=camera.framerate,
                             catch_up_max_frames=camera.catch_up_frames,
                             keyframe_interval_frames=camera.keyframe_interval,
                             audio=cam.audio, camera=cam.name)
            await relay.start()
            self.relays.append(relay)

    def _consumer_fanout(self, cam: Camera, stream: str = "main") -> Fanout:
        """The fan-out a relay or RTSP client of ``cam``'s ``stream`` consumes: the engine's
        (shared with its viewers), or one of its own when the engine has none for it."""
        assert self.engine is not None
        pipeline = cam.stream(stream)
        assert pipeline is not None
        key = cam.name if stream == "main" else f"{cam.name}/{stream}"
        fanout = self.engine.fanout_for(pipeline) or self._relay_fanouts.get(key)
        if fanout is None:
            fanout = self._relay_fanouts[key] = Fanout(
                pipeline, lambda family: None, framerate=pipeline.camera.framerate,
                min_bitrate=pipeline.camera.bitrate)
            fanout.start()
        return fanout

    async def _start_rtsp(self) -> None:
        """The RTSP server (``[rtsp] enable``): every camera at ``rtsp://HOST:PORT/<name>``,
        each client a consumer of its camera's fan-out (as relays are)."""
        if not self.config.rtsp.enable:
            return
        assert self.engine is not None
        sources = []
        absent: dict[str, str] = {}
        for cam in self.cameras:
            # rtsp://HOST:PORT/<name> is the main stream, /<name>/sub the sub-stream.
            for stream in ("main", "sub"):
                feed = cam.stream(stream)
                path = cam.name if stream == "main" else f"{cam.name}/{stream}"
                if feed is None:
                    absent[path] = f"camera {cam.name!r} has no sub-stream: {cam.sub_reason}"
                    continue
                camera = feed.camera
                fanout = self._consumer_fanout(cam, stream)
                # As the engine does for viewers: the GOP so far when no fresh IDR can be had.
                gop_bytes = (0 if feed.keyframes_on_demand
                             else int(camera.bitrate / 8 * GOP_CATCH_UP_MAX_S))
                # The camera's sound is a second track of both its streams (one microphone).
                sources.append(RtspSource(path, feed, fanout, framerate=camera.framerate,
                                          catch_up_max_frames=camera.catch_up_frames,
                                          keyframe_interval_frames=camera.keyframe_interval,
                                          catch_up_max_bytes=gop_bytes, audio=cam.audio))
        self.rtsp = RtspServer(self.config.rtsp, sources, credentials=self.credentials,
                               default=self.cameras.default.name, absent=absent,
                               extra_passwords=self._onvif_passwords)
        await self.rtsp.start()

    def _onvif_passwords(self) -> list[str]:
        """``[onvif] password`` (or its file) when ONVIF is on: RTSP plays for it too, as
        ONVIF's GetStreamUri promises (read each time, as ONVIF's own check does: a changed
        file counts at once). Empty when ONVIF uses the admin secret, which RTSP knows."""
        onvif = self.config.onvif
        if not onvif.enable:
            return []
        try:
            password = onvif.resolve_password()
        except ConfigError as exc:  # the file went away: that account plays no more
            log.warning("onvif: %s", exc)
            return []
        return [password] if password else []

    def _add_onvif(self, app: web.Application) -> None:
        """``[onvif] enable``: the ONVIF device's SOAP routes and its ``/api/status`` section."""
        if not self.config.onvif.enable:
            return
        from .mqtt import load_device_id
        from .onvif import Identity, OnvifDevice, board_model, hostname
        identity = Identity(
            serial=load_device_id(Path(self.config.state.dir), self.config.mqtt.device_id),
            hostname=hostname(), hardware=board_model())
        rtsp = self.rtsp
        self.onvif = OnvifDevice(self.config, self.cameras, self.credentials, identity,
                                 rtsp_port=lambda: rtsp.port if rtsp is not None else None,
                                 clock_synchronized=self.clock.refresh)
        self.onvif.add_routes(app)
        onvif_events = self.onvif.events

        def motion_to_onvif(event: Event) -> None:
            # The motion detectors' events as ONVIF MotionAlarm / CellMotionDetector messages.
            camera = str(event.data.get("camera", ""))
            if event.name in ("motion_started", "motion_ended") and camera:
                onvif_events.publish_motion(camera, event.name == "motion_started")

        self.events.subscribe(motion_to_onvif)
        app[DEVICE_API].status_sections["onvif"] = self._onvif_status
        log.info("onvif: device service at /onvif/device_service (user %s), profiles %s",
                 self.config.onvif.username or "admin", ", ".join(self.cameras.names),
                 extra={"EVENT": "onvif", "MAC": self.onvif.interface.mac})
        if rtsp is None:
            log.warning("onvif: RTSP is off, so ONVIF clients get no stream URI (GetStreamUri "
                        "answers a fault): set [rtsp] enable = true",
                        extra={"EVENT": "onvif_no_rtsp"})

    async def _start_onvif_discovery(self) -> None:
        if self.onvif is None or not self.config.onvif.discovery:
            return
        from .onvif import DiscoveryResponder
        assert self._runner is not None
        bound = self._runner.addresses
        port = int(bound[0][1]) if bound else self.config.http.listen.port
        self.discovery = DiscoveryResponder(
            self.onvif.identity, listen_host=self.config.http.listen.host, http_port=port,
            scheme="https" if self.config.http.https else "http")
        try:
            await self.discovery.start()
        except OSError as exc:  # no multicast on the interface, 3702 taken: SOAP still works
            log.warning("onvif: WS-Discovery cannot start (%s); add the device by its address",
                        exc, extra={"EVENT": "onvif_discovery_failed"})
            self.discovery.stop()
            self.discovery = None

    def _onvif_status(self) -> dict[str, object]:
        assert self.onvif is not None
        out: dict[str, object] = self.onvif.stats()
        out["discovery"] = self.discovery.stats() if self.discovery is not None else None
        return out

    def _rtsp_metrics(self) -> Iterator[Metric]:
        """The RTSP server's figures as ``/metrics`` families (``ruseon_rtsp_*``)."""
        out = Families()
        if self.rtsp is None:
            return out.collect()
        stats = self.rtsp.stats()
        for key, kind, help_text in RTSP_METRICS:
            if kind == "counter":
                out.counter(f"ruseon_rtsp_{key}_total", help_text).add_metric([], stats[key])
            else:
                out.gauge(f"ruseon_rtsp_{key}", help_text).add_metric([], stats[key])
        requests = out.counter("ruseon_rtsp_requests_total", "RTSP requests by method.", ["method"])
        for method, n in sorted(stats["requests"].items()):
            requests.add_metric([method], n)
        return out.collect()

    async def _start_integrations(self) -> None:
        """The stall watcher, webhooks and MQTT: all event-bus consumers that never block the
        stream (bounded queues, background tasks)."""
        for camera in self.cameras:
            camera.start_watching()
        for sender in self.webhooks:
            self.events.subscribe(sender.offer)
            await sender.start()
        if not self.config.mqtt.url:
            return
        # Imported only when configured: paho + aiomqtt are ~1 MiB of RSS (issue 19).
        from .mqtt import HomeAssistantMqtt, load_device_id

        def latest_jpeg_of(pipeline: CapturePipeline) -> SnapshotSource:
            snapshot = KeyframeSnapshot(pipeline)

            async def latest() -> tuple[int, bytes] | None:
                shot = await snapshot.latest()
                return None if shot is None else (shot.keyframe_seq, shot.jpeg)

            return latest

        # Every camera has the same entities in the one HA device; the default camera's keep
        # the unnamed topics and ids (as its routes do), the others are named after them.
        default = self.cameras.default
        named = [c for c in self.cameras if c is not default]

        def controls_of(camera: Camera) -> Any:
            """The camera's controls, with motion on/off and sensitivity when it detects,
            and the microphone switch and gain when it has sound."""
            controls: Any = camera.controls
            if camera.motion is not None:
                from .motion.controls import WithMotionControls  # numpy: only with motion on
                controls = WithMotionControls(controls, camera.motion,
                                              camera.config.motion_sensitivity)
            if camera.audio is not None:
                from .audio.controls import WithAudioControls
                controls = WithAudioControls(controls, camera.audio,
                                             default_gain_db=camera.config.audio_gain_db,
                                             default_muted=camera.config.audio_muted)
            return controls

        self.mqtt = HomeAssistantMqtt(
            self.config.mqtt,
            device_id=load_device_id(Path(self.config.state.dir), self.config.mqtt.device_id),
            name=socket.gethostname(),
            state=self._sensor_state,
            snapshot=latest_jpeg_of(default.pipeline),
            configuration_url=self.urls()[0],
            record=self._toggle_recording,
            controls=controls_of(default),
            camera_snapshots={c.name: latest_jpeg_of(c.pipeline) for c in named},
            camera_controls={c.name: controls_of(c) for c in named
                             if controls_of(c) is not None},
            event_snapshots={c.name: c.motion.store.snapshot_path for c in self.cameras
                             if c.motion is not None and c.motion.store is not None},
            default_camera=default.name,
        )
        self.events.subscribe(self.mqtt.on_event)
        await self.mqtt.start()

    def _sensor_state(self) -> dict[str, object]:
        """What the Home Assistant sensors show: the device's figures, and every camera's
        under ``cameras`` (the default camera's also at the top, where the entities that
        existed before there were several cameras read them)."""
        cameras = self._cameras_state()
        default = cameras[self.cameras.default.name]
        return {
            "viewers": len(self.engine.sessions) if self.engine else 0,
            **{key: default[key] for key in ("fps", "bitrate", "keyframe_age_s", "stalled",
                                             "recording", "recording_state", "motion")},
            "clock_unsynchronized": not self.clock.synchronized,
            "cameras": cameras,
        }

    def _cameras_state(self) -> dict[str, dict[str, object]]:
        """Every camera's sensors (state document ``cameras``), by name."""
        viewers: dict[int, int] = {}
        for session in (self.engine.sessions.values() if self.engine else ()):
            viewers[id(session.feed)] = viewers.get(id(session.feed), 0) + 1
        out: dict[str, dict[str, object]] = {}
        for camera in self.cameras:
            stats = camera.pipeline.stats()
            recorder = camera.recorder
            out[camera.name] = {
                "fps": stats.get("fps"), "bitrate": stats.get("bitrate"),
                "keyframe_age_s": stats.get("keyframe_age_s"),
                "viewers": viewers.get(id(camera.pipeline), 0),
                "up": camera.problem() is None,
                "stalled": bool(camera.stall_watcher and camera.stall_watcher.stalled),
                "recording": bool(recorder and recorder.active),
                "recording_state": recorder.state if recorder else "stopped",
                "motion": bool(camera.motion and camera.motion.active)}
        return out

    async def _toggle_recording(self, camera: str = "") -> None:
        """A Home Assistant record button: start an on-demand recording of that camera (the
        default one without a name), or stop it."""
        cam = self.cameras.resolve(camera)
        recorder = cam.recorder if cam is not None else None
        if recorder is None:
            return
        if recorder.active:
            await recorder.end()
        else:
            recorder.begin()

    def _integrations_status(self) -> dict[str, object]:
        """The events, webhooks and MQTT part of ``/api/status``."""
        return {
            "events": self.events.stats(),
            "camera_stalled": bool(self.cameras.default.stall_watcher
                                   and self.cameras.default.stall_watcher.stalled),
            "cameras_stalled": [c.name for c in self.cameras
                                if c.stall_watcher is not None and c.stall_watcher.stalled],
            "webhooks": [w.stats() for w in self.webhooks],
            "mqtt": self.mqtt.stats() if self.mqtt else None,
        }

    def _controls_changed(self, camera: Camera, changed: dict[str, object],
                          restarted: bool) -> None:
        camera.follow_stream_controls()
        self.events.publish("controls_changed", camera=camera.name, controls=changed,
                            restarted=restarted)

    def _integrations_metrics(self) -> Iterator[Metric]:
        """Events, webhooks, MQTT and camera controls as ``/metrics`` families."""
        out = Families()
        out.stats("ruseon_events", self.events.stats(), "Appliance events")
        stalled = out.gauge("ruseon_camera_stalled", "1 while no frame arrives from the camera.",
                            ["camera"])
        changes = out.counter("ruseon_camera_control_changes_total",
                              "Camera control changes applied.", ["camera"])
        restarts = out.counter("ruseon_camera_control_restarts_total",
                               "Source restarts made by camera control changes.", ["camera"])
        for c in self.cameras:
            stalled.add_metric([c.name], int(bool(c.stall_watcher and c.stall_watcher.stalled)))
            changes.add_metric([c.name], c.controls.changes if c.controls else 0)
            restarts.add_metric([c.name], c.controls.restarts if c.controls else 0)
        hooks = [(str(i), w.stats()) for i, w in enumerate(self.webhooks)]
        for key, kind, help_text in (
                ("sent", "counter", "Webhook events delivered (2xx)."),
                ("failed", "counter", "Webhook events given up after their retries."),
                ("retries", "counter", "Webhook delivery attempts after the first."),
                ("dropped", "counter", "Webhook events dropped from a full queue."),
                ("queued", "gauge", "Webhook events waiting.")):
            family = (out.counter(f"ruseon_webhook_{key}_total", help_text, ["webhook"])
                      if kind == "counter" else
                      out.gauge(f"ruseon_webhook_{key}", help_text, ["webhook"]))
            for webhook, stats in hooks:
                family.add_metric([webhook], stats[key])
        if self.mqtt is not None:
            out.stats("ruseon_mqtt", self.mqtt.stats(), "MQTT")
        return out.collect()

    async def _tls_context(self) -> ssl.SSLContext | None:
        """The HTTP server's TLS context: none, ``http.tls_cert``/``tls_key``, or the
        self-signed certificate kept in the state directory (made on first use); its
        fingerprint goes to the journal once per start."""
        http = self.config.http
        if http.tls == "self-signed":
            assert self.engine is not None
            addresses = [*self.engine.advertised_addresses, http.listen.host,
                         *default_advertise([socket.AF_INET, socket.AF_INET6])]
            self.https = await asyncio.to_thread(
                https_certificate.load_or_create, Path(self.config.state.dir),
                socket.gethostname(), addresses)
        elif http.tls_cert:
            try:
                self.https = https_certificate.from_files(http.tls_cert, http.tls_key)
            except ValueError as exc:
                raise OSError(f"http.tls_cert {http.tls_cert}: not a PEM certificate ({exc})"
                              ) from None
        else:
            return None
        cert = self.https
        log.info("HTTPS certificate (%s%s) SHA-256 fingerprint %s, for %s; valid until %s",
                 cert.mode, ", made now" if cert.generated else "", cert.fingerprint,
                 ", ".join((*cert.names, *cert.addresses)), cert.not_after.date().isoformat(),
                 extra={"EVENT": "https_certificate", "TLS_FINGERPRINT": cert.fingerprint})
        return cert.server_context()

    def _https_status(self) -> dict[str, object]:
        """The ``https`` part of ``/api/status``: whether HTTPS is on, and its certificate."""
        if self.https is None:
            return {"mode": "off"}
        return self.https.status()

    def urls(self) -> list[str]:
        """Where a person can open the device page, most useful first."""
        scheme = "https" if self.config.http.https else "http"
        assert self._runner is not None
        bound = self._runner.addresses
        port = bound[0][1] if bound else self.config.http.listen.port
        host = self.config.http.listen.host
        if host in ("0.0.0.0", "::", ""):
            lan = default_advertise([socket.AF_INET])
            hosts = [a for a in lan if not a.startswith("127.")]
            hosts += ["127.0.0.1"]
        else:
            hosts = [host]
        return [f"{scheme}://{f'[{h}]' if ':' in h else h}:{port}/" for h in hosts]

    async def _status_loop(self) -> None:
        assert self.engine is not None
        while True:
            stats = [camera.pipeline.stats() for camera in self.cameras]
            down = self.cameras.down()
            self.notifier.status(
                f"{len(self.engine.sessions)} viewers, "
                + (f"{len(self.cameras) - len(down)}/{len(self.cameras)} cameras up, "
                   if len(self.cameras) > 1 else "")
                + f"{sum(s.get('fps') or 0 for s in stats):.1f} fps, "
                f"{sum(s.get('bitrate') or 0 for s in stats) / 1e6:.2f} Mbit/s"
            )
            await asyncio.sleep(STATUS_INTERVAL_S)

    async def stop(self) -> None:
        """Close every session (DELETE semantics), then the sockets, then the camera."""
        self.notifier.stopping()
        for task in self._tasks:
            task.cancel()
        for camera in self.cameras:
            await camera.quiesce()  # wakes held HLS requests before the server waits for them
        if self.mqtt is not None:
            await self.mqtt.stop()
        for sender in self.webhooks:
            await sender.stop()
        if self.discovery is not None:
            self.discovery.stop()  # Bye
        if self.onvif is not None:
            self.onvif.events.close()  # wakes held PullMessages before the server waits
        if self._runner is not None:
            await self._runner.cleanup()
        for relay in self.relays:
            relay.stop()
        if self.rtsp is not None:
            await self.rtsp.stop()
        for fanout in self._relay_fanouts.values():
            await fanout.stop()
        if self.engine is not None:
            await self.engine.stop()
        await self.cameras.stop()  # recorders, controls' writes, then the sources
        log.info("stopped", extra={"EVENT": "stopped"})


async def serve(config: Config) -> int:
    """Run the appliance until SIGTERM or SIGINT; return the exit status.

    A signal is honoured at any phase: during start-up it cancels the start and stops what was
    started. The stop gets ``SHUTDOWN_TIMEOUT_S``; ``SHUTDOWN_HARD_S`` after the signal the
    process ends whatever still runs, naming it (``shutdown.StopSignals``).
    """
    try:
        appliance = Appliance(config)
    except SourceUnavailable as exc:
        log.error("%s", exc, extra={"EVENT": "startup_failed"})
        return 1
    signals = StopSignals(asyncio.get_running_loop(), hard_s=SHUTDOWN_HARD_S)
    signals.install()
    try:
        started = await until_stopped(appliance.start(), signals.requested,
                                      grace_s=START_CANCEL_GRACE_S)
    except (OSError, RuntimeError) as exc:
        log.error("start-up failed: %s", exc, extra={"EVENT": "startup_failed"})
        signals.arm(f"still running {SHUTDOWN_HARD_S:.0f} s after start-up failed")
        with contextlib.suppress(Exception):
            await bounded(appliance.stop(), SHUTDOWN_TIMEOUT_S, "the stop after start-up failed")
        return 1
    if started:
        await signals.requested.wait()
    log.info("shutting down (%s%s)", signals.signal_name, "" if started else " during start-up",
             extra={"EVENT": "stopping"})
    await bounded(appliance.stop(), SHUTDOWN_TIMEOUT_S, "shutdown")
    return 0
