"""A camera whose source fails at start (here the first one: its file is missing) does not stop
the others: start-up reaches READY, status and /healthz say which camera is down and why, and it
is retried until it works."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import aiohttp

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    CameraConfig,
    Config,
    HostPort,
    HttpConfig,
    StateConfig,
    WebRtcConfig,
)
from tests.capture.conftest import CAM_STREAM
from tests.tooling import free_port


async def test_a_camera_failing_at_start_is_retried_while_the_others_serve(
        tmp_path: Path) -> None:
    missing = tmp_path / "later.h264"
    cameras = (
        CameraConfig(name="door", source=f"file:{missing}", framerate=30),
        CameraConfig(name="yard", source="synthetic", width=160, height=96, framerate=30,
                     keyframe_interval=30, bitrate=200_000),
    )
    port = free_port()
    app = Appliance(Config(
        cameras=cameras, http=HttpConfig(listen=HostPort("127.0.0.1", port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state"))))
    await app.start()  # READY although the first camera cannot start
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/api/cameras") as response:
                rows = {r["name"]: r for r in (await response.json())["cameras"]}
            assert rows["door"]["up"] is False and rows["door"]["start_failures"] >= 1
            assert "failed to start" in rows["door"]["problem"]
            async with http.get(f"{base}/healthz") as response:
                assert response.status == 200
                assert "degraded" in (text := await response.text()) and "door" in text
            async with http.get(f"{base}/snapshot/yard.jpg") as response:
                assert response.status == 200  # the other camera serves

            shutil.copy(CAM_STREAM, missing)  # the camera comes back: the retry starts it
            for _ in range(240):  # a bound for a broken run; the retry is 2 s, then 4 s
                async with http.get(f"{base}/api/cameras") as response:
                    rows = {r["name"]: r for r in (await response.json())["cameras"]}
                if rows["door"]["up"]:
                    break
                await asyncio.sleep(0.25)
            assert rows["door"]["up"] is True and rows["door"]["problem"] is None, rows["door"]
            async with http.get(f"{base}/healthz") as response:
                assert response.status == 200 and "degraded" not in await response.text()
    finally:
        await app.stop()
