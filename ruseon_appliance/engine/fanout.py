"""The WebRTC viewer on the fan-out send path (``webrtc.send_path = "fanout"``).

aiortc keeps signaling, ICE, DTLS and SRTP key derivation. Once a viewer's DTLS transport is up,
the engine takes over what its ``RTCRtpSender`` would do, at a fraction of the cost, with the
shared stream machinery (``stream/``): the send loop (:class:`Fanout`) hands every viewer the
same packetization of each ring frame, and a :class:`FanoutViewer` is composed of small parts,
each with one duty (Pion's interceptors are the model):

- :class:`ViewerCursor` (``stream/cursor.py``): where in the ring it is, its output timeline;
- :class:`SrtpPacketWriter` (``stream/rtp_writer.py``): per packet only the 12-byte RTP header
  and the negotiated extensions are written, the packet is protected in place with this viewer's
  SRTP session and sent in GSO batches on the mux socket to the nominated address (the hot loop);
- :class:`SendBudget` and :class:`JoinPacer` (``stream/pacing.py``): a token bucket, a multiple
  of the stream's rate, and the join burst's slices; a viewer more than ``MAX_BACKLOG_S`` behind
  skips to the next keyframe instead of queueing;
- :class:`NackResponder` (``stream/nack.py``): NACK -> retransmission (RTX when negotiated) from
  the frames the viewer was sent in the last ``HISTORY_S`` seconds;
- :class:`SenderReports` and :class:`ReceiverStats` (``stream/reports.py``): sender reports
  (NTP/RTP mapping, RTT), receiver reports -> loss/jitter/RTT, REMB.

What is WebRTC's stays here: binding to aiortc's sender and DTLS transport
(``aiortc_internals``), routing its RTCP to the parts, PLI/FIR -> the coalesced keyframe request.
"""

from __future__ import annotations

import logging
import random
import socket
import time
from collections.abc import Callable
from typing import Any

from aiortc import RTCRtpSender
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpparameters import RTCRtpSendParameters
from aiortc.rtp import (
    RTCP_PSFB_APP,
    RTCP_PSFB_FIR,
    RTCP_PSFB_PLI,
    RTCP_RTPFB_NACK,
    RtcpPsfbPacket,
    RtcpRrPacket,
    RtcpRtpfbPacket,
    RtcpSrPacket,
    unpack_remb_fci,
)

from ruseon_appliance.engine import aiortc_internals
from ruseon_appliance.stream.cursor import ViewerCursor
from ruseon_appliance.stream.fanout import Fanout
from ruseon_appliance.stream.gso import DropCounters, GsoSender
from ruseon_appliance.stream.history import PacketizedFrame
from ruseon_appliance.stream.nack import NackResponder
from ruseon_appliance.stream.pacing import JoinPacer, SendBudget
from ruseon_appliance.stream.reports import ReceiverStats, SenderReports
from ruseon_appliance.stream.rtp_header import RtpHeaderTemplate
from ruseon_appliance.stream.rtp_writer import SrtpPacketWriter
from ruseon_appliance.stream.srtp import SrtpPacketBuffer, srtp_handle

__all__ = ["FanoutTrack", "FanoutViewer", "take_over_stream"]

logger = logging.getLogger(__name__)


def _ignore_keyframe_request(reason: str) -> None:
    """A stopped viewer's keyframe requests go nowhere."""


def _ignore_nack(sequence_number: int) -> None:
    """A stopped viewer's NACKs go nowhere."""


def take_over_stream(sender: RTCRtpSender, parameters: RTCRtpSendParameters,
                     sink: aiortc_internals.RtcpSink, reports: SenderReports,
                     payload_type: int, *, batch: SrtpPacketBuffer, single: SrtpPacketBuffer,
                     gso: GsoSender, drops: DropCounters) -> tuple[SrtpPacketWriter, Any]:
    """Once a viewer's DTLS is up: the writer of its stream ``sink._ssrc`` as negotiated
    (payload type, MID and header extensions, the transport's SRTP session), its sender
    reports named, and the transport's RTCP about it routed to ``sink``. Returns the writer
    and the SRTP session (for one-off packets and RTCP)."""
    reports.ssrc = sink._ssrc
    reports.cname = parameters.rtcp.cname or ""
    header = RtpHeaderTemplate(
        payload_type, sink._ssrc, mid=parameters.muxId or "",
        extensions=[(ext.uri, ext.id) for ext in parameters.headerExtensions])
    session = aiortc_internals.srtp_session(sender)
    writer = SrtpPacketWriter(header, srtp_handle(session), batch=batch, single=single, gso=gso,
                              drops=drops)
    aiortc_internals.route_rtcp_to(sender, sink, parameters)
    return writer, session


class FanoutTrack(MediaStreamTrack):  # type: ignore[misc]
    """The track a fan-out viewer's transceiver carries: it only makes aiortc negotiate a
    sendonly video stream (msid, SSRCs); its ``recv`` is never called."""

    kind = "video"

    async def recv(self) -> Any:
        """Never called: the fan-out sends this viewer's media itself."""
        raise MediaStreamError


class FanoutViewer:
    """One WebRTC viewer on the fan-out path: the parts above, bound to its aiortc sender."""

    def __init__(
        self,
        fanout: Fanout,
        cursor: ViewerCursor[PacketizedFrame],
        *,
        on_keyframe_request: Callable[[str], None],
        on_nack: Callable[[int], None],
    ) -> None:
        self._fanout = fanout
        self.cursor = cursor
        self.on_keyframe_request = on_keyframe_request
        self.on_nack = on_nack
        self.active = False
        self.closed = False
        self._sender: RTCRtpSender | None = None
        self._connection: Any = None
        self._srtp: Any = None
        self._ssrc = 0
        self.payload_type = 0
        self.drops = DropCounters()
        self.budget = SendBudget(fanout.stream_byte_rate)
        self.pacer = JoinPacer()
        self.nack = NackResponder(fanout.history.history_s)
        self.reports = SenderReports()
        self.receiver = ReceiverStats()
        self._writer: SrtpPacketWriter | None = None  # from _start (SSRC, PT, SRTP known)
        self._ts_origin = random.randrange(0, 1 << 32)
        # The frame being sent and how many of its packets are out.
        self._current: tuple[PacketizedFrame, int, int] | None = None  # frame, timestamp, next
        # The capture time (wall clock, us) of the frame being sent: sender reports map RTP
        # time to it, as the session's audio does (lip sync).
        self._current_capture_us: int | None = None
        # counters
        self.frames_sent = 0
        self.keyframes_sent = 0
        self.keyframe_skips = 0
        self.refreshes = 0  # keyframe requests answered from the ring (refresh)

    # -- the duck type WhepSession uses for its track ---------------------------------------------

    @property
    def join_mode(self) -> str:
        """How this viewer joined (see ``stream/cursor.py``)."""
        return self.cursor.join_mode

    @property
    def frames_skipped(self) -> int:
        """Frames never sent to this viewer (stale after joining, or dropped to catch up)."""
        return self.cursor.frames_skipped

    # -- the parts' figures, under the names the session's stats use -----------------------------

    @property
    def budget_bytes_per_s(self) -> float | None:
        """This viewer's send budget in bytes/s (None: ``BUDGET_FACTOR`` x the stream's)."""
        return self.budget.override

    @budget_bytes_per_s.setter
    def budget_bytes_per_s(self, value: float | None) -> None:
        self.budget.override = value

    @property
    def join_slices(self) -> int:
        """Service calls that sent part of the join burst."""
        return self.pacer.slices

    @property
    def rtx_ssrc(self) -> int:
        """The SSRC retransmissions go out on (RTX)."""
        return self.nack.rtx_ssrc

    @property
    def rtx_payload_type(self) -> int | None:
        """RTX's payload type, None when not negotiated."""
        return self.nack.rtx_payload_type

    @property
    def packets_sent(self) -> int:
        """RTP packets sent (media and the leading padding packet)."""
        return self.reports.packets_sent

    @property
    def bytes_sent(self) -> int:
        """Payload octets sent, as RTCP SR counts them."""
        return self.reports.octets_sent

    @property
    def nacked(self) -> int:
        """Sequence numbers the viewer NACKed."""
        return self.nack.nacked

    @property
    def retransmitted(self) -> int:
        """Packets sent again on a NACK."""
        return self.nack.retransmitted

    @property
    def send_errors(self) -> int:
        """Packets lost to a send error (or refused by SRTP)."""
        return self.drops.send_errors

    @property
    def send_dropped_full(self) -> int:
        """Packets dropped on a full socket buffer."""
        return self.drops.send_dropped_full

    @property
    def rtt(self) -> float | None:
        """Round-trip time from receiver reports (seconds, smoothed)."""
        return self.receiver.rtt

    def stop(self) -> None:
        """Stop sending and release the ring cursor (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.active = False
        self.pacer.cancel()
        self._fanout.remove(self)
        self.cursor.close()
        self.nack.clear()
        self._current = None
        # Not needed any more, and part of reference cycles through aiortc's objects: let the
        # SRTP session and the connection go as soon as aiortc drops them.
        self._srtp = self._writer = None
        self._sender = self._connection = None
        # The session's callbacks close over the session, which holds this viewer: a cycle.
        self.on_keyframe_request = _ignore_keyframe_request
        self.on_nack = _ignore_nack
        self.cursor.request = _ignore_keyframe_request

    # -- start (from aiortc, once DTLS is connected) ---------------------------------------------

    def attach(self, sender: RTCRtpSender, connection: Any) -> None:
        """Bind to the session's sender and ICE connection (before the answer goes out)."""
        self._sender = sender
        self._connection = connection
        self._ssrc, self.nack.rtx_ssrc = aiortc_internals.sender_ssrcs(sender)
        aiortc_internals.take_over_sending(sender, self._start)

    async def _start(self, parameters: RTCRtpSendParameters) -> None:
        sender = self._sender
        if self.closed or sender is None or not aiortc_internals.transport_connected(sender):
            return
        codec = parameters.codecs[0]
        self.payload_type = codec.payloadType
        for c in parameters.codecs:
            if (c.mimeType.lower() == "video/rtx"
                    and c.parameters.get("apt") == codec.payloadType):
                self.nack.rtx_payload_type = c.payloadType
                break
        fanout = self._fanout
        self._writer, self._srtp = take_over_stream(
            sender, parameters, self, self.reports, self.payload_type, batch=fanout.batch,
            single=fanout.buffer, gso=fanout.gso_sender, drops=self.drops)
        self.budget.fill(time.monotonic())
        self.reports.first_due(time.monotonic() + 0.2)  # an early SR: RTT and sync from the start
        self.active = True
        fanout.activate(self)

    # -- sending ---------------------------------------------------------------------------------

    def _route(self) -> tuple[socket.socket, tuple[str, int]] | None:
        """The mux socket and the viewer's nominated address (None: no route now)."""
        pair = aiortc_internals.nominated_pair(self._connection)
        if pair is None:
            return None
        sock = self._fanout.socket_for(pair[0].family)
        if sock is None:
            return None
        return sock, pair[1]

    def service(self, now: float) -> None:
        """Queue what the ring has for this viewer and send as much as its budget allows."""
        cursor = self.cursor
        joining = cursor.reader is None
        cursor.pull()
        pacer = self.pacer
        if joining:
            pacer.start_burst(len(cursor.queue))
        budget = self.budget
        budget.refill(now)
        sent = self.frames_sent
        # The pacer's bursting()/pacing() tests, read inline: this runs per frame per viewer.
        burst = pacer.burst_frames
        # Before the join burst (keyframe + catch-up frames) is out, a long queue is that burst,
        # which is deliberate, not a viewer falling behind.
        if sent >= burst and len(cursor.queue) > self._fanout.max_backlog_frames:
            # Cannot keep up: everything queued is stale; resume at the next keyframe.
            cursor.skip_to_next_keyframe()
            self._current = None
            self.keyframe_skips += 1
            cursor.pull()
        pair = aiortc_internals.nominated_pair(self._connection)  # _route(), inline
        if pair is None:
            return
        sock = self._fanout.socket_for(pair[0].family)
        if sock is None:
            return
        addr = pair[1]
        paced = sent < burst or (sent == burst and self._current is not None)
        if paced:
            pacer.open_slice(budget)
        writer = self._writer
        assert writer is not None
        while True:
            current = self._current
            if current is None:
                if not cursor.queue:
                    break
                frame, out_pts, keyframe, capture_us = cursor.queue.popleft()
                current = (frame, (self._ts_origin + out_pts) & 0xFFFFFFFF, 0)
                if self.frames_sent == 0:
                    self._send_leading_padding(sock, addr, current[1])
                self.frames_sent += 1
                # A join or refresh burst's frames are stamped for when they leave, not for
                # when they were captured: their reports place RTP time by the send time.
                self._current_capture_us = capture_us if self.frames_sent > burst else None
                self.keyframes_sent += keyframe
            # The rest of the frame, as far as the budget goes (the per-packet loop).
            frame, timestamp, start = current
            first_seq = writer.seq
            i, budget.tokens, octets = writer.send_frame(frame, timestamp, start, budget.tokens,
                                                         sock, addr)
            if i > start:
                self.reports.sent(i - start, octets, timestamp, now, self._current_capture_us)
                self.nack.note(first_seq, frame, start, i - start, timestamp, now)
            if i < len(frame.payloads):
                self._current = (frame, timestamp, i)
                break
            self._current = None
        if paced:
            more = (self._current is not None or bool(cursor.queue)) and not self.closed
            pacer.close_slice(budget, more, self._paced)

    def refresh(self) -> bool:
        """Answer this viewer's PLI/FIR from the ring (:meth:`ViewerCursor.refresh`), sent
        paced like a join burst. A request while such a burst is still going out is served
        by it (False); so is one before the viewer has joined."""
        if self.closed or not self.active or self.pacer.bursting(self.frames_sent):
            return False
        if not self.cursor.refresh():
            return False
        # The frame half sent is superseded: its tail is lost like any packet, and the
        # keyframe behind it starts the picture afresh.
        self._current = None
        self.pacer.start_burst(self.frames_sent + len(self.cursor.queue))
        self.refreshes += 1
        self.service(time.monotonic())
        return True

    def _paced(self) -> None:
        """The next slice of the join burst."""
        if self.closed or not self.active:
            return
        try:
            self.service(time.monotonic())
        except Exception:  # as in Fanout.pump: one viewer's failure stops nothing else
            logger.exception("fan-out: sending the join burst failed")

    def _send_leading_padding(self, sock: socket.socket, addr: tuple[str, int],
                              timestamp: int) -> None:
        """One padding-only packet in front of the viewer's first media packet.

        A receiver cannot notice that the first packet of a stream was lost (it knows no earlier
        sequence number), and ours carries the join keyframe's SPS/PPS: losing it would cost a
        keyframe request and a fresh IDR. Behind this packet that loss is an ordinary gap, which
        the viewer NACKs and :meth:`retransmit` repairs.
        """
        assert self._writer is not None
        self._writer.send_padding(sock, addr, timestamp)
        self.reports.packets_sent += 1  # a packet, but no payload octets (RFC 3550 6.4.1)

    def retransmit(self, seq: int) -> bool:
        """Send packet ``seq`` again (as RTX if negotiated); False if it is gone or over
        budget."""
        writer = self._writer
        route = self._route()
        send = None if route is None or writer is None else self._protected_sender(*route)
        return self.nack.respond(seq, writer.header if writer else None, self.budget,
                                 time.monotonic(), send)

    def _protected_sender(self, sock: socket.socket,
                          addr: tuple[str, int]) -> Callable[[bytes], bool]:
        def send(data: bytes) -> bool:
            try:
                sock.sendto(self._srtp.protect(data), addr)
            except OSError:
                self.drops.send_errors += 1
                return False
            return True
        return send

    # -- RTCP ------------------------------------------------------------------------------------

    def maybe_send_report(self, now: float) -> None:
        """Send a sender report (+ SDES CNAME) when one is due."""
        if self.reports.due(now):
            self.send_report(now)

    def send_report(self, now: float) -> None:
        """Send an SR now: NTP time and the RTP timestamp of this same instant."""
        route = self._route()
        if route is None:
            return
        sock, addr = route
        packet, ntp = self.reports.report(now)
        try:
            sock.sendto(self._srtp.protect_rtcp(packet), addr)
        except OSError:
            self.drops.send_errors += 1
            return
        self.reports.sent_report(ntp, now)

    async def _handle_rtcp_packet(self, packet: Any) -> None:
        """RTCP about this viewer's SSRC, routed here by the DTLS transport."""
        if self.closed:
            return
        if isinstance(packet, RtcpRrPacket | RtcpSrPacket):
            now = time.monotonic()
            for report in packet.reports:
                if report.ssrc != self._ssrc:
                    continue
                self.receiver.report_block(report.fraction_lost, report.packets_lost,
                                           report.jitter, report.dlsr,
                                           self.reports.sent_at(report.lsr), now)
        elif isinstance(packet, RtcpRtpfbPacket) and packet.fmt == RTCP_RTPFB_NACK:
            for seq in packet.lost:
                self.on_nack(seq)
                self.retransmit(seq)
        elif isinstance(packet, RtcpPsfbPacket) and packet.fmt in (RTCP_PSFB_PLI,
                                                                   RTCP_PSFB_FIR):
            self.on_keyframe_request("pli/fir")
        elif isinstance(packet, RtcpPsfbPacket) and packet.fmt == RTCP_PSFB_APP:
            try:
                bitrate, ssrcs = unpack_remb_fci(packet.fci)
            except ValueError:
                return
            if self._ssrc in ssrcs:
                self.receiver.remb(bitrate)

    # -- stats -----------------------------------------------------------------------------------

    def counters(self) -> tuple[int, int, float | None]:
        """``(packets_sent, payload_bytes_sent, rtt_seconds_or_None)``."""
        return self.packets_sent, self.bytes_sent, self.rtt

    def stats(self) -> dict[str, Any]:
        """Per-viewer send-path figures for the session's stats."""
        receiver = self.receiver
        return {
            "retransmitted": self.nack.retransmitted,
            "nack_unavailable": self.nack.nack_unavailable,
            "nack_over_budget": self.nack.nack_over_budget,
            "keyframe_skips": self.keyframe_skips,
            "send_dropped_full": self.drops.send_dropped_full,
            "send_errors": self.drops.send_errors,
            "sender_reports": self.reports.reports_sent,
            "receiver_reports": receiver.reports,
            "fraction_lost": round(receiver.fraction_lost, 4),
            "packets_lost": receiver.packets_lost,
            "jitter_ms": round(receiver.jitter_ms, 2),
            "remb_bps": receiver.remb_bps,
        }
