"""Send-path benchmark: the stock aiortc sender against the fan-out, same stream, same run.

A server process runs the engine on a recorded 720p30 2 Mbit/s stream (libx264, made once and
cached in ``.cache/``) replayed by the file source, with ``webrtc.send_path`` set to ``aiortc``
or ``fanout``. Viewers are real aiortc peers (ICE, DTLS, SRTP) in separate worker processes,
which count and drop what they receive (no decoding), so they do not steal the server's CPU
accounting: the server reports its own CPU time (``time.process_time``, every thread) and the
RTP packets its sessions sent. For each N the figure is

    server CPU µs per packet per viewer = (CPU over the window - idle CPU) / packets sent

where idle CPU is the same server's rate with no viewer (replaying the file, the event loop).
Packets/s per core is 1e6 / that. Everything stays on 127.0.0.1.

    .venv/bin/python bench/fanout.py            # N = 1, 10, 30 (--quick, the default)
    .venv/bin/python bench/fanout.py --full     # N = 1, 10, 30, 100
    .venv/bin/python bench/fanout.py --viewers 1 10 --window 8 --loop uvloop
    .venv/bin/python bench/fanout.py --viewers 20 30 --paths fanout \
        --baseline /tmp/base-tree --aes-mask both     # issue 19: against an older tree

``--baseline DIR`` adds a row served by another checkout's code (``DIR/bench/fanout.py``, e.g.
``git archive <commit> | tar -x -C DIR``), measured in the same run, interleaved with ours;
``--aes-mask on|both`` runs the server with OpenSSL's AES-NI and PCLMUL masked
(``OPENSSL_ia32cap=~0x200000200000000``), a stand-in for a Pi 4's crypto cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aioice.ice

# Loopback only (aioice skips 127.0.0.1 when gathering).
aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]  # type: ignore[assignment]

from aiohttp import ClientSession, web  # noqa: E402
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from whep_endpoint import serve_until_cancelled  # noqa: E402

from ruseon_appliance.capture.pipeline import CapturePipeline  # noqa: E402
from ruseon_appliance.config import CameraConfig, HostPort, WebRtcConfig  # noqa: E402
from ruseon_appliance.engine import Engine, OfferError, aiortc_internals  # noqa: E402

WIDTH, HEIGHT, FPS, BITRATE, GOP, SECONDS = 1280, 720, 30, 2_000_000, 60, 10
STREAM = ROOT / ".cache" / f"bench-{HEIGHT}p{FPS}-{BITRATE // 1000}k.h264"
# OpenSSL without AES-NI and PCLMULQDQ: roughly a Pi 4's AES cost (issue 19).
AES_MASK = "~0x200000200000000"


def recorded_stream() -> Path:
    """The cached 720p30 2 Mbit/s Annex B stream, encoded with libx264 on first use."""
    if not STREAM.exists():
        sys.path.insert(0, str(ROOT / "bench"))
        from capture import record  # bench/capture.py

        STREAM.parent.mkdir(parents=True, exist_ok=True)
        data = record(WIDTH, HEIGHT, FPS, BITRATE, FPS * SECONDS, GOP)
        tmp = STREAM.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(STREAM)
    return STREAM


def rss_kib() -> int:
    """This process's resident set size in KiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def malloc_in_use_kib() -> int | None:
    """Bytes glibc malloc has handed out and not had back (every arena, mmapped chunks too):
    what the process really holds on the C heap, whatever fragmentation does to RSS."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int((info.uordblks + info.hblkhd) // 1024)


def trim_heap() -> None:
    """Give free heap pages back to the OS (``malloc_trim``), so RSS shows live memory."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Engine-side kinds of object that must not outlive their session.
TRACKED_KINDS = ("RTCPeerConnection", "RTCDtlsTransport", "RTCIceTransport", "Connection",
                 "RTCSctpTransport", "RTCRtpSender", "RTCRtpReceiver", "WhepSession",
                 "FanoutViewer", "ViewerCursor", "RingReader", "MuxStunProtocol", "Session",
                 "Task", "_TokenBucket")


def live_objects() -> dict[str, int]:
    """How many objects of each :data:`TRACKED_KINDS` type are alive (after a collection)."""
    gc.collect()
    counts = dict.fromkeys(TRACKED_KINDS, 0)
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in counts:
            counts[name] += 1
    return counts


# --- server ----------------------------------------------------------------------------------


async def serve(send_path: str, port: int, max_viewers: int, record_dir: str = "",
                motion: bool = False) -> None:
    camera = CameraConfig(source=f"file:{recorded_stream()}", width=WIDTH, height=HEIGHT,
                          framerate=FPS, bitrate=BITRATE, keyframe_interval=GOP)
    feed = CapturePipeline(camera)
    await feed.start()
    await feed.wait_first_frame(10)
    engine = Engine(WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",),
                                 max_viewers=max_viewers, send_path=send_path),
                    Path(tempfile.mkdtemp()), feed)
    await engine.start()
    recorder = None
    if record_dir:  # bench/recording.py: the fan-out with a recorder reading the same ring
        from ruseon_appliance.recording import Recorder, RecorderSettings

        recorder = Recorder(RecorderSettings(directory=Path(record_dir), continuous=True),
                            feed.ring)
        await recorder.start()
    if motion:  # bench/motion.py: the fan-out with the motion detector reading the same ring
        from ruseon_appliance.motion.detector import MotionSettings
        from ruseon_appliance.motion.monitor import MotionMonitor

        await MotionMonitor(feed.ring, MotionSettings(), camera="bench").start()

    async def post(request: web.Request) -> web.Response:
        try:
            session, answer = await engine.offer(await request.text())
        except OfferError as exc:
            return web.Response(status=400, text=exc.reason)
        return web.Response(status=201, text=answer, content_type="application/sdp",
                            headers={"Location": f"/whep/{session.id}"})

    async def delete(request: web.Request) -> web.Response:
        await engine.close(request.match_info["sid"])
        return web.Response(status=200)

    async def stats(request: web.Request) -> web.Response:
        if request.query.get("gc"):
            gc.collect()
        sessions = [s.stats() for s in engine.sessions.values()]
        extra: dict[str, Any] = {"malloc_in_use_kib": malloc_in_use_kib(),
                                 "python_blocks": sys.getallocatedblocks()}
        if request.query.get("trim"):
            trim_heap()
            extra["rss_trimmed_kib"] = rss_kib()
        if request.query.get("objects"):
            extra["objects"] = live_objects()
            extra["tasks"] = len(asyncio.all_tasks())
            extra["mux"] = {k: v for k, v in engine.mux.stats().items()
                            if k in ("sessions", "routes", "tracked_sources")}
        return web.json_response({**extra,
            "cpu_s": time.process_time(),
            "wall_s": time.monotonic(),
            "packets": sum(s["packets_sent"] for s in sessions),
            "sessions": len(sessions),
            "connected": sum(s["state"] == "connected" for s in sessions),
            "rss_kib": rss_kib(),
            "keyframe_skips": sum(s.get("keyframe_skips", 0) for s in sessions),
            "gc_full_collections": gc.get_stats()[2]["collections"],
            "offers_accepted": engine.offers_accepted,
            "sessions_ended": dict(engine.sessions_ended),
            # SRTP profile each connected session negotiated (trees before it have none).
            "srtp": dict(Counter(str(s.get("srtp_profile")) for s in sessions
                                 if s["state"] == "connected")),
        })

    async def cleanup() -> None:
        if recorder is not None:
            await recorder.stop()
        await engine.stop()
        await feed.stop()

    await serve_until_cancelled(
        [("POST", "/whep", post), ("DELETE", "/whep/{sid}", delete), ("GET", "/stats", stats)],
        port, cleanup)


# --- viewers (worker processes) --------------------------------------------------------------


class CheapViewer:
    """A real aiortc peer that counts the RTP it receives and drops it (no decoding)."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.addTransceiver("video", direction="recvonly")
        self.packets = 0
        self.location = ""

    def _count(self, size: int) -> None:
        self.packets += 1

    async def connect(self, http: ClientSession, url: str) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with http.post(url + "/whep", data=self.pc.localDescription.sdp,
                             headers={"Content-Type": "application/sdp"}) as resp:
            answer = await resp.text()
            if resp.status != 201:
                raise RuntimeError(f"offer refused: {resp.status} {answer}")
            self.location = resp.headers["Location"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        aiortc_internals.discard_received_rtp(self.pc, self._count)

    async def close(self, http: ClientSession, url: str) -> None:
        async with http.delete(url + self.location):
            pass
        await self.pc.close()


async def connect_all(http: ClientSession, url: str, count: int) -> list[CheapViewer]:
    """Connect ``count`` viewers (10 at a time) and wait until each has received video."""
    viewers = [CheapViewer() for _ in range(count)]
    for i in range(0, count, 10):
        await asyncio.gather(*(v.connect(http, url) for v in viewers[i:i + 10]))
    deadline = time.monotonic() + 60
    while any(v.packets == 0 for v in viewers):
        if time.monotonic() > deadline:
            raise RuntimeError("viewers did not receive video within 60 s")
        await asyncio.sleep(0.1)
    return viewers


async def worker(url: str, count: int, cycles: int, batch: int) -> None:
    async with ClientSession() as http:
        if cycles:
            # Join/leave churn: `cycles` viewers in total, `batch` at a time.
            done = 0
            while done < cycles:
                n = min(batch, cycles - done)
                viewers = await connect_all(http, url, n)
                for v in viewers:
                    await v.close(http, url)
                done += n
            print(json.dumps({"cycles": done}), flush=True)
            return
        viewers = await connect_all(http, url, count)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        print(json.dumps({"packets": sum(v.packets for v in viewers)}), flush=True)
        for v in viewers:
            await v.close(http, url)


# --- orchestration ---------------------------------------------------------------------------


class Server:
    """A server subprocess with its stats endpoint."""

    def __init__(self, send_path: str, *, max_viewers: int = 200, loop: str = "asyncio",
                 record_dir: str = "", tree: Path = ROOT, aes_mask: bool = False,
                 motion: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        if aes_mask:
            env["OPENSSL_ia32cap"] = AES_MASK
        if tree != ROOT:  # the other tree's bench reads the same cached recording
            (tree / ".cache").mkdir(exist_ok=True)
            target = tree / ".cache" / STREAM.name
            if not target.exists():
                target.symlink_to(STREAM)
        self.proc = subprocess.Popen(
            [sys.executable, str(tree / "bench" / "fanout.py"), "serve", "--send-path",
             send_path, "--port", str(self.port), "--max-viewers", str(max_viewers), "--loop",
             loop, "--record-dir", record_dir, *(["--motion"] if motion else [])],
            stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("server did not start")

    def stats(self, collect: bool = False) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(self.url + "/stats" + ("?gc=1" if collect else "")) as r:
            return dict(json.loads(r.read()))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Viewers:
    """Worker processes holding ``count`` viewers between them."""

    def __init__(self, url: str, count: int, workers: int = 2) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        shares = [count // workers + (i < count % workers) for i in range(workers)]
        for share in shares:
            if share:
                self.procs.append(subprocess.Popen(
                    [sys.executable, __file__, "worker", "--url", url, "--count", str(share)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for proc in self.procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a viewer worker failed")

    def close(self) -> int:
        """Let the workers leave; returns the packets they received."""
        received = 0
        for proc in self.procs:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip():
                received += json.loads(line)["packets"]
            proc.wait(30)
        return received


def churn(url: str, cycles: int, batch: int, workers: int = 2) -> None:
    """``cycles`` join/leave cycles spread over worker processes."""
    procs = [subprocess.Popen([sys.executable, __file__, "worker", "--url", url, "--cycles",
                               str(cycles // workers), "--batch", str(batch)],
                              stdout=subprocess.PIPE, text=True) for _ in range(workers)]
    for proc in procs:
        proc.wait(1800)
        if proc.returncode:
            raise RuntimeError("a churn worker failed")


def measure(send_path: str, viewers: int, window: float, loop: str,
            record_dir: str = "", tree: Path = ROOT, aes_mask: bool = False,
            motion: bool = False) -> dict[str, Any]:
    server = Server(send_path, loop=loop, record_dir=record_dir, tree=tree, aes_mask=aes_mask,
                    motion=motion)
    try:
        time.sleep(1.0)
        a = server.stats()
        time.sleep(window / 2)
        b = server.stats()
        idle_rate = (b["cpu_s"] - a["cpu_s"]) / (b["wall_s"] - a["wall_s"])
        group = Viewers(server.url, viewers)
        try:
            time.sleep(2.0)  # past the joins' bursts
            s0 = server.stats()
            time.sleep(window)
            s1 = server.stats()
        finally:
            group.close()
    finally:
        server.close()
    wall = s1["wall_s"] - s0["wall_s"]
    cpu = s1["cpu_s"] - s0["cpu_s"]
    packets = s1["packets"] - s0["packets"]
    net = max(0.0, cpu - idle_rate * wall)
    us = net / packets * 1e6 if packets else float("nan")
    return {"send_path": send_path if tree == ROOT else f"{send_path}@base",
            "viewers": viewers, "loop": loop, "aes_mask": aes_mask,
            "window_s": round(wall, 2), "server_cpu_s": round(cpu, 3),
            "idle_cpu_per_s": round(idle_rate, 4), "packets": packets,
            "packets_per_s": round(packets / wall), "cpu_us_per_packet_per_viewer": round(us, 2),
            "packets_per_s_per_core": round(1e6 / us) if packets else 0,
            "server_cpu_load": round(cpu / wall, 3), "connected": s1["connected"],
            "keyframe_skips": s1["keyframe_skips"], "srtp": s1.get("srtp", {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="bench", choices=["bench", "serve", "worker"])
    parser.add_argument("--send-path", default="fanout")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-viewers", type=int, default=200)
    parser.add_argument("--url", default="")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--cycles", type=int, default=0)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--viewers", type=int, nargs="*")
    parser.add_argument("--full", action="store_true", help="N = 1, 10, 30, 100")
    parser.add_argument("--quick", action="store_true", help="N = 1, 10, 30 (default)")
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--record-dir", default="", help="serve: also record into this dir")
    parser.add_argument("--motion", action="store_true", help="serve: also detect motion")
    parser.add_argument("--paths", nargs="*", default=["aiortc", "fanout"],
                        help="send paths to measure (default: aiortc fanout)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout: its fan-out measured beside ours")
    parser.add_argument("--aes-mask", choices=["off", "on", "both"], default="off")
    args = parser.parse_args()
    if args.role == "serve" and os.environ.get("BENCH_PROFILE"):
        # The server under cProfile (BENCH_PROFILE=FILE): its stats written when terminated.
        import cProfile
        import signal

        profiler = cProfile.Profile()

        def dump(signum: int, frame: Any) -> None:
            profiler.disable()
            profiler.dump_stats(os.environ["BENCH_PROFILE"])
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, dump)
        profiler.enable()
    if args.role == "serve":
        if args.loop == "uvloop":
            import uvloop  # type: ignore[import-not-found,unused-ignore]

            uvloop.run(serve(args.send_path, args.port, args.max_viewers, args.record_dir,
                             args.motion))
        else:
            asyncio.run(serve(args.send_path, args.port, args.max_viewers, args.record_dir,
                              args.motion))
        return
    if args.role == "worker":
        asyncio.run(worker(args.url, args.count, args.cycles, args.batch))
        return
    recorded_stream()
    counts = args.viewers or ([1, 10, 30, 100] if args.full else [1, 10, 30])
    masks = {"off": [False], "on": [True], "both": [False, True]}[args.aes_mask]
    rows: list[dict[str, Any]] = []
    for n in counts:
        for mask in masks:
            runs: list[tuple[str, str, Path]] = [(p, p, ROOT) for p in args.paths]
            if args.baseline is not None:
                runs.insert(0, ("fanout@base", "fanout", args.baseline.resolve()))
            pair = {label: measure(path, n, args.window, args.loop, tree=tree, aes_mask=mask)
                    for label, path, tree in runs}
            for row in pair.values():
                print(f"N={n:<3} {row['send_path']:11} aes_mask={mask!s:5} "
                      f"{row['cpu_us_per_packet_per_viewer']:7.2f} µs/packet/viewer  "
                      f"{row['packets_per_s_per_core']:>7} packets/s/core  "
                      f"({row['packets_per_s']} packets/s, server load "
                      f"{row['server_cpu_load']:.2f}, skips {row['keyframe_skips']}, "
                      f"connected {row['connected']}, srtp {row['srtp']})", flush=True)
                print(json.dumps({"figure": "fanout", **row}), flush=True)
            ours = pair.get("fanout")
            for label, row in pair.items():
                if ours is None or row is ours:
                    continue
                ratio = row["cpu_us_per_packet_per_viewer"] / ours["cpu_us_per_packet_per_viewer"]
                print(f"N={n:<3} {label}/fanout CPU per packet ratio {ratio:.2f}x "
                      f"(aes_mask={mask})", flush=True)
                print(json.dumps({"figure": "fanout_ratio", "viewers": n, "against": label,
                                  "ratio": round(ratio, 2), "loop": args.loop,
                                  "aes_mask": mask}), flush=True)
            rows.extend(pair.values())


if __name__ == "__main__":
    main()
