"""Shared pieces for the stream/ part tests: real H.264 frames, real SRTP sessions, real UDP."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pylibsrtp
import pytest

from ruseon_appliance.capture.h264 import AccessUnitSplitter
from ruseon_appliance.stream.h264_rtp import equal_runs, packetize
from ruseon_appliance.stream.history import PacketizedFrame

DATA = Path(__file__).resolve().parent.parent / "capture" / "data" / "cam_320x240_baseline.h264"


def recorded_frames() -> list[PacketizedFrame]:
    """The recorded test stream, each access unit packetized as the fan-out does."""
    frames = []
    for seq, (data, keyframe) in enumerate(AccessUnitSplitter().split_all(DATA.read_bytes())):
        payloads = packetize(data)
        frames.append(PacketizedFrame(seq, payloads, time.monotonic(), keyframe,
                                      sum(len(p) for p in payloads), equal_runs(payloads)))
    return frames


def big_frame(size: int = 60_000) -> PacketizedFrame:
    """One synthetic IDR of ``size`` bytes: tens of equal FU-A fragments (several GSO batches
    when large enough)."""
    nal = bytes([0x65]) + bytes((i % 251) + 1 for i in range(size))
    payloads = packetize(b"\x00\x00\x00\x01" + nal)
    return PacketizedFrame(0, payloads, time.monotonic(), True,
                           sum(len(p) for p in payloads), equal_runs(payloads))


class SrtpPair:
    """An outbound and an inbound SRTP session on one key (sender and viewer)."""

    def __init__(self) -> None:
        key = os.urandom(30)
        self.tx = pylibsrtp.Session(pylibsrtp.Policy(
            key=key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND))
        self.rx = pylibsrtp.Session(pylibsrtp.Policy(
            key=key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND))


@pytest.fixture
def srtp_pair() -> SrtpPair:
    return SrtpPair()


class Loopback:
    """A sending and a receiving UDP socket on 127.0.0.1."""

    def __init__(self) -> None:
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.rx.bind(("127.0.0.1", 0))
        self.rx.settimeout(2.0)
        self.addr: tuple[str, int] = self.rx.getsockname()
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tx.bind(("127.0.0.1", 0))

    def receive(self, count: int) -> list[bytes]:
        """``count`` datagrams (fails on a timeout: one went missing)."""
        return [self.rx.recv(65_536) for _ in range(count)]

    def nothing_more(self) -> bool:
        """True when no further datagram arrives within a short wait."""
        self.rx.settimeout(0.2)
        try:
            self.rx.recv(65_536)
        except TimeoutError:
            return True
        finally:
            self.rx.settimeout(2.0)
        return False

    def close(self) -> None:
        self.rx.close()
        self.tx.close()


@pytest.fixture
def loopback() -> Iterator[Loopback]:
    pair = Loopback()
    yield pair
    pair.close()
