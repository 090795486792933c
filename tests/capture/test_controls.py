"""Camera controls on the Pi sources: picamera2 applies them live through ``set_controls`` (flips
and size reconfigure the camera), rpicam-vid is restarted with new arguments; frames keep flowing
into the same ring either way."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from ruseon_appliance.capture.controls import CameraControls, ControlError
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.sources.picamera import PicameraSource
from ruseon_appliance.capture.sources.rpicam import RpicamSource

from . import picamera2_stand_in as stand_in
from .test_sources import CAMERA, fake_rpicam_camera


async def frames_flow(pipeline: CapturePipeline, count: int = 5) -> None:
    """``count`` new frames arrive in the ring."""
    reader = pipeline.ring.reader("next")
    try:
        for _ in range(count):
            await asyncio.wait_for(reader.next(), 20)
    finally:
        reader.close()


async def test_picamera_controls_live_and_by_reconfiguring(tmp_path: Path) -> None:
    camera = dataclasses.replace(CAMERA, source="picamera", keyframe_request_interval_ms=0)
    source = PicameraSource(camera, api=stand_in.make_api())
    pipeline = CapturePipeline(camera, source=source)
    controls = CameraControls(source, camera, tmp_path)
    await pipeline.start()
    try:
        await frames_flow(pipeline)
        cam = stand_in.Picamera2.instances[-1]
        assert await controls.update({"brightness": 0.25, "exposure_us": 8000}) is False
        sent = cam.set_controls_calls[-1]
        assert sent["Brightness"] == 0.25 and sent["ExposureTime"] == 8000
        assert not cam.auto_exposure and cam.auto_gain
        # Back to automatic exposure and neutral brightness.
        assert await controls.update({"brightness": None, "exposure_us": 0}) is False
        sent = cam.set_controls_calls[-1]
        assert sent["Brightness"] == 0.0 and "ExposureTime" not in sent and sent["AeEnable"]
        # A flip needs the camera reconfigured: a new Picamera2, frames go on in the same ring.
        assert await controls.update({"hflip": True}) is True
        assert stand_in.Picamera2.instances[-1] is not cam and cam.closed
        assert stand_in.Picamera2.instances[-1].config["transform"].hflip == 1
        await frames_flow(pipeline)
        with pytest.raises(ControlError, match="unknown control 'zoom'"):
            controls.validate({"sharpness": 2.0, "zoom": 1})
    finally:
        await pipeline.stop()


async def test_rpicam_control_restarts_the_child_with_new_arguments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    camera = fake_rpicam_camera(tmp_path, monkeypatch)
    source = RpicamSource(camera)
    pipeline = CapturePipeline(camera, source=source)
    controls = CameraControls(source, camera, tmp_path)
    assert controls.describe()["controls"]["brightness"]["live"] is False
    await pipeline.start()
    try:
        await frames_flow(pipeline)
        assert await controls.update({"brightness": 0.3, "vflip": True, "bitrate": 1_000_000})
        await frames_flow(pipeline)
        starts = (tmp_path / "starts.log").read_text().splitlines()
        assert len(starts) == 2 and source.stats()["control_restarts"] == 1
        assert "--brightness 0.3" in starts[-1] and "--vflip" in starts[-1]
        assert "--bitrate 1000000" in starts[-1] and starts[-1].endswith("-o -")
        assert source.stats()["crashes"] == 0
        # The same values again: nothing to restart.
        assert await controls.update({"brightness": 0.3}) is False
    finally:
        await pipeline.stop()
