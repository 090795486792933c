"""Taps into one aiortc ``RTCRtpReceiver`` to see what a viewer really receives.

Written for aiortc 1.16. aiortc hides the RTP and access-unit level behind its track, so a viewer
that wants honest figures has to reach into the receiver; every such reach is in this module, and
``tests/e2e/test_hil_units.py`` fails loudly if an aiortc upgrade moves what it relies on:

- ``RTCRtpReceiver._handle_rtp_packet(packet, arrival_time_ms)``: wrapped to time the first RTP
  packet and to count packets, bytes, sequence gaps and RTX retransmissions.
- ``RTCRtpReceiver._send_rtcp_nack`` / ``_send_rtcp_pli``: wrapped to count NACKs and PLIs sent.
- ``RTCRtpReceiver._RTCRtpReceiver__decoder_queue``: the queue of ``(codec, JitterFrame)`` that the
  jitter buffer fills with complete access units (Annex B). It is replaced by :class:`TapQueue`,
  which hands every access unit to this harness's own PyAV decoder instead of aiortc's, so the
  harness sees each access unit's NAL types (is the first one an IDR with SPS and PPS?) and counts
  decode errors exactly.
- ``RTCRtpReceiver._RTCRtpReceiver__decoder_error``: set on a decode error, as aiortc's own decoder
  does, so the receiver sends a PLI just as a browser would.
- ``RTCRtpReceiver._RTCRtpReceiver__nack_generator`` and ``__jitter_buffer``: aiortc NACKs a
  missing packet once and then waits until its 512-packet jitter buffer overflows (seconds) before
  it gives up. A browser NACKs again every RTT or so and, after about a second, drops the broken
  frame and asks for a keyframe. :class:`LossRecovery` does the same, so the harness judges the
  device's loss recovery, not aiortc's receive side.
"""

from __future__ import annotations

import queue
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import av

from ruseon_appliance.capture.stamp import read_stamp

# NAL unit types (H.264 Table 7-1).
NAL_IDR = 5
NAL_SPS = 7
NAL_PPS = 8

# Gap between two decoded frames that counts as a freeze (what a viewer notices as a stall).
FREEZE_GAP_S = 0.2

_QUEUE_ATTR = "_RTCRtpReceiver__decoder_queue"
_ERROR_ATTR = "_RTCRtpReceiver__decoder_error"
_NACK_ATTR = "_RTCRtpReceiver__nack_generator"
_JITTER_ATTR = "_RTCRtpReceiver__jitter_buffer"
PRIVATE_RECEIVER_ATTRS = (
    _NACK_ATTR,
    _JITTER_ATTR,
    "_handle_rtp_packet",
    "_send_rtcp_nack",
    "_send_rtcp_pli",
    _QUEUE_ATTR,
    _ERROR_ATTR,
)


def nal_types(annexb: bytes) -> list[int]:
    """The NAL unit types in an Annex B access unit, in order."""
    types: list[int] = []
    i, n = 0, len(annexb)
    while True:
        i = annexb.find(b"\x00\x00\x01", i)
        if i < 0 or i + 3 >= n:
            return types
        types.append(annexb[i + 3] & 0x1F)
        i += 3


class SequenceTracker:
    """Counts distinct RTP sequence numbers of one stream, unwrapping the 16-bit counter."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.highest: int | None = None
        self.seen: set[int] = set()

    def extend(self, seq: int) -> int:
        """The extended (unwrapped) sequence number closest to the highest seen so far."""
        if self.highest is None:
            return seq
        base = self.highest & ~0xFFFF
        candidates = (base - 0x10000 + seq, base + seq, base + 0x10000 + seq)
        return min(candidates, key=lambda c: abs(c - self.highest))  # type: ignore[operator]

    def add(self, seq: int) -> bool:
        """Record ``seq``; True if it was new."""
        ext = self.extend(seq)
        if self.first is None or ext < self.first:
            self.first = ext
        if self.highest is None or ext > self.highest:
            self.highest = ext
        if ext in self.seen:
            return False
        self.seen.add(ext)
        return True

    @property
    def expected(self) -> int:
        """Packets between the first and highest sequence number, inclusive."""
        if self.first is None or self.highest is None:
            return 0
        return self.highest - self.first + 1


@dataclass
class FrameRecord:
    """One decoded picture: when it came out of the decoder and what its stamp said."""

    monotonic: float
    wall_us: int
    keyframe: bool
    stamp: tuple[int, int] | None
    # When its access unit left the jitter buffer for the decoder (monotonic): what separates
    # a picture that arrived late from one this harness's decoder was late with.
    arrived: float | None = None


@dataclass
class TapFigures:
    """Everything the tap counted for one viewer (written by the loop and the decode thread)."""

    first_rtp: float | None = None
    rtp_packets: int = 0
    rtp_bytes: int = 0
    rtx_packets: int = 0
    nacks_sent: int = 0
    nacked_packets: int = 0
    plis_sent: int = 0
    nack_retries: int = 0
    packets_abandoned: int = 0
    access_units: int = 0
    first_au_nals: list[int] = field(default_factory=list)
    first_decoded_au_nals: list[int] = field(default_factory=list)
    # The NAL type the first media RTP packet carries (the first one of a STAP-A, the
    # fragmented one of an FU-A; -1 for an FU-A that is not a fragment's start). The device
    # begins every viewer's stream with its SPS (a keyframe with SPS and PPS prepended), so
    # anything else first means the network lost the stream's first packets: no receiver can
    # tell, since no gap is visible before the first packet it sees.
    first_rtp_nal: int | None = None
    # Access units before the first IDR, not decoded (as a browser's frame buffer drops them
    # and asks for a keyframe), and the keyframe requests that made.
    aus_before_keyframe: int = 0
    decode_errors: int = 0
    frames: list[FrameRecord] = field(default_factory=list)
    # Capture times (device clock, µs) of the IDR pictures seen; they date the device's GOPs.
    idr_capture_us: list[int] = field(default_factory=list)
    media: SequenceTracker = field(default_factory=SequenceTracker)
    recovered: set[int] = field(default_factory=set)

    @property
    def start_lost(self) -> bool:
        """The stream's first packets (its SPS) were lost on the way (see :attr:`first_rtp_nal`)."""
        return self.first_rtp_nal is not None and self.first_rtp_nal != NAL_SPS

    @property
    def packets_lost(self) -> int:
        """Media packets that never arrived the first time (lost on the wire)."""
        return max(0, self.media.expected - len(self.media.seen))

    @property
    def packets_unrecovered(self) -> int:
        """Packets lost on the wire and not repaired by an RTX retransmission either."""
        return max(0, self.media.expected - len(self.media.seen | self.recovered))


class TapQueue(queue.Queue[Any]):
    """Stands in for aiortc's decoder queue: access units go to :class:`FrameDecoder` instead.

    aiortc's decoder thread reads this queue; it only ever receives the None that tells it to
    end (which also ends the receiver's track), so it decodes nothing.
    """

    def __init__(self, sink: Callable[[bytes | None], None]) -> None:
        super().__init__()
        self._sink = sink

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if item is None:
            super().put(None)
            self._sink(None)
            return
        _codec, encoded_frame = item
        self._sink(bytes(encoded_frame.data))


class FrameDecoder:
    """Decodes one viewer's access units with PyAV on its own thread and records each picture.

    ``decode_all=False`` decodes until the first picture and afterwards only parses NAL types
    (load tests with many viewers, where decoding every frame would make the rig the bottleneck).
    ``read`` reads each picture's stamp.
    """

    def __init__(
        self, figures: TapFigures, on_error: Callable[[], None], *, decode_all: bool = True,
        read: Callable[[Any], tuple[int, int] | None] = read_stamp,
    ) -> None:
        self.figures = figures
        self.on_error = on_error
        self.decode_all = decode_all
        # The synthetic source's fixed-place stamp, or (--glass) a GlassStampReader's read.
        self.read = read
        self._queue: queue.SimpleQueue[tuple[bytes, float] | None] = queue.SimpleQueue()
        self._codec = av.CodecContext.create("h264", "r")
        self._thread = threading.Thread(target=self._run, name="hil-decoder", daemon=True)
        self._thread.start()

    def feed(self, access_unit: bytes | None) -> None:
        """Queue one access unit (None ends the thread)."""
        self._queue.put(None if access_unit is None else (access_unit, time.monotonic()))

    def close(self, timeout_s: float = 5.0) -> None:
        """End the thread and wait for it."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        fig = self.figures
        while True:
            item = self._queue.get()
            if item is None:
                return
            au, arrived = item
            nals = nal_types(au)
            fig.access_units += 1
            if fig.access_units == 1:
                fig.first_au_nals = nals
            if not fig.frames and NAL_IDR not in nals:
                # Nothing decodes before a keyframe: a browser drops such access units and asks
                # for a keyframe (libwebrtc's frame buffer); so does this harness, once.
                fig.aus_before_keyframe += 1
                if fig.aus_before_keyframe == 1:
                    self.on_error()
                continue
            if not self.decode_all and fig.frames:
                # Count the access unit as a "frame" for freezes and fps, without decoding.
                fig.frames.append(FrameRecord(time.monotonic(), time.time_ns() // 1000,
                                              NAL_IDR in nals, None, arrived))
                continue
            try:
                pictures = self._codec.decode(av.Packet(au))
            except av.FFmpegError:
                fig.decode_errors += 1
                self.on_error()
                continue
            for picture in pictures:
                now, wall_us = time.monotonic(), time.time_ns() // 1000
                stamp = self.read(picture)
                if not fig.frames:
                    fig.first_decoded_au_nals = nals
                keyframe = bool(picture.key_frame) or NAL_IDR in nals
                fig.frames.append(FrameRecord(now, wall_us, keyframe, stamp, arrived))
                if NAL_IDR in nals and stamp is not None:
                    fig.idr_capture_us.append(stamp[0])


def first_nal_type(payload: bytes) -> int:
    """The NAL type an H.264 RTP payload starts with (RFC 6184): a single NAL's, a STAP-A's
    first aggregated one, an FU-A's fragmented one at its start (-1 for an FU-A's middle or
    end, or a payload too short to say)."""
    if not payload:
        return -1
    kind = payload[0] & 0x1F
    if kind == 24:  # STAP-A: a 2-byte size, then the NAL
        return payload[3] & 0x1F if len(payload) > 3 else -1
    if kind == 28:  # FU-A: the FU header's S bit and type
        return payload[1] & 0x1F if len(payload) > 1 and payload[1] & 0x80 else -1
    return kind


def _rtx_payload_types(sdp: str) -> set[int]:
    out: set[int] = set()
    for line in sdp.splitlines():
        if line.startswith("a=rtpmap:") and " rtx/" in line.lower():
            out.add(int(line[len("a=rtpmap:") :].split()[0]))
    return out


def install(
    receiver: Any, figures: TapFigures, decoder: FrameDecoder, recovery: LossRecovery | None = None
) -> Callable[[str], None]:
    """Hook ``receiver`` (before ``setRemoteDescription``); returns a setter for the answer SDP.

    The setter tells the tap which payload types are RTX, so retransmissions are told apart from
    first transmissions.
    """
    missing = [a for a in PRIVATE_RECEIVER_ATTRS if not hasattr(receiver, a)]
    if missing:
        raise RuntimeError(f"aiortc RTCRtpReceiver lacks {missing}: receive_tap needs updating")
    rtx_types: set[int] = set()
    handle_rtp = receiver._handle_rtp_packet
    send_nack = receiver._send_rtcp_nack
    send_pli = receiver._send_rtcp_pli

    async def tapped_rtp(packet: Any, arrival_time_ms: int) -> None:
        if figures.first_rtp is None:
            figures.first_rtp = time.monotonic()
        figures.rtp_packets += 1
        figures.rtp_bytes += len(packet.payload) + 12
        if packet.payload_type in rtx_types:
            figures.rtx_packets += 1
            if len(packet.payload) >= 2:
                seq = struct.unpack("!H", packet.payload[:2])[0]
                figures.recovered.add(figures.media.extend(seq))
        else:
            if figures.first_rtp_nal is None:
                figures.first_rtp_nal = first_nal_type(bytes(packet.payload))
            figures.media.add(packet.sequence_number)
            if recovery is not None:
                recovery.media_ssrc = packet.ssrc
        await handle_rtp(packet, arrival_time_ms)

    async def tapped_nack(media_ssrc: int, lost: list[int]) -> None:
        figures.nacks_sent += 1
        figures.nacked_packets += len(lost)
        await send_nack(media_ssrc, lost)

    async def tapped_pli(media_ssrc: int) -> None:
        figures.plis_sent += 1
        await send_pli(media_ssrc)

    receiver._handle_rtp_packet = tapped_rtp
    receiver._send_rtcp_nack = tapped_nack
    receiver._send_rtcp_pli = tapped_pli
    setattr(receiver, _QUEUE_ATTR, TapQueue(decoder.feed))
    error_event: threading.Event = getattr(receiver, _ERROR_ATTR)
    decoder.on_error = error_event.set

    def set_answer(sdp: str) -> None:
        rtx_types.update(_rtx_payload_types(sdp))

    return set_answer


class LossRecovery:
    """Browser-like NACK retries and give-up for one receiver (see the module docstring).

    Every ``interval_s``, packets missing for longer than ``interval_s`` are NACKed again (at most
    ``max_retries`` times each, like libwebrtc's NACK module); a packet still missing after
    ``give_up_s`` is abandoned: its incomplete frame is dropped from the jitter buffer and a PLI
    asks the device for a keyframe.
    """

    def __init__(self, receiver: Any, figures: TapFigures, *, interval_s: float = 0.05,
                 max_retries: int = 10, give_up_s: float = 1.0) -> None:
        self.receiver = receiver
        self.figures = figures
        self.interval_s = interval_s
        self.max_retries = max_retries
        self.give_up_s = give_up_s
        self.media_ssrc: int | None = None
        self._first_missing: dict[int, float] = {}
        self._retries: dict[int, int] = {}

    async def run(self) -> None:
        """Loop until cancelled."""
        import asyncio

        nack = getattr(self.receiver, _NACK_ATTR)
        jitter = getattr(self.receiver, _JITTER_ATTR)
        while True:
            await asyncio.sleep(self.interval_s)
            if nack is None or self.media_ssrc is None:
                continue
            now = time.monotonic()
            missing = set(nack.missing)
            for seq in list(self._first_missing):
                if seq not in missing:
                    del self._first_missing[seq]
                    self._retries.pop(seq, None)
            retry: list[int] = []
            abandoned: list[int] = []
            for seq in missing:
                first = self._first_missing.setdefault(seq, now)
                if now - first >= self.give_up_s:
                    abandoned.append(seq)
                    continue
                tries = self._retries.get(seq, 0)
                if now - first >= self.interval_s and tries < self.max_retries:
                    self._retries[seq] = tries + 1
                    retry.append(seq)
            if retry:
                self.figures.nack_retries += len(retry)
                await self.receiver._send_rtcp_nack(self.media_ssrc, sorted(retry))
            if abandoned:
                self.figures.packets_abandoned += len(abandoned)
                for seq in abandoned:
                    nack.missing.discard(seq)
                    self._first_missing.pop(seq, None)
                    self._retries.pop(seq, None)
                self._skip_hole(jitter, max(abandoned, key=lambda q: (q - jitter._origin) & 0xFFFF
                                            if jitter._origin is not None else 0))
                await self.receiver._send_rtcp_pli(self.media_ssrc)

    @staticmethod
    def _skip_hole(jitter: Any, seq: int) -> None:
        """Drop everything in the jitter buffer up to and including the frame after ``seq``."""
        if jitter._origin is None:
            return
        distance = (seq - jitter._origin) & 0xFFFF
        if distance < jitter.capacity:
            jitter.smart_remove(distance + 1)
