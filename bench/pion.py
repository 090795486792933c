"""The appliance side by side with the seed's reference design in Go/Pion, in the same run.

The reference is ``../shared/anchors/pion-whep`` (its README): one Pion ``webrtc.API``, one
certificate, one UDP socket (``NewICEUDPMux``) and one shared ``TrackLocalStaticSample`` fed from
an Annex B file in real time. The appliance is the real ``ruseon serve --source file:`` (the
whole service: device page, HLS, /metrics, default configuration but for more viewer places,
``[webrtc] max_viewers = max_viewers_per_address = 200``). Both serve the same recording, the
fan-out bench's (``bench/fanout.py``: 720p30, 2 Mbit/s, Constrained Baseline, an IDR every 2 s),
to the same aiortc clients, on 127.0.0.1 only (HTTP, the one UDP port, the advertised address;
no STUN). The servers run one at a time, alternating in each round (``--rounds``, default 3;
the order rotates every round), each started afresh every round. Per server and round:

1. **Fresh RSS**: the server process's VmRSS (``/proc/PID/status``; the appliance's main
   process) 8 s after it is ready, no viewer. Beside it the idle CPU (replaying the file).
2. **Concurrent joins** (``--joins 10 30``): a client process makes N real aiortc peer
   connections (recvonly video, PyAV's H.264 decoder), creates every offer first (ICE gathering
   done before the clock starts), then POSTs them all at once. Per viewer, on the client's clock
   from just before its POST: the 201, ``connectionState == "connected"`` (ICE + DTLS), the
   first RTP packet carrying media, the first decoded frame (``track.recv()``: a whole IDR
   decoded), and the decode errors aiortc's decoder logged for it before that frame. A stage not
   reached within ``--join-timeout`` (10 s) counts as missing. After its first frame a viewer
   drops its RTP undecoded (the client's CPU goes to the joins still under way). Beside them,
   the server's CPU over the phase (POSTs to the last DELETE, net of idle) per viewer: a slow
   join on a server that spent little CPU was starved by the machine, not busy.
3. **Server CPU per offer**, the answer alone: ``--offers`` (30) offers from aiortc peers that
   never connect, sequential, then all at once: POST, take the 201, DELETE the session. CPU is
   the server process's, every thread (see below), from just before the first POST to 1 s
   after the last DELETE (what a session's teardown leaves to do), minus the process's idle
   rate measured over 3 s just before, times that span; divided by the offers answered. Plus
   the client's POST -> 201 for the concurrent ones.
4. **Fan-out CPU per packet per viewer** (``--viewers 20``): cheap aiortc viewers in 2 worker
   processes (``bench/fanout.py``'s ``CheapViewer``: they count RTP and drop it); once all
   receive video and 2 s have passed, the server's CPU over ``--window`` s (10) minus the idle
   rate (measured before they joined) times the window, divided by the RTP packets the viewers
   received in that window: server µs per packet per viewer. The servers cut the stream into
   packets of different sizes (Pion's are smaller: more of them), so beside it the same CPU per
   viewer as a share of a core. And the server's RSS then.

The process's CPU: the sum of its threads' run time (``/proc/PID/task/*/schedstat``, in ns)
when the same threads were there at both readings, else utime + stime from ``/proc/PID/stat``
(every thread, ended ones too, but in 10 ms clock ticks: too coarse for 30 offers); the JSON
says which (``cpu_from``).

Rounds pool as the median of the per-round figures (RSS, CPU), or, for latencies, as the p50 /
p95 of every viewer of every round. The table shows each figure for Pion and for each appliance
variant with the ratio appliance / Pion: below 1, the appliance spends less (or is sooner).

    .venv/bin/python bench/pion.py --quick          # 1 round, joins 10, viewers 20, window 6 s
    .venv/bin/python bench/pion.py                  # 3 rounds, joins 10 30, viewers 20
    .venv/bin/python bench/pion.py --appliance default hold-off --rounds 1
    .venv/bin/python bench/pion.py --viewers 20 30 --aes-mask --json /tmp/pion.json

``--appliance`` names appliance variants, each one more server in every round: ``default`` is
``ruseon serve`` as it is; ``hold-off`` has the engine's offer-burst hold disabled
(``engine/offer_burst.py``: the UDP mux is never paused and the collector never held while
offers are answered); ``hold-all`` holds as the engine did before the hold became selective
(the mux reads nothing at all during the hold, connected viewers' datagrams neither);
``eager`` has no lazy sessions (``engine/answer_template.py``: every
offer's aiortc objects are built when it is answered, not on the viewer's first STUN check).
Every variant, ``default`` too, runs through the same small wrapper
(``pion.py serve-appliance VARIANT serve ...``: the patch, then ``ruseon_appliance.cli.main``),
so the A/B differs by the patch alone; :data:`VARIANTS` maps a name to its patch.

``--aes-mask`` starts both servers with ``OPENSSL_ia32cap=~0x200000200000000`` (OpenSSL without
AES-NI and PCLMUL, the Pi 4 stand-in of ``bench/fanout.py``). Go's crypto ignores it: Pion's
figures are then *not* masked and the ratio compares a masked appliance with an unmasked Pion.

Reading it: nothing here asserts a time; on a shared machine every figure is noisy (compare the
rounds in ``--json``). By design Pion gives a new viewer the live P-frames until the next IDR
(up to a GOP, 2 s; they fail to decode) where the appliance sends the GOP so far: the join
figures show that difference as much as speed. The JSON document (summary, ratios, settings)
is printed at the end; ``--json PATH`` also writes it with every round's raw figures (every
viewer's times).

Pion is ``.cache/pion-whep/pion-whep``, built by the anchor's ``build.sh`` when missing or older
than its sources (``apt-get install golang-go golang-github-pion-webrtc.v3-dev`` first, as root,
when Go or Pion's Debian sources are missing), or ``--pion-bin PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
ANCHOR = ROOT.parent / "shared" / "anchors" / "pion-whep"
PION_BIN = ROOT / ".cache" / "pion-whep" / "pion-whep"
PION_GO_SOURCES = Path("/usr/share/gocode/src/github.com/pion/webrtc")
PION_PACKAGES = ("golang-go", "golang-github-pion-webrtc.v3-dev")
# As bench/fanout.py's AES_MASK (not imported: the server wrapper imports nothing of the bench).
AES_MASK = "~0x200000200000000"
CLK_TCK = os.sysconf("SC_CLK_TCK")
FRESH_S = 8.0          # fresh RSS: this long after the server is ready
IDLE_S = 3.0           # idle CPU rate: measured over this long, no viewer
SETTLE_S = 2.0         # fan-out: after every viewer receives video, before the window
OFFER_TAIL_S = 1.0     # CPU per offer: counted on this long after the last DELETE
READY_TIMEOUT_S = 90.0
APPLIANCE_CONFIG = "[webrtc]\nmax_viewers = 200\nmax_viewers_per_address = 200\n"
STAGES = ("answer_ms", "connected_ms", "first_rtp_ms", "first_frame_ms")
STAGE_NAMES = {"answer_ms": "POST->201", "connected_ms": "->connected",
               "first_rtp_ms": "->first RTP", "first_frame_ms": "->first frame"}


# --- appliance variants ----------------------------------------------------------------------


def _hold_off() -> None:
    """No offer-burst hold: the UDP mux keeps reading and the collector keeps running while
    offers are answered (``OfferBurst.begin``/``end`` do nothing)."""
    from ruseon_appliance.engine import offer_burst

    offer_burst.OfferBurst.begin = lambda self: None  # type: ignore[method-assign]
    offer_burst.OfferBurst.end = lambda self: None  # type: ignore[method-assign]


def _no_catch_up() -> None:
    """No GOP catch-up burst for a joining viewer: it starts at the next IDR, as Pion's
    ``--keyframe-on-join`` would (tells what the burst costs the joins' other stages, on the
    server and in the client that receives and decodes it)."""
    from ruseon_appliance.engine import engine

    engine.GOP_CATCH_UP_MAX_S = 0.0  # before app.py imports it


def _dtls_per_connection() -> None:
    """A new OpenSSL context per DTLS connection, as aiortc builds them (the engine shares
    one; it used to build them ahead, in idle time, which cost the same CPU)."""
    from ruseon_appliance.engine import aiortc_internals

    aiortc_internals.share_ssl_contexts = lambda certificate: (lambda: 0)  # type: ignore[assignment]


def _hold_all() -> None:
    """The hold as it was before the selective one: while offers are answered and sessions
    built the mux reads nothing at all (connected viewers' RTCP and consent checks wait in the
    socket's buffer too), instead of keeping only what viewers not connected yet send."""
    from ruseon_appliance.engine.udp_mux import UdpMux

    def pause(self: UdpMux) -> None:
        if self._reading_paused or self._loop is None:
            return
        self._reading_paused = True
        for sock in self._sockets.values():
            self._loop.remove_reader(sock.fileno())

    def resume(self: UdpMux) -> None:
        if not self._reading_paused or self._loop is None:
            return
        self._add_readers()

    UdpMux.pause_reading = pause  # type: ignore[method-assign]
    UdpMux.resume_reading = resume  # type: ignore[method-assign]


def _eager() -> None:
    """No lazy sessions: every offer is answered by aiortc, its objects built at once (the
    engine answers offers of a known shape from a template and builds them on the viewer's
    first STUN check)."""
    from ruseon_appliance.engine import engine

    engine.LAZY_SESSIONS = False


# Appliance variants: name -> the patch applied in the server process before ``serve`` starts
# (None: none). Add one here to A/B another engine internal in the same run.
VARIANTS: dict[str, Callable[[], None] | None] = {
    "default": None,
    "hold-off": _hold_off,
    "hold-all": _hold_all,
    "no-catch-up": _no_catch_up,
    "dtls-per-connection": _dtls_per_connection,
    "eager": _eager,
}


def serve_appliance(variant: str, argv: list[str]) -> int:
    """The server wrapper: ``variant``'s patch, then the ``ruseon`` command with ``argv``."""
    sys.path[0] = str(ROOT)  # the appliance's modules, not bench/'s (capture.py, audio.py, ...)
    patch = VARIANTS[variant]
    if patch is not None:
        patch()
    from ruseon_appliance.cli import main

    return main(argv)


# --- the process under measurement -----------------------------------------------------------


def stat_cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid``, exited ones too (``/proc/PID/stat``), in
    seconds (clock ticks: 10 ms steps)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


@dataclass(frozen=True)
class CpuReading:
    """A process's CPU time at one moment, two ways: ``/proc/PID/stat`` (every thread, exited
    ones too, in clock ticks) and the sum of its live threads' run time (``schedstat``, ns)."""

    wall: float
    stat_s: float
    threads: frozenset[int]
    threads_s: float

    @classmethod
    def of(cls, pid: int) -> CpuReading:
        tids, ns = [], 0
        for entry in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"{entry.path}/schedstat") as fh:
                    ns += int(fh.read().split()[0])
                tids.append(int(entry.name))
        return cls(time.monotonic(), stat_cpu_seconds(pid), frozenset(tids), ns / 1e9)


def cpu_between(a: CpuReading, b: CpuReading) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, how) from ``a`` to ``b``: the threads' run time when the same
    threads were there both times (ns precision), else ``/proc/PID/stat``'s ticks (a thread
    that ended in between is counted only there)."""
    if a.threads == b.threads:
        return b.threads_s - a.threads_s, b.wall - a.wall, "schedstat"
    return b.stat_s - a.stat_s, b.wall - a.wall, "stat"


def idle_rate(pid: int, seconds: float = IDLE_S) -> float:
    """The process's CPU seconds per second over the next ``seconds``."""
    a = CpuReading.of(pid)
    time.sleep(seconds)
    cpu, wall, _ = cpu_between(a, CpuReading.of(pid))
    return cpu / wall


def free_port(kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


class Server:
    """A server process on 127.0.0.1 (HTTP and one UDP port), its output in a log file."""

    label = ""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.http_port = free_port()
        self.rtc_port = free_port(socket.SOCK_DGRAM)
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.log = workdir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def is_ready(self) -> bool:
        return http_get(self.url + "/healthz")[0] == 200

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.command(), cwd=ROOT, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.is_ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.label} did not get ready; its log ends:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is None:
            return
        from tests.tooling import stop_process

        stop_process(self.proc)
        self.proc = None

    def status(self) -> dict[str, Any]:
        raise NotImplementedError

    def viewers(self) -> int | None:
        raise NotImplementedError


class PionServer(Server):
    label = "pion"

    def __init__(self, workdir: Path, env: dict[str, str], binary: Path, stream: Path) -> None:
        super().__init__(workdir, env)
        self.binary = binary
        self.stream = stream

    def command(self) -> list[str]:
        return [str(self.binary), "--http", f"127.0.0.1:{self.http_port}",
                "--rtc", f"127.0.0.1:{self.rtc_port}", "--source", str(self.stream)]

    def status(self) -> dict[str, Any]:
        code, body = http_get(self.url + "/api/status")
        return dict(json.loads(body)) if code == 200 else {"http_status": code}

    def viewers(self) -> int | None:
        count = self.status().get("viewers")
        return None if count is None else int(count)


class ApplianceServer(Server):
    """``ruseon serve --source file:`` through the variant wrapper (:func:`serve_appliance`)."""

    def __init__(self, workdir: Path, env: dict[str, str], variant: str, stream: Path) -> None:
        # The service refuses RUSEON_* variables it does not know.
        super().__init__(workdir, {k: v for k, v in env.items() if not k.startswith("RUSEON_")})
        self.variant = variant
        self.label = "appliance" if variant == "default" else f"appliance:{variant}"
        self.stream = stream
        self.state = workdir / "state"
        self.state.mkdir()
        self.config = workdir / "ruseon.toml"
        self.config.write_text(APPLIANCE_CONFIG)

    def command(self) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "serve-appliance", self.variant,
                "serve", "--config", str(self.config), "--source", f"file:{self.stream}",
                "--http", f"127.0.0.1:{self.http_port}", "--rtc", f"127.0.0.1:{self.rtc_port}",
                "--advertise", "127.0.0.1", "--state-dir", str(self.state),
                "--log-level", "info"]

    def is_ready(self) -> bool:
        return "ready: open" in self.log.read_text(errors="replace") and super().is_ready()

    def _status(self) -> dict[str, Any]:
        secret = (self.state / "admin-secret").read_text().strip()
        code, body = http_get(self.url + "/api/status", {"Authorization": f"Bearer {secret}"})
        return dict(json.loads(body)) if code == 200 else {"http_status": code}

    def status(self) -> dict[str, Any]:
        document = self._status()
        stats = document.get("webrtc", {}).get("stats", {})
        return {k: stats.get(k) for k in ("offers_accepted", "offers_rejected", "sessions_ended",
                                          "offer_bursts", "srtp", "receive_errors")}

    def viewers(self) -> int | None:
        count = self._status().get("viewers", {}).get("count")
        return None if count is None else int(count)


def wait_no_viewers(server: Server, timeout_s: float = 15.0) -> int | None:
    """Wait until the server has no session left; the count left when it gives up."""
    deadline = time.monotonic() + timeout_s
    while True:
        count = server.viewers()
        if count == 0 or time.monotonic() > deadline:
            return count
        time.sleep(0.25)


# --- client processes (started and driven from the bench) ------------------------------------


class Client:
    """A client role of this file in its own process: it prints ``ready`` once prepared, starts
    on ``go`` and prints one JSON line of results."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError(f"the client {args[0]} did not get ready")

    def go(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the client failed (see its traceback above)")
        return dict(json.loads(line))

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class ViewerWorkers:
    """Cheap viewers (``viewers`` role) in ``workers`` processes: ``packets()`` asks them for
    the RTP packets received so far."""

    def __init__(self, url: str, count: int, workers: int = 2) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.srtp: Counter[str] = Counter()
        shares = [count // workers + (i < count % workers) for i in range(workers)]
        try:
            for share in filter(None, shares):
                self.procs.append(subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "viewers", "--url", url,
                     "--count", str(share)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    text=True))
            for proc in self.procs:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError("a viewer worker failed (see its traceback above)")
                self.srtp.update(json.loads(line)["srtp"])
        except BaseException:
            self.close()
            raise

    def packets(self) -> int:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("count\n")
            proc.stdin.flush()
        total = 0
        for proc in self.procs:
            assert proc.stdout is not None
            total += int(json.loads(proc.stdout.readline())["packets"])
        return total

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert proc.stdin is not None
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _loopback_only() -> None:
    """aioice skips 127.0.0.1 when gathering: gather only that."""
    import aioice.ice

    aioice.ice.get_host_addresses = (  # type: ignore[assignment]
        lambda use_ipv4, use_ipv6: ["127.0.0.1"])


async def _ready_then_go() -> None:
    print("ready", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if line.strip() != "go":
        raise SystemExit(0)


@dataclass
class _Join:
    """One viewer of the concurrent-join phase, on the client's perf_counter clock."""

    pc: Any
    receiver: Any
    t0: float = 0.0
    status: int | None = None
    error: str = ""
    location: str = ""
    answer_at: float | None = None
    connected_at: float | None = None
    first_frame_at: float | None = None
    decode_errors: int | None = None
    got_frame: asyncio.Event = field(default_factory=asyncio.Event)


async def joins_client(url: str, count: int, timeout_s: float) -> None:
    """``count`` real viewers POSTing at once; one JSON line with each one's times."""
    _loopback_only()
    import logging
    import threading

    from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from aiortc.mediastreams import MediaStreamError
    from aiortc.rtcrtpreceiver import RTCRtpReceiver

    sys.path.insert(0, str(ROOT))
    from ruseon_appliance.engine.aiortc_internals import discard_received_rtp

    # aiortc's decoder threads log "failed to decode" (bench/join.py counts them the same way);
    # by thread, so each viewer's are its own.
    errors: Counter[int | None] = Counter()

    class DecodeErrors(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "failed to decode" in record.getMessage():
                errors[record.thread] += 1

    logging.getLogger("aiortc.rtcrtpreceiver").addHandler(DecodeErrors(logging.WARNING))
    first_media: dict[int, float] = {}  # id(receiver) -> its first RTP packet with a payload
    original = RTCRtpReceiver._handle_rtp_packet

    async def noting(self: RTCRtpReceiver, packet: Any, arrival_time_ms: int) -> None:
        if packet.payload and id(self) not in first_media:
            first_media[id(self)] = time.perf_counter()
        await original(self, packet, arrival_time_ms)

    RTCRtpReceiver._handle_rtp_packet = noting  # type: ignore[method-assign]

    def errors_of(join: _Join) -> int:
        thread = getattr(join.receiver, "_RTCRtpReceiver__decoder_thread", None)
        return errors[thread.ident] if isinstance(thread, threading.Thread) else 0

    tasks: list[asyncio.Task[None]] = []

    async def consume(join: _Join, track: Any) -> None:
        while True:
            try:
                await track.recv()
            except MediaStreamError:
                return
            if join.first_frame_at is None:
                join.first_frame_at = time.perf_counter()
                join.decode_errors = errors_of(join)
                # Decoding ends here (frames already queued are still drained).
                discard_received_rtp(join.pc, lambda size: None)
                join.got_frame.set()

    def watch(join: _Join) -> None:
        @join.pc.on("connectionstatechange")  # type: ignore[untyped-decorator,misc]
        def on_state() -> None:
            if join.pc.connectionState == "connected" and join.connected_at is None:
                join.connected_at = time.perf_counter()

        @join.pc.on("track")  # type: ignore[untyped-decorator,misc]
        def on_track(track: Any) -> None:
            tasks.append(asyncio.ensure_future(consume(join, track)))

    joins: list[_Join] = []
    for _ in range(count):
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        join = _Join(pc, pc.addTransceiver("video", direction="recvonly").receiver)
        watch(join)
        await pc.setLocalDescription(await pc.createOffer())  # gathers: before the clock
        joins.append(join)
    await _ready_then_go()

    async def one(http: ClientSession, join: _Join) -> None:
        join.t0 = time.perf_counter()
        try:
            async with http.post(url + "/whep", data=join.pc.localDescription.sdp,
                                 headers={"Content-Type": "application/sdp"},
                                 timeout=ClientTimeout(total=timeout_s)) as resp:
                answer = await resp.text()
                join.status = resp.status
                join.location = resp.headers.get("Location", "")
        except (ClientError, TimeoutError) as exc:
            join.error = repr(exc)
            return
        if join.status != 201:
            join.error = f"{join.status} {answer[:300]}"
            return
        join.answer_at = time.perf_counter()
        await join.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        remaining = join.t0 + timeout_s - time.perf_counter()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(join.got_frame.wait(), max(0.0, remaining))
        if join.decode_errors is None:
            join.decode_errors = errors_of(join)

    def ms(join: _Join, at: float | None) -> float | None:
        if at is None or at - join.t0 > timeout_s:
            return None
        return round((at - join.t0) * 1000, 1)

    async def leave(http: ClientSession, join: _Join) -> int | None:
        status = None
        if join.location:
            with contextlib.suppress(ClientError, TimeoutError):
                async with http.delete(url + join.location) as resp:
                    status = resp.status
        await join.pc.close()
        return status

    async with ClientSession(connector=TCPConnector(limit=0)) as http:
        await asyncio.gather(*(one(http, join) for join in joins))
        rows = [{"status": j.status, "error": j.error, "answer_ms": ms(j, j.answer_at),
                 "connected_ms": ms(j, j.connected_at),
                 "first_rtp_ms": ms(j, first_media.get(id(j.receiver))),
                 "first_frame_ms": ms(j, j.first_frame_at), "decode_errors": j.decode_errors}
                for j in joins]
        deletes = await asyncio.gather(*(leave(http, join) for join in joins))
    for task in tasks:
        task.cancel()
    print(json.dumps({"viewers": rows, "decode_errors_total": sum(errors.values()),
                      "delete_failures": sum(s is not None and s >= 300 for s in deletes)}),
          flush=True)


async def offers_client(url: str, count: int, concurrent: bool) -> None:
    """``count`` offers from peers that never connect: POST, 201, DELETE; one JSON line."""
    _loopback_only()
    from aiohttp import ClientSession, TCPConnector
    from aiortc import RTCConfiguration, RTCPeerConnection

    pcs = []
    for _ in range(count):
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        pcs.append(pc)
    await _ready_then_go()

    async def one(http: ClientSession, pc: RTCPeerConnection) -> dict[str, Any]:
        t0 = time.perf_counter()
        async with http.post(url + "/whep", data=pc.localDescription.sdp,
                             headers={"Content-Type": "application/sdp"}) as resp:
            text = await resp.text()
            status, location = resp.status, resp.headers.get("Location", "")
        row: dict[str, Any] = {"status": status,
                               "post_ms": round((time.perf_counter() - t0) * 1000, 2)}
        if status != 201:
            row["error"] = text[:300]
        elif location:
            async with http.delete(url + location) as resp:
                row["delete_status"] = resp.status
        return row

    async with ClientSession(connector=TCPConnector(limit=0)) as http:
        start = time.perf_counter()
        if concurrent:
            rows = list(await asyncio.gather(*(one(http, pc) for pc in pcs)))
        else:
            rows = [await one(http, pc) for pc in pcs]
        elapsed = time.perf_counter() - start
    print(json.dumps({"offers": rows, "elapsed_s": round(elapsed, 4)}), flush=True)
    await asyncio.gather(*(pc.close() for pc in pcs))


async def viewers_worker(url: str, count: int) -> None:
    """``count`` cheap viewers (``bench/fanout.py``); on each stdin line, print the packets
    received so far; at EOF, leave."""
    from aiohttp import ClientSession
    from fanout import CheapViewer, connect_all  # bench/fanout.py (gathers 127.0.0.1 only)

    def srtp_profile(viewer: CheapViewer) -> str:
        with contextlib.suppress(Exception):
            dtls = viewer.pc.getTransceivers()[0].receiver.transport
            return str(dtls._ssl.get_selected_srtp_profile().decode())
        return "?"

    loop = asyncio.get_running_loop()
    async with ClientSession() as http:
        viewers = await connect_all(http, url, count)
        print(json.dumps({"srtp": Counter(srtp_profile(v) for v in viewers)}), flush=True)
        while await loop.run_in_executor(None, sys.stdin.readline):
            print(json.dumps({"packets": sum(v.packets for v in viewers)}), flush=True)
        for viewer in viewers:
            with contextlib.suppress(Exception):
                await viewer.close(http, url)


# --- the phases ------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_joins(server: Server, count: int, timeout_s: float) -> dict[str, Any]:
    client = Client("joins", "--url", server.url, "--count", str(count),
                    "--join-timeout", str(timeout_s))
    try:
        idle = idle_rate(server.pid)
        before = CpuReading.of(server.pid)
        result = client.go()  # back once every viewer has its frame (or timed out) and left
        cpu, span, how = cpu_between(before, CpuReading.of(server.pid))
    finally:
        client.close()
    rows = result["viewers"]
    result.update({"cpu_s": round(cpu, 4), "span_s": round(span, 3), "cpu_from": how,
                   "idle_cpu_per_s": round(idle, 4),
                   "cpu_ms_per_viewer": round((cpu - idle * span) / count * 1000, 2),
                   "left_over_sessions": wait_no_viewers(server)})
    parts = []
    for stage in STAGES:
        values = [r[stage] for r in rows if r[stage] is not None]
        if values:
            parts.append(f"{STAGE_NAMES[stage]} {statistics.median(values):.0f}/"
                         f"{percentile(values, 0.95):.0f}")
    missing = sum(r["first_frame_ms"] is None for r in rows)
    refused = [r["error"] for r in rows if r["status"] != 201]
    print(f"  {server.label}: {count} joins, ms p50/p95: {', '.join(parts)}; "
          f"{missing} without a frame, decode errors "
          f"{sum(r['decode_errors'] or 0 for r in rows)}; server CPU "
          f"{result['cpu_ms_per_viewer']} ms per viewer over {span:.1f} s"
          + (f"; REFUSED {len(refused)}: {refused[0]}" if refused else ""), flush=True)
    return result


def run_offers(server: Server, count: int, concurrent: bool) -> dict[str, Any]:
    client = Client("offers", "--url", server.url, "--count", str(count),
                    *(["--concurrent"] if concurrent else []))
    try:
        idle = idle_rate(server.pid)
        before = CpuReading.of(server.pid)
        result = client.go()
        time.sleep(OFFER_TAIL_S)
        cpu, span, how = cpu_between(before, CpuReading.of(server.pid))
    finally:
        client.close()
    rows = result.pop("offers")
    answered = sum(r["status"] == 201 for r in rows)
    net = cpu - idle * span
    result.update({
        "answered": answered, "refused": [r.get("error") for r in rows if r["status"] != 201],
        "cpu_s": round(cpu, 4), "span_s": round(span, 3), "cpu_from": how,
        "idle_cpu_per_s": round(idle, 4),
        "cpu_ms_per_offer": round(net / answered * 1000, 3) if answered else None,
        "post_ms": [r["post_ms"] for r in rows if r["status"] == 201],
        "left_over_sessions": wait_no_viewers(server),
    })
    mode = "concurrent" if concurrent else "sequential"
    posts = result["post_ms"]
    print(f"  {server.label}: {count} {mode} offers: {result['cpu_ms_per_offer']} ms CPU per "
          f"offer (CPU {result['cpu_s']} s over {result['span_s']} s, idle "
          f"{idle * 100:.1f}%); POST->201 p50 {statistics.median(posts) if posts else '-'} ms"
          + (f"; REFUSED {len(result['refused'])}: {result['refused'][0]}"
             if result["refused"] else ""), flush=True)
    return result


def run_fanout(server: Server, count: int, window_s: float) -> dict[str, Any]:
    idle = idle_rate(server.pid)
    workers = ViewerWorkers(server.url, count)
    try:
        time.sleep(SETTLE_S)
        before, p0 = CpuReading.of(server.pid), workers.packets()
        time.sleep(window_s)
        after, p1 = CpuReading.of(server.pid), workers.packets()
        rss = rss_kib(server.pid)
        connected = server.viewers()
    finally:
        workers.close()
    cpu, span, how = cpu_between(before, after)
    packets = p1 - p0
    net = cpu - idle * span
    result = {
        "viewers": count, "window_s": round(span, 3), "cpu_s": round(cpu, 4), "cpu_from": how,
        "idle_cpu_per_s": round(idle, 4), "packets": packets,
        "packets_per_s_per_viewer": round(packets / span / count, 1),
        "us_per_packet_per_viewer": round(net / packets * 1e6, 3) if packets else None,
        # Independent of how the stream is cut into packets (the servers' sizes differ).
        "core_pct_per_viewer": round(net / span / count * 100, 3),
        "server_load": round(cpu / span, 3), "rss_kib": rss,
        "sessions_at_end": connected, "srtp": dict(workers.srtp),
        "left_over_sessions": wait_no_viewers(server),
    }
    print(f"  {server.label}: {count} viewers: {result['us_per_packet_per_viewer']} µs per "
          f"packet per viewer, {result['core_pct_per_viewer']}% of a core per viewer "
          f"({result['packets_per_s_per_viewer']} packets/s per viewer, server load "
          f"{result['server_load']:.2f}, idle {idle * 100:.1f}%), RSS {rss / 1024:.1f} MiB, "
          f"SRTP {dict(workers.srtp)}", flush=True)
    return result


@contextlib.contextmanager
def phase(row: dict[str, Any], name: str) -> Iterator[None]:
    """Note a phase's failure in the round's row and go on with the next phase."""
    try:
        yield
    except Exception as exc:
        print(f"  {name} FAILED: {exc!r}", flush=True)
        row["errors"].append(f"{name}: {exc!r}")


def measure(server: Server, args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    """One server, one round: every phase on a freshly started server."""
    row: dict[str, Any] = {"round": round_no, "load_average": os.getloadavg(), "errors": [],
                           "joins": {}, "offers": {}, "fanout": {}}
    try:
        server.start()
    except RuntimeError as exc:
        print(f"  {exc}", flush=True)
        row["errors"].append(str(exc))
        return row
    try:
        ready = time.monotonic()
        time.sleep(max(0.0, ready + FRESH_S - IDLE_S - 2.0 - time.monotonic()))
        row["idle_cpu_fresh"] = round(idle_rate(server.pid, IDLE_S + 2.0), 4)
        time.sleep(max(0.0, ready + FRESH_S - time.monotonic()))
        row["fresh_rss_kib"] = rss_kib(server.pid)
        print(f"  {server.label}: fresh RSS {row['fresh_rss_kib'] / 1024:.1f} MiB, idle CPU "
              f"{row['idle_cpu_fresh'] * 100:.1f}%", flush=True)
        for n in args.joins:
            with phase(row, f"joins {n}"):
                row["joins"][str(n)] = run_joins(server, n, args.join_timeout)
        for mode in ("sequential", "concurrent"):
            with phase(row, f"offers {mode}"):
                row["offers"][mode] = run_offers(server, args.offers, mode == "concurrent")
        for n in args.viewers:
            with phase(row, f"fan-out {n}"):
                row["fanout"][str(n)] = run_fanout(server, n, args.window)
        with phase(row, "status"):
            row["status"] = server.status()
            print(f"  {server.label}: status {json.dumps(row['status'])}", flush=True)
    finally:
        server.stop()
    return row


# --- pooling and the table -------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(rounds: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """One server's rounds pooled: medians of per-round figures, pooled latency percentiles."""
    out: dict[str, Any] = {"rounds": len(rounds),
                           "errors": sum(len(r["errors"]) for r in rounds)}
    out["fresh_rss_mib"] = _median([r["fresh_rss_kib"] / 1024 for r in rounds
                                    if "fresh_rss_kib" in r])
    out["idle_cpu_pct"] = _median([r["idle_cpu_fresh"] * 100 for r in rounds
                                   if "idle_cpu_fresh" in r])
    for n in map(str, args.joins):
        results = [r["joins"][n] for r in rounds if n in r["joins"]]
        rows = [v for res in results for v in res["viewers"]]
        out[f"join{n}_viewers"] = len(rows)
        out[f"join{n}_refused"] = sum(v["status"] != 201 for v in rows)
        for stage in STAGES:
            values = [v[stage] for v in rows if v[stage] is not None]
            out[f"join{n}_{stage}_p50"] = statistics.median(values) if values else None
            out[f"join{n}_{stage}_p95"] = percentile(values, 0.95) if values else None
            out[f"join{n}_{stage}_missing"] = len(rows) - len(values)
        out[f"join{n}_decode_errors"] = sum(v["decode_errors"] or 0 for v in rows)
        out[f"join{n}_cpu_ms"] = _median([res["cpu_ms_per_viewer"] for res in results])
    for mode in ("sequential", "concurrent"):
        results = [r["offers"][mode] for r in rounds if mode in r["offers"]]
        out[f"offer_{mode}_cpu_ms"] = _median([res["cpu_ms_per_offer"] for res in results
                                               if res["cpu_ms_per_offer"] is not None])
        posts = [ms for res in results for ms in res["post_ms"]]
        out[f"offer_{mode}_post_p50"] = statistics.median(posts) if posts else None
        out[f"offer_{mode}_post_p95"] = percentile(posts, 0.95) if posts else None
        out[f"offer_{mode}_refused"] = sum(len(res["refused"]) for res in results)
    out["offer_refused"] = out["offer_sequential_refused"] + out["offer_concurrent_refused"]
    for n in map(str, args.viewers):
        results = [r["fanout"][n] for r in rounds if n in r["fanout"]]
        out[f"fanout{n}_us"] = _median([res["us_per_packet_per_viewer"] for res in results
                                        if res["us_per_packet_per_viewer"] is not None])
        out[f"fanout{n}_core_pct"] = _median([res["core_pct_per_viewer"] for res in results])
        out[f"fanout{n}_srtp"] = sorted({p for res in results for p in res["srtp"]})
        out[f"fanout{n}_rss_mib"] = _median([res["rss_kib"] / 1024 for res in results])
        out[f"fanout{n}_pps"] = _median([res["packets_per_s_per_viewer"] for res in results])
    return out


def table_rows(args: argparse.Namespace) -> list[tuple[str, str, str, bool]]:
    """(label, summary key, format, whether a ratio means anything) for each row."""
    rows = [("fresh RSS, MiB", "fresh_rss_mib", "{:.1f}", True),
            ("idle CPU (replaying the file), %", "idle_cpu_pct", "{:.1f}", True)]
    for n in args.joins:
        for stage in STAGES:
            for q in ("p50", "p95"):
                rows.append((f"join {n}: {STAGE_NAMES[stage]} {q}, ms",
                             f"join{n}_{stage}_{q}", "{:.0f}", True))
        rows += [(f"join {n}: server CPU over the phase, ms per viewer", f"join{n}_cpu_ms",
                  "{:.1f}", True),
                 (f"join {n}: viewers without a frame in {args.join_timeout:g} s",
                  f"join{n}_first_frame_ms_missing", "{}", False),
                 (f"join {n}: decode errors before the first frame",
                  f"join{n}_decode_errors", "{}", False),
                 (f"join {n}: offers refused", f"join{n}_refused", "{}", False)]
    rows += [(f"offer CPU, {args.offers} sequential, ms per offer", "offer_sequential_cpu_ms",
              "{:.2f}", True),
             (f"offer CPU, {args.offers} concurrent, ms per offer", "offer_concurrent_cpu_ms",
              "{:.2f}", True),
             ("offer POST->201 sequential p50, ms", "offer_sequential_post_p50", "{:.1f}", True),
             ("offer POST->201 concurrent p50, ms", "offer_concurrent_post_p50", "{:.1f}", True),
             ("offer POST->201 concurrent p95, ms", "offer_concurrent_post_p95", "{:.1f}", True),
             ("offers refused (CPU-per-offer phases)", "offer_refused", "{}", False)]
    for n in args.viewers:
        rows += [(f"fan-out {n}: server µs per packet per viewer", f"fanout{n}_us", "{:.2f}",
                  True),
                 (f"fan-out {n}: server CPU per viewer, % of a core", f"fanout{n}_core_pct",
                  "{:.3f}", True),
                 (f"fan-out {n}: server RSS, MiB", f"fanout{n}_rss_mib", "{:.1f}", True),
                 (f"fan-out {n}: packets/s per viewer received", f"fanout{n}_pps", "{:.0f}",
                  False)]
    rows.append(("phases failed", "errors", "{}", False))
    return rows


def ratio(value: Any, base: Any) -> float | None:
    if value is None or not base:
        return None
    return round(float(value) / float(base), 3)


def print_table(summaries: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    labels = list(summaries)
    appliances = labels[1:]
    rows = table_rows(args)
    width = max(len(label) for label, *_ in rows)
    columns = [max(10, len(label)) for label in labels]
    header = f"{'figure':{width}} | {labels[0]:>{columns[0]}}"
    for label, w in zip(appliances, columns[1:], strict=True):
        header += f" | {label:>{w}} | {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for label, key, fmt, has_ratio in rows:
        cells = [summaries[s].get(key) for s in labels]
        line = f"{label:{width}} | " + f"{_cell(cells[0], fmt):>{columns[0]}}"
        for value, w in zip(cells[1:], columns[1:], strict=True):
            r = ratio(value, cells[0]) if has_ratio else None
            line += f" | {_cell(value, fmt):>{w}} | {'-' if r is None else f'{r:.2f}':>6}"
        print(line)


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


# --- Pion's binary ---------------------------------------------------------------------------


def ensure_go() -> None:
    """Go and Pion's Debian sources, installed with apt-get when missing and we are root."""
    if shutil.which("go") and PION_GO_SOURCES.is_dir():
        return
    if os.geteuid() != 0:
        raise SystemExit(f"pion.py: building pion-whep needs Go and Pion's sources: "
                         f"sudo apt-get install {' '.join(PION_PACKAGES)} (or --pion-bin PATH)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", *PION_PACKAGES]
    print(f"installing {' '.join(PION_PACKAGES)}", flush=True)
    if subprocess.run(install, env=env, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, check=True)
        subprocess.run(install, env=env, check=True)


def pion_binary(given: Path | None) -> Path:
    """``given``, or .cache/pion-whep/pion-whep, built when missing or older than its sources."""
    if given is not None:
        if not given.is_file():
            raise SystemExit(f"pion.py: --pion-bin {given}: no such file")
        return given
    build = ANCHOR / "build.sh"
    if not build.is_file():
        raise SystemExit(f"pion.py: the Pion reference is not there: {ANCHOR}")
    sources = [p for p in ANCHOR.iterdir() if p.suffix in (".go", ".sh", ".mod")]
    newest = max(p.stat().st_mtime for p in sources)
    if PION_BIN.is_file() and PION_BIN.stat().st_mtime >= newest:
        return PION_BIN
    ensure_go()
    print(f"building {PION_BIN} with {build}", flush=True)
    PION_BIN.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(build), str(PION_BIN)], check=True)
    return PION_BIN


# --- orchestration ---------------------------------------------------------------------------


def settings(args: argparse.Namespace, binary: Path, stream: Path) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=False).stdout.strip()
    return {"rounds": args.rounds, "joins": args.joins, "join_timeout_s": args.join_timeout,
            "offers": args.offers, "viewers": args.viewers, "window_s": args.window,
            "aes_mask": args.aes_mask, "appliance_variants": args.appliance,
            "pion_binary": str(binary), "stream": str(stream), "commit": commit,
            "cpus": os.cpu_count(), "load_average_start": os.getloadavg()}


def bench(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(BENCH))
    sys.path.insert(1, str(ROOT))  # tests.tooling (Server.stop)
    from fanout import recorded_stream

    binary = pion_binary(args.pion_bin)
    stream = recorded_stream()
    env = dict(os.environ)
    caveats = []
    if args.aes_mask:
        env["OPENSSL_ia32cap"] = AES_MASK
        caveats.append(f"--aes-mask: OPENSSL_ia32cap={AES_MASK} masks OpenSSL only; Go's "
                       "crypto ignores it, so Pion's figures are NOT masked (the ratio compares "
                       "a masked appliance with an unmasked Pion)")
    caveats.append("Pion gives a new viewer live P-frames until the next IDR (up to 2 s, they "
                   "fail to decode); the appliance sends the GOP so far: join figures compare "
                   "designs, not only speed")
    info = settings(args, binary, stream)
    labels = ["pion", *("appliance" if v == "default" else f"appliance:{v}"
                        for v in args.appliance)]
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    print(f"pion vs appliance: {args.rounds} round(s), joins {args.joins}, {args.offers} offers, "
          f"viewers {args.viewers}, window {args.window:g} s; servers {', '.join(labels)}"
          + ("; AES masked (the appliance only)" if args.aes_mask else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="pion-bench-") as tmp:
        for r in range(args.rounds):
            order = labels[r % len(labels):] + labels[:r % len(labels)]
            for label in order:
                print(f"round {r + 1}/{args.rounds}: {label}", flush=True)
                workdir = Path(tmp) / f"{r}-{label.replace(':', '-')}"
                workdir.mkdir()
                server: Server
                if label == "pion":
                    server = PionServer(workdir, env, binary, stream)
                else:
                    variant = label.partition(":")[2] or "default"
                    server = ApplianceServer(workdir, env, variant, stream)
                results[label].append(measure(server, args, r + 1))
    summaries = {label: summarize(rows, args) for label, rows in results.items()}
    srtp = {label: sorted({p for n in args.viewers for p in summaries[label][f"fanout{n}_srtp"]})
            for label in labels}
    caveats.append("SRTP the aiortc viewers negotiated: "
                   + "; ".join(f"{label} {', '.join(p) or '-'}" for label, p in srtp.items()))
    load = os.getloadavg()
    print(f"\n{args.rounds} round(s); load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"on {os.cpu_count()} CPUs; ratio = appliance / pion")
    print_table(summaries, args)
    for caveat in caveats:
        print(f"note: {caveat}")
    ratios = {label: {key: ratio(summaries[label].get(key), summaries["pion"].get(key))
                      for _, key, _, has_ratio in table_rows(args) if has_ratio}
              for label in labels[1:]}
    document = {"figure": "pion_side_by_side", "settings": {**info, "load_average_end": load},
                "caveats": caveats, "summary": summaries, "ratios": ratios}
    if args.json is not None:
        args.json.write_text(json.dumps({**document, "rounds": results}, indent=1) + "\n")
        print(f"wrote {args.json}")
    print(json.dumps(document))


def main() -> None:
    if sys.argv[1:2] == ["serve-appliance"]:  # the server wrapper: no argparse of ours
        raise SystemExit(serve_appliance(sys.argv[2], sys.argv[3:]))
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("role", nargs="?", default="bench",
                        choices=["bench", "build", "joins", "offers", "viewers"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--joins", type=int, nargs="*", default=[10, 30],
                        help="concurrent joins: viewers POSTing at once (default 10 30)")
    parser.add_argument("--join-timeout", type=float, default=10.0)
    parser.add_argument("--offers", type=int, default=30, help="offers per CPU-per-offer phase")
    parser.add_argument("--viewers", type=int, nargs="*", default=[20],
                        help="fan-out: viewers connected during the window (default 20)")
    parser.add_argument("--window", type=float, default=10.0, help="fan-out window, s")
    parser.add_argument("--appliance", nargs="+", choices=list(VARIANTS), default=["default"],
                        help="appliance variants, each one more server per round")
    parser.add_argument("--aes-mask", action="store_true",
                        help=f"servers with OPENSSL_ia32cap={AES_MASK} (Pion ignores it)")
    parser.add_argument("--pion-bin", type=Path, default=None,
                        help=f"the pion-whep binary (default {PION_BIN}, built when missing)")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the JSON document with every round's figures here")
    parser.add_argument("--quick", action="store_true",
                        help="1 round, joins 10, viewers 20, window 6 s")
    parser.add_argument("--url", default="", help="client roles: the server")
    parser.add_argument("--count", type=int, default=1, help="client roles: how many")
    parser.add_argument("--concurrent", action="store_true", help="offers: all at once")
    args = parser.parse_args()
    if args.role == "build":  # the Go/Pion server only (scripts/bench, before its netns)
        print(pion_binary(args.pion_bin))
    elif args.role == "joins":
        asyncio.run(joins_client(args.url, args.count, args.join_timeout))
    elif args.role == "offers":
        asyncio.run(offers_client(args.url, args.count, args.concurrent))
    elif args.role == "viewers":
        asyncio.run(viewers_worker(args.url, args.count))
    else:
        if args.quick:
            args.rounds, args.joins, args.viewers, args.window = 1, [10], [20], 6.0
        args.appliance = list(dict.fromkeys(args.appliance))
        bench(args)


if __name__ == "__main__":
    main()
