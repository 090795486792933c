"""Real HLS clients against a real ``ruseon serve`` (synthetic camera, loopback, inside the test
run's private network namespace): ffmpeg and ffprobe read the live playlist; LL-HLS and plain
HLS live-edge latency from the capture clock; 100 LL-HLS clients through Debian's nginx with the
shipped caching recipe (``docs/nginx-hls.conf``), where the board's request rate must not grow
with the number of clients. Figures go to ``artifacts/hls-clients.json``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.browser_netns import Server, merge_artifact, running_server
from tests.hls.harness import LlHlsClient, PlainHlsClient, percentile, running_nginx
from tests.hls.m3u8 import parse
from tests.tooling import free_port, require_tool

pytestmark = [pytest.mark.slow]

TOKEN = "nginx-hls-token"
# Protocol-behaviour bounds from the issue, on loopback (generous: a shared 2-core machine).
LL_HLS_P95_S = 1.5
# Clients joining at once are given this long before the steady-state rates are measured.
JOIN_S = 2.0
PLAIN_HLS_P95_S = 6.0


def record(key: str, figures: dict[str, Any]) -> None:
    """Merge ``figures`` under ``key`` into artifacts/hls-clients.json."""
    merge_artifact("hls-clients.json", key, figures)


async def _play(clients: list[Any], seconds: float) -> None:
    await asyncio.gather(*(c.run(seconds) for c in clients))


def test_ffmpeg_decodes_while_ll_and_plain_clients_measure_latency(tmp_path: Path) -> None:
    """ffprobe and ffmpeg read the live playlist (10 s decoded without an error) while, at the
    same time and on the same board, an LL-HLS and a plain client measure the live-edge latency:
    the newest part's capture time vs the wall clock when a blocking reload returns it. (One
    board and one run for both: each half waits on real time, ~16 s apiece when run apart.)"""
    ffmpeg = require_tool("ffmpeg", "apt-get install ffmpeg")
    ffprobe = require_tool("ffprobe", "apt-get install ffmpeg")
    with running_server(tmp_path) as server:
        url = server.url + "hls/index.m3u8"
        probe = subprocess.run(
            [ffprobe, "-v", "error", "-show_entries", "stream=codec_name,width,height",
             "-of", "json", url], capture_output=True, text=True, timeout=60, check=False)
        assert probe.returncode == 0 and not probe.stderr.strip(), probe.stderr
        streams = json.loads(probe.stdout)["streams"]
        source = server.status()["source"]
        # The picture, and the synthetic camera's tone muxed as AAC (issue 30).
        assert [(s["codec_name"], s.get("width"), s.get("height")) for s in streams] == [
            ("h264", source["width"], source["height"]), ("aac", None, None)]
        # 10 s of the live stream decoded; -v error prints nothing when nothing is wrong.
        decode = subprocess.Popen(
            [ffmpeg, "-nostdin", "-v", "error", "-i", url, "-t", "10", "-f", "null",
             "-progress", "pipe:1", "-"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        async def run() -> tuple[list[float], list[float]]:
            async with aiohttp.ClientSession() as session:
                ll = LlHlsClient(session, server.url)
                plain = PlainHlsClient(session, server.url, reload_s=1.0)
                await _play([ll, plain], 12)
                assert ll.stats.errors == 0 and plain.stats.errors == 0
                return ll.stats.latencies_s, plain.stats.latencies_s

        try:
            ll, plain = asyncio.run(run())
        finally:
            try:
                out, err = decode.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                decode.kill()
                out, err = decode.communicate()
        source = server.status()["source"]
        fps = source["fps"]
        # Slots the synthetic camera skipped since it started (a busy machine made it late):
        # 10 s of its stream hold that many frames fewer (seen: 282 decoded at 30 fps, load 8).
        late = source["stats"]["source_frames_late"]
    assert decode.returncode == 0, err
    assert err.strip() == "", err
    frames = [int(line.split("=")[1]) for line in out.splitlines() if line.startswith("frame=")]
    assert frames and frames[-1] >= 0.95 * 10 * fps - late, (frames[-1:], fps, late)
    record("ffmpeg", {"frames_decoded": frames[-1], "source_fps": fps, "camera_frames_late": late})

    assert len(ll) >= 20 and len(plain) >= 5, (len(ll), len(plain))
    figures = {
        "ll_hls": {"samples": len(ll), "p50_s": round(percentile(ll, 0.5), 3),
                   "p95_s": round(percentile(ll, 0.95), 3)},
        "plain_hls": {"samples": len(plain), "p50_s": round(percentile(plain, 0.5), 3),
                      "p95_s": round(percentile(plain, 0.95), 3)},
    }
    record("latency", figures)
    # A capture time in the future would mean the stamps are wrong, not that we are fast.
    assert min(ll) > 0 and min(plain) > 0, figures
    assert figures["ll_hls"]["p95_s"] <= LL_HLS_P95_S, figures
    assert figures["plain_hls"]["p95_s"] <= PLAIN_HLS_P95_S, figures


def board_requests(server: Server) -> dict[str, int]:
    """HLS requests the board has answered so far, by kind."""
    requests: dict[str, int] = server.status()["hls"]["requests"]
    return requests


def test_many_clients_through_nginx_cost_the_board_one_client(tmp_path: Path) -> None:
    nginx_bin = require_tool("nginx", "apt-get install nginx-light")
    seconds = 8.0
    with running_server(tmp_path / "board", token=TOKEN) as server, running_nginx(
        nginx_bin, server.http_port, free_port(), tmp_path / "nginx", token=TOKEN
    ) as nginx:

        async def phase(count: int) -> dict[str, Any]:
            """``count`` clients join at once; rates are measured after the join (steady
            state), the join itself is reported apart."""
            headers = {"Authorization": f"Bearer {TOKEN}"}
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                clients = [LlHlsClient(session, nginx.url, headers=headers)
                           for _ in range(count)]
                start = board_requests(server)
                playing = asyncio.ensure_future(_play(clients, JOIN_S + seconds))
                await asyncio.sleep(JOIN_S)
                before, started = board_requests(server), time.monotonic()
                sent_before = sum(c.stats.requests for c in clients)
                seen = [len(c.stats.latencies_s) for c in clients]
                await asyncio.sleep(seconds)
                after, elapsed = board_requests(server), time.monotonic() - started
                sent = sum(c.stats.requests for c in clients) - sent_before
                await playing
            by_kind = {k: v - before.get(k, 0) for k, v in after.items()}
            joining = {k: v - start.get(k, 0) for k, v in before.items()}
            errors = sum(c.stats.errors for c in clients)
            kinds: dict[str, int] = {}
            for c in clients:
                for kind, n in c.stats.error_kinds.items():
                    kinds[kind] = kinds.get(kind, 0) + n
            latencies = [x for c, n in zip(clients, seen, strict=True)
                         for x in c.stats.latencies_s[n:]]
            return {
                "clients": count, "client_requests_per_s": round(sent / elapsed, 1),
                "board_requests_per_s": round(sum(by_kind.values()) / elapsed, 1),
                "board_requests_by_kind": by_kind, "board_requests_while_joining": joining,
                "errors": errors, "error_kinds": kinds,
                "latency_p50_s": round(percentile(latencies, 0.5), 3) if latencies else None,
                "latency_p95_s": round(percentile(latencies, 0.95), 3) if latencies else None,
            }

        async def native_then_unauthenticated() -> list[int]:
            """A native player (``?token=``, no header) plays a part, then strangers ask for
            the playlist and for that part, which are both in the cache by then."""
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{nginx.url}/hls/index.m3u8?token={TOKEN}") as answer:
                    assert answer.status == 200
                    text = await answer.text()
                    # Parts the board split at PART-TARGET (its camera skipped frames) may be
                    # under 85% of it, one-frame parts of a stalled camera over it: see
                    # tests.hls.m3u8.parse.
                    stats = server.status()["hls"]["stream"]
                    part = parse(text, split_parts=stats["parts_split_at_target"],
                                 stalled_parts=stats["parts_over_target"]
                                 ).segments[-1].parts[-1].uri
                assert part is not None and part.endswith(f"?token={TOKEN}"), part
                async with session.get(f"{nginx.url}/hls/{part}") as answer:
                    assert answer.status == 200
                statuses = []
                for path in ("index.m3u8", "index.m3u8?token=wrong", part.split("?")[0]):
                    async with session.get(f"{nginx.url}/hls/{path}") as response:
                        statuses.append(response.status)
                return statuses

        few = asyncio.run(phase(10))
        many = asyncio.run(phase(100))
        # Cached answers exist now; without the token nginx still refuses them.
        refused = asyncio.run(native_then_unauthenticated())
        log = nginx.log_tail()
    record("nginx", {"few": few, "many": many})
    assert refused == [401, 401, 401], refused
    # The token is neither in the access log nor in a cache key (nginx writes keys to disk).
    access = (nginx.prefix / "access.log").read_text()
    assert "index.m3u8" in access and "part-" in access and TOKEN not in access
    keys = [line for path in (nginx.prefix / "cache").rglob("*") if path.is_file()
            for line in path.read_bytes().split(b"\n") if line.startswith(b"KEY: ")]
    assert keys and not any(TOKEN.encode() in key for key in keys), keys[:3]
    assert few["errors"] == 0 and many["errors"] == 0, (few, many, log)
    # Ten times the clients, ten times the requests at nginx...
    assert many["client_requests_per_s"] > 5 * few["client_requests_per_s"], (few, many)
    # ...and about the same at the board: one blocking reload and one part per new part.
    assert many["board_requests_per_s"] <= 2 * few["board_requests_per_s"] + 2, (few, many)
    assert many["board_requests_per_s"] * 10 < many["client_requests_per_s"], (few, many)
    # Through the cache the live edge stays close too (nginx's lock waiters poll every 500 ms,
    # and 100 clients share this process: a looser bound than the direct one).
    assert many["latency_p95_s"] is not None and many["latency_p95_s"] <= 2 * LL_HLS_P95_S, many
