"""Scale-out benchmark: the board's CPU when viewers watch through Janus against watching it
directly over WHEP.

The board is a real ``ruseon serve`` process replaying the cached 720p30 2 Mbit/s recording
(the file source: no encoder in the figures) with one ``[[relay]]`` to a real Janus 1.1.2
(Debian's ``janus``, Streaming plugin, RTP mountpoint with an rtcpport). Viewers are aiortc peers
in this process that count and drop what they receive (no decoding): through Janus they use its
HTTP API (watch, answer, start); directly they POST to the board's ``/whep``. The board's CPU is
read from ``/proc/<pid>/stat`` (every thread) over a window in each scenario:

    idle          no relay, no viewer (replaying the file, the event loop)
    relay+0       the relay alone (Janus up, nobody watching)
    relay+1       1 viewer through Janus
    relay+20      20 viewers through Janus
    whep+1        no relay, 1 direct WHEP viewer
    whep+20       no relay, 20 direct WHEP viewers

The claim: relay+20 is within noise of relay+1 (the board serves one consumer whatever Janus
does), while whep+20 costs about 20 consumers. Janus's own CPU is shown beside.

``--joins N``: instead, how long a viewer joining through Janus waits for its first decoded
picture (watch -> first frame, p50/p95 of N joins one after another; the synthetic camera at
720p30, an IDR every 2 s unless asked: it makes one on request as a Pi's encoder does), with
the relay's RTCP port left out (the default: the RTP port + 1, the mountpoint's rtcpport here)
against ``rtcp_port = 0`` (no RTCP: Janus's keyframe requests never reach the camera, and a
joiner waits for the camera's own next keyframe), in the same run.

It runs in a private network namespace it creates (``unshare --net``, root) with a veth address
for Janus's ICE; nothing leaves the machine.

    .venv/bin/python bench/relay.py                 # window 10 s per scenario
    .venv/bin/python bench/relay.py --window 20 --viewers 20
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
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

NETNS_ENV = "RUSEON_BENCH_RELAY_NETNS"
VETH, VETH_PEER, ADDRESS, GATEWAY = "rbr0", "rbr1", "198.18.0.1/24", "198.18.0.2"
RTP_PORT, RTCP_PORT, MOUNTPOINT = 5004, 5005, 1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
WINDOW = [10.0]


def rerun_in_netns() -> int:
    """Run this script again inside a fresh network namespace."""
    env = {**os.environ, NETNS_ENV: "1"}
    return subprocess.call(["unshare", "--net", "--fork", "--", sys.executable, *sys.argv],
                           env=env)


def prepare_namespace() -> None:
    present = {name for _, name in socket.if_nameindex()}
    if not present <= {"lo", VETH, VETH_PEER}:
        raise SystemExit(f"not a private network namespace: {sorted(present)}")
    for command in (["ip", "link", "set", "lo", "up"],
                    ["ip", "link", "add", VETH, "type", "veth", "peer", "name", VETH_PEER],
                    ["ip", "addr", "add", ADDRESS, "dev", VETH],
                    ["ip", "link", "set", VETH, "up"], ["ip", "link", "set", VETH_PEER, "up"],
                    ["ip", "route", "add", "default", "via", GATEWAY, "dev", VETH]):
        subprocess.run(command, check=True, capture_output=True)


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Board:
    """``ruseon serve`` with the file source, optionally relaying to Janus."""

    def __init__(self, stream: Path | None, state: Path, *, relay: bool,
                 rtcp: str = f"rtcp_port = {RTCP_PORT}\n") -> None:
        from tests.tooling import free_port

        self.http = free_port()
        self.state = state
        config = state / ("relay.toml" if relay else "plain.toml")
        # None: the synthetic camera (libx264, which makes an IDR on request, as a Pi's encoder
        # does; a recording cannot).
        source = f"file:{stream}" if stream is not None else "synthetic"
        text = (f'[camera]\nsource = "{source}"\nframerate = 30\nkeyframe_interval = 60\n'
                f'[webrtc]\nmax_viewers = 100\n')
        if relay:
            text += (f'[[relay]]\nname = "janus"\nurl = "rtp://127.0.0.1:{RTP_PORT}"\n'
                     f'{rtcp}bind = "127.0.0.1:0"\n')
        config.write_text(text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUSEON_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ruseon_appliance", "serve", "--config", str(config),
             "--http", f"127.0.0.1:{self.http}", "--rtc", f"127.0.0.1:{free_port(2)}",
             "--advertise", "127.0.0.1", "--state-dir", str(state), "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("the board did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    def status(self) -> dict[str, Any]:
        """The full ``/api/status`` (with the admin secret the board made on its first start:
        without a credential it is the reduced form)."""
        secret = (self.state / "admin-secret").read_text().strip()
        request = urllib.request.Request(f"{self.url}/api/status",
                                         headers={"Authorization": f"Bearer {secret}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            data: dict[str, Any] = json.load(response)
            return data

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


async def whep_viewers(url: str, count: int) -> tuple[list[Any], Any]:
    from aiohttp import ClientSession
    from fanout import CheapViewer  # bench/fanout.py

    http = ClientSession()
    viewers = [CheapViewer() for _ in range(count)]
    # The board allows only two not-yet-connected sessions per address (429 beyond): all
    # these viewers come from 127.0.0.1, so they join two at a time.
    for i in range(0, count, 2):
        batch = viewers[i:i + 2]
        await asyncio.gather(*(v.connect(http, url) for v in batch))
        await wait_receiving(batch)
    return viewers, http


async def wait_receiving(viewers: list[Any], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while any(v.packets == 0 for v in viewers):
        if time.monotonic() > deadline:
            raise RuntimeError("viewers receive nothing")
        await asyncio.sleep(0.2)


async def window(board: Board, janus_pid: int | None, seconds: float,
                 viewers: list[Any]) -> dict[str, Any]:
    """Board (and Janus) CPU over ``seconds``, after 2 s of settling."""
    await asyncio.sleep(2.0)
    packets0 = sum(v.packets for v in viewers)
    b0, j0, t0 = cpu_seconds(board.proc.pid), cpu_seconds(janus_pid) if janus_pid else 0.0, \
        time.monotonic()
    await asyncio.sleep(seconds)
    b1, j1, t1 = cpu_seconds(board.proc.pid), cpu_seconds(janus_pid) if janus_pid else 0.0, \
        time.monotonic()
    wall = t1 - t0
    return {"board_cpu": round((b1 - b0) / wall, 4),
            "janus_cpu": round((j1 - j0) / wall, 4) if janus_pid else None,
            "viewer_packets_per_s": round((sum(v.packets for v in viewers) - packets0) / wall)}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import aioice.ice

    gather = aioice.ice.get_host_addresses
    from fanout import recorded_stream  # (pins aioice to 127.0.0.1 for the WHEP viewers)

    from tests.relay.janus import Janus, JanusViewer

    stream = recorded_stream()
    results: list[dict[str, Any]] = []

    def report(name: str, figures: dict[str, Any], **extra: Any) -> None:
        row = {"scenario": name, **figures, **extra}
        results.append(row)
        print(json.dumps(row), flush=True)

    with tempfile.TemporaryDirectory(prefix="ruseon-bench-relay-") as tmp:
        base = Path(tmp)
        # Without relay: idle and direct WHEP viewers.
        board = Board(stream, base, relay=False)
        try:
            report("idle", await window(board, None, args.window, []))
            for count in (1, args.viewers):
                viewers, http = await whep_viewers(board.url, count)
                await wait_receiving(viewers)
                report(f"whep+{count}", await window(board, None, args.window, viewers))
                for v in viewers:
                    await v.close(http, board.url)
                await http.close()
                await asyncio.sleep(1.0)
        finally:
            board.close()

        # With the relay, through Janus: its ICE is on the veth (libnice skips loopback), so
        # these viewers gather there too.
        aioice.ice.get_host_addresses = gather
        janus = Janus(base / "janus")
        janus.start()
        board = Board(stream, base, relay=True)
        try:
            info = board.status()["source"]
            await asyncio.to_thread(janus.create_mountpoint, MOUNTPOINT, port=RTP_PORT,
                                    rtcp_port=RTCP_PORT,
                                    profile_level_id=info["profile_level_id"])
            assert janus.proc is not None
            report("relay+0", await window(board, janus.proc.pid, args.window, []))
            for count in (1, args.viewers):
                viewers = [JanusViewer(janus, MOUNTPOINT, decode=False) for _ in range(count)]
                for i in range(0, count, 5):
                    await asyncio.gather(*(v.watch() for v in viewers[i:i + 5]))
                await wait_receiving(viewers)
                relay = board.status()["relays"][0]
                report(f"relay+{count}", await window(board, janus.proc.pid, args.window,
                                                      viewers),
                       relay_keyframe_requests=relay["keyframe_requests_received"])
                await asyncio.gather(*(v.close() for v in viewers))
                await asyncio.sleep(1.0)
        finally:
            board.close()
            janus.stop()
    return results


async def joins(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Watch -> first decoded picture through Janus, for each RTCP setting of the relay."""
    import statistics

    import aioice.ice

    gather = aioice.ice.get_host_addresses
    from fanout import recorded_stream  # (pins aioice to 127.0.0.1: undone below)

    from tests.relay.janus import Janus, JanusViewer

    del recorded_stream  # the synthetic camera: it makes IDRs on request
    # Janus's ICE is on the veth (libnice skips loopback): the viewers gather there too.
    aioice.ice.get_host_addresses = gather
    out: dict[str, dict[str, float]] = {}
    # (relay's rtcp line, the mountpoint's bufferkf)
    settings = {"rtcp left out (RTP port + 1)": ("", False),
                "rtcp_port = 0 (none)": ("rtcp_port = 0\n", False),
                "rtcp + bufferkf = true": ("", True)}
    with tempfile.TemporaryDirectory(prefix="ruseon-bench-relay-") as tmp:
        for i, (label, (rtcp, bufferkf)) in enumerate(settings.items()):
            base = Path(tmp) / str(i)
            base.mkdir()
            janus = Janus(base / "janus")  # a fresh one per setting (and board)
            janus.start()
            board = Board(None, base, relay=True, rtcp=rtcp)
            try:
                info = board.status()["source"]
                await asyncio.to_thread(janus.create_mountpoint, MOUNTPOINT, port=RTP_PORT,
                                        rtcp_port=RTP_PORT + 1, bufferkf=bufferkf,
                                        profile_level_id=info["profile_level_id"])
                waits: list[float] = []
                connects: list[float] = []
                for _ in range(args.joins):
                    viewer = JanusViewer(janus, MOUNTPOINT)
                    began = time.monotonic()
                    await viewer.watch()
                    deadline = began + 20
                    connected: float | None = None
                    while viewer.first_frame_at is None and time.monotonic() < deadline:
                        if connected is None and viewer.pc.connectionState == "connected":
                            connected = time.monotonic()
                        await asyncio.sleep(0.005)
                    if connected is not None:
                        connects.append(connected - began)
                    if viewer.first_frame_at is not None:
                        waits.append(viewer.first_frame_at - began)
                    await viewer.close()
                    await asyncio.sleep(0.3)
                relay = board.status()["relays"][0]
            finally:
                board.close()
                janus.stop()
            waits.sort()
            q = (statistics.quantiles(waits, n=20, method="inclusive") if len(waits) > 1
                 else waits * 19)
            out[label] = {"joins": len(waits), "of": args.joins,
                          "p50_ms": round(statistics.median(waits) * 1000),
                          "p95_ms": round(q[18] * 1000),
                          "connected_p50_ms": round(statistics.median(connects) * 1000)
                          if connects else None,
                          "keyframe_requests": relay["keyframe_requests_received"],
                          "rtcp_port": relay["rtcp_port"]}
            print(json.dumps({label: out[label]}), flush=True)
    return out


def summary(results: list[dict[str, Any]], viewers: int) -> None:
    """Costs from differences: with no consumer nothing is packetized, so the first consumer
    (a relay, or the first WHEP viewer) also pays the shared packetization."""
    cpu = {r["scenario"]: r["board_cpu"] for r in results}
    n = viewers
    first_whep = cpu["whep+1"] - cpu["idle"]
    further_whep = (cpu[f"whep+{n}"] - cpu["whep+1"]) / max(1, n - 1)
    relay = cpu["relay+0"] - cpu["idle"]
    figures = {
        "first_whep_viewer_core": round(first_whep, 5),
        "further_whep_viewer_core": round(further_whep, 5),
        "relay_core": round(relay, 5),
        "relay_n_over_relay_1": round(cpu[f"relay+{n}"] / cpu["relay+1"], 3),
        "whep_n_over_relay_n": round(cpu[f"whep+{n}"] / cpu[f"relay+{n}"], 3),
    }
    print()
    print(f"board CPU (fraction of one core; /proc ticks of 10 ms, so +-{0.01 / WINDOW[0]:.4f}):")
    for r in results:
        janus = f"   janus {r['janus_cpu']:.4f}" if r["janus_cpu"] is not None else ""
        print(f"  {r['scenario']:<10} board {r['board_cpu']:.4f}{janus}")
    print(f"  the relay (incl. packetizing)        {relay:.4f} core")
    print(f"  first WHEP viewer (incl. packetizing) {first_whep:.4f} core")
    print(f"  each further WHEP viewer             {further_whep:.4f} core")
    print(f"  relay+{n} / relay+1 board CPU        {figures['relay_n_over_relay_1']:.2f}x")
    print(f"  whep+{n} / relay+{n} board CPU         {figures['whep_n_over_relay_n']:.2f}x")
    print(json.dumps({"summary": figures}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=10.0, help="seconds per scenario")
    parser.add_argument("--viewers", type=int, default=20)
    parser.add_argument("--joins", type=int, default=0,
                        help="measure N joins' first picture through Janus instead")
    args = parser.parse_args()
    if os.environ.get(NETNS_ENV) != "1":
        if os.geteuid() != 0:
            raise SystemExit("bench/relay.py needs root (it creates a network namespace)")
        raise SystemExit(rerun_in_netns())
    prepare_namespace()
    WINDOW[0] = args.window
    if args.joins:
        figures = asyncio.run(joins(args))
        labels = list(figures)
        on, off = figures[labels[0]], figures[labels[1]]
        print(f"watch -> first picture through Janus, {args.joins} joins each:")
        for label, f in figures.items():
            print(f"  {label:<30} p50 {f['p50_ms']:>5} ms  p95 {f['p95_ms']:>5} ms  "
                  f"(DTLS up p50 {f['connected_p50_ms']} ms; PLIs reaching the camera: "
                  f"{f['keyframe_requests']})")
        print(f"  p50 without RTCP / with: {off['p50_ms'] / max(1, on['p50_ms']):.1f}x")
        return
    results = asyncio.run(run(args))
    summary(results, args.viewers)


if __name__ == "__main__":
    main()
