"""The MQTT connection: announce, keep state fresh, answer buttons, reconnect with back-off.

A broker that is down, slow or gone never touches streaming: everything runs in one task on the
event loop through ``aiomqtt`` (paho's protocol code driven by the loop's reader/writer callbacks;
only the TCP connect runs in a worker thread), outgoing and incoming queues are bounded, and every
publish has a timeout. On every (re)connect the appliance publishes ``online`` and all discovery
configs, retained, so a broker restarted without persistence learns them again; the Last Will
turns availability ``offline`` when the appliance dies without saying goodbye.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import aiomqtt

from ..config import ConfigError, MqttConfig
from ..events import Event
from .discovery import OFFLINE, ONLINE, PRESS, Discovery, Topics

log = logging.getLogger(__name__)


class _QuietUnexpectedAck(logging.Filter):
    """aiomqtt logs an acknowledgement for a message id it no longer waits for (a SUBACK or
    UNSUBACK that arrives after its request timed out or its connection was replaced) with
    ``logger.exception``: a KeyError traceback in the journal for something harmless. Keep the
    line, as a warning, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and str(record.msg).startswith("Unexpected message ID"):
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_client_log = logging.getLogger(__name__ + ".client")
_client_log.addFilter(_QuietUnexpectedAck())

# Reconnect back-off: doubles from the first to the cap, with +-20 % jitter.
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
# A connection must last this long before the back-off starts from the first delay again: a
# broker that accepts and drops at once (flapping, or refusing us after CONNACK) would otherwise
# be reconnected to, and sent every discovery config, once a second for ever.
STABLE_CONNECTION_S = 30.0
KEEPALIVE_S = 30
# Bounded queues in paho/aiomqtt: a stuck broker costs at most this many messages of memory.
MAX_OUTGOING = 64
# Incoming also carries this device's own retained discovery configs once per connect (checked
# for stale entities), so it holds a few more than the largest device's entity count.
MAX_INCOMING = 128
PUBLISH_TIMEOUT_S = 10.0
# Connecting and the DISCONNECT handshake (aiomqtt's default timeout); and how long stop() waits
# for all of it before it leaves the connection to be torn down with the process.
CONNECT_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0
# How long stop() waits for the task to end before cancelling it again.
STOP_RECANCEL_S = 0.25
# Events (a viewer joined, the camera stalled) push a state update at most this often.
MIN_STATE_GAP_S = 0.5
# Home Assistant's "online" re-announces at most this often: anyone may publish it, and each
# one costs every discovery config again (they are retained anyway).
MIN_ANNOUNCE_GAP_S = 10.0

# A JPEG of the newest keyframe and its ring sequence number (to publish only on change).
SnapshotSource = Callable[[], Awaitable[tuple[int, bytes] | None]]
# A control command's payload larger than this is not a value.
MAX_COMMAND_BYTES = 256


class CameraControlsPort(Protocol):
    """What MQTT needs of the camera controls (``capture.controls.CameraControls``)."""

    def describe(self) -> dict[str, Any]:
        """Values, ranges and live/restart per control."""

    async def update(self, changes: Mapping[str, Any]) -> bool:
        """Validate and apply; raises ``ValueError`` naming the control when refused."""


class HomeAssistantMqtt:
    """Publishes one appliance to Home Assistant over MQTT.

    ``state()`` returns the sensors' values (``viewers``, ``fps``, ``bitrate``,
    ``keyframe_age_s``, ``stalled`` and, with recording, ``recording`` / ``recording_state`` /
    ``clock_unsynchronized``);
    ``snapshot()`` the newest keyframe as JPEG; ``record()`` starts a recording (the button).
    """

    def __init__(
        self,
        config: MqttConfig,
        *,
        device_id: str,
        name: str,
        state: Callable[[], Mapping[str, Any]],
        snapshot: SnapshotSource,
        configuration_url: str = "",
        record: Callable[..., Awaitable[Any]] | None = None,
        controls: CameraControlsPort | None = None,
        camera_snapshots: Mapping[str, SnapshotSource] | None = None,
        camera_controls: Mapping[str, CameraControlsPort] | None = None,
        event_snapshots: Mapping[str, Callable[[str], Path]] | None = None,
        default_camera: str = "",
    ) -> None:
        self.config = config
        self.topics = Topics(config.topic_prefix, device_id)
        self.discovery = Discovery(config.discovery_prefix, self.topics, name=name,
                                   configuration_url=configuration_url,
                                   recording=record is not None,
                                   controls=controls.describe()["controls"] if controls else None,
                                   cameras=list(camera_snapshots or {}),
                                   commands=config.commands,
                                   camera_controls={
                                       name: c.describe()["controls"]
                                       for name, c in (camera_controls or {}).items()},
                                   motion_images=[
                                       "" if name == default_camera else name
                                       for name in (event_snapshots or {})])
        # Where each camera that detects motion keeps an event's picture (event id -> path);
        # the default camera's is published at the unnamed topic.
        self._event_snapshots = dict(event_snapshots or {})
        self._default_camera = default_camera
        self._event_pending: dict[str, str] = {}  # camera -> the event id to publish
        self._event_jpegs: dict[str, bytes] = {}  # camera -> the last picture (for reconnects)
        self._event_kick = asyncio.Event()
        self.event_snapshots_published = 0
        # The other cameras' snapshots and controls (the default camera's are ``snapshot``
        # and ``controls``), by name.
        self._camera_snapshots = dict(camera_snapshots or {})
        # Every camera's controls by name; "" is the default camera's.
        self._all_controls: dict[str, CameraControlsPort] = dict(camera_controls or {})
        if controls is not None:
            self._all_controls[""] = controls
        self._state = state
        self._snapshot = snapshot
        self._record = record
        self._config_topics = frozenset(self.discovery.configs())
        self.control_errors = 0
        self._state_kick = asyncio.Event()
        self._snapshot_kick = asyncio.Event()
        self._snapshot_forced = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._saying_offline = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.connected = False
        # The wait before the next connection attempt (doubling while attempts fail).
        self.retry_delay_s = BACKOFF_FIRST_S
        self._announced_at = -MIN_ANNOUNCE_GAP_S
        self.connects = 0
        self.disconnects = 0
        self.published = 0
        self.snapshots = 0
        self.commands = 0
        self.last_error = ""
        # The password and TLS context, read once (off the loop) and kept for every reconnect;
        # not kept while they fail (a password file that appears later is picked up).
        self._credentials: tuple[str, ssl.SSLContext | None] | None = None
        self.credential_loads = 0

    # -- wiring ------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        """An event bus subscriber: something changed, publish the state soon (and a motion
        event's picture, when the event has one)."""
        self._state_kick.set()
        if event.name in ("motion_started", "motion_ended") and event.data.get("snapshot"):
            camera, event_id = event.data.get("camera"), event.data.get("event_id")
            if camera in self._event_snapshots and isinstance(event_id, str):
                self._event_pending[camera] = event_id
                self._event_kick.set()

    async def start(self) -> None:
        """Connect in the background; returns at once (a broker being down is not an error)."""
        if self._task is None:
            self._stopping = self._saying_offline = False
            self._task = asyncio.create_task(self._run(), name="mqtt")

    async def stop(self) -> None:
        """Publish ``offline`` (if connected) and disconnect cleanly."""
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_TIMEOUT_S
        while not task.done() and loop.time() < deadline:
            # On Python 3.11 asyncio.wait_for (which aiomqtt awaits every SUBACK/PUBACK with)
            # swallows a cancellation that arrives while the acknowledgement completes: the
            # task then runs on as if never cancelled. Cancel again until it ends, but not while
            # it publishes "offline" (that publish has its own timeout).
            if not self._saying_offline:
                task.cancel()
            await asyncio.wait({task}, timeout=STOP_RECANCEL_S)
        if not task.done():
            log.warning("mqtt: the connection did not close within %.0f s; leaving it",
                        STOP_TIMEOUT_S)

    def stats(self) -> dict[str, Any]:
        """Counters for ``/api/status`` and ``/metrics``."""
        return {
            "connected": self.connected,
            "connects": self.connects,
            "disconnects": self.disconnects,
            "published": self.published,
            "snapshots": self.snapshots,
            "event_snapshots": self.event_snapshots_published,
            "commands": self.commands,
            "control_errors": self.control_errors,
            # Why the last attempt failed or the connection dropped ("" once connected).
            "last_error": self.last_error,
        }

    # -- the connection ----------------------------------------------------------------------

    async def _load_credentials(self) -> tuple[str, ssl.SSLContext | None]:
        """The password and TLS context: read from files and built (certificate chains
        parsed) in a worker thread the first time, then the same objects on every reconnect."""
        if self._credentials is None:
            config = self.config

            def load() -> tuple[str, ssl.SSLContext | None]:
                return config.resolve_password(), config.tls_context()

            self._credentials = await asyncio.to_thread(load)
            self.credential_loads += 1
        return self._credentials

    def _client(self, password: str, tls_context: ssl.SSLContext | None) -> aiomqtt.Client:
        host, port, _ = self.config.endpoint()
        return aiomqtt.Client(
            host, port,
            username=self.config.username or None,
            password=password or None,
            identifier=f"ruseon-{self.topics.device_id}",
            will=aiomqtt.Will(self.topics.availability, OFFLINE, qos=1, retain=True),
            keepalive=KEEPALIVE_S,
            timeout=CONNECT_TIMEOUT_S,
            max_queued_outgoing_messages=MAX_OUTGOING,
            max_queued_incoming_messages=MAX_INCOMING,
            tls_context=tls_context,
            logger=_client_log,
        )

    async def _run(self) -> None:
        self.retry_delay_s = delay = BACKOFF_FIRST_S
        while not self._stopping:
            connected_at: float | None = None
            try:
                async with self._client(*await self._load_credentials()) as client:
                    self.connected = True
                    self.connects += 1
                    connected_at = time.monotonic()
                    log.info("mqtt: connected to %s:%d as %s", *self.config.endpoint()[:2],
                             self.topics.device_id)
                    try:
                        await self._session(client)
                    finally:
                        self.connected = False
                        if self._stopping:
                            self._saying_offline = True
                            with contextlib.suppress(Exception):
                                await client.publish(self.topics.availability, OFFLINE, qos=1,
                                                     retain=True, timeout=2.0)
            except* (aiomqtt.MqttError, OSError, TimeoutError) as group:
                why = "; ".join(str(e) or type(e).__name__ for e in group.exceptions)
                if self.connects and self.last_error != why:
                    log.warning("mqtt: disconnected (%s); reconnecting with back-off", why)
                elif not self.last_error:
                    log.warning("mqtt: cannot reach the broker (%s); retrying with back-off",
                                why)
                self.last_error = why
                self.disconnects += 1
            except* ConfigError as group:
                # mqtt.password_file unreadable: say so once, not with a traceback per attempt
                # (the file may appear or get its permissions fixed; attempts go on).
                why = str(group.exceptions[0])
                if self.last_error != why:
                    log.error("mqtt: %s; retrying with back-off", why)
                self.last_error = why
                self.disconnects += 1
            except* Exception:  # a bug here must not end MQTT for good, nor streaming
                log.exception("mqtt: unexpected error; reconnecting with back-off")
                self.disconnects += 1
            if self._stopping:
                return
            if connected_at is not None and time.monotonic() - connected_at >= STABLE_CONNECTION_S:
                delay = BACKOFF_FIRST_S
            self.retry_delay_s = delay
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _session(self, client: aiomqtt.Client) -> None:
        """One connection's work: announce, then state, snapshots and commands until it drops."""
        if self.config.commands:
            for wildcard in self.topics.commands:
                await client.subscribe(wildcard, qos=1)
            if self._all_controls:
                for wildcard in self.topics.control_sets:
                    await client.subscribe(wildcard, qos=1)
        await client.subscribe(f"{self.config.discovery_prefix}/status", qos=1)
        await self._announce(client)
        # Every retained config under this device id: what is not announced any more (a
        # control the source lost, recording or a camera taken out of the config) is removed,
        # or Home Assistant keeps showing it as an unavailable entity for ever.
        await client.subscribe(self.discovery.config_topics(), qos=1)
        self.last_error = ""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._state_loop(client))
            group.create_task(self._snapshot_loop(client))
            group.create_task(self._command_loop(client))
            if self._event_snapshots:
                group.create_task(self._event_snapshot_loop(client))

    async def _publish(self, client: aiomqtt.Client, topic: str, payload: str | bytes,
                       *, qos: int = 0, retain: bool = True) -> None:
        await client.publish(topic, payload, qos=qos, retain=retain, timeout=PUBLISH_TIMEOUT_S)
        self.published += 1

    async def _announce(self, client: aiomqtt.Client) -> None:
        """Availability and every discovery config, retained (again on every connect)."""
        self._announced_at = time.monotonic()
        for topic, config in self.discovery.configs().items():
            await self._publish(client, topic, config, qos=1)
        await self._publish(client, self.topics.availability, ONLINE, qos=1)
        self._state_kick.set()
        self._snapshot_kick.set()

    async def _state_loop(self, client: aiomqtt.Client) -> None:
        interval = self.config.state_interval_s
        gap = min(MIN_STATE_GAP_S, interval)
        while True:
            self._state_kick.clear()
            document = dict(self._state())
            await self._publish(client, self.topics.state,
                                json.dumps(document, sort_keys=True, default=str))
            for camera, controls in self._all_controls.items():
                values = {name: spec["value"] for name, spec
                          in controls.describe()["controls"].items()}
                await self._publish(client, self.topics.camera_controls(camera) if camera
                                    else self.topics.controls, json.dumps(values, sort_keys=True))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._state_kick.wait()
            await asyncio.sleep(gap)  # the throttle: bursts of events make one message

    async def _snapshot_loop(self, client: aiomqtt.Client) -> None:
        sources = {self.topics.snapshot: self._snapshot, **{
            self.topics.camera_snapshot(name): source
            for name, source in self._camera_snapshots.items()}}
        last_seq: dict[str, int | None] = dict.fromkeys(sources)
        while True:
            self._snapshot_kick.clear()
            forced, self._snapshot_forced = self._snapshot_forced, False
            for topic, source in sources.items():
                try:
                    shot = await source()
                except Exception as exc:  # a snapshot that cannot be made: not a lost connection
                    log.debug("mqtt: no snapshot for %s (%s)", topic, exc)
                    shot = None
                if shot is not None and (forced or shot[0] != last_seq[topic]):
                    await self._publish(client, topic, shot[1])
                    last_seq[topic] = shot[0]
                    self.snapshots += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.snapshot_interval_s):
                    await self._snapshot_kick.wait()

    async def _event_snapshot_loop(self, client: aiomqtt.Client) -> None:
        """Each camera's latest motion picture, retained on its image topic; after a
        reconnect the last one again (a broker without persistence forgot it)."""
        loop = asyncio.get_running_loop()
        for camera, jpeg in self._event_jpegs.items():
            await self._publish(client, self._event_topic(camera), jpeg)
        while True:
            await self._event_kick.wait()
            self._event_kick.clear()
            pending, self._event_pending = self._event_pending, {}
            for camera, event_id in pending.items():
                path = self._event_snapshots[camera](event_id)
                try:
                    jpeg = await loop.run_in_executor(None, path.read_bytes)
                except OSError as exc:  # pruned meanwhile, or a disk error: the picture only
                    log.debug("mqtt: no picture for motion event %s (%s)", event_id, exc)
                    continue
                self._event_jpegs[camera] = jpeg
                await self._publish(client, self._event_topic(camera), jpeg)
                self.event_snapshots_published += 1

    def _event_topic(self, camera: str) -> str:
        return self.topics.event_snapshot("" if camera == self._default_camera else camera)

    async def _command_loop(self, client: aiomqtt.Client) -> None:
        ha_status = f"{self.config.discovery_prefix}/status"
        async for message in client.messages:
            topic = str(message.topic)
            if topic == ha_status:
                # Home Assistant (re)started: it asks everyone to announce again.
                if (message.payload in (b"online", "online") and time.monotonic()
                        - self._announced_at >= MIN_ANNOUNCE_GAP_S):
                    await self._announce(client)
                continue
            if message.topic.matches(self.discovery.config_topics()):
                if message.payload and topic not in self._config_topics:
                    log.info("mqtt: removing the stale discovery config %s", topic)
                    await self._publish(client, topic, b"", qos=1)
                continue
            if message.retain:
                # A command is an action now, not a state: a retained one (published with
                # retain by mistake, or by someone else) would re-run on every reconnect,
                # toggling recording or a control each time the broker flaps.
                log.warning("mqtt: ignoring the retained command on %s", topic)
                continue
            self.commands += 1
            tail = topic.removeprefix(f"{self.topics.base}/").split("/")
            if tail[0] == "control" and tail[-1] == "set" and len(tail) in (3, 4):
                # control/<name>/set (the default camera) or control/<camera>/<name>/set
                camera = tail[1] if len(tail) == 4 else ""
                await self._set_control(tail[-2], message.payload, camera)
                continue
            # command/<button> (the default camera) or command/<button>/<camera>
            command = tail[1] if len(tail) > 1 else ""
            camera = tail[2] if len(tail) == 3 else ""
            if message.payload not in (PRESS, PRESS.encode()):
                log.debug("mqtt: ignoring %r on %s (a press is %s)", message.payload, topic,
                          PRESS)
            elif command == "snapshot":
                self._snapshot_forced = True
                self._snapshot_kick.set()
            elif command == "record" and self._record is not None and (
                    not camera or camera in self.discovery.cameras):
                name = f"mqtt-record-{camera}"
                if any(t.get_name() == name for t in self._tasks):
                    # A press while the last one still runs: a flood of presses must not
                    # start and stop recording over and over, nor pile up tasks.
                    log.info("mqtt: record pressed again while busy; ignored")
                    continue
                task = asyncio.create_task(self._run_record(camera), name=name)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                log.debug("mqtt: ignoring command %r", command)

    async def _set_control(self, name: str, payload: Any, camera: str = "") -> None:
        """A Home Assistant number/switch/select changed a camera control (of the default
        camera, or of the camera named)."""
        controls = self._all_controls.get(camera)
        spec = controls.describe()["controls"].get(name) if controls is not None else None
        try:
            raw = (bytes(payload)[:MAX_COMMAND_BYTES + 1].decode()
                   if isinstance(payload, bytes | bytearray) else str(payload))
            if controls is None or spec is None or len(raw) > MAX_COMMAND_BYTES:
                raise ValueError(f"no camera control {name!r}"
                                 + (f" of camera {camera[:40]!r}" if camera else "")
                                 + f" takes {raw[:40]!r}")
            kind = spec["type"]
            value: Any = raw.strip()
            if kind == "bool":
                value = {"ON": True, "OFF": False}.get(value.upper(), value)
            elif kind in ("int", "float"):
                number = float(value)
                value = int(number) if kind == "int" and number.is_integer() else number
            await controls.update({name: value})
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            self.control_errors += 1
            log.warning("mqtt: camera control %s refused: %s", name, exc)
        except Exception:  # the camera failed to apply it: not a reason to drop the connection
            self.control_errors += 1
            log.exception("mqtt: camera control %s could not be applied", name)
        self._state_kick.set()  # publish the values (changed, or unchanged after a refusal)

    async def _run_record(self, camera: str = "") -> None:
        assert self._record is not None
        try:
            await (self._record(camera) if camera else self._record())
        except Exception as exc:
            log.warning("mqtt: the record button failed: %s", exc)
        self._state_kick.set()


