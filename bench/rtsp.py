"""The board's CPU per RTSP client against per WebRTC (WHEP) viewer.

The board is a real ``ruseon serve`` process replaying the cached 720p30 2 Mbit/s recording
(the file source: no encoder in the figures) with ``[rtsp] enable``. RTSP clients are raw
RTSP/1.0 clients in this process (DESCRIBE, SETUP, PLAY; then they count and drop what
arrives, no decoding), over TCP interleaved or UDP; WHEP viewers are bench/fanout.py's
CheapViewer aiortc peers. The board's CPU is read from ``/proc/<pid>/stat`` (every thread):

    idle             nobody watching (replaying the file, the event loop)
    rtsp-tcp+1 / +N  RTSP clients, RTP interleaved on the RTSP connection
    rtsp-udp+1 / +N  RTSP clients, RTP over UDP
    whep+1 / +N      WebRTC viewers (SRTP over the one UDP port)

An RTSP client costs the header, the framing and a TCP write (or a plain ``sendmsg``) per
packet, no SRTP: it should cost no more than a WHEP viewer.

It runs in a private network namespace it creates (``unshare --net``, root) with only
loopback up; nothing leaves the machine.

    .venv/bin/python bench/rtsp.py                  # window 10 s per scenario, N = 20
    .venv/bin/python bench/rtsp.py --window 20 --clients 10
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

NETNS_ENV = "RUSEON_BENCH_RTSP_NETNS"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Board:
    """``ruseon serve`` with the file source and the RTSP server."""

    def __init__(self, stream: Path, state: Path) -> None:
        from tests.tooling import free_port

        self.http = free_port()
        self.rtsp = free_port()
        config = state / "rtsp.toml"
        config.write_text(
            f'[camera]\nsource = "file:{stream}"\nframerate = 30\nkeyframe_interval = 60\n'
            f'[webrtc]\nmax_viewers = 100\n'
            f'[rtsp]\nenable = true\nlisten = "127.0.0.1:{self.rtsp}"\nmax_clients = 100\n')
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

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


class RtspClient:
    """Plays ``rtsp://127.0.0.1:PORT/`` and counts the RTP bytes it receives."""

    def __init__(self, port: int, transport: str) -> None:
        self.port = port
        self.transport = transport
        self.bytes = 0
        self.packets = 0
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._udp: socket.socket | None = None

    async def _request(self, reader: asyncio.StreamReader, text: str) -> str:
        assert self._writer is not None
        self._writer.write(text.encode())
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        length = 0
        for line in head.split("\r\n"):
            if line.lower().startswith("content-length:"):
                length = int(line.split(":", 1)[1])
        if length:
            await reader.readexactly(length)
        if not head.startswith("RTSP/1.0 200"):
            raise RuntimeError(head.split("\r\n", 1)[0])
        return head

    async def start(self) -> None:
        reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        url = f"rtsp://127.0.0.1:{self.port}/"
        await self._request(reader, f"DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\n\r\n")
        if self.transport == "tcp":
            transport = "RTP/AVP/TCP;unicast;interleaved=0-1"
        else:
            self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._udp.bind(("127.0.0.1", 0))
            self._udp.setblocking(False)
            self._udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
            port = self._udp.getsockname()[1]
            transport = f"RTP/AVP;unicast;client_port={port}-{port + 1}"
            asyncio.get_running_loop().add_reader(self._udp.fileno(), self._on_udp)
        head = await self._request(reader, f"SETUP {url}trackID=0 RTSP/1.0\r\nCSeq: 2\r\n"
                                           f"Transport: {transport}\r\n\r\n")
        session = next(line.split(":", 1)[1].split(";")[0].strip()
                       for line in head.split("\r\n") if line.lower().startswith("session:"))
        await self._request(reader, f"PLAY {url} RTSP/1.0\r\nCSeq: 3\r\nSession: {session}"
                                    "\r\n\r\n")
        self._task = asyncio.get_running_loop().create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            head = await reader.readexactly(4)
            if head[0] != 0x24:
                raise RuntimeError("not interleaved data")
            length = int.from_bytes(head[2:], "big")
            await reader.readexactly(length)
            if head[1] == 0:
                self.packets += 1
                self.bytes += length

    def _on_udp(self) -> None:
        assert self._udp is not None
        while True:
            try:
                data = self._udp.recv(4096)
            except BlockingIOError:
                return
            self.packets += 1
            self.bytes += len(data)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._udp is not None:
            asyncio.get_running_loop().remove_reader(self._udp.fileno())
            self._udp.close()
        if self._writer is not None:
            self._writer.close()


async def wait_receiving(clients: list[Any], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while any(c.packets == 0 for c in clients):
        if time.monotonic() > deadline:
            raise RuntimeError("clients receive nothing")
        await asyncio.sleep(0.2)


async def window(board: Board, seconds: float, clients: list[Any]) -> dict[str, Any]:
    """Board CPU over ``seconds``, after 2 s of settling."""
    await asyncio.sleep(2.0)
    packets0 = sum(c.packets for c in clients)
    b0, t0 = cpu_seconds(board.proc.pid), time.monotonic()
    await asyncio.sleep(seconds)
    b1, t1 = cpu_seconds(board.proc.pid), time.monotonic()
    wall = t1 - t0
    return {"board_cpu": round((b1 - b0) / wall, 4),
            "client_packets_per_s": round((sum(c.packets for c in clients) - packets0) / wall)}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from aiohttp import ClientSession
    from fanout import CheapViewer, recorded_stream  # (pins aioice to 127.0.0.1)

    stream = recorded_stream()
    results: list[dict[str, Any]] = []

    def report(name: str, figures: dict[str, Any]) -> None:
        row = {"scenario": name, **figures}
        results.append(row)
        print(json.dumps(row), flush=True)

    with tempfile.TemporaryDirectory(prefix="ruseon-bench-rtsp-") as tmp:
        board = Board(stream, Path(tmp))
        try:
            report("idle", await window(board, args.window, []))
            for transport in ("tcp", "udp"):
                for count in (1, args.clients):
                    clients = [RtspClient(board.rtsp, transport) for _ in range(count)]
                    for client in clients:
                        await client.start()
                    await wait_receiving(clients)
                    report(f"rtsp-{transport}+{count}", await window(board, args.window,
                                                                      clients))
                    for client in clients:
                        await client.close()
                    await asyncio.sleep(1.0)
            for count in (1, args.clients):
                http = ClientSession()
                viewers = [CheapViewer() for _ in range(count)]
                # Two pending sessions per address at most: join two at a time.
                for i in range(0, count, 2):
                    batch = viewers[i:i + 2]
                    await asyncio.gather(*(v.connect(http, board.url) for v in batch))
                    await wait_receiving(batch)
                report(f"whep+{count}", await window(board, args.window, viewers))
                for v in viewers:
                    await v.close(http, board.url)
                await http.close()
                await asyncio.sleep(1.0)
        finally:
            board.close()
    return results


def summary(results: list[dict[str, Any]], n: int, window_s: float) -> None:
    """Per-consumer costs from differences (the first consumer also pays the packetizing)."""
    cpu = {r["scenario"]: r["board_cpu"] for r in results}
    figures: dict[str, float] = {}
    for kind in ("rtsp-tcp", "rtsp-udp", "whep"):
        figures[f"first_{kind}_core"] = round(cpu[f"{kind}+1"] - cpu["idle"], 5)
        figures[f"further_{kind}_core"] = round(
            (cpu[f"{kind}+{n}"] - cpu[f"{kind}+1"]) / max(1, n - 1), 5)
    whep = figures["further_whep_core"]
    for kind in ("rtsp-tcp", "rtsp-udp"):
        figures[f"{kind}_over_whep"] = round(figures[f"further_{kind}_core"] / whep, 3) \
            if whep > 0 else float("nan")
    print()
    print(f"board CPU (fraction of one core; /proc ticks of 10 ms, so +-{0.01 / window_s:.4f}):")
    for r in results:
        print(f"  {r['scenario']:<14} board {r['board_cpu']:.4f}   "
              f"{r['client_packets_per_s']} packets/s received")
    for kind in ("rtsp-tcp", "rtsp-udp", "whep"):
        print(f"  each further {kind:<9} client {figures[f'further_{kind}_core']:.5f} core")
    for kind in ("rtsp-tcp", "rtsp-udp"):
        print(f"  {kind} client / WHEP viewer     {figures[f'{kind}_over_whep']:.2f}x")
    print(json.dumps({"summary": figures}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=10.0, help="seconds per scenario")
    parser.add_argument("--clients", type=int, default=20)
    args = parser.parse_args()
    if os.environ.get(NETNS_ENV) != "1":
        if os.geteuid() != 0:
            raise SystemExit("bench/rtsp.py needs root (it creates a network namespace)")
        env = {**os.environ, NETNS_ENV: "1"}
        raise SystemExit(subprocess.call(
            ["unshare", "--net", "--fork", "--", sys.executable, *sys.argv], env=env))
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    results = asyncio.run(run(args))
    summary(results, args.clients, args.window)


if __name__ == "__main__":
    main()
