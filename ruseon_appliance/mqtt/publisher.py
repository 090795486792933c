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
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiomqtt

from ..config import MqttConfig
from ..events import Event
from .discovery import OFFLINE, ONLINE, Discovery, Topics

log = logging.getLogger(__name__)

# Reconnect back-off: doubles from the first to the cap, with +-20 % jitter.
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
KEEPALIVE_S = 30
# Bounded queues in paho/aiomqtt: a stuck broker costs at most this many messages of memory.
MAX_OUTGOING = 64
MAX_INCOMING = 32
PUBLISH_TIMEOUT_S = 10.0
# Events (a viewer joined, the camera stalled) push a state update at most this often.
MIN_STATE_GAP_S = 0.5

# A JPEG of the newest keyframe and its ring sequence number (to publish only on change).
SnapshotSource = Callable[[], Awaitable[tuple[int, bytes] | None]]


class HomeAssistantMqtt:
    """Publishes one appliance to Home Assistant over MQTT.

    ``state()`` returns the sensors' values (``viewers``, ``fps``, ``bitrate``,
    ``keyframe_age_s``, ``stalled`` and, with recording, ``recording`` / ``recording_state``);
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
        record: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        self.config = config
        self.topics = Topics(config.topic_prefix, device_id)
        self.discovery = Discovery(config.discovery_prefix, self.topics, name=name,
                                   configuration_url=configuration_url,
                                   recording=record is not None)
        self._state = state
        self._snapshot = snapshot
        self._record = record
        self._state_kick = asyncio.Event()
        self._snapshot_kick = asyncio.Event()
        self._snapshot_forced = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.connected = False
        self.connects = 0
        self.disconnects = 0
        self.published = 0
        self.snapshots = 0
        self.commands = 0
        self.last_error = ""

    # -- wiring ------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        """An event bus subscriber: something changed, publish the state soon."""
        self._state_kick.set()

    async def start(self) -> None:
        """Connect in the background; returns at once (a broker being down is not an error)."""
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._run(), name="mqtt")

    async def stop(self) -> None:
        """Publish ``offline`` (if connected) and disconnect cleanly."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def stats(self) -> dict[str, Any]:
        """Counters for ``/api/status`` and ``/metrics``."""
        return {
            "connected": self.connected,
            "connects": self.connects,
            "disconnects": self.disconnects,
            "published": self.published,
            "snapshots": self.snapshots,
            "commands": self.commands,
        }

    # -- the connection ----------------------------------------------------------------------

    def _client(self) -> aiomqtt.Client:
        host, port, tls = self.config.endpoint()
        password = self.config.resolve_password()
        return aiomqtt.Client(
            host, port,
            username=self.config.username or None,
            password=password or None,
            identifier=f"ruseon-{self.topics.device_id}",
            will=aiomqtt.Will(self.topics.availability, OFFLINE, qos=1, retain=True),
            keepalive=KEEPALIVE_S,
            timeout=PUBLISH_TIMEOUT_S,
            max_queued_outgoing_messages=MAX_OUTGOING,
            max_queued_incoming_messages=MAX_INCOMING,
            tls_context=ssl.create_default_context() if tls else None,
        )

    async def _run(self) -> None:
        delay = BACKOFF_FIRST_S
        while not self._stopping:
            try:
                async with self._client() as client:
                    self.connected = True
                    self.connects += 1
                    delay = BACKOFF_FIRST_S
                    log.info("mqtt: connected to %s:%d as %s", *self.config.endpoint()[:2],
                             self.topics.device_id)
                    try:
                        await self._session(client)
                    finally:
                        self.connected = False
                        if self._stopping:
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
            except* Exception:  # a bug here must not end MQTT for good, nor streaming
                log.exception("mqtt: unexpected error; reconnecting with back-off")
                self.disconnects += 1
            if self._stopping:
                return
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _session(self, client: aiomqtt.Client) -> None:
        """One connection's work: announce, then state, snapshots and commands until it drops."""
        await client.subscribe(self.topics.commands, qos=1)
        await client.subscribe(f"{self.config.discovery_prefix}/status", qos=1)
        await self._announce(client)
        self.last_error = ""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._state_loop(client))
            group.create_task(self._snapshot_loop(client))
            group.create_task(self._command_loop(client))

    async def _publish(self, client: aiomqtt.Client, topic: str, payload: str | bytes,
                       *, qos: int = 0, retain: bool = True) -> None:
        await client.publish(topic, payload, qos=qos, retain=retain, timeout=PUBLISH_TIMEOUT_S)
        self.published += 1

    async def _announce(self, client: aiomqtt.Client) -> None:
        """Availability and every discovery config, retained (again on every connect)."""
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._state_kick.wait(), interval)
            await asyncio.sleep(gap)  # the throttle: bursts of events make one message

    async def _snapshot_loop(self, client: aiomqtt.Client) -> None:
        last_seq: int | None = None
        while True:
            self._snapshot_kick.clear()
            forced, self._snapshot_forced = self._snapshot_forced, False
            try:
                shot = await self._snapshot()
            except Exception as exc:  # a snapshot that cannot be made is not a lost connection
                log.debug("mqtt: no snapshot (%s)", exc)
                shot = None
            if shot is not None and (forced or shot[0] != last_seq):
                await self._publish(client, self.topics.snapshot, shot[1])
                last_seq = shot[0]
                self.snapshots += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._snapshot_kick.wait(),
                                       self.config.snapshot_interval_s)

    async def _command_loop(self, client: aiomqtt.Client) -> None:
        ha_status = f"{self.config.discovery_prefix}/status"
        async for message in client.messages:
            topic = str(message.topic)
            if topic == ha_status:
                # Home Assistant (re)started: it asks everyone to announce again.
                if message.payload in (b"online", "online"):
                    await self._announce(client)
                continue
            self.commands += 1
            command = topic.rsplit("/", 1)[-1]
            if command == "snapshot":
                self._snapshot_forced = True
                self._snapshot_kick.set()
            elif command == "record" and self._record is not None:
                task = asyncio.create_task(self._run_record())
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                log.debug("mqtt: ignoring command %r", command)

    async def _run_record(self) -> None:
        assert self._record is not None
        try:
            await self._record()
        except Exception as exc:
            log.warning("mqtt: the record button failed: %s", exc)
        self._state_kick.set()


