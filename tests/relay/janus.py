"""A real Janus (Debian's ``janus`` 1.1.2) for the relay tests, and aiortc viewers that watch
through it over its HTTP API.

Janus runs from a private config dir generated here: HTTP transport on 127.0.0.1 only, the
Streaming plugin only (every other plugin, transport, event handler and logger disabled). libnice
gathers no loopback candidates, so the test's private namespace gets a veth address
(:func:`tests.e2e.browser_netns.prepare_namespace`) and Janus's ICE is pinned to it with
``nat { ice_enforce_list }``. Nothing leaves the namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RtcpPacket, RtcpSrPacket

from ruseon_appliance.capture.stamp import read_stamp
from ruseon_appliance.engine import aiortc_internals
from ruseon_appliance.stream.rtcp import NTP_EPOCH_OFFSET
from tests.e2e.browser_netns import NETNS_ENV, VETH
from tests.tooling import free_port, require_root, require_tool

JANUS = "/usr/bin/janus"
KEEP_PLUGINS = {"libjanus_streaming.so"}
KEEP_TRANSPORTS = {"libjanus_http.so"}


def _library_dir(kind: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/*/janus/{kind}"))
    if not found:
        raise FileNotFoundError(f"no Janus {kind} folder under /usr/lib/*/janus/")
    return found[0]


def _others(folder: str, keep: set[str]) -> str:
    names = {Path(p).name for p in glob.glob(f"{folder}/*.so")}
    return ",".join(sorted(names - keep))


def write_config(directory: Path, http_port: int, *, streaming: str = "") -> Path:
    """The minimal Janus configuration; returns the path of ``janus.jcfg``."""
    directory.mkdir(parents=True, exist_ok=True)
    plugins, transports = _library_dir("plugins"), _library_dir("transports")
    (directory / "janus.jcfg").write_text(f"""
general: {{
    configs_folder = "{directory}"
    plugins_folder = "{plugins}"
    transports_folder = "{transports}"
    debug_level = 4
    session_timeout = 60
}}
certificates: {{}}
media: {{
    rtp_port_range = "30000-39999"
}}
nat: {{
    ice_enforce_list = "{VETH}"
}}
plugins: {{
    disable = "{_others(plugins, KEEP_PLUGINS)}"
}}
transports: {{
    disable = "{_others(transports, KEEP_TRANSPORTS)}"
}}
events: {{
    broadcast = false
}}
loggers: {{
    disable = "libjanus_jsonlog.so"
}}
""")
    (directory / "janus.transport.http.jcfg").write_text(f"""
general: {{
    json = "compact"
    base_path = "/janus"
    http = true
    port = {http_port}
    ip = "127.0.0.1"
    https = false
}}
admin: {{
    admin_http = false
    admin_https = false
}}
""")
    (directory / "janus.plugin.streaming.jcfg").write_text("general: {}\n" + streaming)
    return directory / "janus.jcfg"


class Janus:
    """One Janus process (restartable) and a tiny client for its HTTP API."""

    def __init__(self, directory: Path, *, streaming: str = "") -> None:
        self.directory = directory
        self.http_port = free_port()
        self.config = write_config(directory, self.http_port, streaming=streaming)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = directory / "janus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/janus"

    def start(self, timeout: float = 30.0) -> None:
        """Start and wait until the HTTP API answers ``info``."""
        log = self.log.open("ab")
        self.proc = subprocess.Popen(
            [JANUS, "-F", str(self.directory), "-C", str(self.config), "-o"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("janus exited:\n" + self.tail())
            with contextlib.suppress(OSError, ValueError):
                info = self._get(f"{self.url}/info")
                if "janus.plugin.streaming" in info.get("plugins", {}):
                    return
            time.sleep(0.2)
        raise RuntimeError("janus did not answer:\n" + self.tail())

    def kill(self) -> None:
        """SIGKILL (a crash, not a shutdown)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def tail(self, chars: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # -- the HTTP API (blocking; the tests call it through asyncio.to_thread) ---------------

    def _get(self, url: str) -> dict[str, Any]:
        with urllib.request.urlopen(url, timeout=5) as response:
            data: dict[str, Any] = json.load(response)
            return data

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        body = {"transaction": secrets.token_hex(6), **body}
        request = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            data: dict[str, Any] = json.load(response)
        if data.get("janus") == "error":
            raise RuntimeError(f"janus error: {data}")
        return data

    def poll(self, session: int, timeout_s: int = 5) -> list[dict[str, Any]]:
        """Long-poll a session's events."""
        url = f"{self.url}/{session}?maxev=10&rid={time.time_ns()}"
        with urllib.request.urlopen(url, timeout=timeout_s + 30) as response:
            data = json.load(response)
        return data if isinstance(data, list) else [data]

    def attach(self) -> tuple[int, int]:
        """A new session with the Streaming plugin attached: ``(session, handle)``."""
        session = self.post("", {"janus": "create"})["data"]["id"]
        handle = self.post(f"/{session}", {"janus": "attach",
                                           "plugin": "janus.plugin.streaming"})["data"]["id"]
        return int(session), int(handle)

    def request(self, session: int, handle: int, body: dict[str, Any]) -> dict[str, Any]:
        """A synchronous Streaming request (create, destroy, list, info)."""
        answer = self.post(f"/{session}/{handle}", {"janus": "message", "body": body})
        data: dict[str, Any] = answer["plugindata"]["data"]
        if "error" in data:
            raise RuntimeError(f"streaming error: {data}")
        return data

    def create_mountpoint(self, mountpoint_id: int, *, port: int, rtcp_port: int,
                          profile_level_id: str, srtp_key: str = "",
                          bufferkf: bool = False, audio_port: int = 0,
                          audio_rtcp_port: int = 0) -> None:
        """An RTP mountpoint for H.264 (as DESIGN.md's verified request), optionally SRTP;
        ``bufferkf``: Janus keeps the latest keyframe and sends it to each viewer as it starts;
        ``audio_port``: Opus too (payload type 111, its RTCP on ``audio_rtcp_port``)."""
        session, handle = self.attach()
        media: list[dict[str, Any]] = [
            {"type": "video", "mid": "v", "port": port, "pt": 96, "codec": "h264",
             "fmtp": f"profile-level-id={profile_level_id};packetization-mode=1",
             "rtcpport": rtcp_port, "bufferkf": bufferkf}]
        if audio_port:
            audio: dict[str, Any] = {"type": "audio", "mid": "a", "port": audio_port,
                                     "pt": 111, "codec": "opus"}
            if audio_rtcp_port:
                audio["rtcpport"] = audio_rtcp_port
            media.append(audio)
        body: dict[str, Any] = {
            "request": "create", "type": "rtp", "id": mountpoint_id,
            "name": f"relay-{mountpoint_id}", "media": media,
        }
        if srtp_key:
            body.update(srtpsuite=80, srtpcrypto=srtp_key)
        self.request(session, handle, body)
        with contextlib.suppress(OSError, RuntimeError):
            self.post(f"/{session}", {"janus": "destroy"})


@contextlib.contextmanager
def running_janus(directory: Path, *, streaming: str = "") -> Iterator[Janus]:
    janus = Janus(directory, streaming=streaming)
    janus.start()
    try:
        yield janus
    except BaseException as exc:
        exc.add_note("janus log (tail):\n" + janus.tail(3000))
        raise
    finally:
        janus.stop()


# --- viewers -------------------------------------------------------------------------------


@dataclass
class JanusViewer:
    """An aiortc peer watching a mountpoint through Janus (session, attach, watch, answer the
    offer, start) and decoding what arrives."""

    janus: Janus
    mountpoint_id: int
    pc: RTCPeerConnection = field(default_factory=lambda: RTCPeerConnection(
        RTCConfiguration(iceServers=[])))
    stamps: list[tuple[int, int]] = field(default_factory=list)
    decoded: int = 0
    # False: count the RTP packets and drop them (benchmarks: cheap viewers, no decoding).
    decode: bool = True
    packets: int = 0
    session: int = 0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _keepalive: asyncio.Task[None] | None = None
    ended: bool = False
    # time.monotonic() of the first decoded picture (decode=True).
    first_frame_at: float | None = None
    # Decoded sound (a mountpoint with audio): one mono int16 array per frame.
    sound: list[Any] = field(default_factory=list)
    sound_pts: list[int] = field(default_factory=list)  # of each frame in ``sound``
    pictures: list[tuple[int, int]] = field(default_factory=list)  # (capture µs, pts)
    # With ``sync``: each SSRC's sender reports from Janus (ntp, rtp) and first RTP timestamp
    # (aiortc's decoded pts count from it), and the SSRC of each kind (Janus's offer).
    sync: bool = False
    reports: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    origins: dict[int, int] = field(default_factory=dict)
    ssrcs: dict[str, int] = field(default_factory=dict)
    kinds: list[str] = field(default_factory=list)  # of the tracks received

    async def watch(self) -> None:
        """Join the mountpoint; frames are decoded in the background from then on."""
        janus = self.janus
        self.session, handle = await asyncio.to_thread(janus.attach)
        await asyncio.to_thread(janus.post, f"/{self.session}/{handle}",
                                {"janus": "message",
                                 "body": {"request": "watch", "id": self.mountpoint_id}})
        offer = await self._wait_for_jsep()
        tracks: asyncio.Queue[MediaStreamTrack] = asyncio.Queue()
        self.pc.on("track", tracks.put_nowait)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer["sdp"],
                                                                 type="offer"))
        answer = await self.pc.createAnswer()
        await self.pc.setLocalDescription(answer)
        if self.sync:
            self._tap_sync(offer["sdp"])
        if not self.decode:
            aiortc_internals.discard_received_rtp(self.pc, self._count)
        await asyncio.to_thread(janus.post, f"/{self.session}/{handle}", {
            "janus": "message", "body": {"request": "start"},
            "jsep": {"type": "answer", "sdp": self.pc.localDescription.sdp}})
        track = await asyncio.wait_for(tracks.get(), 10)
        received = [track]
        while not tracks.empty():  # every track of the offer came with setRemoteDescription
            received.append(tracks.get_nowait())
        self.kinds = [t.kind for t in received]
        if self.decode:
            for track in received:
                task = asyncio.create_task(self._decode(track) if track.kind == "video"
                                           else self._listen(track))
                self._tasks.append(task)
        self._keepalive = asyncio.create_task(self._keep_alive())

    async def _wait_for_jsep(self) -> dict[str, Any]:
        for _ in range(20):
            for event in await asyncio.to_thread(self.janus.poll, self.session):
                if "jsep" in event:
                    jsep: dict[str, Any] = event["jsep"]
                    return jsep
        raise AssertionError("janus sent no offer")

    def _tap_sync(self, offer: str) -> None:
        kind = ""
        for line in offer.splitlines():
            if line.startswith("m="):
                kind = line[2:].split()[0]
            elif line.startswith("a=ssrc:") and kind:
                self.ssrcs.setdefault(kind, int(line[7:].split()[0]))
        transport = self.pc.getTransceivers()[0].receiver.transport
        original = transport._handle_rtcp_data

        async def handle(data: bytes) -> None:
            with contextlib.suppress(Exception):
                for packet in RtcpPacket.parse(data):
                    if isinstance(packet, RtcpSrPacket):
                        info = packet.sender_info
                        self.reports.setdefault(packet.ssrc, []).append(
                            (info.ntp_timestamp, info.rtp_timestamp))
            await original(data)

        transport._handle_rtcp_data = handle
        aiortc_internals.tap_received_rtp(
            self.pc, lambda packet: self.origins.setdefault(packet.ssrc, packet.timestamp))

    def to_wall_us(self, kind: str, pts: int, clock_rate: int) -> int:
        """A decoded frame's ``pts`` of ``kind`` as wall-clock µs by the stream's newest sender
        report from Janus (what a browser behind Janus lines the two streams up by)."""
        ssrc = self.ssrcs[kind]
        rtp_ts = (self.origins[ssrc] + pts) & 0xFFFFFFFF
        ntp, sr_rtp = self.reports[ssrc][-1]
        wall_s = (ntp >> 32) - NTP_EPOCH_OFFSET + (ntp & 0xFFFFFFFF) / (1 << 32)
        delta = ((rtp_ts - sr_rtp + (1 << 31)) % (1 << 32)) - (1 << 31)
        return round((wall_s + delta / clock_rate) * 1e6)

    def _count(self, size: int) -> None:
        self.packets += 1

    async def _keep_alive(self) -> None:
        with contextlib.suppress(Exception):
            while True:
                await asyncio.sleep(15)
                await asyncio.to_thread(self.janus.post, f"/{self.session}",
                                        {"janus": "keepalive"})

    async def _decode(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                if self.first_frame_at is None:
                    self.first_frame_at = time.monotonic()
                self.decoded += 1
                stamp = read_stamp(frame)
                if stamp is not None:
                    self.stamps.append(stamp)
                    self.pictures.append((stamp[0], frame.pts))
        except MediaStreamError:
            self.ended = True

    async def _listen(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                samples = frame.to_ndarray().reshape(-1, len(frame.layout.channels))[:, 0]
                self.sound.append(samples.copy())
                self.sound_pts.append(frame.pts)
        except MediaStreamError:
            pass
        except Exception as exc:
            self.kinds.append(repr(exc))
            raise

    async def close(self) -> None:
        for task in (*self._tasks, self._keepalive):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self.pc.close()


def rerun_in_janus_netns(nodeid: str) -> None:
    """Run test ``nodeid`` again in a fresh network namespace (where it starts Janus and gives
    it a veth address); fail with its output if it fails there."""
    require_root("creates a network namespace with a veth pair for Janus")
    unshare = require_tool("unshare", "apt-get install util-linux")
    require_tool("ip", "apt-get install iproute2")
    require_tool("janus", "apt-get install janus")
    env = {**os.environ, NETNS_ENV: "1"}
    command = [unshare, "--net", "--fork", "--", sys.executable, "-m", "pytest", nodeid,
               "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=", "--timeout=280",
               "--show-capture=no"]
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True,
                            timeout=320, check=False)
    if result.returncode != 0:
        pytest.fail(f"in the Janus namespace:\n{result.stdout[-8000:]}\n{result.stderr[-4000:]}",
                    pytrace=False)
