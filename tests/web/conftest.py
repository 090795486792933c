"""Fixtures for web tests: the real synthetic capture pipeline, the real engine on a loopback UDP
port, the aiohttp app in front of them, and real aiortc viewers.

Everything binds and advertises 127.0.0.1 only. aioice leaves 127.0.0.1 out of the host
candidates it gathers, which in the test bench's loopback-only namespace would leave a client with
none at all, so client peers are told to gather exactly 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aioice.ice
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.rtcrtpreceiver import RTCRtpReceiver

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.config import AuthConfig, CameraConfig, Config, HostPort, WebRtcConfig
from ruseon_appliance.engine.engine import Engine
from ruseon_appliance.web.app import make_app

# Small and quick: the web tests are about HTTP, not picture quality.
SOURCE_WIDTH, SOURCE_HEIGHT, SOURCE_FPS = 320, 240, 30
# The admin secret of every test device (auth.token), and the header that presents it.
ADMIN_SECRET = "test-admin-secret-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_SECRET}"}


def web_config(**sections: dict[str, Any]) -> Config:
    """A Config bound to loopback with a small synthetic source and :data:`ADMIN_SECRET` as the
    admin secret; ``sections`` override fields."""
    config = Config(
        auth=AuthConfig(token=ADMIN_SECRET),
        cameras=(CameraConfig(
            source="synthetic", width=SOURCE_WIDTH, height=SOURCE_HEIGHT, framerate=SOURCE_FPS,
            keyframe_interval=30,
        ),),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
    )
    for name, values in sections.items():
        if name == "camera":  # the one camera's settings
            config = dataclasses.replace(
                config, cameras=(dataclasses.replace(config.cameras[0], **values),))
            continue
        config = dataclasses.replace(
            config, **{name: dataclasses.replace(getattr(config, name), **values)}
        )
    return config


@pytest.fixture(autouse=True)
def loopback_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Client peers gather one host candidate, 127.0.0.1 (see the module docstring)."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


@contextlib.asynccontextmanager
async def running_engine(
    config: Config, tmp_path: Path
) -> AsyncIterator[tuple[CapturePipeline, Engine]]:
    """Capture (first frame seen) and the engine, started; stopped on exit."""
    capture = CapturePipeline(config.default_camera)
    await capture.start()
    engine = Engine(config.webrtc, tmp_path, capture)
    try:
        assert await capture.wait_first_frame(20), "the synthetic source produced no frame"
        await engine.start()
        yield capture, engine
    finally:
        await engine.stop()
        await capture.stop()


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[TestClient[Any, Any]]:
    """``app`` on a real loopback HTTP server, and a client for it; closed on exit."""
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def running_device(
    config: Config, tmp_path: Path
) -> AsyncIterator[tuple[CapturePipeline, Engine, TestClient[Any, Any]]]:
    """Capture, engine and the web app in front of them, all started; stopped on exit."""
    async with (
        running_engine(config, tmp_path) as (capture, engine),
        serving(make_app(config, engine, capture, started=time.monotonic())) as client,
    ):
        yield capture, engine, client


@pytest.fixture
async def device(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[CapturePipeline, Engine, TestClient[Any, Any]]]:
    """A running device; parametrize indirectly with a dict of config sections to override."""
    overrides: dict[str, dict[str, Any]] = getattr(request, "param", {})
    async with running_device(web_config(**overrides), tmp_path) as running:
        yield running


class Viewer:
    """A real aiortc receive-only peer, as a WHEP client would be."""

    def __init__(self, *, codecs: list[str] | None = None) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.transceiver = self.pc.addTransceiver("video", direction="recvonly")
        if codecs is not None:
            capabilities = RTCRtpReceiver.getCapabilities("video").codecs
            self.transceiver.setCodecPreferences(
                [c for c in capabilities if c.mimeType in codecs]
            )
        self.track: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pc.on("track", self._on_track)

    def _on_track(self, track: Any) -> None:
        if not self.track.done():
            self.track.set_result(track)

    async def offer(self) -> str:
        """Create the offer (gathering completes first in aiortc)."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return str(self.pc.localDescription.sdp)

    async def accept(self, answer: str) -> None:
        """Apply the server's answer."""
        await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))

    async def close(self) -> None:
        """Close the peer."""
        await self.pc.close()


@pytest.fixture
async def viewers() -> AsyncIterator[list[Viewer]]:
    """A list to put viewers in; every one is closed at the end."""
    made: list[Viewer] = []
    yield made
    for viewer in made:
        await viewer.close()


async def new_offer(
    viewers: list[Viewer], *, codecs: list[str] | None = None
) -> tuple[Viewer, str]:
    """A fresh viewer and its offer."""
    viewer = Viewer(codecs=codecs)
    viewers.append(viewer)
    return viewer, await viewer.offer()


def admin_of(appliance: Any) -> dict[str, str]:
    """The header that presents a running :class:`~ruseon_appliance.app.Appliance`'s admin
    secret (its ``[auth] token``, or the one it generated in its state dir)."""
    return {"Authorization": f"Bearer {appliance.credentials.admin.value}"}
