"""RTSP test helpers: a real synthetic camera with its fan-out, the server on 127.0.0.1, and a
small raw RTSP client (real TCP) for what FFmpeg and GStreamer do not let a test see: status
codes, headers, interleaved RTP counted frame by frame, a client that stops reading."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.config import CameraConfig, HostPort, RtspConfig
from ruseon_appliance.rtsp import RtspServer, RtspSource
from ruseon_appliance.stream.fanout import Fanout

FPS = 30


def camera(**overrides: Any) -> CameraConfig:
    values: dict[str, Any] = dict(source="synthetic", width=320, height=240, framerate=FPS,
                                  bitrate=300_000, keyframe_interval=60)
    values.update(overrides)
    return CameraConfig(**values)


@dataclass
class Rig:
    """A camera, its fan-out and a way to start RTSP servers on it."""

    capture: CapturePipeline
    fanout: Fanout
    servers: list[RtspServer] = field(default_factory=list)
    audio: Any = None  # an AudioPipeline (the tone) for start_rig(audio=True)

    async def server(self, *, token: str = "", max_clients: int = 20,
                     **kwargs: Any) -> RtspServer:
        source = RtspSource("cam", self.capture, self.fanout, framerate=FPS,
                            catch_up_max_frames=15, keyframe_interval_frames=60,
                            audio=self.audio)
        server = RtspServer(RtspConfig(enable=True, listen=HostPort("127.0.0.1", 0),
                                       max_clients=max_clients),
                            [source], token=token, **kwargs)
        await server.start()
        self.servers.append(server)
        return server


async def start_rig(*, audio: bool = False, **overrides: Any) -> Rig:
    """``audio``: the synthetic camera's sound too (the real tone through the real encoders,
    as cameras/assembly.py gives a synthetic camera)."""
    capture = CapturePipeline(camera(**overrides))
    await capture.start()
    fanout = Fanout(capture, lambda family: None, framerate=FPS, min_bitrate=300_000)
    fanout.start()
    assert await capture.wait_first_frame(20)
    pipeline = None
    if audio:
        from ruseon_appliance.audio.pipeline import AudioPipeline
        from ruseon_appliance.audio.sources.tone import ToneSource

        pipeline = AudioPipeline(ToneSource())
        await pipeline.start()
        # Encoded only while read (the RTSP server's SETUP makes it a reader): the tone runs.
        await wait_for(lambda: pipeline.running and pipeline.chunks_in >= 5, 20, "the tone")
    return Rig(capture, fanout, audio=pipeline)


async def stop_rig(rig: Rig) -> None:
    for server in rig.servers:
        await server.stop()
    if rig.audio is not None:
        await rig.audio.stop()
    await rig.fanout.stop()
    await rig.capture.stop()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    """A synthetic 320x240 camera at 30 fps with a fan-out (no WebRTC viewers)."""
    rig = await start_rig()
    try:
        yield rig
    finally:
        await stop_rig(rig)


@dataclass
class Response:
    status: int
    headers: dict[str, list[str]]
    body: bytes

    def header(self, name: str) -> str:
        values = self.headers.get(name.lower(), [])
        return values[0] if values else ""


class RawClient:
    """A minimal RTSP/1.0 client over a real TCP connection, reading interleaved data too."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 url: str) -> None:
        self.reader = reader
        self.writer = writer
        self.url = url
        self.cseq = 0
        self.session = ""
        self.rtp_packets = 0
        self.frames = 0  # RTP packets with the marker bit (one per access unit)
        self.keyframes = 0
        self.rtcp: list[bytes] = []
        self.sequence_gaps = 0
        self.first_nal: int | None = None  # of the first RTP packet (7: SPS, a keyframe)
        self.first_seq: int | None = None
        self.first_timestamp: int | None = None
        self.frame_timestamps: list[int] = []  # of each frame's last packet (marker bit)
        self.played: Response | None = None
        # The sound's track (play_tcp(audio=True)): its RTP channel, (seq, timestamp,
        # payload) of each packet, and what came first on each channel ("rtp" or "rtcp").
        self.audio_channel: int | None = None
        self.audio_packets: list[tuple[int, int, bytes]] = []
        self.rtcp_on: list[tuple[int, bytes]] = []
        self.first_on: dict[int, str] = {}
        self._last_seq: int | None = None
        self._pending: list[Response] = []
        self._task: asyncio.Task[None] | None = None
        self._responses: asyncio.Queue[Response | None] = asyncio.Queue()

    @classmethod
    async def connect(cls, port: int, path: str = "cam", *,
                      rcvbuf: int | None = None, source: str | None = None) -> RawClient:
        """``source``: another loopback address to connect from (127.0.0.2, ...)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if source is not None:
            sock.bind((source, 0))
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
        client = cls(reader, writer, f"rtsp://127.0.0.1:{port}/{path}")
        client._task = asyncio.get_running_loop().create_task(client._read_loop())
        return client

    async def _read_loop(self) -> None:
        reader = self.reader
        try:
            while True:
                first = await reader.readexactly(1)
                if first == b"$":
                    head = await reader.readexactly(3)
                    data = await reader.readexactly(int.from_bytes(head[1:], "big"))
                    self._interleaved(head[0], data)
                    continue
                head = first + await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                status = int(lines[0].split(" ")[1])
                headers: dict[str, list[str]] = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, _, value = line.partition(":")
                        headers.setdefault(name.strip().lower(), []).append(value.strip())
                length = int(headers.get("content-length", ["0"])[0])
                body = await reader.readexactly(length) if length else b""
                await self._responses.put(Response(status, headers, body))
        except (asyncio.IncompleteReadError, ConnectionError):
            await self._responses.put(None)

    def _interleaved(self, channel: int, data: bytes) -> None:
        self.first_on.setdefault(channel, "rtcp" if channel % 2 else "rtp")
        if channel % 2:
            self.rtcp.append(data)
            self.rtcp_on.append((channel, data))
            return
        if channel == self.audio_channel:
            _, _, seq, timestamp = struct.unpack_from("!BBHI", data)
            self.audio_packets.append((seq, timestamp, data[12:]))
            return
        _, second, seq, timestamp = struct.unpack_from("!BBHI", data)
        if self.first_seq is None:
            self.first_seq, self.first_timestamp = seq, timestamp
        if self._last_seq is not None and (seq - self._last_seq) & 0xFFFF != 1:
            self.sequence_gaps += 1
        self._last_seq = seq
        self.rtp_packets += 1
        payload = data[12:]
        nal = payload[0] & 0x1F
        if nal == 28 and payload[1] & 0x80:  # FU-A start
            nal = payload[1] & 0x1F
        elif nal == 24:  # STAP-A: the first aggregated NAL
            nal = payload[3] & 0x1F
        if self.first_nal is None:
            self.first_nal = nal
        if nal == 7:  # the muxer puts SPS+PPS in front of every IDR
            self.keyframes += 1
        if second & 0x80:
            self.frames += 1
            self.frame_timestamps.append(timestamp)

    async def request(self, method: str, url: str | None = None,
                      headers: dict[str, str] | None = None, *,
                      timeout: float = 20.0) -> Response:
        self.cseq += 1
        lines = [f"{method} {url or self.url} RTSP/1.0", f"CSeq: {self.cseq}"]
        if self.session and method not in ("OPTIONS", "DESCRIBE", "SETUP"):
            lines.append(f"Session: {self.session}")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        return await self.response(timeout)

    async def response(self, timeout: float = 20.0) -> Response:
        async with asyncio.timeout(timeout):
            response = await self._responses.get()
        if response is None:
            raise ConnectionError("the server closed the connection")
        return response

    async def play_tcp(self, headers: dict[str, str] | None = None, *,
                       audio: bool = False) -> None:
        """DESCRIBE, SETUP (interleaved 0-1; ``audio``: then the sound's track on 2-3 in the
        same session), PLAY; asserts each is 200."""
        described = await self.request("DESCRIBE", headers=headers)
        assert described.status == 200, described
        setup = await self.request("SETUP", f"{self.url}/trackID=0", {
            "Transport": "RTP/AVP/TCP;unicast;interleaved=0-1", **(headers or {})})
        assert setup.status == 200, setup
        self.session = setup.header("session").split(";")[0]
        if audio:
            self.audio_channel = 2
            setup = await self.request("SETUP", f"{self.url}/trackID=1", {
                "Transport": "RTP/AVP/TCP;unicast;interleaved=2-3", "Session": self.session,
                **(headers or {})})
            assert setup.status == 200, setup
        played = await self.request("PLAY", headers=headers)
        assert played.status == 200, played
        self.played = played

    async def closed(self, timeout: float = 20.0) -> bool:
        """Wait until the server closes the connection."""
        assert self._task is not None
        async with asyncio.timeout(timeout):
            await asyncio.shield(self._task)
        return True

    def stop_reading(self) -> None:
        """Stop taking data off the socket (a stuck client): the kernel's window fills."""
        self.writer.transport.pause_reading()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.writer.transport.abort()


async def wait_for(condition: Callable[[], Any], timeout: float = 30.0,
                   what: str = "condition") -> None:
    """Poll ``condition()`` until true; fail with ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
