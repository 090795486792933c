"""The fan-out's own CPU per packet per viewer, in process: what the send loop costs by itself.

``bench/fanout.py`` and ``bench/pion.py`` measure the whole server (event loop, aiortc's RTCP and
STUN, the kernel delivering every datagram to viewer processes that sleep in ``epoll``). This
measures only :meth:`Fanout.pump` (issue 31, goal 3: where the fan-out's time goes): N real
:class:`FanoutViewer` objects on a real ring, each with its own libsrtp session (AES-256-GCM, what
aiortc viewers negotiate; ``--profile`` for another), sending real SRTP in GSO batches over a real
UDP socket to one loopback socket this process drains between frames, fed the cached 720p30
2 Mbit/s recording of ``bench/fanout.py``. Only the aiortc objects are left out: the viewer is
started as ``FanoutViewer._start`` would leave it (writer, SRTP session, nominated pair).

    server CPU µs per packet per viewer = process CPU inside pump() / packets sent

The gap to ``bench/fanout.py``'s figure is what the rest of a server costs per packet (mostly
the kernel waking the viewers' processes, which Pion pays as well). ``--cprofile`` prints the
pump's functions by own time. Nothing here is timed against a threshold.

    .venv/bin/python bench/fanout_pump.py [--viewers 1 10 30] [--rounds 3] [--cprofile]
    OPENSSL_ia32cap=~0x200000200000000 .venv/bin/python bench/fanout_pump.py   # Pi 4 stand-in
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

from pylibsrtp import Policy, Session

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(1, str(ROOT))

from fanout import recorded_stream  # noqa: E402

from ruseon_appliance.capture.access_unit import AccessUnit  # noqa: E402
from ruseon_appliance.capture.h264 import AccessUnitSplitter  # noqa: E402
from ruseon_appliance.capture.ring import RingBuffer  # noqa: E402
from ruseon_appliance.engine.fanout import FanoutViewer  # noqa: E402
from ruseon_appliance.stream.cursor import ViewerCursor  # noqa: E402
from ruseon_appliance.stream.fanout import Fanout  # noqa: E402
from ruseon_appliance.stream.rtp_header import ABS_SEND_TIME_URI, MID_URI, RtpHeaderTemplate  # noqa: E402
from ruseon_appliance.stream.rtp_writer import SrtpPacketWriter  # noqa: E402
from ruseon_appliance.stream.srtp import srtp_handle  # noqa: E402

PROFILES = {"aes256gcm": (Policy.SRTP_PROFILE_AEAD_AES_256_GCM, 44),
            "aes128gcm": (Policy.SRTP_PROFILE_AEAD_AES_128_GCM, 28),
            "aes128cm": (Policy.SRTP_PROFILE_AES128_CM_SHA1_80, 30)}
FRAME_TICKS = 3000  # 30 fps in 1/90000 s
WARM_UP_FRAMES = 120


def access_units() -> list[tuple[bytes, bool]]:
    """The recording's access units ``(annexb, idr)``."""
    return AccessUnitSplitter().feed(recorded_stream().read_bytes())


class Harness:
    """A ring, a fan-out and ``count`` started viewers sending to one drained loopback socket."""

    def __init__(self, count: int, profile: str) -> None:
        self.ring = RingBuffer(8 << 20, 1024)
        feed = types.SimpleNamespace(ring=self.ring, request_keyframe=lambda reason="": True)
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.bind(("127.0.0.1", 0))
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        self.rx.setblocking(False)
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tx.bind(("127.0.0.1", 0))
        self.tx.setblocking(False)
        self.fanout = Fanout(feed, lambda family: self.tx, framerate=30, min_bitrate=500_000)
        pair = types.SimpleNamespace(protocol=types.SimpleNamespace(family=socket.AF_INET),
                                     remote_addr=self.rx.getsockname())
        connection = types.SimpleNamespace(_nominated={1: pair})
        srtp_profile, key_length = PROFILES[profile]
        self.viewers: list[FanoutViewer] = []
        for n in range(count):
            cursor = ViewerCursor(feed, self.fanout.take, frame_interval=FRAME_TICKS,
                                  catch_up_max_frames=3, keyframe_interval_frames=60)
            viewer = FanoutViewer(self.fanout, cursor, on_keyframe_request=lambda reason: None,
                                  on_nack=lambda seq: None)
            session = Session(policy=Policy(key=os.urandom(key_length),
                                            ssrc_type=Policy.SSRC_ANY_OUTBOUND,
                                            srtp_profile=srtp_profile))
            header = RtpHeaderTemplate(96, 1000 + n, mid="0",
                                       extensions=[(MID_URI, 1), (ABS_SEND_TIME_URI, 2)])
            # As FanoutViewer._start leaves a viewer once aiortc's DTLS is up.
            viewer._writer = SrtpPacketWriter(
                header, srtp_handle(session), batch=self.fanout.batch, single=self.fanout.buffer,
                gso=self.fanout.gso_sender, drops=viewer.drops)
            viewer._srtp = session
            viewer._connection = connection
            viewer._ssrc = viewer.reports.ssrc = 1000 + n
            # pump() runs here as fast as it can, not at 30 frames/s: a budget refilled by the
            # clock would starve; the budget is not what is measured.
            viewer.budget.override = 1e9
            self.viewers.append(viewer)
        self._pts = 0
        self._capture_us = time.time_ns() // 1000
        self.received = 0

    def write(self, unit: tuple[bytes, bool]) -> None:
        self._pts += FRAME_TICKS
        self._capture_us += 33_333
        self.ring.write(AccessUnit(unit[0], self._pts, unit[1], self._capture_us))

    def drain(self) -> None:
        recv = self.rx.recv
        try:
            while True:
                recv(4096)
                self.received += 1
        except BlockingIOError:
            pass

    def start(self, first: tuple[bytes, bool]) -> None:
        self.write(first)
        now = time.monotonic()
        for viewer in self.viewers:
            viewer.budget.fill(now)
            viewer.active = True
            self.fanout.activate(viewer)
        self.drain()

    def packets(self) -> int:
        return sum(v.packets_sent for v in self.viewers)


async def measure(count: int, rounds: int, profile: str, units: list[tuple[bytes, bool]],
                  cprofile: bool) -> dict[str, Any]:
    harness = Harness(count, profile)
    harness.start(units[0])
    for unit in units[1:WARM_UP_FRAMES]:  # joined, out of the join burst, in steady state
        harness.write(unit)
        harness.fanout.pump()
        harness.drain()
        await asyncio.sleep(0)  # the join burst's paced slices
    figures = []
    for _ in range(rounds):
        cpu = 0.0
        before = harness.packets()
        for unit in units[WARM_UP_FRAMES:]:
            harness.write(unit)
            t = time.process_time()
            harness.fanout.pump()
            cpu += time.process_time() - t
            harness.drain()
        figures.append(cpu / (harness.packets() - before) * 1e6)
    if cprofile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for unit in units[WARM_UP_FRAMES:]:
            harness.write(unit)
            harness.fanout.pump()
            harness.drain()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    viewers = harness.viewers
    return {"figure": "fanout_pump", "viewers": count, "srtp": profile,
            "openssl_ia32cap": os.environ.get("OPENSSL_ia32cap", ""),  # noqa: SIM112 (its name)
            "us_per_packet_per_viewer": round(statistics.median(figures), 3),
            "rounds_us": [round(f, 3) for f in figures],
            "packets_per_frame": round(harness.packets() / max(1, sum(v.frames_sent
                                                                      for v in viewers)), 2),
            "gso": harness.fanout.gso,
            "keyframe_skips": sum(v.keyframe_skips for v in viewers),
            "dropped": sum(v.drops.send_dropped_full + v.drops.send_errors for v in viewers),
            "service_errors": harness.fanout.service_errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--viewers", type=int, nargs="+", default=[1, 10, 30])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", choices=list(PROFILES), default="aes256gcm")
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    units = access_units()
    for count in args.viewers:
        row = asyncio.run(measure(count, args.rounds, args.profile, units, args.cprofile))
        print(f"N={count:<3} {row['us_per_packet_per_viewer']:6.2f} µs per packet per viewer "
              f"in pump() ({args.profile}, {row['packets_per_frame']} packets per frame, "
              f"rounds {row['rounds_us']}, skips {row['keyframe_skips']}, dropped "
              f"{row['dropped']}, errors {row['service_errors']})", flush=True)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
