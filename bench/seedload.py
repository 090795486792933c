"""The seed's mixed load test, reproduced: many cameras on one engine, WHEP + HLS + REST at once.

The system this project descends from ran 50 synthetic cameras with 30 WHEP viewers, 30 HLS
clients and its REST API at once, and printed one line. This runs the same mix against a real
``ruseon serve`` (a child process, on loopback only):

- N cameras (default 10 on a 2-core machine), each a file source replaying its own recording
  (distinct pictures, 720p30 2 Mbit/s libx264, made once and cached in ``.cache/``), so cameras
  cost no encoder time;
- 30 WHEP viewers spread over the cameras: real aiortc peers (ICE, DTLS, SRTP) in two worker
  processes that count the RTP they receive and drop it (no decoding), all offered at once;
- 30 LL-HLS clients at the live edge (blocking reloads + the newest part), spread over
  ``/hls/<camera>/``;
- REST polling: ``/api/status``, ``/api/cameras`` and ``/metrics``, once a second each;
- motion detection off on every camera, as the seed had none (``--motion``: on, the default
  config's; each 720p camera then decodes its stream, about 3.5 % of a core and 8 MiB each);
- for ``--seconds`` (60).

It prints the seed's own line and ours side by side, then one JSON line. Figures:

- Sessions OK / err: WHEP offers answered 201 and connected (first RTP packet) / not.
- RTP packets, egress: what the board's sessions sent during the window (``/metrics``
  ``ruseon_sent_packets_total`` / ``ruseon_sent_bytes_total``), and what the viewers got.
- Handshake latency: the seed's stopped at the SDP answer, so "answer" is POST -> 201 (the
  comparable figure); ours also reports "connected": POST -> the first SRTP packet decrypted by
  the viewer (ICE checks, DTLS handshake, keys, the first frame sent), what a person waits for.
  All 30 offers go out at once, as the seed's did.
- Board CPU: the server process's CPU time (user + system, every thread, from
  ``/proc/<pid>/stat``) over the window's wall time, as % of one core; also with no client.
- RSS: the server's resident set at the end of the window (the seed reported its Go heap).
- GC pause total: time spent in Python's cyclic garbage collector during the window (every
  generation, measured with ``gc.callbacks`` inside the server).
- threads / tasks: the server's OS threads and its most asyncio tasks alive at once.

The machine may be shared: CPU time (not wall time) is what is measured, but queueing latency
(handshakes, REST) still shows other processes' load.

    .venv/bin/python bench/seedload.py [--cameras 10] [--viewers 30] [--hls 30] [--seconds 60]
        [--motion]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WIDTH, HEIGHT, FPS, BITRATE, GOP, SECONDS = 1280, 720, 30, 2_000_000, 60, 4
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SEED = ("Sessions OK: 30 (err: 0) | RTP Packets: 488,214 | Egress: 9.04 MB/s | Handshake Latency: "
        "p50=3.21ms p95=6.84ms max=11.20ms | heap 34 MB | GC pause total 3.82 ms")


def recording(index: int) -> Path:
    """Camera ``index``'s recording: its own moving picture (seeded), cached."""
    path = ROOT / ".cache" / f"seedload-{HEIGHT}p{FPS}-{BITRATE // 1000}k-{index}.h264"
    if path.exists():
        return path
    import av

    from ruseon_appliance.capture.sources.synthetic import MovingPicture

    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = WIDTH, HEIGHT, "yuv420p"
    ctx.time_base, ctx.framerate = Fraction(1, FPS), Fraction(FPS, 1)
    ctx.bit_rate, ctx.gop_size, ctx.max_b_frames = BITRATE, GOP, 0
    ctx.options = {"preset": "ultrafast", "tune": "zerolatency", "profile": "baseline",
                   "x264-params": f"keyint={GOP}:min-keyint={GOP}:scenecut=0:repeat-headers=1:"
                   f"vbv-maxrate={BITRATE // 1000}:vbv-bufsize={BITRATE // 1000}"}
    picture = MovingPicture(WIDTH, HEIGHT, seed=index + 1)
    out = bytearray()
    for i in range(FPS * SECONDS):
        frame = picture.render(i, 1_700_000_000_000_000 + i * 1_000_000 // FPS)
        frame.pts = i
        for packet in ctx.encode(frame):
            out += bytes(packet)
    for packet in ctx.encode(None):
        out += bytes(packet)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(bytes(out))
    tmp.replace(path)
    return path


def snapshot_cost() -> dict[str, float]:
    """Board CPU of one snapshot tile: ``/snapshot/<camera>.jpg`` decodes the newest 720p IDR
    and encodes a JPEG (cached per keyframe); a tile refreshing every 3 s costs one of those per
    3 s at most. Median CPU time of 20 (``time.process_time``)."""
    from ruseon_appliance.capture.h264 import AccessUnitSplitter
    from ruseon_appliance.web.snapshot import keyframe_to_jpeg

    units = AccessUnitSplitter().split_all(recording(0).read_bytes())
    idr = next(data for data, key in units if key)
    times = []
    for _ in range(20):
        began = time.process_time()
        keyframe_to_jpeg(idr)
        times.append(time.process_time() - began)
    ms = 1000 * statistics.median(times)
    return {"snapshot_ms": ms, "snapshot_tile_core_percent": 100 * ms / 1000 / 3}


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p95": float("nan"), "max": float("nan")}
    ordered = sorted(values)
    return {"p50": statistics.median(ordered),
            "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
            "max": ordered[-1]}


# --- the board (child process): ruseon serve with GC and task accounting ----------------------


def board_main(config: str, figures: str) -> int:
    """``ruseon serve --config CONFIG``, writing GC/thread/task figures to FIGURES on exit."""
    pauses: dict[str, Any] = {"total_s": 0.0, "collections": 0, "started": 0.0,
                              "by_generation_s": [0.0, 0.0, 0.0], "by_generation": [0, 0, 0]}
    peak = {"tasks": 0, "threads": 0}

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            pauses["started"] = time.perf_counter()
        else:
            took = time.perf_counter() - pauses["started"]
            pauses["total_s"] += took
            pauses["collections"] += 1
            generation = min(2, int(info.get("generation", 0)))
            pauses["by_generation_s"][generation] += took
            pauses["by_generation"][generation] += 1

    gc.callbacks.append(on_gc)
    from ruseon_appliance import app

    if os.environ.get("SEEDLOAD_GC_THRESHOLD"):  # an experiment: other collector thresholds
        # What the appliance sets once started (app.GC_THRESHOLDS), replaced.
        app.GC_THRESHOLDS = tuple(  # type: ignore[assignment]
            int(x) for x in os.environ["SEEDLOAD_GC_THRESHOLD"].split(","))
    from ruseon_appliance.cli import main

    serve = app.serve

    async def counted(cfg: Any) -> int:
        async def sample() -> None:
            while True:
                peak["tasks"] = max(peak["tasks"], len(asyncio.all_tasks()))
                peak["threads"] = max(peak["threads"], threading.active_count())
                Path(figures).write_text(json.dumps({**pauses, **peak}))
                await asyncio.sleep(1)

        task = asyncio.create_task(sample())
        try:
            return await serve(cfg)
        finally:
            task.cancel()

    app.serve = counted  # type: ignore[assignment]
    return main(["serve", "--config", config])


class Board:
    """The ``ruseon serve`` child process."""

    def __init__(self, cameras: int, state: Path, motion: bool = False) -> None:
        self.state = state
        self.http_port = free_port()
        self.figures = state / "figures.json"
        lines = ["[http]", f'listen = "127.0.0.1:{self.http_port}"',
                 "[webrtc]", f'listen = "127.0.0.1:{free_port(socket.SOCK_DGRAM)}"',
                 'advertise = ["127.0.0.1"]', "max_viewers = 200",
                 "max_viewers_per_address = 200", "connect_timeout_s = 30",
                 "[state]", f'dir = "{state}"', "[log]", 'level = "info"']
        for i in range(cameras):
            lines += ["[[camera]]", f'name = "cam{i}"', f'source = "file:{recording(i)}"',
                      f"width = {WIDTH}", f"height = {HEIGHT}", f"framerate = {FPS}",
                      f"bitrate = {BITRATE}", f"keyframe_interval = {GOP}",
                      f"motion = {'true' if motion else 'false'}"]
        config = state / "ruseon.toml"
        config.write_text("\n".join(lines) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUSEON_")}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "board", str(config), str(self.figures)], cwd=ROOT,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        self.output: list[str] = []
        for line in self.proc.stdout:
            self.output.append(line)
            if "ready: open" in line:
                break
        else:
            raise RuntimeError("ruseon serve did not start:\n" + "".join(self.output))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def admin(self) -> dict[str, str]:
        """The admin credential ``/api/status`` and ``/metrics`` ask for (the secret the board
        generated in its state directory)."""
        secret = (self.state / "admin-secret").read_text().strip()
        return {"Authorization": f"Bearer {secret}"}

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def status(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def gc_figures(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.figures.read_text()))
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


# --- WHEP viewers (worker processes) ---------------------------------------------------------


async def viewers_main(url: str, cameras: list[str]) -> None:
    """Offer one viewer per camera name at once; report handshakes; count RTP until stdin ends."""
    import aioice.ice

    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]  # type: ignore
    from aiohttp import ClientSession
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    from ruseon_appliance.engine import aiortc_internals

    class Viewer:
        def __init__(self, camera: str) -> None:
            self.camera = camera
            self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            self.pc.addTransceiver("video", direction="recvonly")
            self.packets = self.bytes = 0
            self.first = asyncio.get_running_loop().create_future()
            self.answer_s = self.connected_s = float("nan")
            self.location = ""
            self.error = ""

        def count(self, size: int) -> None:
            self.packets += 1
            self.bytes += size
            if not self.first.done():
                self.first.set_result(time.perf_counter())

        async def connect(self, http: ClientSession) -> None:
            await self.pc.setLocalDescription(await self.pc.createOffer())
            began = time.perf_counter()
            try:
                async with http.post(f"{url}/whep/{self.camera}", data=self.pc.localDescription.sdp,
                                     headers={"Content-Type": "application/sdp"}) as resp:
                    answer = await resp.text()
                    self.answer_s = time.perf_counter() - began
                    if resp.status != 201:
                        self.error = f"{resp.status}"
                        return
                    self.location = resp.headers["Location"]
                await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
                aiortc_internals.discard_received_rtp(self.pc, self.count)
                self.connected_s = await asyncio.wait_for(self.first, 30) - began
            except Exception as exc:
                self.error = type(exc).__name__

    async with ClientSession() as http:
        viewers = [Viewer(name) for name in cameras]
        # Offers prepared first, then all POSTed at once (the handshake clock starts at POST).
        await asyncio.gather(*(v.connect(http) for v in viewers))
        print(json.dumps({"answer_s": [v.answer_s for v in viewers if not v.error],
                          "connected_s": [v.connected_s for v in viewers if not v.error],
                          "errors": [v.error for v in viewers if v.error]}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        print(json.dumps({"packets": sum(v.packets for v in viewers),
                          "bytes": sum(v.bytes for v in viewers)}), flush=True)
        for v in viewers:
            if v.location:
                async with http.delete(url + v.location):
                    pass
            await v.pc.close()


class Viewers:
    """Two worker processes holding the viewers between them."""

    def __init__(self, url: str, cameras: list[str], workers: int = 2) -> None:
        self.procs = [subprocess.Popen([sys.executable, __file__, "viewers", url,
                                        ",".join(cameras[i::workers])],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                      for i in range(workers) if cameras[i::workers]]
        self.handshakes: dict[str, list[Any]] = {"answer_s": [], "connected_s": [], "errors": []}
        for proc in self.procs:
            assert proc.stdout is not None
            for key, values in json.loads(proc.stdout.readline()).items():
                self.handshakes[key] += values

    def close(self) -> dict[str, int]:
        got = {"packets": 0, "bytes": 0}
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in self.procs:
            assert proc.stdout is not None
            for key, value in json.loads(proc.stdout.readline()).items():
                got[key] += value
            proc.wait(60)
        return got


# --- HLS clients and REST polling (this process) ---------------------------------------------


async def hls_and_rest(url: str, cameras: list[str], clients: int, seconds: float,
                       admin: dict[str, str]
                       ) -> dict[str, Any]:
    import aiohttp

    from tests.hls.harness import LlHlsClient

    rest: dict[str, Any] = {"requests": 0, "errors": 0, "latency_s": []}

    async def poll(session: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for path in ("/api/status", "/api/cameras", "/metrics"):
                began = time.perf_counter()
                try:
                    async with session.get(url + path, headers=admin) as response:
                        await response.read()
                        rest["errors"] += response.status != 200
                except aiohttp.ClientError:
                    rest["errors"] += 1
                rest["requests"] += 1
                rest["latency_s"].append(time.perf_counter() - began)
            await asyncio.sleep(1.0)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        players = []
        for i in range(clients):
            player = LlHlsClient(session, url)
            player.base = f"{url}/hls/{cameras[i % len(cameras)]}/"
            players.append(player)
        await asyncio.gather(poll(session), *(p.run(seconds) for p in players))
    return {"hls_requests": sum(p.stats.requests for p in players),
            "hls_errors": sum(p.stats.errors for p in players),
            "hls_bytes": sum(p.stats.bytes for p in players),
            "hls_latency": percentiles([x for p in players for x in p.stats.latencies_s]),
            "rest_requests": rest["requests"], "rest_errors": rest["errors"],
            "rest_latency": percentiles(rest["latency_s"])}


def sent_totals(url: str, admin: dict[str, str]) -> tuple[float, float]:
    """``ruseon_sent_packets_total`` and ``ruseon_sent_bytes_total`` from ``/metrics``."""
    import urllib.request

    request = urllib.request.Request(url + "/metrics", headers=admin)
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("ruseon_sent_packets_total", "ruseon_sent_bytes_total"):
            values[name] = float(value)
    return values["ruseon_sent_packets_total"], values["ruseon_sent_bytes_total"]


def run(cameras: int, viewers: int, hls: int, seconds: float, idle_s: float,
        motion: bool = False) -> dict[str, Any]:
    for i in range(cameras):
        recording(i)  # before the board starts: encoding is not the board's cost
    with tempfile.TemporaryDirectory(prefix="seedload-") as tmp:
        board = Board(cameras, Path(tmp), motion)
        try:
            names = [f"cam{i}" for i in range(cameras)]
            time.sleep(2)  # every camera's first GOP in its ring
            cpu0, t0 = board.cpu_s(), time.monotonic()
            time.sleep(idle_s)
            idle = (board.cpu_s() - cpu0) / (time.monotonic() - t0)

            watchers = Viewers(board.url, [names[i % cameras] for i in range(viewers)])
            gc0 = board.gc_figures()
            packets0, bytes0 = sent_totals(board.url, board.admin)
            cpu0, t0 = board.cpu_s(), time.monotonic()
            mixed = asyncio.run(hls_and_rest(board.url, names, hls, seconds, board.admin))
            cpu1, t1 = board.cpu_s(), time.monotonic()
            packets1, bytes1 = sent_totals(board.url, board.admin)
            gc1 = board.gc_figures()
            rss_kib = board.status("VmRSS")
            threads = board.status("Threads")
            got = watchers.close()
        finally:
            board.stop()
    window = t1 - t0
    hs = watchers.handshakes
    return {
        "cameras": cameras, "viewers": viewers, "hls_clients": hls, "motion": motion,
        "window_s": round(window, 1),
        "sessions_ok": len(hs["connected_s"]), "sessions_err": len(hs["errors"]),
        "session_errors": hs["errors"],
        "rtp_packets_sent": int(packets1 - packets0), "rtp_packets_received": got["packets"],
        "egress_mb_s": (bytes1 - bytes0) / window / 1e6,
        "answer_ms": {k: v * 1000 for k, v in percentiles(hs["answer_s"]).items()},
        "connected_ms": {k: v * 1000 for k, v in percentiles(hs["connected_s"]).items()},
        "board_cpu_percent": 100 * (cpu1 - cpu0) / window,
        "board_idle_cpu_percent": 100 * idle,
        "rss_mib": rss_kib / 1024,
        "gc_pause_ms": 1000 * (gc1.get("total_s", 0.0) - gc0.get("total_s", 0.0)),
        "gc_collections": gc1.get("collections", 0) - gc0.get("collections", 0),
        # Per generation (0, 1, 2): collections and their pause total in the window.
        "gc_by_generation": [b - a for a, b in zip(gc0.get("by_generation", [0, 0, 0]),
                                                   gc1.get("by_generation", [0, 0, 0]),
                                                   strict=True)],
        "gc_pause_ms_by_generation": [
            round(1000 * (b - a), 2) for a, b in zip(gc0.get("by_generation_s", [0.0] * 3),
                                                     gc1.get("by_generation_s", [0.0] * 3),
                                                     strict=True)],
        "threads": threads, "tasks_peak": gc1.get("tasks", 0),
        **mixed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=10)
    parser.add_argument("--viewers", type=int, default=30)
    parser.add_argument("--hls", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU first")
    parser.add_argument("--motion", action="store_true",
                        help="motion detection on every camera (the seed had none)")
    args = parser.parse_args()
    r = run(args.cameras, args.viewers, args.hls, args.seconds, args.idle, args.motion)
    r.update(snapshot_cost())
    # One WebRTC tile is one more viewer: the window's CPU over idle, shared by the viewers
    # (HLS clients and REST polling are in it too, so this overstates a viewer's cost).
    r["webrtc_tile_core_percent_at_most"] = (
        (r["board_cpu_percent"] - r["board_idle_cpu_percent"]) / max(1, r["viewers"]))
    ours = (f"Sessions OK: {r['sessions_ok']} (err: {r['sessions_err']}) | RTP Packets: "
            f"{r['rtp_packets_sent']:,} | Egress: {r['egress_mb_s']:.2f} MB/s | Handshake Latency: "
            f"p50={r['answer_ms']['p50']:.2f}ms p95={r['answer_ms']['p95']:.2f}ms "
            f"max={r['answer_ms']['max']:.2f}ms | RSS {r['rss_mib']:.0f} MB | GC pause total "
            f"{r['gc_pause_ms']:.2f} ms | threads {r['threads']} / tasks {r['tasks_peak']}")
    print(f"seed (50 cameras, its machine, 60 s): {SEED}")
    print(f"ours ({r['cameras']} cameras, motion {'on' if r['motion'] else 'off'}, "
          f"{r['window_s']:.0f} s): {ours}")
    print(f"  handshake to the first media packet (ICE+DTLS+SRTP): p50="
          f"{r['connected_ms']['p50']:.0f}ms p95={r['connected_ms']['p95']:.0f}ms "
          f"max={r['connected_ms']['max']:.0f}ms; viewers received {r['rtp_packets_received']:,} "
          f"packets")
    print(f"  board CPU {r['board_cpu_percent']:.0f} % of a core (idle with {r['cameras']} "
          f"cameras and HLS segmenting: {r['board_idle_cpu_percent']:.0f} %), "
          f"GC collections {r['gc_collections']} (by generation {r['gc_by_generation']}, "
          f"pauses {r['gc_pause_ms_by_generation']} ms)")
    print(f"  HLS: {r['hls_requests']:,} requests ({r['hls_errors']} errors), LL latency p50 "
          f"{r['hls_latency']['p50']:.2f} s p95 {r['hls_latency']['p95']:.2f} s; REST: "
          f"{r['rest_requests']} requests ({r['rest_errors']} errors), p50 "
          f"{1000 * r['rest_latency']['p50']:.0f} ms p95 {1000 * r['rest_latency']['p95']:.0f} ms")
    print(f"  grid tiles (board CPU): a snapshot tile {r['snapshot_ms']:.1f} ms per 720p keyframe "
          f"JPEG, {r['snapshot_tile_core_percent']:.2f} % of a core at one per 3 s; a WebRTC tile "
          f"at most {r['webrtc_tile_core_percent_at_most']:.2f} % (one viewer)")
    print(json.dumps({"bench": "seedload", **r}, default=str))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "board":
        sys.exit(board_main(sys.argv[2], sys.argv[3]))
    if len(sys.argv) > 1 and sys.argv[1] == "viewers":
        asyncio.run(viewers_main(sys.argv[2], sys.argv[3].split(",")))
        sys.exit(0)
    main()
