"""Sub-stream benchmark: the appliance's own CPU for main + sub against main alone, and the bytes
a 4-tile grid pulls from the sub-stream against the main one.

One in-process appliance (``app.Appliance``) per scenario, one synthetic camera (720p30 at
2 Mbit/s by default; the sub-stream 640x360 at 500 kbit/s, the defaults), HLS and RTSP off,
motion off. Four WHEP viewers (real aiortc peers: ICE, DTLS, SRTP) run in a child process, so
their decoding does not count. The appliance's own share is its process CPU over the window
minus the synthetic camera's worker thread (it draws and encodes both streams with libx264:
that is the camera's work, a Pi's ISP and hardware encoder there), read per thread from
``/proc/self/task/<tid>/stat``. Bytes (RTP payload) and packets are what the engine's
sessions count as sent.

Scenarios: ``main-only`` (substream = false, 4 viewers of the main stream), ``sub-idle``
(sub-stream on, nobody watching it, 4 viewers of main: what the second ring costs), ``sub-grid``
(sub-stream on, 4 viewers of ``/whep/cam/sub``: the grid of tiles).

    .venv/bin/python bench/substream.py                 # 10 s per scenario
    .venv/bin/python bench/substream.py --window 20 --width 1920 --height 1080
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def thread_cpu_s(tid: int) -> float:
    """utime + stime of one thread of this process, in seconds."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def encoder_threads() -> list[int]:
    """Native ids of the synthetic camera's worker threads (draw + libx264, threads=1)."""
    return [t.native_id for t in threading.enumerate()
            if t.name == "synthetic-camera" and t.native_id is not None]


# -- the viewers (child process) ---------------------------------------------------------------


async def viewers(url: str, count: int, seconds: float) -> dict[str, Any]:
    import aioice.ice
    from aiohttp import ClientSession
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]  # type: ignore
    pcs = []
    sizes: set[tuple[int, int]] = set()

    async def consume(track: Any) -> None:
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            sizes.add((frame.width, frame.height))

    tasks = []
    async with ClientSession() as http:
        for _ in range(count):
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            pc.addTransceiver("video", direction="recvonly")
            pc.on("track", lambda t: tasks.append(asyncio.ensure_future(consume(t))))
            await pc.setLocalDescription(await pc.createOffer())
            async with http.post(url, data=pc.localDescription.sdp,
                                 headers={"Content-Type": "application/sdp"}) as response:
                assert response.status == 201, await response.text()
                answer = await response.text()
            await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            pcs.append(pc)
    while not all(pc.connectionState == "connected" for pc in pcs) or not sizes:
        await asyncio.sleep(0.1)
    await asyncio.sleep(2)  # past the join bursts

    print("ready", flush=True)
    await asyncio.sleep(seconds)
    print("done", flush=True)
    for pc in pcs:
        await pc.close()
    for task in tasks:
        task.cancel()
    return {"sizes": sorted(sizes)}


# -- the appliance (this process) ---------------------------------------------------------------


def sent(app: Any) -> tuple[int, int]:
    """RTP payload bytes and packets every WHEP session has sent so far (the engine's count)."""
    total_bytes = total_packets = 0
    for session in app.engine.sessions.values():
        stats = session.stats()
        total_bytes += stats["bytes_sent"]
        total_packets += stats["packets_sent"]
    return total_bytes, total_packets


async def scenario(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from ruseon_appliance.app import Appliance
    from ruseon_appliance.config import (
        CameraConfig,
        Config,
        HlsConfig,
        HostPort,
        HttpConfig,
        StateConfig,
        SubstreamConfig,
        WebRtcConfig,
    )

    sub = SubstreamConfig(mode="off") if name == "main-only" else SubstreamConfig(mode="on")
    port = free_port()
    with tempfile.TemporaryDirectory() as state:
        config = Config(
            cameras=(CameraConfig(name="cam", source="synthetic", width=args.width,
                                  height=args.height, framerate=30, bitrate=2_000_000,
                                  motion=False, substream=sub),),
            http=HttpConfig(listen=HostPort("127.0.0.1", port)),
            webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
            state=StateConfig(dir=state), hls=HlsConfig(enable=False))
        app = Appliance(config)
        await app.start()
        try:
            assert await app.cameras.wait_first_frame(30)
            path = "/whep/cam/sub" if name == "sub-grid" else "/whep/cam"
            child = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--viewers-of", f"http://127.0.0.1:{port}{path}",
                "--count", str(args.viewers), "--window", str(args.window),
                env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE)
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 120)
            assert line.strip() == b"ready", line
            tids = encoder_threads()
            bytes0, packets0 = sent(app)
            cpu0, wall0 = time.process_time(), time.monotonic()
            enc0 = sum(thread_cpu_s(t) for t in tids)
            line = await child.stdout.readline()
            cpu1, wall1 = time.process_time(), time.monotonic()
            enc1 = sum(thread_cpu_s(t) for t in tids)
            bytes1, packets1 = sent(app)
            assert line.strip() == b"done", line
            result = json.loads((await child.stdout.read()).decode())
            await child.wait()
        finally:
            await app.stop()
    wall = wall1 - wall0
    own = (cpu1 - cpu0) - (enc1 - enc0)
    return {
        "scenario": name,
        "process_cpu_pct": round(100 * (cpu1 - cpu0) / wall, 1),
        "encoder_cpu_pct": round(100 * (enc1 - enc0) / wall, 1),
        "appliance_cpu_pct": round(100 * own / wall, 1),
        "grid_kbit_s": round((bytes1 - bytes0) * 8 / wall / 1000),
        "packets_s": round((packets1 - packets0) / wall),
        "appliance_us_per_packet": round(1e6 * own / max(1, packets1 - packets0), 1),
        "sizes": result["sizes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--viewers", type=int, default=4)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--scenarios", nargs="+", default=["main-only", "sub-idle", "sub-grid"])
    parser.add_argument("--viewers-of", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.viewers_of:
        print(json.dumps(asyncio.run(viewers(args.viewers_of, args.count, args.window))))
        return
    rows = [asyncio.run(scenario(name, args)) for name in args.scenarios]
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(str(row[k]) for k in keys))


if __name__ == "__main__":
    main()
