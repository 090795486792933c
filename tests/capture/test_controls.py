"""Camera controls on the Pi sources: picamera2 applies them live through ``set_controls`` (flips
and size reconfigure the camera), rpicam-vid is restarted with new arguments; frames keep flowing
into the same ring either way."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from ruseon_appliance.capture.controls import (
    CONTROLS_FILE,
    CameraControls,
    ControlError,
    ControlRejected,
)
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


async def test_rpicam_refusing_new_values_rolls_back_and_saves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: a control change whose restart fails left the camera stopped, and rpicam saved
    the values first, so a refused value crash-looped on every boot. Now the new rpicam-vid
    must deliver a frame before anything is kept: this one refuses 1280x720 (as a sensor
    without that mode does), so the old arguments come back and run, the change is refused
    with rpicam-vid's words, and the values file still holds what was there."""
    camera = fake_rpicam_camera(tmp_path, monkeypatch, FAKE_RPICAM_REJECT="--width=1280")
    source = RpicamSource(camera)
    pipeline = CapturePipeline(camera, source=source)
    controls = CameraControls(source, camera, tmp_path)
    await pipeline.start()
    try:
        await frames_flow(pipeline)
        assert await controls.update({"brightness": 0.3})  # accepted: a restart, then saved
        await controls.flush()
        saved = (tmp_path / CONTROLS_FILE).read_bytes()
        with pytest.raises(ControlRejected) as refused:
            await controls.update({"resolution": "1280x720"})
        assert "exited with status 255" in str(refused.value)
        assert "--width 1280 not supported" in str(refused.value)
        assert "the previous values are back" in str(refused.value)
        await frames_flow(pipeline)  # running again, with the old values
        await controls.flush()
        assert (tmp_path / CONTROLS_FILE).read_bytes() == saved
        assert controls.values["resolution"] == "320x240" and controls.values["brightness"] == 0.3
        starts = (tmp_path / "starts.log").read_text().splitlines()
        # First, brightness, the refused size (twice when the supervisor's back-off ran out
        # before the refusal was seen, on a loaded machine), then the old values again.
        assert len(starts) in (4, 5), starts
        assert all("--width 1280" in start for start in starts[2:-1]), starts
        assert "--width 320" in starts[-1] and "--brightness 0.3" in starts[-1]
        assert source.stats()["controls_rejected"] == 1
        assert pipeline.stats()["running"]
    finally:
        await pipeline.stop()


async def test_picamera_refusing_a_size_rolls_back(tmp_path: Path) -> None:
    """The picamera2 path: libcamera refuses the configuration; the camera is reopened with the
    previous size and delivers again, and the change is refused with libcamera's words."""
    camera = dataclasses.replace(CAMERA, source="picamera", keyframe_request_interval_ms=0)
    source = PicameraSource(camera, api=stand_in.make_api())
    pipeline = CapturePipeline(camera, source=source)
    controls = CameraControls(source, camera, tmp_path)
    monkey = stand_in.Picamera2.refused_sizes
    monkey.add((1280, 720))
    await pipeline.start()
    try:
        await frames_flow(pipeline)
        with pytest.raises(ControlRejected, match="no sensor mode for"):
            await controls.update({"resolution": "1280x720"})
        await frames_flow(pipeline)
        assert stand_in.Picamera2.instances[-1].config["main"]["size"] == (320, 240)
        assert controls.values["resolution"] == "320x240"
        assert not (tmp_path / CONTROLS_FILE).exists()
    finally:
        monkey.discard((1280, 720))
        await pipeline.stop()
