"""Several cameras on one engine, through the real appliance (``app.Appliance``).

Three cameras of different sizes: two synthetic ones (their pictures carry a stamped frame
counter) and a stand-in ``rpicam-vid`` replaying a recording. Viewers are real aiortc peers on
loopback that decode what they receive.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import itertools
import os
import shlex
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aioice.ice
import av
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from ruseon_appliance.app import Appliance
from ruseon_appliance.capture.sources.rpicam import RpicamSource
from ruseon_appliance.capture.stamp import read_stamp
from ruseon_appliance.config import (
    CameraConfig,
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    RelayConfig,
    StateConfig,
    WebRtcConfig,
)
from ruseon_appliance.relay import parameter_sets
from ruseon_appliance.systemd_integration import frames_flowing
from tests.capture.conftest import CAM_STREAM
from tests.capture.test_sources import FAKE_RPICAM
from tests.tooling import free_port
from tests.web.conftest import admin_of

# name -> (width, height); "back" is the rpicam stand-in replaying CAM_STREAM (320x240).
SIZES = {"front": (256, 144), "side": (160, 96), "back": (320, 240)}
STAMPED = ("front", "side")


@pytest.fixture(autouse=True)
def loopback_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Client peers gather 127.0.0.1 only (aioice leaves loopback out by default)."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


@dataclass
class Viewer:
    """A WHEP viewer of one camera: every decoded frame's size and stamped frame number."""

    camera: str
    pc: RTCPeerConnection = field(default_factory=lambda: RTCPeerConnection(
        RTCConfiguration(iceServers=[])))
    sizes: set[tuple[int, int]] = field(default_factory=set)
    numbers: list[int] = field(default_factory=list)
    decoded: int = 0
    answer: str = ""
    session_id: str = ""
    task: asyncio.Task[None] | None = None

    async def connect(self, http: aiohttp.ClientSession, base: str) -> None:
        self.pc.addTransceiver("video", direction="recvonly")
        track: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pc.on("track", lambda t: track.done() or track.set_result(t))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with http.post(f"{base}/whep/{self.camera}", data=self.pc.localDescription.sdp,
                             headers={"Content-Type": "application/sdp"}) as response:
            assert response.status == 201, await response.text()
            self.answer = await response.text()
            self.session_id = response.headers["Location"].rsplit("/", 1)[-1]
        await self.pc.setRemoteDescription(RTCSessionDescription(self.answer, "answer"))
        self.task = asyncio.create_task(self._consume(await asyncio.wait_for(track, 30)))

    async def _consume(self, track: Any) -> None:
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            self.decoded += 1
            self.sizes.add((frame.width, frame.height))
            if self.camera in STAMPED:
                stamp = read_stamp(frame)
                assert stamp is not None, f"{self.camera}: a frame without a readable stamp"
                self.numbers.append(stamp[1])

    async def close(self) -> None:
        await self.pc.close()
        if self.task is not None:
            self.task.cancel()


def fingerprints(answer: str) -> frozenset[str]:
    lines = frozenset(ln for ln in answer.splitlines() if ln.startswith("a=fingerprint:"))
    assert lines
    return lines


def candidate_port(answer: str) -> int:
    ports = {int(ln.split()[5]) for ln in answer.splitlines() if ln.startswith("a=candidate:")}
    assert len(ports) == 1, ports
    return ports.pop()


def missed(numbers: list[int]) -> int:
    """Frame numbers a viewer's stamped sequence skipped (a repeat or a step back counts too)."""
    return sum(b - a - 1 if b > a else 1 for a, b in itertools.pairwise(numbers) if b != a + 1)


def assert_no_frame_missed(app: Appliance, viewer: Viewer) -> None:
    """Every frame the camera made while the viewer watched was decoded, but for the ones the
    camera or the engine says it skipped: the synthetic source skips a frame number only when a
    busy machine made it late (its frames_late), and a viewer whose join found the cached
    keyframe too old for a catch-up burst gets that keyframe, then skips the stale frames after
    it until a fresh IDR (the session's frames_skipped: seen as [0, 24, 25, ...] when a loaded
    machine made the join late)."""
    camera = app.cameras.get(viewer.camera)
    assert camera is not None and app.engine is not None
    late = camera.pipeline.source.stats()["frames_late"]
    session = app.engine.sessions.get(viewer.session_id)
    assert session is not None, viewer.session_id
    stats = session.stats()
    assert missed(viewer.numbers) <= late + stats["frames_skipped"], (
        viewer.camera, viewer.numbers[:80], late, stats["frames_skipped"], stats["join_mode"])


async def wait_until(predicate: Any, timeout: float = 60.0, what: str = "") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def hls_size(http: aiohttp.ClientSession, base: str) -> tuple[int, int]:
    """The picture size of the first part an HLS playlist lists (init segment + part)."""
    for _ in range(200):  # a bound for a broken run; the window fills within seconds
        async with http.get(base + "index.m3u8") as response:
            assert response.status == 200, await response.text()
            text = await response.text()
        init = [ln.split('"')[1] for ln in text.splitlines() if ln.startswith("#EXT-X-MAP")]
        parts = [ln.split('URI="')[1].split('"')[0] for ln in text.splitlines()
                 if ln.startswith("#EXT-X-PART:") and "INDEPENDENT=YES" in ln]
        if init and parts:
            break
        await asyncio.sleep(0.25)
    data = b""
    for name in (init[0], parts[0]):
        async with http.get(base + name) as response:
            assert response.status == 200
            data += await response.read()
    with av.open(io.BytesIO(data)) as container:
        frame = next(container.decode(video=0))
        return frame.width, frame.height


@pytest.fixture
async def appliance(tmp_path: Path) -> AsyncIterator[tuple[Appliance, str, Path]]:
    relay_target = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    relay_target.bind(("127.0.0.1", 0))
    relay_target.setblocking(False)
    unplugged = tmp_path / "back-unplugged"
    fake = (f"env FAKE_RPICAM_STREAM={shlex.quote(str(CAM_STREAM))} "
            f"FAKE_RPICAM_UNPLUGGED={shlex.quote(str(unplugged))} "
            f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_RPICAM))}")
    common: dict[str, Any] = {"framerate": 30, "keyframe_interval": 30, "bitrate": 300_000}
    cameras = (
        CameraConfig(name="front", source="synthetic", width=256, height=144, **common),
        CameraConfig(name="side", source="synthetic", width=160, height=96, **common),
        CameraConfig(name="back", source="rpicam:1", width=320, height=240,
                     rpicam_command=fake, **common),
    )
    port = free_port()
    config = Config(
        cameras=cameras,
        http=HttpConfig(listen=HostPort("127.0.0.1", port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        hls=HlsConfig(part_duration_s=0.5, window_s=6.0),
        # A relay of the second camera (relays default to the first).
        relay=(RelayConfig(name="side-out", camera="side",
                           url=f"rtp://127.0.0.1:{relay_target.getsockname()[1]}"),),
    )
    app = Appliance(config)
    await app.start()
    app.relay_target = relay_target  # type: ignore[attr-defined]
    try:
        yield app, f"http://127.0.0.1:{port}", unplugged
    finally:
        await app.stop()
        relay_target.close()


async def test_each_camera_streams_its_own_picture_on_one_port_and_one_certificate(
        appliance: tuple[Appliance, str, Path]) -> None:
    app, base, _ = appliance
    assert app.engine is not None
    viewers = [Viewer(name) for name in SIZES]
    async with aiohttp.ClientSession(headers=admin_of(app)) as http:
        try:
            for viewer in viewers:
                await viewer.connect(http, base)

            async def enough() -> bool:
                return all(v.decoded >= 45 for v in viewers)

            await wait_until(enough, what="45 decoded frames from every camera")
            for viewer in viewers:
                assert viewer.sizes == {SIZES[viewer.camera]}, viewer.camera
                if viewer.camera in STAMPED:
                    assert_no_frame_missed(app, viewer)
            # One engine: every answer has the same certificate and the one UDP port.
            assert len({fingerprints(v.answer) for v in viewers}) == 1
            assert {candidate_port(v.answer) for v in viewers} == {app.engine.udp_port}

            async with http.get(f"{base}/api/status") as response:
                status = await response.json()
            rows = {row["name"]: row for row in status["cameras"]}
            assert list(rows) == list(SIZES)
            for name, (width, height) in SIZES.items():
                assert rows[name]["up"] and rows[name]["viewers"] == 1
                assert (rows[name]["width"], rows[name]["height"]) == (width, height)
            assert rows["back"]["kind"] == "rpicam"

            async with http.get(f"{base}/snapshot/side.jpg") as response:
                assert response.status == 200
                jpeg = await response.read()
            with av.open(io.BytesIO(jpeg)) as picture:
                frame = next(picture.decode(video=0))
                assert (frame.width, frame.height) == SIZES["side"]

            async with http.post(f"{base}/whep/nope", data=viewers[0].pc.localDescription.sdp,
                                 headers={"Content-Type": "application/sdp"}) as response:
                assert response.status == 404
                assert "front, side, back" in (await response.json())["detail"]
            # Every per-camera route: an unknown camera is a 404 listing the names.
            for method, path in (("GET", "/snapshot/nope.jpg"), ("GET", "/hls/nope/index.m3u8"),
                                 ("GET", "/hls/nope/part0.m4s"),
                                 ("GET", "/api/camera/nope/controls"),
                                 ("PATCH", "/api/camera/nope/controls"),
                                 ("GET", "/recordings/list?path=nope")):
                async with http.request(method, base + path, json={}) as response:
                    assert response.status == 404, path
                    assert "front, side, back" in (await response.json())["detail"], path

            # HLS per camera under /hls/<camera>/ (and /hls/ is the first camera's).
            for name, path in (("side", "/hls/side/"), ("front", "/hls/")):
                assert await hls_size(http, base + path) == SIZES[name]
                if name == "side":  # every camera's HLS requests count in status and metrics
                    async with http.get(f"{base}/api/status") as response:
                        assert sum((await response.json())["hls"]["requests"].values()) >= 2

            # The relay names its camera: its SDP carries that camera's SPS, its RTP arrives.
            async with http.get(f"{base}/relay/side-out.sdp") as response:
                sdp = await response.text()
            side = app.cameras.get("side")
            assert side is not None
            sets = parameter_sets(side.pipeline.ring)
            assert sets is not None and base64.b64encode(sets[0]).decode() in sdp
            received = 0
            with contextlib.suppress(BlockingIOError):
                while app.relay_target.recv(2048):  # type: ignore[attr-defined]
                    received += 1
            assert received > 10

            # Recording per camera: ?path=<camera> (mediamtx's stream name) picks it.
            async with http.post(f"{base}/api/recording/start?path=side&preroll=1") as response:
                assert response.status == 200 and (await response.json())["started"]
            await asyncio.sleep(1.5)
            async with http.post(f"{base}/api/recording/stop?path=side") as response:
                assert (await response.json())["stopped"]
            async with http.get(f"{base}/recordings/list?path=side") as response:
                (clip,) = await response.json()
            async with http.get(f"{base}/recordings/list") as response:
                assert await response.json() == []  # the first camera recorded nothing
            async with http.get(base + clip["url"]) as response:
                assert response.status == 200
                mp4 = await response.read()
            with av.open(io.BytesIO(mp4)) as container:
                frame = next(container.decode(video=0))
                assert (frame.width, frame.height) == SIZES["side"]
            async with http.get(f"{base}/recordings/list?path=nope") as response:
                assert response.status == 404

            # Controls per camera: a change to one leaves the others as they were.
            async with http.patch(f"{base}/api/camera/side/controls",
                                  json={"brightness": 0.3}) as response:
                assert response.status == 200, await response.text()
            async with http.get(f"{base}/api/camera/side/controls") as response:
                assert (await response.json())["controls"]["brightness"]["value"] == 0.3
            async with http.get(f"{base}/api/camera/controls") as response:  # the first's
                assert (await response.json())["controls"]["brightness"]["value"] == 0.0
            async with http.get(f"{base}/api/camera/nope/controls") as response:
                assert response.status == 404

            async with http.get(f"{base}/metrics") as response:
                metrics = await response.text()
            for name in SIZES:
                assert f'ruseon_camera_up{{camera="{name}"}} 1.0' in metrics
                assert f'ruseon_camera_viewers{{camera="{name}"}} 1.0' in metrics
        finally:
            for viewer in viewers:
                await viewer.close()


async def test_a_camera_that_dies_fails_alone_and_comes_back(
        appliance: tuple[Appliance, str, Path]) -> None:
    """The rpicam child is killed and the camera stays unplugged for a while: its viewer gets
    nothing and status/health name it; the other cameras' viewers never miss a frame; once it
    is back its viewer decodes its picture again on the same session."""
    app, base, unplugged = appliance
    back = app.cameras.get("back")
    assert back is not None
    source = back.pipeline.source
    viewers = [Viewer("front"), Viewer("back")]
    front_viewer, back_viewer = viewers
    async with aiohttp.ClientSession(headers=admin_of(app)) as http:
        try:
            for viewer in viewers:
                await viewer.connect(http, base)

            async def flowing() -> bool:
                return front_viewer.decoded >= 15 and back_viewer.decoded >= 15

            await wait_until(flowing, what="both viewers decoding")

            async def status() -> dict[str, Any]:
                async with http.get(f"{base}/api/status") as response:
                    return {row["name"]: row for row in (await response.json())["cameras"]}

            events: list[tuple[str, Any]] = []
            app.events.subscribe(lambda event: events.append((event.name, event.data)))
            unplugged.touch()
            assert isinstance(source, RpicamSource) and source._proc is not None
            os.kill(source._proc.pid, signal.SIGKILL)

            async def back_down() -> bool:
                return not (await status())["back"]["up"]

            await wait_until(back_down, what="the back camera reported down")
            async with http.get(f"{base}/healthz") as response:
                assert response.status == 200  # two of three cameras still deliver
                health = await response.text()
            assert health.startswith("degraded: 1 of 3 cameras down: back: no frame")
            assert frames_flowing(app.cameras.newest_frame_monotonic)()  # the watchdog's check
            rows = await status()
            assert rows["front"]["up"] and rows["side"]["up"]
            stalled_at = back_viewer.decoded
            await asyncio.sleep(1.0)
            assert back_viewer.decoded == stalled_at  # nothing comes while it is unplugged

            unplugged.unlink()

            async def back_again() -> bool:
                return back_viewer.decoded >= stalled_at + 15 and (await status())["back"]["up"]

            await wait_until(back_again, what="the back camera's viewer decoding again")
            assert back_viewer.sizes == {SIZES["back"]}
            # Webhooks and MQTT hear of it, naming the camera.
            stalls = [(n, d["camera"]) for n, d in events if n.startswith("camera_")]
            assert ("camera_stalled", "back") in stalls
            async with http.get(f"{base}/healthz") as response:
                assert response.status == 200 and await response.text() == "ok\n"
            assert front_viewer.sizes == {SIZES["front"]}
            assert_no_frame_missed(app, front_viewer)
            assert len(front_viewer.numbers) > 60
        finally:
            for viewer in viewers:
                await viewer.close()
