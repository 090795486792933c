"""Audio for WebRTC viewers: the feed's Opus packets, sent to every viewer whose offer asked.

The audio is encoded once per feed, upstream (one Opus packet per 20 ms in a ring buffer, see
CONTRACTS.md "audio"); an Opus packet is one RTP payload, so "packetized once" is the ring's
packet itself. One :class:`AudioFanout` per ring wakes on each write, copies the new packets
out of the ring once, and sends each to every :class:`AudioViewer`: per packet and viewer only
the RTP header is written, the packet protected in place with that viewer's SRTP session and
sent on the mux socket to its nominated address (the same writer as video,
``stream/rtp_writer.py``). Audio is never queued for a viewer: a viewer joins at the next
packet, and a packet the socket refuses is lost like on the wire (Opus conceals it).

Sync with the video of the same session: both streams' sender reports map their RTP time to
the capture instant (wall clock) of what they carry (``stream/reports.py``), and both tracks
share the session's MediaStream (msid), which is what a browser lines up.

The engine knows nothing of cameras: an audio feed is anything with an ``opus_ring``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from aiortc import RTCRtpSender
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpparameters import RTCRtpSendParameters
from aiortc.rtp import RtcpRrPacket, RtcpSrPacket

from ruseon_appliance.capture.ring import RingReader
from ruseon_appliance.engine import aiortc_internals
from ruseon_appliance.engine.fanout import take_over_stream
from ruseon_appliance.logs import RateLimit
from ruseon_appliance.stream.gso import DropCounters, GsoSender
from ruseon_appliance.stream.opus import OPUS_CLOCK_RATE, AudioFeed, OpusTimeline
from ruseon_appliance.stream.reports import ReceiverStats, SenderReports
from ruseon_appliance.stream.rtp_writer import SrtpPacketWriter
from ruseon_appliance.stream.srtp import SrtpPacketBuffer
from ruseon_appliance.tasks import cancel_and_wait

__all__ = ["OPUS_CLOCK_RATE", "AudioFanout", "AudioFeed", "AudioViewer", "FanoutAudioTrack",
           "offers_opus"]

logger = logging.getLogger(__name__)

ERROR_LOG_INTERVAL_S = 10.0


def offers_opus(media: Any) -> bool:
    """Whether a parsed offer's ``m=audio`` section can receive Opus from the engine."""
    if media.kind != "audio" or media.direction not in (None, "recvonly", "sendrecv"):
        return False
    return any(c.mimeType.lower() == "audio/opus" and c.clockRate == OPUS_CLOCK_RATE
               for c in media.rtp.codecs)


class FanoutAudioTrack(MediaStreamTrack):  # type: ignore[misc]
    """The track an audio transceiver carries: it only makes aiortc negotiate a sendonly audio
    stream (msid, SSRC); its ``recv`` is never called."""

    kind = "audio"

    async def recv(self) -> Any:
        """Never called: the audio fan-out sends this viewer's packets itself."""
        raise MediaStreamError


class AudioFanout:
    """The send loop of one audio feed: wakes on each ring write, sends the new packets to
    every active viewer."""

    def __init__(self, feed: AudioFeed,
                 socket_for: Callable[[int], socket.socket | None]) -> None:
        self._ring = feed.opus_ring
        self.socket_for = socket_for
        self.buffer = SrtpPacketBuffer()
        self.gso_sender = GsoSender(False)  # one packet at a time: nothing to segment
        self._viewers: list[AudioViewer] = []
        self._reader: RingReader | None = None
        self._task: asyncio.Task[None] | None = None
        self.packets_read = 0
        self.packets_sent = 0
        self.service_errors = 0
        self._error_log = RateLimit(ERROR_LOG_INTERVAL_S)

    @property
    def viewers(self) -> list[AudioViewer]:
        """Viewers currently sent to."""
        return list(self._viewers)

    def start(self) -> None:
        """Start the send loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the send loop (viewers are stopped by their sessions)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def activate(self, viewer: AudioViewer) -> None:
        """A viewer is ready: it is sent every packet written from now on. The loop reads
        the ring only while it has viewers: without a reader the camera does not encode
        Opus at all (audio/pipeline.py)."""
        if viewer not in self._viewers:
            self._viewers.append(viewer)
        if self._reader is None:
            self._reader = self._ring.reader("next")

    def remove(self, viewer: AudioViewer) -> None:
        """Stop sending to ``viewer``."""
        if viewer in self._viewers:
            self._viewers.remove(viewer)
        if not self._viewers and self._reader is not None:
            self._reader.close()
            self._reader = None

    def pump(self) -> None:
        """Copy what is new in the ring out once and send it to every viewer."""
        reader = self._reader
        if reader is None:
            return
        packets: list[tuple[bytes, int, int]] = []
        while (view := reader.poll()) is not None:
            packets.append((bytes(view.data), view.pts, view.capture_time_us))
        if not packets:
            return
        self.packets_read += len(packets)
        now = time.monotonic()
        for viewer in self._viewers:
            try:
                self.packets_sent += viewer.send(packets, now)
                viewer.maybe_send_report(now)
            except Exception:  # one viewer's failure must not stop the others' sound
                self.service_errors += 1
                if self._error_log.ready():
                    logger.exception("audio fan-out: sending to a viewer failed (%d so far)",
                                     self.service_errors)

    async def _run(self) -> None:
        ring = self._ring
        while True:
            await ring.wait()
            self.pump()

    def stats(self) -> dict[str, Any]:
        """Send-loop figures (packets counted apart from video's)."""
        return {
            "viewers": len(self._viewers),
            "packets_read": self.packets_read,
            "packets_sent": self.packets_sent,
            "service_errors": self.service_errors,
        }


class AudioViewer:
    """One viewer's audio stream, bound to its aiortc audio sender (which never sends: DTLS up,
    it hands over its negotiated parameters and this takes over, as the video viewer does)."""

    def __init__(self, fanout: AudioFanout) -> None:
        self._fanout = fanout
        self.active = False
        self.closed = False
        self._sender: RTCRtpSender | None = None
        self._connection: Any = None
        self._srtp: Any = None
        self._ssrc = 0
        self.payload_type = 0
        self.drops = DropCounters()
        self.reports = SenderReports(clock_rate=OPUS_CLOCK_RATE)
        self.receiver = ReceiverStats(OPUS_CLOCK_RATE)
        self._writer: SrtpPacketWriter | None = None
        self._timeline = OpusTimeline()

    @property
    def packets_sent(self) -> int:
        """Audio RTP packets sent."""
        return self.reports.packets_sent

    @property
    def bytes_sent(self) -> int:
        """Audio payload octets sent."""
        return self.reports.octets_sent

    def attach(self, sender: RTCRtpSender, connection: Any) -> None:
        """Bind to the session's audio sender and ICE connection (before the answer leaves)."""
        self._sender = sender
        self._connection = connection
        self._ssrc = aiortc_internals.sender_ssrcs(sender)[0]
        aiortc_internals.take_over_sending(sender, self._start)

    async def _start(self, parameters: RTCRtpSendParameters) -> None:
        sender = self._sender
        if self.closed or sender is None or not aiortc_internals.transport_connected(sender):
            return
        self.payload_type = parameters.codecs[0].payloadType
        fanout = self._fanout
        self._writer, self._srtp = take_over_stream(
            sender, parameters, self, self.reports, self.payload_type, batch=fanout.buffer,
            single=fanout.buffer, gso=fanout.gso_sender, drops=self.drops)
        self.reports.first_due(time.monotonic() + 0.2)
        self.active = True
        fanout.activate(self)

    def stop(self) -> None:
        """Stop sending (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.active = False
        self._fanout.remove(self)
        self._srtp = self._writer = None
        self._sender = self._connection = None

    def send(self, packets: list[tuple[bytes, int, int]], now: float) -> int:
        """Send ``(payload, pts, capture_time_us)`` packets; returns how many went out."""
        writer = self._writer
        if writer is None or self.closed:
            return 0
        pair = aiortc_internals.nominated_pair(self._connection)
        if pair is None:
            return 0
        sock = self._fanout.socket_for(pair[0].family)
        if sock is None:
            return 0
        addr = pair[1]
        sent = octets = 0
        timestamp = capture = 0
        for payload, pts, capture_us in packets:
            timestamp, marker = self._timeline.stamp(pts)
            capture = capture_us
            if writer.send_payload(payload, timestamp, marker, sock, addr):
                sent += 1
                octets += len(payload)
        # Sent or not, these timestamps are used (a lost packet is lost like on the wire).
        self.reports.sent(sent, octets, timestamp, now, capture)
        return sent

    def maybe_send_report(self, now: float) -> None:
        """Send a sender report (+ SDES CNAME) when one is due."""
        if not self.reports.due(now) or self._srtp is None:
            return
        pair = aiortc_internals.nominated_pair(self._connection)
        sock = None if pair is None else self._fanout.socket_for(pair[0].family)
        if pair is None or sock is None:
            return
        packet, ntp = self.reports.report(now)
        try:
            sock.sendto(self._srtp.protect_rtcp(packet), pair[1])
        except OSError:
            self.drops.send_errors += 1
            return
        self.reports.sent_report(ntp, now)

    async def _handle_rtcp_packet(self, packet: Any) -> None:
        """RTCP about this stream's SSRC (receiver reports), routed by the DTLS transport."""
        if self.closed or not isinstance(packet, RtcpRrPacket | RtcpSrPacket):
            return
        now = time.monotonic()
        for report in packet.reports:
            if report.ssrc == self._ssrc:
                self.receiver.report_block(report.fraction_lost, report.packets_lost,
                                           report.jitter, report.dlsr,
                                           self.reports.sent_at(report.lsr), now)

    def stats(self) -> dict[str, Any]:
        """This viewer's audio figures for the session's stats."""
        receiver = self.receiver
        return {
            "codec": "opus",
            "packets_sent": self.reports.packets_sent,
            "bytes_sent": self.reports.octets_sent,
            "sender_reports": self.reports.reports_sent,
            "receiver_reports": receiver.reports,
            "fraction_lost": round(receiver.fraction_lost, 4),
            "packets_lost": receiver.packets_lost,
            "jitter_ms": round(receiver.jitter_ms, 2),
            "send_dropped_full": self.drops.send_dropped_full,
            "send_errors": self.drops.send_errors,
        }
