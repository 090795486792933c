"""The engine's CPU per offer, in process, lazy sessions on and off alternated in one run.

One synthetic camera, then per round and per variant a fresh :class:`Engine` on 127.0.0.1: a
first offer teaches it the offers' shape, then ``--offers`` offers made beforehand by aiortc
peers (never connected) are answered and closed, one after another, then all at once. The
figure is the event loop thread's CPU (``time.thread_time``) from the first offer to 0.3 s
after the last close, minus the thread's idle rate (the camera's frames reach the loop;
measured over 1 s just before each phase) times that span, per offer: what ``Engine.offer``
and ``Engine.close`` cost, without HTTP (``bench/pion.py`` measures the whole ``ruseon
serve``). The idle rate wanders by a few ms per second, so with few offers a figure of tens of
microseconds can come out negative: use ``--offers`` in the hundreds. ``--profile PATH`` writes
a cProfile of the lazy variant.

    .venv/bin/python bench/offers.py                 # 3 rounds, 100 offers
    .venv/bin/python bench/offers.py --rounds 5 --profile /tmp/offers.prof
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aioice.ice

# Loopback only (as bench/handshake.py): the client peers gather 127.0.0.1 alone.
aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]  # type: ignore[assignment]

from aiortc import RTCConfiguration, RTCPeerConnection  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ruseon_appliance.capture.pipeline import CapturePipeline  # noqa: E402
from ruseon_appliance.config import CameraConfig, HostPort, WebRtcConfig  # noqa: E402
from ruseon_appliance.engine import Engine  # noqa: E402

CAMERA = CameraConfig(source="synthetic", width=320, height=240, framerate=30, bitrate=300_000,
                      keyframe_interval=60)
TAIL_S = 0.3


async def made_offers(count: int) -> tuple[list[RTCPeerConnection], list[str]]:
    pcs, offers = [], []
    for _ in range(count):
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        pcs.append(pc)
        offers.append(pc.localDescription.sdp)
    return pcs, offers


async def idle_rate() -> float:
    started = time.thread_time()
    await asyncio.sleep(1.0)
    return (time.thread_time() - started) / 1.0


async def measure(engine: Engine, offers: list[str], concurrent: bool, idle: float,
                  profiler: cProfile.Profile | None) -> float:
    if profiler is not None:
        profiler.enable()
    cpu, wall = time.thread_time(), time.monotonic()
    if concurrent:
        answered = await asyncio.gather(*(engine.offer(o, remote="127.0.0.1") for o in offers))
        for session, _ in answered:
            await engine.close(session.id)
    else:
        for offer in offers:
            session, _ = await engine.offer(offer, remote="127.0.0.1")
            await engine.close(session.id)
    await asyncio.sleep(TAIL_S)
    spent = time.thread_time() - cpu - idle * (time.monotonic() - wall)
    if profiler is not None:
        profiler.disable()
    return spent / len(offers) * 1000


async def run(args: argparse.Namespace) -> None:
    feed = CapturePipeline(CAMERA)
    await feed.start()
    await feed.wait_first_frame(10)
    # Made before any engine answers (its first offer adds the camera's profile to aiortc's
    # codec list, which this process's peers would then offer too: another shape).
    pcs, offers = await made_offers(args.offers + 1)
    profiler = cProfile.Profile() if args.profile else None
    figures: dict[str, dict[str, list[float]]] = {
        v: {"sequential": [], "concurrent": []} for v in ("eager", "lazy")}
    try:
        for _ in range(args.rounds):
            for variant in ("eager", "lazy"):
                config = WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",),
                                      max_viewers=500, max_viewers_per_address=500)
                engine = Engine(config, Path(tempfile.mkdtemp()), feed,
                                lazy_sessions=variant == "lazy")
                await engine.start()
                try:
                    first, _ = await engine.offer(offers[0], remote="127.0.0.1")
                    await engine.close(first.id)
                    prof = profiler if variant == "lazy" else None
                    for phase in ("sequential", "concurrent"):
                        idle = await idle_rate()
                        figures[variant][phase].append(await measure(
                            engine, offers[1:], phase == "concurrent", idle, prof))
                finally:
                    await engine.stop()
    finally:
        await feed.stop()
        await asyncio.gather(*(pc.close() for pc in pcs))
    for variant, phases in figures.items():
        print(f"{variant:6} " + "; ".join(
            f"{phase} ms per offer {' '.join(f'{x:.3f}' for x in values)} "
            f"(median {statistics.median(values):.3f})" for phase, values in phases.items()))
    print(json.dumps({"figure": "engine_cpu_per_offer_ms", "offers": args.offers,
                      "rounds": args.rounds, **{
                          f"{variant}_{phase}": round(statistics.median(values), 4)
                          for variant, phases in figures.items()
                          for phase, values in phases.items()}}))
    if profiler is not None:
        profiler.dump_stats(args.profile)
        print(f"wrote {args.profile}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offers", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
