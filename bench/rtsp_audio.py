"""The board's CPU per RTSP client with the camera's sound against without it.

The board is a real ``ruseon serve`` process with a synthetic camera (320x240, 30 fps, its
test tone: ``audio = "auto"``), ``[rtsp] enable`` and no HLS or recording (which would keep
the AAC encoder running whatever the RTSP clients do). N raw RTSP/1.0 clients in this process
DESCRIBE, SETUP the picture (``trackID=0``) and, in the "both" rounds, the sound
(``trackID=1``, AAC) in the same session, PLAY, then count and drop what arrives (no
decoding), over TCP interleaved or UDP. The board encodes AAC only while someone reads it
(once per camera, however many): the first client of the sound starts the encoder, each
further one costs only its sending:

    video+1 / both+1   one client: the picture alone / picture and sound (+ the AAC encoder)
    video+N / both+N   N clients

    first client's sound (with the encoder) = both+1 - video+1
    each further client's sound = ((both+N - both+1) - (video+N - video+1)) / (N - 1)

Rounds repeat (video+1, both+1, video+N, both+N, ...) so a drift of the machine's load
counts for all. The board's CPU is read from ``/proc/<pid>/stat`` (every thread). It runs in
a private network namespace it creates (``unshare --net``, root) with only loopback up.

    .venv/bin/python bench/rtsp_audio.py                    # 15 s windows, N = 10, TCP
    .venv/bin/python bench/rtsp_audio.py --transport udp --clients 20
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

NETNS_ENV = "RUSEON_BENCH_RTSP_AUDIO_NETNS"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Board:
    """``ruseon serve`` with a synthetic camera and its tone, and the RTSP server."""

    def __init__(self, state: Path) -> None:
        from tests.tooling import free_port

        self.http = free_port()
        self.rtsp = free_port()
        config = state / "rtsp.toml"
        config.write_text(
            '[camera]\nsource = "synthetic"\nwidth = 320\nheight = 240\nframerate = 30\n'
            'bitrate = 300000\nkeyframe_interval = 60\naudio = "auto"\nmotion = false\n'
            # No HLS (nor recording): they would keep the AAC encoder running on their own.
            '[hls]\nenable = false\n'
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
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("the board did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


class Client:
    """Plays ``rtsp://127.0.0.1:PORT/cam`` (the picture, and the sound with ``audio``)."""

    def __init__(self, port: int, transport: str, audio: bool) -> None:
        self.port = port
        self.transport = transport
        self.audio = audio
        self.packets = {"video": 0, "audio": 0}
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._udp: list[socket.socket] = []
        self._cseq = 0

    async def _request(self, reader: asyncio.StreamReader, line: str, *headers: str) -> str:
        assert self._writer is not None
        self._cseq += 1
        text = "\r\n".join([line, f"CSeq: {self._cseq}", *headers]) + "\r\n\r\n"
        self._writer.write(text.encode())
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        length = 0
        for row in head.split("\r\n"):
            if row.lower().startswith("content-length:"):
                length = int(row.split(":", 1)[1])
        if length:
            await reader.readexactly(length)
        if not head.startswith("RTSP/1.0 200"):
            raise RuntimeError(head.split("\r\n", 1)[0])
        return head

    def _transport(self, track: str, channel: int) -> str:
        if self.transport == "tcp":
            return f"RTP/AVP/TCP;unicast;interleaved={channel}-{channel + 1}"
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
        self._udp.append(sock)
        asyncio.get_running_loop().add_reader(sock.fileno(), self._on_udp, sock, track)
        port = sock.getsockname()[1]
        return f"RTP/AVP;unicast;client_port={port}-{port + 1}"

    async def start(self) -> None:
        reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        url = f"rtsp://127.0.0.1:{self.port}/cam"
        await self._request(reader, f"DESCRIBE {url} RTSP/1.0")
        head = await self._request(reader, f"SETUP {url}/trackID=0 RTSP/1.0",
                                   f"Transport: {self._transport('video', 0)}")
        session = next(row.split(":", 1)[1].split(";")[0].strip()
                       for row in head.split("\r\n") if row.lower().startswith("session:"))
        if self.audio:
            await self._request(reader, f"SETUP {url}/trackID=1 RTSP/1.0",
                                f"Transport: {self._transport('audio', 2)}",
                                f"Session: {session}")
        await self._request(reader, f"PLAY {url} RTSP/1.0", f"Session: {session}")
        self._task = asyncio.get_running_loop().create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            head = await reader.readexactly(4)
            if head[0] != 0x24:
                raise RuntimeError("not interleaved data")
            await reader.readexactly(int.from_bytes(head[2:], "big"))
            if head[1] in (0, 2):
                self.packets["video" if head[1] == 0 else "audio"] += 1

    def _on_udp(self, sock: socket.socket, track: str) -> None:
        while True:
            try:
                sock.recv(4096)
            except BlockingIOError:
                return
            self.packets[track] += 1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for sock in self._udp:
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        if self._writer is not None:
            self._writer.close()


async def window(board: Board, seconds: float, clients: list[Client]) -> dict[str, Any]:
    """Board CPU over ``seconds``, after 2 s of settling."""
    await asyncio.sleep(2.0)
    video0 = sum(c.packets["video"] for c in clients)
    audio0 = sum(c.packets["audio"] for c in clients)
    b0, t0 = cpu_seconds(board.proc.pid), time.monotonic()
    await asyncio.sleep(seconds)
    b1, t1 = cpu_seconds(board.proc.pid), time.monotonic()
    wall = t1 - t0
    return {"board_cpu": round((b1 - b0) / wall, 4),
            "video_packets_per_s": round((sum(c.packets["video"] for c in clients)
                                          - video0) / wall),
            "audio_packets_per_s": round((sum(c.packets["audio"] for c in clients)
                                          - audio0) / wall)}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ruseon-bench-rtsp-audio-") as tmp:
        board = Board(Path(tmp))
        try:
            await asyncio.sleep(3.0)  # the camera and its sound are up
            for round_ in range(args.rounds):
                for count, audio in ((1, False), (1, True), (args.clients, False),
                                     (args.clients, True)):
                    clients = [Client(board.rtsp, args.transport, audio) for _ in range(count)]
                    for client in clients:
                        await client.start()
                    row = {"scenario": f"{'both' if audio else 'video'}+{count}",
                           "round": round_, **await window(board, args.window, clients)}
                    results.append(row)
                    print(json.dumps(row), flush=True)
                    for client in clients:
                        await client.close()
                    await asyncio.sleep(1.0)
        finally:
            board.close()
    return results


def summary(results: list[dict[str, Any]], n: int, window_s: float) -> None:
    def mean(name: str) -> float:
        rows = [r["board_cpu"] for r in results if r["scenario"] == name]
        return sum(rows) / len(rows)

    first = mean("both+1") - mean("video+1")
    further = ((mean(f"both+{n}") - mean("both+1"))
               - (mean(f"video+{n}") - mean("video+1"))) / max(1, n - 1)
    print()
    print(f"board CPU (fraction of one core; /proc ticks of 10 ms, so +-{0.01 / window_s:.4f}"
          " a window):")
    for name in ("video+1", "both+1", f"video+{n}", f"both+{n}"):
        rows = [r["board_cpu"] for r in results if r["scenario"] == name]
        print(f"  {name:<10} {', '.join(f'{v:.4f}' for v in rows)}")
    print(f"  the first client's sound (with the AAC encoder): {first:.4f} core")
    print(f"  each further client's sound:                     {further:.5f} core")
    print(json.dumps({"summary": {"clients": n, "first_audio_client_core": round(first, 5),
                                  "further_audio_client_core": round(further, 5)}}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=15.0, help="seconds per round")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--transport", choices=("tcp", "udp"), default="tcp")
    args = parser.parse_args()
    if os.environ.get(NETNS_ENV) != "1":
        if os.geteuid() != 0:
            raise SystemExit("bench/rtsp_audio.py needs root (it creates a network namespace)")
        env = {**os.environ, NETNS_ENV: "1"}
        raise SystemExit(subprocess.call(
            ["unshare", "--net", "--fork", "--", sys.executable, *sys.argv], env=env))
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    results = asyncio.run(run(args))
    summary(results, args.clients, args.window)


if __name__ == "__main__":
    main()
