"""Both renditions of a camera through the real appliance: the main stream and the sub-stream
decode at their sizes over WHEP (aiortc peers on loopback), over RTSP (FFmpeg's client through
PyAV, ``/<cam>/sub``) and as snapshots; a camera without a sub-stream answers 404 saying why;
``/api/status`` and ``/metrics`` show both."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import aioice.ice
import av
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    CameraConfig,
    Config,
    HostPort,
    HttpConfig,
    RtspConfig,
    StateConfig,
    SubstreamConfig,
    WebRtcConfig,
)
from tests.tooling import free_port
from tests.web.conftest import admin_of

MAIN_SIZE, SUB_SIZE = (640, 360), (320, 180)


@pytest.fixture(autouse=True)
def loopback_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Client peers gather 127.0.0.1 only (aioice leaves loopback out by default)."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


@pytest.fixture
async def appliance(tmp_path: Path) -> AsyncIterator[tuple[Appliance, str, int]]:
    common: dict[str, Any] = {"source": "synthetic", "framerate": 15, "keyframe_interval": 15,
                              "motion": False}
    cameras = (
        CameraConfig(name="front", width=MAIN_SIZE[0], height=MAIN_SIZE[1], bitrate=600_000,
                     substream=SubstreamConfig("on", *SUB_SIZE, 0, 150_000), **common),
        CameraConfig(name="side", width=160, height=96, bitrate=150_000,
                     substream=SubstreamConfig(mode="off"), **common),
    )
    port, rtsp_port = free_port(), free_port()
    config = Config(
        cameras=cameras,
        http=HttpConfig(listen=HostPort("127.0.0.1", port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        rtsp=RtspConfig(enable=True, listen=HostPort("127.0.0.1", rtsp_port)),
        state=StateConfig(dir=str(tmp_path / "state")),
    )
    app = Appliance(config)
    await app.start()
    try:
        yield app, f"http://127.0.0.1:{port}", rtsp_port
    finally:
        await app.stop()


async def watch(http: aiohttp.ClientSession, url: str, frames: int = 10) -> set[tuple[int, int]]:
    """POST an aiortc offer to ``url``; the sizes of the first ``frames`` decoded pictures."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("video", direction="recvonly")
        track: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        pc.on("track", lambda t: track.done() or track.set_result(t))
        await pc.setLocalDescription(await pc.createOffer())
        async with http.post(url, data=pc.localDescription.sdp,
                             headers={"Content-Type": "application/sdp"}) as response:
            assert response.status == 201, await response.text()
            answer = await response.text()
        await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        remote = await asyncio.wait_for(track, 30)
        sizes = set()
        for _ in range(frames):
            frame = await asyncio.wait_for(remote.recv(), 30)
            sizes.add((frame.width, frame.height))
        return sizes
    finally:
        await pc.close()


def rtsp_sizes(url: str, frames: int = 10) -> set[tuple[int, int]]:
    """FFmpeg's RTSP client (TCP) decodes ``frames`` pictures of ``url`` (blocking)."""
    container = av.open(url, options={"rtsp_transport": "tcp", "timeout": "10000000"},
                        timeout=20)
    sizes = set()
    try:
        stream = container.streams.video[0]
        decoded = 0
        for packet in container.demux(stream):
            for frame in packet.decode():
                sizes.add((frame.width, frame.height))
                decoded += 1
            if decoded >= frames:
                break
    finally:
        container.close()
    return sizes


def jpeg_size(data: bytes) -> tuple[int, int]:
    """The picture size of a JPEG, decoded with FFmpeg's mjpeg decoder."""
    assert data.startswith(b"\xff\xd8")
    decoder = av.CodecContext.create("mjpeg", "r")
    frames = list(decoder.decode(av.Packet(data))) + list(decoder.decode(None))
    assert len(frames) == 1
    return frames[0].width, frames[0].height


async def problem(response: aiohttp.ClientResponse) -> str:
    assert response.content_type == "application/problem+json"
    return str((await response.json())["detail"])


async def test_both_renditions_decode_at_their_sizes(
        appliance: tuple[Appliance, str, int]) -> None:
    app, base, rtsp_port = appliance
    front = app.cameras.get("front")
    assert front is not None and front.sub is not None
    assert await front.pipeline.wait_first_frame(30) and await front.sub.wait_first_frame(30)
    async with aiohttp.ClientSession(headers=admin_of(app)) as http:
        # WHEP: the main stream, and the sub-stream by path, by query, and the default
        # camera's by query.
        assert await watch(http, f"{base}/whep/front") == {MAIN_SIZE}
        assert await watch(http, f"{base}/whep/front/sub") == {SUB_SIZE}
        assert await watch(http, f"{base}/whep/front?stream=sub") == {SUB_SIZE}
        assert await watch(http, f"{base}/whep?stream=sub") == {SUB_SIZE}
        assert await watch(http, f"{base}/whep/front/main") == {MAIN_SIZE}
        # RTSP: /front the main stream, /front/sub the sub-stream.
        rtsp = f"rtsp://127.0.0.1:{rtsp_port}"
        assert await asyncio.to_thread(rtsp_sizes, f"{rtsp}/front") == {MAIN_SIZE}
        assert await asyncio.to_thread(rtsp_sizes, f"{rtsp}/front/sub") == {SUB_SIZE}
        # Snapshots: a JPEG of each size.
        for path, size in (("/snapshot/front.jpg", MAIN_SIZE),
                           ("/snapshot/front.jpg?stream=sub", SUB_SIZE),
                           ("/snapshot.jpg?stream=sub", SUB_SIZE),
                           ("/snapshot.jpg", MAIN_SIZE)):
            for _ in range(100):
                async with http.get(base + path) as response:
                    status, kind, body = (response.status, response.content_type,
                                          await response.read())
                if status != 503:
                    break
                await asyncio.sleep(0.1)
            assert (status, kind) == (200, "image/jpeg"), path
            assert jpeg_size(body) == size, path
        # Status: the sub-stream's size, rate, bitrate, state; the other camera's reason.
        async with http.get(base + "/api/status") as response:
            rows = {row["name"]: row for row in (await response.json())["cameras"]}
        sub = rows["front"]["substream"]
        assert sub["enabled"] and sub["up"] and sub["problem"] is None
        assert (sub["width"], sub["height"], sub["framerate"]) == (*SUB_SIZE, 15)
        assert sub["configured_bitrate"] == 150_000 and sub["fps"] > 0 and sub["bitrate"] > 0
        assert (rows["front"]["width"], rows["front"]["height"]) == MAIN_SIZE
        assert rows["side"]["substream"] == {"enabled": False, "reason": "substream = false"}
        # Metrics: per-stream families carry stream="main"|"sub".
        async with http.get(base + "/metrics") as response:
            text = await response.text()
        for line in ('ruseon_camera_stream_up{camera="front",stream="sub"} 1.0',
                     'ruseon_camera_stream_up{camera="front",stream="main"} 1.0',
                     'ruseon_camera_stream_up{camera="side",stream="main"} 1.0'):
            assert line in text
        assert 'ruseon_camera_fps{camera="front",stream="sub"}' in text
        assert 'camera="side",stream="sub"' not in text


async def test_no_sub_stream_and_unknown_streams_are_404s_with_reasons(
        appliance: tuple[Appliance, str, int]) -> None:
    app, base, rtsp_port = appliance
    sdp = {"Content-Type": "application/sdp"}
    async with aiohttp.ClientSession(headers=admin_of(app)) as http:
        for url in (f"{base}/whep/side/sub", f"{base}/whep/side?stream=sub"):
            async with http.post(url, data="v=0\r\n", headers=sdp) as response:
                assert response.status == 404
                assert await problem(response) == (
                    "camera 'side' has no sub-stream: substream = false")
        for url in (f"{base}/whep/front/hd", f"{base}/whep?stream=hd",
                    f"{base}/whep/front?stream=hd"):
            async with http.post(url, data="v=0\r\n", headers=sdp) as response:
                assert response.status == 404
                assert "there is no stream 'hd'" in await problem(response)
        async with http.get(f"{base}/whep/front/sub") as response:
            assert response.status == 405 and response.headers["Allow"] == "OPTIONS, POST"
        async with http.get(f"{base}/snapshot/side.jpg?stream=sub") as response:
            assert response.status == 404 and "no sub-stream" in await problem(response)
        async with http.get(f"{base}/snapshot.jpg?stream=hd") as response:
            assert response.status == 404 and "no stream 'hd'" in await problem(response)
    # RTSP: DESCRIBE of a sub-stream there is not says why.
    reader, writer = await asyncio.open_connection("127.0.0.1", rtsp_port)
    try:
        writer.write(f"DESCRIBE rtsp://127.0.0.1:{rtsp_port}/side/sub RTSP/1.0\r\nCSeq: 1\r\n"
                     f"Authorization: Bearer {app.credentials.admin.value}\r\n\r\n".encode())
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode()
        length = int(head.lower().split("content-length:")[1].split()[0])
        body = (await asyncio.wait_for(reader.readexactly(length), 10)).decode()
    finally:
        writer.close()
    assert head.startswith("RTSP/1.0 404 ")
    assert body.strip() == "camera 'side' has no sub-stream: substream = false"
