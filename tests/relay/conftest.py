"""Relay test helpers: a real RTP receiver on loopback that checks continuity, undoes SRTP,
depacketizes H.264 (aiortc's own depayloader) and decodes it with PyAV."""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

import av
import pylibsrtp
from aiortc.codecs.h264 import H264PayloadDescriptor

from ruseon_appliance.capture.stamp import read_stamp


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
    decoded: int = 0
    unprotect_failures: int = 0
    _srtp: Any = None
    _codec: Any = None
    _au: bytearray = field(default_factory=bytearray)
    _task: asyncio.Task[None] | None = None
    rtcp_sock: socket.socket | None = None

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
        if not payload:
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
