"""The default camera is routing only: ``http.default_camera`` moves every unnamed route (the
page's /whep, /snapshot.jpg, /api/camera/controls, /api/status ``source``) to the camera it
names, the others stay reachable by name, and a name that is not a camera stops start-up."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from pathlib import Path

import aiohttp
import av
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    CameraConfig,
    ConfigError,
    HostPort,
    RtspConfig,
    StateConfig,
    validate,
)
from tests.tooling import free_port
from tests.web.conftest import ADMIN, web_config


def decode_size(url: str) -> tuple[int, int]:
    """The size of the first picture FFmpeg's RTSP client decodes from ``url`` (blocking)."""
    with av.open(url, options={"rtsp_transport": "tcp"}, timeout=20) as container:
        frame = next(container.decode(video=0))
        return int(frame.width), int(frame.height)


def jpeg_width(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return int(next(container.decode(video=0)).width)


def two_cameras(tmp_path: Path, default: str) -> Appliance:
    config = web_config()
    config = dataclasses.replace(
        config,
        cameras=(CameraConfig(name="front", source="synthetic", width=320, height=240,
                              keyframe_interval=30),
                 CameraConfig(name="yard", source="synthetic", width=160, height=96,
                              keyframe_interval=30)),
        http=dataclasses.replace(config.http, default_camera=default),
        rtsp=RtspConfig(enable=True, listen=HostPort("127.0.0.1", free_port())),
        state=StateConfig(dir=str(tmp_path / "state")))
    validate(config)
    return Appliance(config)


async def test_the_unnamed_routes_serve_the_configured_default_camera(tmp_path: Path) -> None:
    appliance = two_cameras(tmp_path, "yard")
    assert appliance.cameras.default.name == "yard"
    await appliance.start()
    base = f"http://127.0.0.1:{appliance.config.http.listen.port}"
    try:
        async with aiohttp.ClientSession(headers=ADMIN) as http:
            async with http.get(f"{base}/snapshot.jpg") as resp:
                assert resp.status == 200
                assert jpeg_width(await resp.read()) == 160  # the yard camera's picture
            async with http.get(f"{base}/snapshot/front.jpg") as resp:
                assert jpeg_width(await resp.read()) == 320  # the other, by name
            async with http.get(f"{base}/api/status") as resp:
                status = await resp.json()
            assert status["source"]["width"] == 160
            async with http.patch(f"{base}/api/camera/controls",
                                  json={"brightness": 0.5}) as resp:
                assert resp.status == 200, await resp.text()
        yard, front = appliance.cameras.resolve("yard"), appliance.cameras.resolve("front")
        assert yard is not None and front is not None
        assert yard.controls is not None and front.controls is not None
        assert yard.controls.values["brightness"] == 0.5
        assert front.controls.values["brightness"] == 0.0
        # RTSP's unnamed path too (FFmpeg's client, as an NVR would open it).
        rtsp = f"rtsp://127.0.0.1:{appliance.config.rtsp.listen.port}"
        heard = await asyncio.to_thread(decode_size, f"{rtsp}/stream")
        assert heard == (160, 96)
        assert await asyncio.to_thread(decode_size, f"{rtsp}/front") == (320, 240)
    finally:
        await appliance.stop()


def test_a_default_camera_that_is_not_a_camera_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"http\.default_camera"):
        two_cameras(tmp_path, "garage")
