"""The picamera2 path: the ISP's lores Y plane (the stand-in scales the same pictures it
encodes) analysed without any decode, through the camera's ``post_callback``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.sources.picamera import PicameraSource
from ruseon_appliance.config import CameraConfig
from ruseon_appliance.motion.detector import MotionSettings
from ruseon_appliance.motion.monitor import MotionMonitor
from tests.capture import picamera2_stand_in as stand_in
from tests.motion.scenes import Scene

W, H, FPS = 640, 360, 30


async def test_a_crossing_seen_on_the_lores_plane_without_decoding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    render = Scene(W, H).crossing(1.0, 2.0)
    monkeypatch.setattr(stand_in.Picamera2, "scene", lambda n: render(n, n / FPS))
    camera = CameraConfig(source="picamera", width=W, height=H, framerate=FPS, bitrate=500_000,
                          keyframe_interval=30)
    source = PicameraSource(camera, api=stand_in.make_api())
    assert source.offers_lores  # motion is on by default
    pipeline = CapturePipeline(camera, source=source)
    events: list[tuple[str, dict[str, Any]]] = []
    monitor = MotionMonitor(pipeline.ring, MotionSettings(off_delay_s=1.0), camera="cam",
                            publish=lambda name, **data: events.append((name, data)),
                            lores=source)
    await monitor.start()
    await pipeline.start()
    try:
        picam2 = stand_in.Picamera2.instances[-1]
        assert picam2.config["lores"] == {"size": (320, 240), "format": "YUV420"}
        async with asyncio.timeout(30):
            while [name for name, _ in events] != ["motion_started", "motion_ended"]:
                await asyncio.sleep(0.05)
    finally:
        await pipeline.stop()
        await monitor.stop()
    stats = monitor.stats()
    assert stats["path"] == "lores" and stats["decoded"] == 0 and stats["analysed"] >= 30
    (_, started), (_, ended) = events
    assert ended["event_id"] == started["event_id"]
    assert 1.5 <= ended["end"] - ended["start"] <= 2.5  # the 2 s crossing, on the camera's clock
    assert source.lores_sink is None  # let go on stop


def test_no_lores_stream_without_motion() -> None:
    camera = CameraConfig(source="picamera", width=W, height=H, motion=False)
    assert not PicameraSource(camera, api=stand_in.make_api()).offers_lores
    small = CameraConfig(source="picamera", width=160, height=120)
    assert PicameraSource(small, api=stand_in.make_api()).lores_size == (160, 120)
