"""The fan-out send loop: packetize each access unit once, send it to every reader.

One task wakes on each ring write and services every viewer in turn (a WebRTC viewer:
``engine/fanout.py``), then every other consumer (RTSP sessions, relays). Each frame is split
into RTP payloads **once**, by :class:`PacketHistory`; everybody sends the same payload objects.
The loop owns what its viewers share: the packet buffers libsrtp protects in place and the GSO
sender (one loop, one thread, one send at a time).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from ruseon_appliance.capture.ring import FrameView
from ruseon_appliance.logs import RateLimit
from ruseon_appliance.stream.cursor import VideoFeed
from ruseon_appliance.stream.gso import GSO_MAX_BYTES, GsoSender
from ruseon_appliance.stream.history import HISTORY_S, PacketHistory, PacketizedFrame
from ruseon_appliance.stream.srtp import SrtpPacketBuffer
from ruseon_appliance.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

# A viewer further behind than this (in queued frames' worth of time) skips to the next keyframe.
MAX_BACKLOG_S = 0.5
# A failing viewer or consumer is logged with its traceback at most this often.
ERROR_LOG_INTERVAL_S = 10.0


class ServicedViewer(Protocol):
    """What the loop needs of a viewer: serviced on every ring write, before the consumers."""

    keyframe_skips: int

    def service(self, now: float) -> None:
        """Queue what the ring has for this viewer and send what its budget allows."""

    def maybe_send_report(self, now: float) -> None:
        """Send an RTCP sender report if one is due."""


class FanoutConsumer(Protocol):
    """Something besides WebRTC viewers that sends the shared packets (an RTP relay, say):
    serviced on every ring write, after the viewers. It makes its own cursor with
    :meth:`Fanout.take`, so each frame is still packetized once for everybody."""

    def service(self, now: float) -> None:
        """Send what is new; must not raise for one destination's trouble."""


class Fanout:
    """The one send loop of a feed: wakes on each ring write and services every viewer."""

    def __init__(self, feed: VideoFeed, socket_for: Callable[[int], socket.socket | None], *,
                 framerate: int, min_bitrate: int, history_s: float = HISTORY_S,
                 gso: bool = True) -> None:
        self._feed = feed
        self.socket_for = socket_for
        self.history = PacketHistory(history_s)
        # Packet buffers shared by every viewer: the loop is single-threaded and sends at once.
        self.buffer = SrtpPacketBuffer()
        self.batch = SrtpPacketBuffer(GSO_MAX_BYTES + 4096)
        # UDP_SEGMENT until the kernel refuses it once (then datagram by datagram for good).
        self.gso_sender = GsoSender(gso)
        self.max_backlog_frames = max(2, round(framerate * MAX_BACKLOG_S))
        self.min_byte_rate = min_bitrate / 8
        self._viewers: list[ServicedViewer] = []
        self._consumers: list[FanoutConsumer] = []
        self._task: asyncio.Task[None] | None = None
        self.pumps = 0
        # A viewer or consumer failing on every ring write (30 a second) must not flood the
        # journal with tracebacks: counted always, logged at most once per interval.
        self.service_errors = 0
        self._error_log = RateLimit(ERROR_LOG_INTERVAL_S)

    @property
    def gso(self) -> bool:
        """True until the kernel refused ``UDP_SEGMENT`` once."""
        return self.gso_sender.enabled

    @property
    def gso_refused(self) -> str | None:
        """Why the kernel refused ``UDP_SEGMENT`` (None: it has not)."""
        return self.gso_sender.refused

    @property
    def viewers(self) -> list[ServicedViewer]:
        """Viewers currently being sent to."""
        return list(self._viewers)

    def stream_byte_rate(self) -> float:
        """The stream's byte rate, at least the configured minimum (what budgets scale)."""
        return max(self.history.byte_rate, self.min_byte_rate)

    def start(self) -> None:
        """Start the send loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the send loop (viewers are stopped by their sessions)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def activate(self, viewer: ServicedViewer) -> None:
        """A viewer is ready: send it its first frames now, then on every ring write."""
        if viewer not in self._viewers:
            self._viewers.append(viewer)
        viewer.service(time.monotonic())

    def remove(self, viewer: ServicedViewer) -> None:
        """Stop sending to ``viewer``."""
        if viewer in self._viewers:
            self._viewers.remove(viewer)

    def add_consumer(self, consumer: FanoutConsumer) -> None:
        """Service ``consumer`` on every ring write (see :class:`FanoutConsumer`)."""
        if consumer not in self._consumers:
            self._consumers.append(consumer)

    def remove_consumer(self, consumer: FanoutConsumer) -> None:
        """Stop servicing ``consumer``."""
        if consumer in self._consumers:
            self._consumers.remove(consumer)

    def take(self, view: FrameView) -> PacketizedFrame:
        """What a viewer's cursor keeps of a ring frame: its shared packetization."""
        return self.history.frame(view)

    def pump(self) -> None:
        """Service every viewer once (called on each ring write)."""
        now = time.monotonic()
        self.pumps += 1
        for viewer in self._viewers:
            try:
                viewer.service(now)
                viewer.maybe_send_report(now)
            except Exception:  # one viewer's failure must not stop the others' video
                self._service_failed("sending to a viewer failed")
        for consumer in self._consumers:
            try:
                consumer.service(now)
            except Exception:
                self._service_failed("a consumer failed")
        self.history.prune(now)

    def _service_failed(self, what: str) -> None:
        """Count a viewer's or consumer's failure; log its traceback at most once per interval."""
        self.service_errors += 1
        if self._error_log.ready():
            logger.exception("fan-out: %s (%d failures so far; logged at most every %.0f s)",
                             what, self.service_errors, ERROR_LOG_INTERVAL_S)

    async def _run(self) -> None:
        ring = self._feed.ring
        while True:
            await ring.wait()
            self.pump()

    def stats(self) -> dict[str, Any]:
        """Send-loop figures."""
        return {
            "viewers": len(self._viewers),
            "consumers": len(self._consumers),
            "frames_packetized": self.history.frames_packetized,
            "packets_packetized": self.history.packets_packetized,
            "history_frames": len(self.history),
            "stream_byte_rate": round(self.history.byte_rate),
            "keyframe_skips": sum(v.keyframe_skips for v in self._viewers),
            "gso": int(self.gso),  # 0 once refused (the reason: gso_refused, and the log)
            "gso_sends": self.gso_sender.gso_sends,
            "datagram_sends": self.gso_sender.datagram_sends,
            "service_errors": self.service_errors,
        }
