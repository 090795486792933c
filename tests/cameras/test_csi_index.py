"""Two CSI cameras on one board (a Pi 5 has two connectors): ``picamera:N`` opens
``Picamera2(N)`` and ``rpicam:N`` runs ``rpicam-vid --camera N``; both cameras deliver at once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.sources.picamera import PicameraSource
from ruseon_appliance.capture.sources.rpicam import RpicamSource
from ruseon_appliance.config import validate_camera
from tests.capture import picamera2_stand_in as stand_in
from tests.capture.test_sources import (
    CAMERA,
    assert_decodable_sequence,
    fake_rpicam_camera,
    read_frames,
)


async def test_picamera_sources_open_their_own_sensor() -> None:
    api = stand_in.make_api()
    pipelines = []
    for index in (0, 1):
        camera = dataclasses.replace(CAMERA, name=f"csi{index}", source=f"picamera:{index}")
        validate_camera(camera)
        pipelines.append(CapturePipeline(camera, source=PicameraSource(camera, api=api)))
    before = len(stand_in.Picamera2.instances)
    try:
        for pipeline in pipelines:
            await pipeline.start()
        opened = stand_in.Picamera2.instances[before:]
        assert [cam.camera_num for cam in opened] == [0, 1]
        for pipeline in pipelines:
            assert_decodable_sequence(await read_frames(pipeline, 10))
    finally:
        for pipeline in pipelines:
            await pipeline.stop()


async def test_rpicam_sources_pass_their_camera_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = fake_rpicam_camera(tmp_path, monkeypatch)
    pipelines = []
    for index in (0, 1):
        camera = dataclasses.replace(base, name=f"csi{index}", source=f"rpicam:{index}")
        validate_camera(camera)
        pipelines.append(CapturePipeline(camera, source=RpicamSource(camera)))
    try:
        for pipeline in pipelines:
            await pipeline.start()
        for pipeline in pipelines:
            assert_decodable_sequence(await read_frames(pipeline, 10))
        logged = (tmp_path / "starts.log").read_text().splitlines()
        # rpicam-vid's --camera defaults to 0; the second sensor must be asked for by index.
        assert sorted("--camera 1" in line for line in logged) == [False, True]
        assert sum("--camera" in line.split() for line in logged) == 1
    finally:
        for pipeline in pipelines:
            await pipeline.stop()
