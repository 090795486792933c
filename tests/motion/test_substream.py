"""Motion detection prefers the sub-stream (issue 29): where picamera2's lores feed is not used
and the camera has a sub-stream, the detector decodes the sub-stream's ring instead of the
main one. Real H.264 (libx264 from generated pictures, so the truth is known): the main stream
is a still 1280x720 scene and the sub-stream a 640x360 one with an object crossing, so an
event proves which ring was read; zones (picture fractions) give the same answers at both sizes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    StateConfig,
    WebRtcConfig,
)
from ruseon_appliance.motion.analyser import DecodeAnalyser
from ruseon_appliance.motion.detector import MotionSettings
from ruseon_appliance.motion.zones import Zone
from tests.engine.conftest import wait_for
from tests.motion.scenes import Scene, encode
from tests.substream import cameras_with_substreams
from tests.tooling import free_port

TOKEN = "motion-sub-admin-secret-0123456789"
MAIN, SUB = (1280, 720), (640, 360)
FPS = 15
LEFT_HALF = "0,0 0.5,0 0.5,1 0,1"


def clip(path: Path, render: Any, seconds: float, size: tuple[int, int]) -> Path:
    units = encode(render, seconds, width=size[0], height=size[1], fps=FPS, gop=FPS)
    path.write_bytes(b"".join(u.data for u in units))
    return path


async def test_the_detector_reads_the_sub_stream_and_finds_the_motion_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    still = clip(tmp_path / "main.h264", Scene(*MAIN).static(), 4, MAIN)
    crossing = clip(tmp_path / "sub.h264", Scene(*SUB).crossing(2.0, 3.0), 12, SUB)
    cameras_with_substreams(monkeypatch, names=["porch"], size=SUB, source=f"file:{crossing}")
    config = Config(
        cameras=(CameraConfig(name="porch", source=f"file:{still}", width=MAIN[0],
                              height=MAIN[1], framerate=FPS, keyframe_interval=FPS,
                              motion_off_delay_s=1.0, motion_include=(LEFT_HALF,)),),
        http=HttpConfig(listen=HostPort("127.0.0.1", free_port())),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        auth=AuthConfig(token=TOKEN),
        state=StateConfig(dir=str(tmp_path / "state")),
        hls=HlsConfig(enable=False),
    )
    app = Appliance(config)
    await app.start()
    base = f"http://127.0.0.1:{config.http.listen.port}"
    try:
        camera = app.cameras.get("porch")
        assert camera is not None and camera.motion is not None and camera.sub is not None
        assert camera.motion.ring is camera.sub.ring
        monitor = camera.motion
        await wait_for(lambda: monitor.stats()["events"] >= 1, timeout=40)
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            events: list[Any] = []
            for _ in range(200):  # listed once it is stored (it ends 1 s after the object left)
                async with http.get(f"{base}/api/events?camera=porch") as response:
                    events = (await response.json())["events"]
                if events:
                    break
                await asyncio.sleep(0.1)
            async with http.get(f"{base}/api/status") as response:
                motion = (await response.json())["motion"]["porch"]
        assert motion["path"] == "decode" and motion["stream"] == "sub", motion
        assert motion["picture"] == list(SUB), motion  # not the main stream's 1280x720
        assert motion["decode_errors"] == 0 and motion["analysed"] > 10, motion
        assert events and events[0]["camera"] == "porch", events
    finally:
        await app.stop()


def events_of(size: tuple[int, int], zones: tuple[Zone, ...]) -> list[tuple[str, float]]:
    """(kind, seconds) of each start/end the detector finds in an object crossing the left
    half of the picture at ``size``."""
    scene = Scene(*size).crossing(1.0, 2.0, x0=0.08, x1=0.4)
    analyser = DecodeAnalyser(MotionSettings(off_delay_s=1.0, zones=zones))
    for unit in encode(scene, 5, width=size[0], height=size[1], fps=FPS, gop=FPS):
        analyser.feed(unit.data, unit.keyframe, unit.capture_time_us)
    analyser.finish()
    assert analyser.picture == size
    return [(t.kind, t.at) for t in analyser.transitions if t.kind != "peak"]


@pytest.mark.parametrize("include", [True, False])
def test_zones_give_the_same_answer_on_the_main_and_the_sub_stream(include: bool) -> None:
    zones = (Zone.parse(LEFT_HALF, include=include),)
    main, sub = events_of(MAIN, zones), events_of(SUB, zones)
    assert [k for k, _ in main] == [k for k, _ in sub] == (
        ["started", "ended"] if include else [])
    for (_, t_main), (_, t_sub) in zip(main, sub, strict=True):
        assert abs(t_main - t_sub) <= 0.25  # within a few analysed frames
