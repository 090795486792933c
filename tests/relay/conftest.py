"""Relay test helpers: a real RTP receiver on loopback that checks continuity, undoes SRTP,
depacketizes H.264 (aiortc's own depayloader) and decodes it with PyAV."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
import pylibsrtp
from aiortc.codecs.h264 import H264PayloadDescriptor

from ruseon_appliance.audio.sources.tone import BASE_AMPLITUDE
from ruseon_appliance.capture.stamp import read_stamp

# The test tone's level between beeps: a sine of BASE_AMPLITUDE peak, as RMS dBFS (about -33.5).
TONE_RMS_DBFS = 20 * math.log10(BASE_AMPLITUDE / math.sqrt(2))
# The beep (-6 dBFS peak) against the tone (-30 dBFS peak).
BEEP_THRESHOLD = 0.2 * 32768


@dataclass
class RtpReceiver:
    """Receives one relay's RTP (and answers nothing unless asked) on 127.0.0.1."""

    srtp_key: bytes | None = None
    bind_port: int = 0
    sock: socket.socket = field(init=False)
    packets: list[tuple[int, int, int, bool]] = field(default_factory=list)  # seq, ts, ssrc, M
    rtcp: list[bytes] = field(default_factory=list)
    rtcp_from: tuple[str, int] | None = None
    stamps: list[tuple[int, int]] = field(default_factory=list)
    # (RTP timestamp, capture time µs) of each stamped picture decoded.
    stamped_at: list[tuple[int, int]] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)  # the first few, padding removed
    empty_payloads: int = 0
    decoded: int = 0
    unprotect_failures: int = 0
    _srtp: Any = None
    _codec: Any = None
    _au: bytearray = field(default_factory=bytearray)
    _task: asyncio.Task[None] | None = None
    rtcp_sock: socket.socket | None = None
    _reports: list[tuple[int, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", self.bind_port))
        self.sock.setblocking(False)
        if self.srtp_key is not None:
            policy = pylibsrtp.Policy(key=self.srtp_key,
                                      ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND)
            self._srtp = pylibsrtp.Session(policy)
        self._codec = av.CodecContext.create("h264", "r")

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def open_rtcp(self) -> int:
        """Listen for RTCP too (the relay's sender reports); returns the port."""
        self.rtcp_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rtcp_sock.bind(("127.0.0.1", 0))
        self.rtcp_sock.setblocking(False)
        return int(self.rtcp_sock.getsockname()[1])

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.sock.fileno(), self._on_rtp)
        if self.rtcp_sock is not None:
            loop.add_reader(self.rtcp_sock.fileno(), self._on_rtcp)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.sock.fileno())
        self.sock.close()
        if self.rtcp_sock is not None:
            loop.remove_reader(self.rtcp_sock.fileno())
            self.rtcp_sock.close()

    def _on_rtcp(self) -> None:
        assert self.rtcp_sock is not None
        while True:
            try:
                data, address = self.rtcp_sock.recvfrom(2048)
            except BlockingIOError:
                return
            self.rtcp.append(data)
            self.rtcp_from = address
            self._sender_report(data)

    def rtcp_reports(self) -> list[tuple[int, int, int]]:
        """The sender reports received so far (SRTCP undone): ``(ssrc, ntp, rtp)``."""
        return list(self._reports)

    def _sender_report(self, data: bytes) -> None:
        if self._srtp is not None:
            try:
                data = self._srtp.unprotect_rtcp(data)
            except pylibsrtp.Error:
                return
        if len(data) >= 20 and data[1] == 200:
            ssrc, ntp_hi, ntp_lo, rtp = struct.unpack_from("!IIII", data, 4)
            self._reports.append((ssrc, (ntp_hi << 32) | ntp_lo, rtp))

    def _on_rtp(self) -> None:
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return
            if self._srtp is not None:
                try:
                    data = self._srtp.unprotect(data)
                except pylibsrtp.Error:
                    self.unprotect_failures += 1
                    continue
            self._packet(data)

    def _packet(self, data: bytes) -> None:
        first, second, seq, ts, ssrc = struct.unpack_from("!BBHII", data)
        marker = bool(second & 0x80)
        self.packets.append((seq, ts, ssrc, marker))
        payload = data[12:]
        if first & 0x20:  # padding
            payload = payload[:len(payload) - payload[-1]]
        if len(self.payloads) < 8:
            self.payloads.append(payload)
        if not payload:
            # What a server that forwards it (Janus) hands a WebRTC viewer, whose FFmpeg decoder
            # (aiortc's) takes an empty packet as the end of the stream: so does this one.
            self.empty_payloads += 1
            with contextlib.suppress(av.error.FFmpegError):
                self._codec.decode(av.Packet(b""))
            return
        try:
            _, annexb = H264PayloadDescriptor.parse(payload)
        except ValueError:
            return
        self._au += annexb
        if marker:
            au, self._au = bytes(self._au), bytearray()
            try:
                frames = self._codec.decode(av.Packet(au))
            except av.error.FFmpegError:
                return
            for frame in frames:
                self.decoded += 1
                stamp = read_stamp(frame)
                if stamp is not None:
                    self.stamps.append(stamp)
                    self.stamped_at.append((ts, stamp[0]))

    def assert_continuous(self) -> None:
        """One SSRC, sequence numbers without a gap, timestamps never going back."""
        assert self.packets, "no RTP packet arrived"
        assert len({p[2] for p in self.packets}) == 1, "the SSRC changed"
        for (seq_a, ts_a, _, _), (seq_b, ts_b, _, _) in zip(self.packets, self.packets[1:],
                                                            strict=False):
            assert (seq_b - seq_a) & 0xFFFF == 1, f"sequence gap {seq_a} -> {seq_b}"
            assert 0 <= (ts_b - ts_a) & 0xFFFFFFFF < 1 << 31, f"timestamp back {ts_a} -> {ts_b}"


async def wait_for(condition: Any, timeout: float = 20.0, what: str = "condition") -> None:
    """Poll ``condition()`` until true; fail with ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def rms_dbfs(samples: Any) -> float:
    rms = math.sqrt(float(np.mean(np.square(samples.astype(np.float64)))))
    return 20 * math.log10(max(rms, 1e-9) / 32768)


def assert_the_tone(frames: list[Any]) -> None:
    """Decoded 20 ms frames: most at the tone's level, and beeps in between."""
    quiet = [rms_dbfs(f) for f in frames if np.max(np.abs(f.astype(np.int32))) < BEEP_THRESHOLD]
    loud = [f for f in frames if np.max(np.abs(f.astype(np.int32))) >= BEEP_THRESHOLD]
    assert len(quiet) >= 20, (len(quiet), len(frames))
    level = float(np.median(quiet))
    assert abs(level - TONE_RMS_DBFS) < 1.5, (level, TONE_RMS_DBFS)
    assert loud, "no beep heard"
