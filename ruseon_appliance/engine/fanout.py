"""The fan-out send path: packetize each access unit once, send it to every viewer.

aiortc keeps signaling, ICE, DTLS and SRTP key derivation. Once a viewer's DTLS transport is up,
the engine takes over what its ``RTCRtpSender`` would do, at a fraction of the cost:

- each ring frame is split into RTP payloads (single NAL / STAP-A / FU-A) **once**, by
  :class:`PacketHistory`; every viewer sends the same payload objects;
- per viewer and packet only the 12-byte RTP header and the negotiated header extensions are
  written (``struct.pack_into`` into a buffer made once per viewer), the packet is protected
  with that viewer's SRTP session and sent with a plain non-blocking ``sendto`` on the mux
  socket to the viewer's nominated address: no awaits, no per-packet objects;
- the RTCP the engine then owes: sender reports (NTP/RTP mapping, RTT), NACK -> retransmission
  (RTX when negotiated) from the frames the viewer was sent in the last :data:`HISTORY_S`
  seconds, PLI/FIR -> the coalesced keyframe request, receiver reports -> loss/jitter/RTT stats;
- a per-viewer send budget (token bucket, a multiple of the stream's rate): a viewer that falls
  more than :data:`MAX_BACKLOG_S` behind skips to the next keyframe instead of queueing.

One task drives everything: it wakes on each ring write and services every viewer in turn.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiortc import RTCRtpSender
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpparameters import RTCRtpSendParameters
from aiortc.rtp import (
    RTCP_PSFB_APP,
    RTCP_PSFB_FIR,
    RTCP_PSFB_PLI,
    RTCP_RTPFB_NACK,
    RtcpPacket,
    RtcpPsfbPacket,
    RtcpRrPacket,
    RtcpRtpfbPacket,
    RtcpSrPacket,
    unpack_remb_fci,
)

from ruseon_appliance.capture.ring import FrameView
from ruseon_appliance.engine import aiortc_internals
from ruseon_appliance.engine.h264_rtp import equal_runs, packetize
from ruseon_appliance.engine.track import VideoFeed, ViewerCursor
from ruseon_appliance.logs import RateLimit
from ruseon_appliance.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

# Packets a viewer can have re-sent: at least one second of video (a whole 1080p keyframe).
HISTORY_S = 1.5
# A viewer further behind than this (in queued frames' worth of time) skips to the next keyframe.
MAX_BACKLOG_S = 0.5
# Per-viewer send budget as a multiple of the stream's byte rate, and its burst in seconds of
# that budget: room for a join burst (keyframe + catch-up frames) and retransmissions.
BUDGET_FACTOR = 3.0
BUDGET_BURST_S = 1.0
# The join burst (keyframe + catch-up frames, up to a whole GOP) leaves in slices of this many
# bytes this far apart: about 50 Mbit/s to the joining viewer, so a GOP reaches it within
# ~100 ms without overrunning the socket's send buffer or a Wi-Fi link in one go.
JOIN_PACE_BYTES = 32_768
JOIN_PACE_S = 0.005
# The join burst's RTP timestamps follow that pace (see ``track.py``): 90 kHz ticks per byte.
JOIN_TICKS_PER_BYTE = JOIN_PACE_S * 90_000 / JOIN_PACE_BYTES
# Sender report interval (randomised 0.5-1.5x, as RFC 3550 asks).
SR_INTERVAL_S = 1.0
# A failing viewer or consumer is logged with its traceback at most this often.
ERROR_LOG_INTERVAL_S = 10.0

MID_URI = "urn:ietf:params:rtp-hdrext:sdes:mid"
ABS_SEND_TIME_URI = "http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"
NTP_EPOCH_OFFSET = 2_208_988_800  # seconds from 1900 (NTP) to 1970 (Unix)

_HEADER = struct.Struct("!BHII")  # byte 1 (marker|PT), sequence number, timestamp, SSRC
# The payload of a padding-only RTP packet (RFC 3550 5.1: the last octet counts the padding).
_LEADING_PADDING = b"\x00\x00\x00\x04"
_ABS = struct.Struct("!I")

# UDP generic segmentation offload (Linux >= 4.18): one sendmsg, many datagrams of one size.
UDP_SEGMENT = 103
# The kernel's UDP_MAX_SEGMENTS (64 up to Linux 6.x) and the largest UDP payload over IPv4.
GSO_MAX_SEGMENTS = 64
GSO_MAX_BYTES = 65_000
# Errors meaning the kernel or the route will not segment for us: send datagram by datagram.
GSO_REFUSED = (errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP)


def ntp_now() -> int:
    """The current wall-clock time as a 64-bit NTP timestamp."""
    t = time.time() + NTP_EPOCH_OFFSET
    seconds = int(t)
    return (seconds << 32) | int((t - seconds) * (1 << 32))


def sender_report(ssrc: int, rtp_timestamp: int, packets: int, octets: int, cname: str) -> bytes:
    """An RTCP compound packet: sender report (now, in NTP) + SDES CNAME, as relays and RTSP
    clients send them (RFC 3550 6.4.1, 6.5.1)."""
    ntp = ntp_now()
    sr = struct.pack("!BBHIIIIII", 0x80, 200, 6, ssrc, ntp >> 32, ntp & 0xFFFFFFFF,
                     rtp_timestamp & 0xFFFFFFFF, packets & 0xFFFFFFFF, octets & 0xFFFFFFFF)
    name = cname.encode()
    chunk = struct.pack("!IBB", ssrc, 1, len(name)) + name + b"\x00"
    chunk += b"\x00" * (-len(chunk) % 4)
    return sr + struct.pack("!BBH", 0x81, 202, len(chunk) // 4) + chunk


@dataclass
class RtcpFeedback:
    """What a relay target or RTSP client said in one RTCP datagram about the stream ``ssrc``."""

    keyframe_requests: list[str]  # "pli" / "fir", one per request
    remb_bps: int | None = None
    fraction_lost: float | None = None
    reports: int = 0  # receiver report blocks about ssrc


def rtcp_feedback(data: bytes, ssrc: int) -> RtcpFeedback | None:
    """Parse an RTCP compound packet from a consumer's peer; None when it is not RTCP (a
    client's bytes must not crash anything)."""
    try:
        packets = RtcpPacket.parse(data)
    except Exception:
        return None
    feedback = RtcpFeedback([])
    for packet in packets:
        if isinstance(packet, RtcpPsfbPacket) and packet.fmt in (RTCP_PSFB_PLI, RTCP_PSFB_FIR):
            if packet.fmt == RTCP_PSFB_PLI and packet.media_ssrc not in (ssrc, 0):
                continue
            feedback.keyframe_requests.append("pli" if packet.fmt == RTCP_PSFB_PLI else "fir")
        elif isinstance(packet, RtcpPsfbPacket) and packet.fmt == RTCP_PSFB_APP:
            try:
                bitrate, ssrcs = unpack_remb_fci(packet.fci)
            except ValueError:
                continue
            if ssrc in ssrcs or not ssrcs:
                feedback.remb_bps = bitrate
        elif isinstance(packet, RtcpRrPacket | RtcpSrPacket):
            for report in packet.reports:
                if report.ssrc == ssrc:
                    feedback.reports += 1
                    feedback.fraction_lost = report.fraction_lost / 256
    return feedback


def _ignore_keyframe_request(reason: str) -> None:
    """A stopped viewer's keyframe requests go nowhere."""


def _ignore_nack(sequence_number: int) -> None:
    """A stopped viewer's NACKs go nowhere."""


@dataclass(eq=False, slots=True)
class PacketizedFrame:
    """One ring frame's RTP payloads, shared by every viewer."""

    seq: int
    payloads: list[bytes]
    created: float
    keyframe: bool
    size: int
    # Index one past each batch of equal-sized payloads (see ``h264_rtp.equal_runs``).
    ends: list[int]


class PacketHistory:
    """Frames packetized once, by ring sequence number, kept for :data:`HISTORY_S` (viewers
    that were sent a frame keep a reference to it for their retransmissions)."""

    def __init__(self, history_s: float = HISTORY_S) -> None:
        self.history_s = history_s
        self._frames: dict[int, PacketizedFrame] = {}
        self.frames_packetized = 0
        self.packets_packetized = 0
        # Stream byte rate, smoothed: the viewers' send budget is a multiple of it.
        self.byte_rate = 0.0
        self._rate_stamp: float | None = None

    def frame(self, view: FrameView) -> PacketizedFrame:
        """The shared packetization of ``view`` (made on first request)."""
        frame = self._frames.get(view.seq)
        if frame is None:
            payloads = packetize(bytes(view.data))
            now = time.monotonic()
            frame = PacketizedFrame(view.seq, payloads, now, view.keyframe,
                                    sum(len(p) for p in payloads), equal_runs(payloads))
            self._frames[view.seq] = frame
            self.frames_packetized += 1
            self.packets_packetized += len(payloads)
            self._measure(frame.size, now)
        return frame

    def _measure(self, size: int, now: float) -> None:
        if self._rate_stamp is None:
            self._rate_stamp = now
            return
        dt = max(1e-3, now - self._rate_stamp)
        self._rate_stamp = now
        alpha = min(1.0, dt / 2.0)  # ~2 s smoothing
        self.byte_rate += alpha * (size / dt - self.byte_rate)

    def prune(self, now: float) -> None:
        """Forget frames older than the history (oldest first; dicts keep insertion order)."""
        cutoff = now - self.history_s
        frames = self._frames
        while frames:
            seq = next(iter(frames))
            if frames[seq].created >= cutoff:
                return
            del frames[seq]

    def __len__(self) -> int:
        return len(self._frames)


class FanoutTrack(MediaStreamTrack):  # type: ignore[misc]
    """The track a fan-out viewer's transceiver carries: it only makes aiortc negotiate a
    sendonly video stream (msid, SSRCs); its ``recv`` is never called."""

    kind = "video"

    async def recv(self) -> Any:
        """Never called: the fan-out sends this viewer's media itself."""
        raise MediaStreamError


@dataclass(eq=False, slots=True)
class _SentRun:
    """Packets ``offset .. offset+count-1`` of ``frame`` went out as ``seq .. seq+count-1``."""

    seq: int
    frame: PacketizedFrame
    offset: int
    count: int
    timestamp: int


class FanoutViewer:
    """One viewer on the fan-out path: its RTP state, SRTP session, budget and RTCP."""

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
        self._srtp_handle: Any = None
        self._ssrc = 0
        self.rtx_ssrc = 0
        self.payload_type = 0
        self.rtx_payload_type: int | None = None
        self._cname = ""
        self._header = bytearray(12)
        # The whole header in one pack_into: first byte, M|PT, seq, timestamp, SSRC, extensions.
        self._hstruct = struct.Struct("!BBHII0s")
        self._b0 = 0x80
        self._ext = b""
        self._abs_offset = -1
        self._seq = random.randrange(0, 32768)  # lower half, as aiortc: no early SRTP ROC wrap
        self._rtx_seq = random.randrange(0, 32768)
        self._ts_origin = random.randrange(0, 1 << 32)
        self._runs: deque[_SentRun] = deque()
        # The frame being sent and how many of its packets are out.
        self._current: tuple[PacketizedFrame, int, int] | None = None  # frame, timestamp, next
        self._tokens = 0.0
        self._token_stamp = time.monotonic()
        # Frames in the join burst (set when the cursor joins) and the pacing timer.
        self._burst_frames = 0
        self._pace_handle: asyncio.TimerHandle | None = None
        self.join_slices = 0  # service calls that sent part of the join burst
        self.budget_bytes_per_s: float | None = None  # None: BUDGET_FACTOR x stream rate
        self._last_ts = 0
        self._last_send_monotonic = 0.0
        self._next_sr = 0.0
        self._lsr: dict[int, float] = {}
        # counters
        self.frames_sent = 0
        self.keyframes_sent = 0
        self.packets_sent = 0
        self.bytes_sent = 0  # payload octets, as RTCP SR counts them
        self.retransmitted = 0
        self.nacked = 0
        self.nack_unavailable = 0
        self.nack_over_budget = 0
        self.keyframe_skips = 0
        self.refreshes = 0  # keyframe requests answered from the ring (refresh)
        self.send_dropped_full = 0
        self.send_errors = 0
        self.srs_sent = 0
        self.rrs_received = 0
        self.rtt: float | None = None
        self.fraction_lost = 0.0
        self.packets_lost = 0
        self.jitter_ms = 0.0
        self.remb_bps: int | None = None

    # -- the duck type WhepSession uses for its track ---------------------------------------------

    @property
    def join_mode(self) -> str:
        """How this viewer joined (see ``track.py``)."""
        return self.cursor.join_mode

    @property
    def frames_skipped(self) -> int:
        """Frames never sent to this viewer (stale after joining, or dropped to catch up)."""
        return self.cursor.frames_skipped

    def stop(self) -> None:
        """Stop sending and release the ring cursor (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.active = False
        if self._pace_handle is not None:
            self._pace_handle.cancel()
            self._pace_handle = None
        self._fanout.remove(self)
        self.cursor.close()
        self._runs.clear()
        self._current = None
        # Not needed any more, and part of reference cycles through aiortc's objects: let the
        # SRTP session and the connection go as soon as aiortc drops them.
        self._srtp = self._srtp_handle = None
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
        self._ssrc, self.rtx_ssrc = aiortc_internals.sender_ssrcs(sender)
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
                self.rtx_payload_type = c.payloadType
                break
        self._cname = parameters.rtcp.cname or ""
        self._build_header(parameters)
        self._srtp = aiortc_internals.srtp_session(sender)
        self._srtp_handle = aiortc_internals.srtp_handle(self._srtp)
        aiortc_internals.route_rtcp_to(sender, self, parameters)
        self._token_stamp = time.monotonic()
        self._tokens = self._budget_rate() * BUDGET_BURST_S
        self._next_sr = time.monotonic() + 0.2  # an early SR: RTT and sync from the start
        self.active = True
        self._fanout.activate(self)

    def _build_header(self, parameters: RTCRtpSendParameters) -> None:
        mid = (parameters.muxId or "").encode()
        extensions: list[tuple[int, bytes]] = []
        for ext in parameters.headerExtensions:
            if ext.uri == MID_URI and mid:
                extensions.append((ext.id, mid))
            elif ext.uri == ABS_SEND_TIME_URI:
                extensions.append((ext.id, b""))  # 3 bytes, written per frame
        header = bytearray(struct.pack("!BBHII", 0x80, self.payload_type, 0, 0, self._ssrc))
        if extensions:
            header[0] |= 0x10
            one_byte = all(0 < i <= 14 and len(v) <= 16 for i, v in extensions)
            body = bytearray()
            for ext_id, value in extensions:
                length = len(value) or 3
                body += bytes([(ext_id << 4) | (length - 1)] if one_byte else [ext_id, length])
                if not value:
                    self._abs_offset = 16 + len(body)
                    value = b"\x00\x00\x00"
                body += value
            body += b"\x00" * (-len(body) % 4)
            header += struct.pack("!HH", 0xBEDE if one_byte else 0x1000, len(body) // 4) + body
        self._header = header
        self._b0 = header[0]
        self._ext = bytes(header[12:])
        self._hstruct = struct.Struct(f"!BBHII{len(self._ext)}s")

    # -- sending ---------------------------------------------------------------------------------

    def _budget_rate(self) -> float:
        if self.budget_bytes_per_s is not None:
            return self.budget_bytes_per_s
        return BUDGET_FACTOR * max(self._fanout.history.byte_rate, self._fanout.min_byte_rate)

    def service(self, now: float) -> None:
        """Queue what the ring has for this viewer and send as much as its budget allows."""
        cursor = self.cursor
        joining = cursor.reader is None
        cursor.pull()
        if joining:
            self._burst_frames = len(cursor.queue)
        self._refill(now)
        sent = self.frames_sent
        burst = self._burst_frames
        # Before the join burst (keyframe + catch-up frames) is out, a long queue is that burst,
        # which is deliberate, not a viewer falling behind.
        if sent >= burst and len(cursor.queue) > self._fanout.max_backlog_frames:
            # Cannot keep up: everything queued is stale; resume at the next keyframe.
            cursor.skip_to_next_keyframe()
            self._current = None
            self.keyframe_skips += 1
            cursor.pull()
        pair = aiortc_internals.nominated_pair(self._connection)
        if pair is None:
            return
        sock = self._fanout.socket_for(pair[0].family)
        if sock is None:
            return
        paced = sent < burst or (sent == burst and self._current is not None)
        if paced:
            tokens = self._tokens
            self._tokens = min(tokens, JOIN_PACE_BYTES)
            allowed = self._tokens
        addr = pair[1]
        while True:
            current = self._current
            if current is None:
                if not cursor.queue:
                    break
                frame, out_pts, keyframe, _capture = cursor.queue.popleft()
                current = (frame, (self._ts_origin + out_pts) & 0xFFFFFFFF, 0)
                if self.frames_sent == 0:
                    self._send_leading_padding(sock, addr, current[1])
                self.frames_sent += 1
                self.keyframes_sent += keyframe
            if not self._send_frame(current, sock, addr, now):
                break
        if paced:
            self.join_slices += 1
            self._tokens = tokens - (allowed - self._tokens)
            if ((self._current is not None or cursor.queue) and self._pace_handle is None
                    and not self.closed):
                self._pace_handle = asyncio.get_running_loop().call_later(
                    JOIN_PACE_S, self._paced)

    def refresh(self) -> bool:
        """Answer this viewer's PLI/FIR from the ring (:meth:`ViewerCursor.refresh`), sent
        paced like a join burst. A request while such a burst is still going out is served
        by it (False); so is one before the viewer has joined."""
        if self.closed or not self.active or self.frames_sent < self._burst_frames:
            return False
        if not self.cursor.refresh():
            return False
        # The frame half sent is superseded: its tail is lost like any packet, and the
        # keyframe behind it starts the picture afresh.
        self._current = None
        self._burst_frames = self.frames_sent + len(self.cursor.queue)
        self.refreshes += 1
        self.service(time.monotonic())
        return True

    def _paced(self) -> None:
        """The next slice of the join burst."""
        self._pace_handle = None
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
        buffer = self._fanout.buffer
        view = buffer.view
        header = self._header
        self._stamp_abs_send_time(header)
        hl = len(header)
        view[0:hl] = header
        view[0] = header[0] | 0x20  # P bit: the payload is all padding
        _HEADER.pack_into(view, 1, self.payload_type, self._seq, timestamp, self._ssrc)
        view[hl:hl + len(_LEADING_PADDING)] = _LEADING_PADDING
        buffer.length[0] = hl + len(_LEADING_PADDING)
        if aiortc_internals.srtp_protect_in_place(
                self._srtp_handle, buffer.cdata, buffer.length) == aiortc_internals.SRTP_OK:
            try:
                sock.sendto(view[:buffer.length[0]], addr)
            except OSError:
                self.send_errors += 1
        self._seq = (self._seq + 1) & 0xFFFF
        self.packets_sent += 1

    def _stamp_abs_send_time(self, header: bytearray) -> None:
        if self._abs_offset >= 0:
            at = self._abs_offset
            header[at:at + 3] = ((ntp_now() >> 14) & 0xFFFFFF).to_bytes(3, "big")

    def _send_frame(self, current: tuple[PacketizedFrame, int, int], sock: socket.socket,
                    addr: tuple[str, int], now: float) -> bool:
        """Send the rest of ``current`` within budget; True if the whole frame is out.

        The hot loop. Packets are written one behind the other into the fan-out's batch buffer
        (the whole header in one ``pack_into``, the payload copied behind it), protected in
        place, and every batch of equal-sized packets (``frame.ends``) leaves in one
        ``sendmsg`` with ``UDP_SEGMENT`` set to their protected size: one syscall per batch
        instead of one per packet. Without GSO each packet goes out with ``sendto``.
        """
        frame, timestamp, start = current
        payloads = frame.payloads
        last = len(payloads) - 1
        fanout = self._fanout
        ext = self._ext
        if self._abs_offset >= 0:
            # abs-send-time: 24 bits of NTP time (6.18 fixed point), written once per frame.
            at = self._abs_offset - 12
            ext = ext[:at] + ((ntp_now() >> 14) & 0xFFFFFF).to_bytes(3, "big") + ext[at + 3:]
        buffer = fanout.batch
        view = buffer.view
        cdata = buffer.cdata
        length = buffer.length
        protect = aiortc_internals.srtp_protect_in_place
        handle = self._srtp_handle
        ok = aiortc_internals.SRTP_OK
        pack_into = self._hstruct.pack_into
        b0 = self._b0
        hl = self._hstruct.size
        pt = self.payload_type
        ssrc = self._ssrc
        seq = self._seq
        first_seq = seq
        tokens = self._tokens
        octets = 0
        i = start
        starved = False
        for end in frame.ends:
            # One batch of equal-sized packets: i .. end-1, in as many sends as it takes.
            while i < end:
                offset = 0
                count = 0
                segment = 0
                while i < end and count < GSO_MAX_SEGMENTS:
                    payload = payloads[i]
                    size = len(payload)
                    if tokens < size:
                        starved = True
                        break
                    n = offset + hl + size
                    if n + 32 > GSO_MAX_BYTES:
                        break
                    pack_into(view, offset, b0, (0x80 | pt) if i == last else pt, seq,
                              timestamp, ssrc, ext)
                    view[offset + hl:n] = payload
                    length[0] = n - offset
                    if protect(handle, cdata + offset, length) == ok:
                        if not count:
                            segment = length[0]
                        offset += length[0]
                        count += 1
                    else:
                        self.send_errors += 1  # lost like on the wire: a NACK recovers it
                    tokens -= size
                    octets += size
                    seq = (seq + 1) & 0xFFFF
                    i += 1
                if count:
                    fanout.send_batch(self, sock, addr, view, offset, segment, count)
                if starved:
                    break
            if starved:
                break
        sent = i - start
        self._tokens = tokens
        self._seq = seq
        if sent:
            self.bytes_sent += octets
            self.packets_sent += sent
            self._last_ts = timestamp
            self._last_send_monotonic = now
            self._note_run(first_seq, frame, start, sent, timestamp, now)
        if i > last:
            self._current = None
            return True
        self._current = (frame, timestamp, i)
        return False

    def _note_run(self, seq: int, frame: PacketizedFrame, offset: int, count: int,
                  timestamp: int, now: float) -> None:
        runs = self._runs
        if runs:
            tail = runs[-1]
            if tail.frame is frame and tail.offset + tail.count == offset:
                tail.count += count
                return
        runs.append(_SentRun(seq, frame, offset, count, timestamp))
        cutoff = now - self._fanout.history.history_s
        while runs and runs[0].frame.created < cutoff and len(runs) > 1:
            runs.popleft()

    def retransmit(self, seq: int) -> bool:
        """Send packet ``seq`` again (as RTX if negotiated); False if it is gone or over
        budget."""
        for run in reversed(self._runs):
            delta = (seq - run.seq) & 0xFFFF
            if delta < run.count:
                break
        else:
            self.nack_unavailable += 1
            return False
        payload = run.frame.payloads[run.offset + delta]
        marker = 0x80 if run.offset + delta == len(run.frame.payloads) - 1 else 0
        pair = aiortc_internals.nominated_pair(self._connection)
        sock = self._fanout.socket_for(pair[0].family) if pair else None
        if sock is None or pair is None:
            return False
        self._refill(time.monotonic())
        if self._tokens < len(payload) + 2:
            self.nack_over_budget += 1
            return False
        header = bytearray(self._header)
        self._stamp_abs_send_time(header)
        if self.rtx_payload_type is not None:
            _HEADER.pack_into(header, 1, marker | self.rtx_payload_type, self._rtx_seq,
                              run.timestamp, self.rtx_ssrc)
            self._rtx_seq = (self._rtx_seq + 1) & 0xFFFF
            data = b"".join((header, seq.to_bytes(2, "big"), payload))
        else:
            _HEADER.pack_into(header, 1, marker | self.payload_type, seq, run.timestamp,
                              self._ssrc)
            data = b"".join((header, payload))
        try:
            sock.sendto(self._srtp.protect(data), pair[1])
        except OSError:
            self.send_errors += 1
            return False
        self._tokens -= len(payload) + 2
        self.retransmitted += 1
        return True

    def _refill(self, now: float) -> None:
        rate = self._budget_rate()
        self._tokens = min(rate * BUDGET_BURST_S,
                           self._tokens + (now - self._token_stamp) * rate)
        self._token_stamp = now

    # -- RTCP ------------------------------------------------------------------------------------

    def maybe_send_report(self, now: float) -> None:
        """Send a sender report (+ SDES CNAME) when one is due."""
        if now < self._next_sr or not self.packets_sent:
            return
        self._next_sr = now + SR_INTERVAL_S * (0.5 + random.random())
        self.send_report(now)

    def send_report(self, now: float) -> None:
        """Send an SR now: NTP time and the RTP timestamp of this same instant."""
        pair = aiortc_internals.nominated_pair(self._connection)
        sock = self._fanout.socket_for(pair[0].family) if pair else None
        if sock is None or pair is None:
            return
        ntp = ntp_now()
        rtp_ts = (self._last_ts + int((now - self._last_send_monotonic) * 90_000)) & 0xFFFFFFFF
        sr = struct.pack("!BBHIIIIII", 0x80, 200, 6, self._ssrc, ntp >> 32, ntp & 0xFFFFFFFF,
                         rtp_ts, self.packets_sent & 0xFFFFFFFF, self.bytes_sent & 0xFFFFFFFF)
        cname = self._cname.encode()[:255]
        chunk = struct.pack("!IBB", self._ssrc, 1, len(cname)) + cname + b"\x00"
        chunk += b"\x00" * (-len(chunk) % 4)
        sdes = struct.pack("!BBH", 0x81, 202, len(chunk) // 4) + chunk
        try:
            sock.sendto(self._srtp.protect_rtcp(sr + sdes), pair[1])
        except OSError:
            self.send_errors += 1
            return
        self._lsr[(ntp >> 16) & 0xFFFFFFFF] = now
        if len(self._lsr) > 8:
            del self._lsr[next(iter(self._lsr))]
        self.srs_sent += 1

    async def _handle_rtcp_packet(self, packet: Any) -> None:
        """RTCP about this viewer's SSRC, routed here by the DTLS transport."""
        if self.closed:
            return
        if isinstance(packet, RtcpRrPacket | RtcpSrPacket):
            now = time.monotonic()
            for report in packet.reports:
                if report.ssrc != self._ssrc:
                    continue
                self.rrs_received += 1
                self.fraction_lost = report.fraction_lost / 256
                self.packets_lost = report.packets_lost
                self.jitter_ms = report.jitter / 90
                sent_at = self._lsr.get(report.lsr)
                if report.lsr and sent_at is not None:
                    rtt = max(0.0, now - sent_at - report.dlsr / 65536)
                    self.rtt = rtt if self.rtt is None else 0.85 * self.rtt + 0.15 * rtt
        elif isinstance(packet, RtcpRtpfbPacket) and packet.fmt == RTCP_RTPFB_NACK:
            for seq in packet.lost:
                self.nacked += 1
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
                self.remb_bps = bitrate

    # -- stats -----------------------------------------------------------------------------------

    def counters(self) -> tuple[int, int, float | None]:
        """``(packets_sent, payload_bytes_sent, rtt_seconds_or_None)``."""
        return self.packets_sent, self.bytes_sent, self.rtt

    def stats(self) -> dict[str, Any]:
        """Per-viewer send-path figures for the session's stats."""
        return {
            "retransmitted": self.retransmitted,
            "nack_unavailable": self.nack_unavailable,
            "nack_over_budget": self.nack_over_budget,
            "keyframe_skips": self.keyframe_skips,
            "send_dropped_full": self.send_dropped_full,
            "send_errors": self.send_errors,
            "sender_reports": self.srs_sent,
            "receiver_reports": self.rrs_received,
            "fraction_lost": round(self.fraction_lost, 4),
            "packets_lost": self.packets_lost,
            "jitter_ms": round(self.jitter_ms, 2),
            "remb_bps": self.remb_bps,
        }


class FanoutConsumer(Protocol):
    """Something besides WebRTC viewers that sends the shared packets (an RTP relay, say):
    serviced on every ring write, after the viewers. It makes its own cursor with
    :meth:`Fanout.take`, so each frame is still packetized once for everybody."""

    def service(self, now: float) -> None:
        """Send what is new; must not raise for one destination's trouble."""


class Fanout:
    """The engine's one send loop: wakes on each ring write and services every viewer."""

    def __init__(self, feed: VideoFeed, socket_for: Callable[[int], socket.socket | None], *,
                 framerate: int, min_bitrate: int, history_s: float = HISTORY_S,
                 gso: bool = True) -> None:
        self._feed = feed
        self.socket_for = socket_for
        self.history = PacketHistory(history_s)
        # Packet buffers shared by every viewer: the loop is single-threaded and sends at once.
        self.buffer = aiortc_internals.SrtpPacketBuffer()
        self.batch = aiortc_internals.SrtpPacketBuffer(GSO_MAX_BYTES + 4096)
        # UDP_SEGMENT until the kernel refuses it once (then datagram by datagram for good).
        self.gso = gso
        self.gso_refused: str | None = None
        self._segment_cmsg: dict[int, list[tuple[int, int, bytes]]] = {}
        self.gso_sends = 0
        self.datagram_sends = 0
        self.max_backlog_frames = max(2, round(framerate * MAX_BACKLOG_S))
        self.min_byte_rate = min_bitrate / 8
        self._viewers: list[FanoutViewer] = []
        self._consumers: list[FanoutConsumer] = []
        self._task: asyncio.Task[None] | None = None
        self.pumps = 0
        # A viewer or consumer failing on every ring write (30 a second) must not flood the
        # journal with tracebacks: counted always, logged at most once per interval.
        self.service_errors = 0
        self._error_log = RateLimit(ERROR_LOG_INTERVAL_S)

    @property
    def viewers(self) -> list[FanoutViewer]:
        """Viewers currently being sent to."""
        return list(self._viewers)

    def start(self) -> None:
        """Start the send loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the send loop (viewers are stopped by their sessions)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def activate(self, viewer: FanoutViewer) -> None:
        """A viewer's DTLS is up: send it its first frames now, then on every ring write."""
        if viewer not in self._viewers:
            self._viewers.append(viewer)
        viewer.service(time.monotonic())

    def remove(self, viewer: FanoutViewer) -> None:
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

    def send_batch(self, viewer: FanoutViewer, sock: socket.socket, addr: tuple[str, int],
                   view: memoryview, size: int, segment: int, count: int) -> None:
        """Send ``view[:size]``: ``count`` protected packets of ``segment`` bytes each, laid
        end to end (the last may be shorter), in one ``UDP_SEGMENT`` send when the kernel
        allows it, else one ``sendto`` each."""
        if count > 1 and self.gso:
            cmsg = self._segment_cmsg.get(segment)
            if cmsg is None:
                cmsg = [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("H", segment))]
                self._segment_cmsg[segment] = cmsg
            try:
                sock.sendmsg((view[:size],), cmsg, 0, addr)
                self.gso_sends += 1
                return
            except BlockingIOError:
                viewer.send_dropped_full += count  # lost like on the wire: NACKs recover them
                return
            except OSError as exc:
                if exc.errno not in GSO_REFUSED:
                    viewer.send_errors += count
                    return
                # Detected once: this kernel/route does not segment. Resend this batch below.
                self.gso = False
                self.gso_refused = f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc}"
                logger.warning("fan-out: UDP GSO refused (%s); sending datagram by datagram",
                               self.gso_refused)
        sendto = sock.sendto
        offset = 0
        while offset < size:
            end = min(offset + segment, size)
            try:
                sendto(view[offset:end], addr)
            except BlockingIOError:
                viewer.send_dropped_full += 1
            except OSError:
                viewer.send_errors += 1
            offset = end
        self.datagram_sends += count

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
            "gso_sends": self.gso_sends,
            "datagram_sends": self.datagram_sends,
            "service_errors": self.service_errors,
        }
