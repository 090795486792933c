"""HLS clients and an nginx caching proxy for the tests and ``bench/hls.py``.

:class:`LlHlsClient` behaves like an LL-HLS player at the live edge: a blocking reload for the
part after the newest it has, then that part, and so on. :class:`PlainHlsClient` reloads the
playlist every half target duration and fetches new complete segments, like an older player.
Both record the live-edge latency with the capture clock: the wall clock when the playlist
arrives minus the newest part's (or segment's) capture time, from ``EXT-X-PROGRAM-DATE-TIME``
plus the durations of the parts before it.

:func:`running_nginx` starts Debian's nginx with ``docs/nginx-hls.conf`` (the shipped recipe,
its example board address, port, cache path and token replaced) in a private prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
NGINX_RECIPE = REPO / "docs" / "nginx-hls.conf"
_PDT = re.compile(r"^#EXT-X-PROGRAM-DATE-TIME:(.+)$")
_PART = re.compile(r'^#EXT-X-PART:DURATION=([0-9.]+),URI="([^"]+)"')
_EXTINF = re.compile(r"^#EXTINF:([0-9.]+),")


@dataclass
class Edge:
    """What a playlist says about its live edge."""

    msn: int  # the newest segment (open or complete)
    part: int  # its newest part's index, -1 if it lists none
    newest_part_uri: str | None
    newest_part_capture_s: float | None  # capture time of the newest part's first frame
    newest_segment_uri: str | None
    newest_segment_capture_s: float | None  # capture time of the newest complete segment


def read_edge(text: str) -> Edge:
    """The live edge of a playlist the appliance served (a quick scan, not a validation)."""
    media_sequence = 0
    segment_index = 0
    segment_start: float | None = None
    offset = 0.0
    part_index = -1
    newest_part: tuple[str, float] | None = None
    newest_segment: tuple[str, float] | None = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#EXT-X-MEDIA-SEQUENCE:"):
            media_sequence = int(line.split(":", 1)[1])
        elif match := _PDT.match(line):
            segment_start = dt.datetime.fromisoformat(
                match.group(1).replace("Z", "+00:00")).timestamp()
            offset, part_index = 0.0, -1
        elif match := _PART.match(line):
            part_index += 1
            if segment_start is not None:
                newest_part = (match.group(2), segment_start + offset)
            offset += float(match.group(1))
        elif _EXTINF.match(line):
            if segment_start is not None:
                newest_segment = (lines[i + 1], segment_start)
            segment_index += 1
            part_index = -1
    msn = media_sequence + segment_index if part_index >= 0 else media_sequence + segment_index - 1
    return Edge(msn, part_index, newest_part[0] if newest_part else None,
                newest_part[1] if newest_part else None,
                newest_segment[0] if newest_segment else None,
                newest_segment[1] if newest_segment else None)


@dataclass
class ClientStats:
    """What one client did."""

    requests: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    latencies_s: list[float] = field(default_factory=list)


class LlHlsClient:
    """An LL-HLS player at the live edge (blocking reloads + the newest part each time)."""

    def __init__(self, session: aiohttp.ClientSession, base: str,
                 headers: dict[str, str] | None = None) -> None:
        self.session = session
        self.base = base.rstrip("/") + "/hls/"
        self.headers = headers or {}
        self.stats = ClientStats()

    async def _get(self, url: str) -> bytes | None:
        self.stats.requests += 1
        try:
            async with self.session.get(url, headers=self.headers) as response:
                body = await response.read()
                if response.status != 200:
                    self._error(f"{response.status} {url.rsplit('/', 1)[-1][:40]}")
                    await asyncio.sleep(0.2)  # a player backs off before retrying
                    return None
                self.stats.bytes += len(body)
                return body
        except (TimeoutError, aiohttp.ClientError) as exc:
            self._error(type(exc).__name__)
            await asyncio.sleep(0.2)
            return None

    def _error(self, kind: str) -> None:
        self.stats.errors += 1
        self.stats.error_kinds[kind] = self.stats.error_kinds.get(kind, 0) + 1

    async def run(self, seconds: float) -> ClientStats:
        """Play for ``seconds``."""
        deadline = time.monotonic() + seconds
        body = await self._get(self.base + "index.m3u8")
        edge = read_edge(body.decode()) if body else None
        fetched: str | None = None
        while time.monotonic() < deadline:
            if edge is None:
                body = await self._get(self.base + "index.m3u8")
                edge = read_edge(body.decode()) if body else None
                continue
            query = f"index.m3u8?_HLS_msn={edge.msn}&_HLS_part={edge.part + 1}"
            body = await self._get(self.base + query)
            if body is None:
                edge = None
                continue
            edge = read_edge(body.decode())
            if edge.newest_part_capture_s is not None:
                self.stats.latencies_s.append(time.time() - edge.newest_part_capture_s)
            if edge.newest_part_uri and edge.newest_part_uri != fetched:
                await self._get(self.base + edge.newest_part_uri)
                fetched = edge.newest_part_uri
        return self.stats


class PlainHlsClient:
    """An older player: reloads the playlist every half target duration (RFC 8216 §6.3.4 asks
    for at least the target duration after a change) and fetches each new complete segment."""

    def __init__(self, session: aiohttp.ClientSession, base: str, *, reload_s: float = 1.0,
                 headers: dict[str, str] | None = None) -> None:
        self.session = session
        self.base = base.rstrip("/") + "/hls/"
        self.reload_s = reload_s
        self.headers = headers or {}
        self.stats = ClientStats()

    async def run(self, seconds: float) -> ClientStats:
        """Play for ``seconds``."""
        deadline = time.monotonic() + seconds
        fetched: str | None = None
        while time.monotonic() < deadline:
            self.stats.requests += 1
            async with self.session.get(self.base + "index.m3u8", headers=self.headers) as r:
                text = await r.text()
            edge = read_edge(text)
            if edge.newest_segment_capture_s is not None:
                self.stats.latencies_s.append(time.time() - edge.newest_segment_capture_s)
            if edge.newest_segment_uri and edge.newest_segment_uri != fetched:
                self.stats.requests += 1
                async with self.session.get(self.base + edge.newest_segment_uri,
                                            headers=self.headers) as r:
                    self.stats.bytes += len(await r.read())
                fetched = edge.newest_segment_uri
            await asyncio.sleep(self.reload_s)
        return self.stats


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Nginx:
    """A running nginx and where it listens."""

    port: int
    proc: subprocess.Popen[bytes]
    prefix: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text()[-3000:] if path.exists() else ""


def nginx_config(board_port: int, listen_port: int, prefix: Path, token: str) -> str:
    """The shipped recipe with this run's board, port, cache and token, in a whole nginx.conf."""
    recipe = NGINX_RECIPE.read_text()
    recipe = recipe.replace("192.168.1.20:8080", f"127.0.0.1:{board_port}")
    recipe = recipe.replace("listen 80;", f"listen 127.0.0.1:{listen_port};")
    recipe = recipe.replace("/var/cache/nginx/ruseon", str(prefix / "cache"))
    recipe = recipe.replace("/var/log/nginx/ruseon-hls.log", str(prefix / "access.log"))
    if token:
        recipe = recipe.replace("CHANGE-ME", token)
    else:  # no token on the board: the recipe's auth check goes, as its comment says
        recipe = re.sub(r"\n\s*if \(\$ruseon_denied\) \{.*?\n\s*\}", "", recipe, flags=re.S)
    return f"""worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
{recipe}
}}
"""


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Return once something accepts connections on 127.0.0.1:``port`` (nginx is up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"nginx did not start listening on {port}")
        time.sleep(0.05)


@contextlib.contextmanager
def running_nginx(nginx: str, board_port: int, listen_port: int, prefix: Path,
                  token: str = "") -> Iterator[Nginx]:
    """Start nginx (as the current user; root keeps its workers as root here so the private
    cache directory needs no chown) and stop it on exit."""
    prefix.mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    text = nginx_config(board_port, listen_port, prefix, token)
    conf.write_text(("user root;\n" if os.geteuid() == 0 else "") + text)
    subprocess.run([nginx, "-t", "-q", "-p", str(prefix), "-c", str(conf)], check=True,
                   capture_output=True)
    proc = subprocess.Popen([nginx, "-p", str(prefix), "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_listening(listen_port, proc)
        yield Nginx(listen_port, proc, prefix)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
