"""Benchmark: HLS / LL-HLS on the board.

1. Segmenter cost per access unit: a recorded 720p30 2 Mbit/s stream (libx264, camera-like GOP)
   through the fMP4 segmenter and the live window, and the playlist render per part.
2. Board CPU per HLS client, from ``/proc/<pid>/stat`` of a real ``ruseon serve`` (synthetic
   camera): N LL-HLS clients straight at the board, then 10x as many through Debian's nginx with
   the shipped recipe (docs/nginx-hls.conf); each minus the board's CPU with no client.
3. LL-HLS live-edge latency p50/p95 (newest part's capture time vs the wall clock when the
   blocking reload returns), direct and through nginx, and plain HLS for comparison.

    .venv/bin/python bench/hls.py [--clients 20] [--seconds 10]

Prints a summary and one JSON line per figure. Everything stays on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from capture import record  # noqa: E402

from ruseon_appliance.capture.h264 import AccessUnitSplitter  # noqa: E402
from ruseon_appliance.hls import LiveWindow, render  # noqa: E402
from ruseon_appliance.hls.window import fragment_max_for  # noqa: E402
from ruseon_appliance.segmenter import Fmp4Segmenter  # noqa: E402
from tests.hls.harness import (  # noqa: E402
    LlHlsClient,
    PlainHlsClient,
    percentile,
    running_nginx,
)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TOKEN = "bench-hls-token"  # auth on, as a deployment behind nginx would have it
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def segmenter_cost(frames: int) -> dict[str, float]:
    """µs per access unit for segmenter.push (+ window.add) and µs per playlist render."""
    fps = 30
    stream = record(1280, 720, fps, 2_000_000, frames, 60)
    units = AccessUnitSplitter().split_all(stream)
    segmenter = Fmp4Segmenter(fragment_max_s=fragment_max_for(0.25, fps))
    window = LiveWindow(target_duration=2, part_target_s=0.25, window_s=12)
    push_ns: list[int] = []
    add_ns = 0
    render_ns: list[int] = []
    pts = 0
    for i, (data, keyframe) in enumerate(units):
        started = time.perf_counter_ns()
        fragments = segmenter.push(data, pts, keyframe, 1_764_000_000_000_000 + i * 33_333)
        push_ns.append(time.perf_counter_ns() - started)
        pts += 90_000 // fps
        if fragments:
            started = time.perf_counter_ns()
            for fragment in fragments:
                init = segmenter.init_segment
                assert init is not None
                window.add_init(fragment.init_generation, init)
                window.add(fragment)
            add_ns += time.perf_counter_ns() - started
            started = time.perf_counter_ns()
            render(window)
            render_ns.append(time.perf_counter_ns() - started)
    push_ns.sort()
    render_ns.sort()
    return {
        "frames": len(units),
        "segmenter_us_per_au_median": push_ns[len(push_ns) // 2] / 1000,
        "segmenter_us_per_au_mean": sum(push_ns) / len(push_ns) / 1000,
        "window_add_us_per_au": add_ns / len(units) / 1000,
        "playlist_render_us_median": render_ns[len(render_ns) // 2] / 1000,
    }


class Board:
    """A ``ruseon serve`` process with the synthetic camera."""

    def __init__(self, state_dir: Path) -> None:
        self.http_port = free_port()
        self.rtc_port = free_port(socket.SOCK_DGRAM)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUSEON_")}
        env.update(RUSEON_CAMERA_WIDTH="640", RUSEON_CAMERA_HEIGHT="360")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ruseon_appliance", "serve", "--config", "/dev/null",
             "--source", "synthetic", "--http", f"127.0.0.1:{self.http_port}",
             "--rtc", f"127.0.0.1:{self.rtc_port}", "--advertise", "127.0.0.1",
             "--state-dir", str(state_dir), "--token", TOKEN],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "ready: open" in line:
                break
        else:
            raise RuntimeError("ruseon serve did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def run_clients(base: str, count: int, seconds: float, plain: int = 0) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        ll = [LlHlsClient(session, base, headers=HEADERS) for _ in range(count)]
        old = [PlainHlsClient(session, base, headers=HEADERS) for _ in range(plain)]
        await asyncio.gather(*(c.run(seconds) for c in [*ll, *old]))
    lat = [x for c in ll for x in c.stats.latencies_s]
    plain_lat = [x for c in old for x in c.stats.latencies_s]
    return {
        "requests": sum(c.stats.requests for c in [*ll, *old]),
        "errors": sum(c.stats.errors for c in [*ll, *old]),
        "ll_p50_s": round(percentile(lat, 0.5), 3) if lat else None,
        "ll_p95_s": round(percentile(lat, 0.95), 3) if lat else None,
        "plain_p50_s": round(percentile(plain_lat, 0.5), 3) if plain_lat else None,
        "plain_p95_s": round(percentile(plain_lat, 0.95), 3) if plain_lat else None,
    }


def board_phase(board: Board, base: str, count: int, seconds: float,
                idle_cpu_per_s: float, plain: int = 0) -> dict[str, Any]:
    cpu0, t0 = board.cpu_s(), time.monotonic()
    result = asyncio.run(run_clients(base, count, seconds, plain))
    cpu1, t1 = board.cpu_s(), time.monotonic()
    cpu_per_s = (cpu1 - cpu0) / (t1 - t0)
    extra = cpu_per_s - idle_cpu_per_s
    return {
        "clients": count + plain,
        "board_cpu_percent": round(100 * cpu_per_s, 1),
        "board_cpu_percent_over_idle": round(100 * extra, 1),
        "board_cpu_ms_per_client_per_s": round(1000 * extra / max(1, count + plain), 3),
        "client_requests_per_s": round(result["requests"] / (t1 - t0), 1),
        **result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--frames", type=int, default=600)
    args = parser.parse_args()

    cost = segmenter_cost(args.frames)
    print(f"segmenter: median {cost['segmenter_us_per_au_median']:.1f} µs/AU "
          f"(mean {cost['segmenter_us_per_au_mean']:.1f}), window add "
          f"{cost['window_add_us_per_au']:.2f} µs/AU, playlist render median "
          f"{cost['playlist_render_us_median']:.0f} µs per part (720p30 2 Mbit/s)")
    print(json.dumps({"figure": "hls_segmenter", **cost}), flush=True)

    nginx_bin = shutil.which("nginx")
    with tempfile.TemporaryDirectory() as tmp:
        board = Board(Path(tmp) / "state")
        try:
            time.sleep(3)  # a first segment, and the camera's CPU settled
            cpu0, t0 = board.cpu_s(), time.monotonic()
            time.sleep(args.seconds / 2)
            idle = (board.cpu_s() - cpu0) / (time.monotonic() - t0)
            print(f"board idle (synthetic camera encoding 640x360): {100 * idle:.1f} % CPU")
            rows = []
            direct = board_phase(board, board.url, args.clients, args.seconds, idle)
            rows.append({"path": "direct", **direct})
            plain = board_phase(board, board.url, 1, args.seconds, idle, plain=1)
            rows.append({"path": "direct-ll+plain", **plain})
            if nginx_bin:
                with running_nginx(nginx_bin, board.http_port, free_port(),
                                   Path(tmp) / "nginx", token=TOKEN) as nginx:
                    for count in (args.clients, 10 * args.clients):
                        row = board_phase(board, nginx.url, count, args.seconds, idle)
                        rows.append({"path": "nginx", **row})
            else:
                print("nginx not installed (scripts/install-system-deps): skipped that half")
        finally:
            board.stop()
    for row in rows:
        print(f"{row['path']:>16} {row['clients']:>4} clients: board "
              f"{row['board_cpu_percent']:5.1f} % CPU ({row['board_cpu_percent_over_idle']:+.1f}"
              f" over idle, {row['board_cpu_ms_per_client_per_s']:.2f} ms CPU per client per s),"
              f" {row['client_requests_per_s']:.0f} req/s at the front, LL p50/p95 "
              f"{row['ll_p50_s']}/{row['ll_p95_s']} s, plain p50/p95 {row['plain_p50_s']}/"
              f"{row['plain_p95_s']} s, errors {row['errors']}")
        print(json.dumps({"figure": "hls_clients", **row}), flush=True)
    direct_row = rows[0]
    nginx_rows = [r for r in rows if r["path"] == "nginx"]
    if nginx_rows and direct_row["board_cpu_ms_per_client_per_s"] > 0:
        big = nginx_rows[-1]
        ratio = direct_row["board_cpu_ms_per_client_per_s"] / max(
            1e-6, big["board_cpu_ms_per_client_per_s"])
        print(f"board CPU per client: direct / through nginx ({big['clients']} clients) = "
              f"{ratio:.1f}x")
        print(json.dumps({"figure": "hls_nginx_ratio", "ratio": round(ratio, 1)}), flush=True)


if __name__ == "__main__":
    main()
