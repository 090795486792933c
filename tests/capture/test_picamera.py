"""The picamera source against a stand-in picamera2 that behaves like upstream's releases."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging

import pytest

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.sources.picamera import PicameraSource, uses_libav
from ruseon_appliance.capture.sources.rpicam import rpicam_command

from . import picamera2_stand_in as stand_in
from .conftest import decode_alone
from .test_sources import CAMERA, assert_decodable_sequence, read_frames

PICAMERA = dataclasses.replace(CAMERA, source="picamera", keyframe_request_interval_ms=0)


async def wait_for_keyframe(pipeline: CapturePipeline, timeout: float = 10) -> tuple[int, bytes]:
    """(frames before it, the keyframe) from now on."""
    reader = pipeline.ring.reader("next")
    count = 0
    view = await asyncio.wait_for(reader.next(), timeout)
    while not view.keyframe:
        count += 1
        view = await asyncio.wait_for(reader.next(), timeout)
    data = bytes(view.data)
    reader.close()
    return count, data


async def test_picamera_source_with_stand_in_camera() -> None:
    camera = dataclasses.replace(PICAMERA, vflip=True, exposure_us=8000, awb="daylight")
    api = stand_in.make_api()
    source = PicameraSource(camera, api=api)
    pipeline = CapturePipeline(camera, source=source)
    assert pipeline.source_kind == "picamera"
    await pipeline.start()
    cam = stand_in.Picamera2.instances[-1]
    try:
        assert_decodable_sequence(await read_frames(pipeline, 20))
        controls = cam.config["controls"]
        assert controls["FrameRate"] == 30.0 and controls["ExposureTime"] == 8000
        assert controls["AwbMode"] == stand_in.Controls.AwbModeEnum.Daylight
        assert cam.config["main"]["size"] == (320, 240)
        assert (cam.config["transform"].hflip, cam.config["transform"].vflip) == (0, 1)
        assert isinstance(cam.encoder, stand_in.V4L2H264Encoder032)
        assert cam.encoder.args == {"bitrate": 250_000, "repeat": True, "iperiod": 30,
                                    "framerate": 30, "profile": "baseline"}
        # Upstream's timestamps start at 0; the first access unit's pts follows them.
        assert cam.encoder.outputs_seen[0][2] == 0
        await read_frames(pipeline, 3)  # mid-GOP
        assert pipeline.request_keyframe("pli") is True
        count, data = await wait_for_keyframe(pipeline)
        assert count <= 2 and len(decode_alone(data)) == 1
        assert source.stats()["libav"] is False
    finally:
        await pipeline.stop()
    assert cam.closed


def test_encoder_bytes_are_kept_not_copied() -> None:
    source = PicameraSource(PICAMERA, api=stand_in.make_api())
    frame = bytes(range(256)) * 4  # what upstream hands over: immutable bytes
    au: AccessUnit = source.make_access_unit(frame, True, 0)
    assert au.data is frame
    view = memoryview(bytearray(frame))  # a reusable buffer would be copied once
    assert source.make_access_unit(view, False, 33_333).data == frame


@pytest.mark.parametrize(
    ("exposure_us", "gain"), [(8000, 0.0), (0, 2.0), (8000, 2.0), (0, 0.0)],
    ids=["exposure-only", "gain-only", "both", "neither"])
async def test_manual_exposure_or_gain_leaves_the_other_automatic(
    exposure_us: int, gain: float
) -> None:
    """Both sources fix exactly what is configured (libcamera's rules, in the stand-in)."""
    camera = dataclasses.replace(PICAMERA, exposure_us=exposure_us, gain=gain)
    source = PicameraSource(camera, api=stand_in.make_api())
    await source.start(lambda au: None)
    cam = stand_in.Picamera2.instances[-1]
    await source.stop()
    assert "AeEnable" not in cam.config["controls"]
    picamera = (cam.auto_exposure, cam.auto_gain)
    assert picamera == (exposure_us == 0, gain == 0)
    # rpicam-apps' rule (rpicam_app.cpp): --shutter makes only the exposure manual, --gain
    # only the gain.
    argv = rpicam_command(camera)
    assert ("--shutter" not in argv, "--gain" not in argv) == picamera


def test_bcm2712_is_asked_of_picamera2() -> None:
    assert uses_libav(stand_in.make_api(platform=stand_in.Platform.PISP))
    assert not uses_libav(stand_in.make_api(platform=stand_in.Platform.VC4))
    # Without the H264Encoder binding, picamera2.platform alone answers.
    api = dataclasses.replace(stand_in.make_api(platform=stand_in.Platform.PISP),
                              H264Encoder=stand_in.V4L2H264Encoder032)
    assert uses_libav(api)
    assert not uses_libav(dataclasses.replace(api, platform=None))


@pytest.mark.parametrize("version", [(0, 3, 31), (0, 3, 32)], ids=["0.3.31", "0.3.32"])
async def test_bcm2712_board_takes_the_fixed_libav_path(version: tuple[int, int, int]) -> None:
    """On any BCM2712 board (Pi 5, CM5), picamera2's libav encoder gets the PyAV >= 14 fix
    (which also gives 0.3.31's libav encoder the force_key_frame it lacks)."""
    api = stand_in.make_api(platform=stand_in.Platform.PISP, version=version)
    source = PicameraSource(PICAMERA, api=api)
    pipeline = CapturePipeline(PICAMERA, source=source)
    await pipeline.start()
    cam = stand_in.Picamera2.instances[-1]
    try:
        assert_decodable_sequence(await read_frames(pipeline, 5))
        assert pipeline.request_keyframe("pli") is True
        count, data = await wait_for_keyframe(pipeline)
        assert count <= 2 and len(decode_alone(data)) == 1
        assert cam.encoder.errors == [] and source.stats()["libav"] is True
    finally:
        await pipeline.stop()


async def test_picamera2_without_force_key_frame(caplog: pytest.LogCaptureFixture) -> None:
    """picamera2 0.3.31: requests are counted and logged once; frames keep coming."""
    api = stand_in.make_api(version=(0, 3, 31))
    source = PicameraSource(PICAMERA, api=api)
    pipeline = CapturePipeline(PICAMERA, source=source)
    with caplog.at_level(logging.WARNING):
        await pipeline.start()
        try:
            await read_frames(pipeline, 3)
            for _ in range(3):
                pipeline.request_keyframe("pli")
            _, data = await wait_for_keyframe(pipeline)  # the periodic one (GOP 30)
            assert len(decode_alone(data)) == 1
            assert source.stats()["keyframe_requests_unsupported"] >= 3  # (+ retries)
        finally:
            await pipeline.stop()
    assert caplog.text.count("no force_key_frame") == 1


async def test_lost_forced_idr_is_retried() -> None:
    """A forced IDR that comes out as an SPS/PPS-only buffer (dropped upstream) is asked again."""
    # GOP 600 at 30 fps: no periodic IDR within the test; only a forced one can arrive.
    camera = dataclasses.replace(PICAMERA, keyframe_interval=600, keyframe_request_interval_ms=100)
    source = PicameraSource(camera, api=stand_in.make_api())
    pipeline = CapturePipeline(camera, source=source)
    await pipeline.start()
    cam = stand_in.Picamera2.instances[-1]
    cam.encoder.lose_forced_idrs = 1
    try:
        await read_frames(pipeline, 3)
        assert pipeline.request_keyframe("pli") is True
        count, data = await wait_for_keyframe(pipeline)
        # A retry comes after a window (~8 frames here); the periodic IDR only at frame 600.
        assert count < 300 and len(decode_alone(data)) == 1
        assert cam.encoder.dropped_header_buffers == 1  # the first answer was lost upstream
        stats = pipeline.stats()
        assert stats["keyframes_lost"] >= 1 and stats["keyframe_retries"] >= 1
    finally:
        await pipeline.stop()


async def test_pts_keep_pace_across_a_camera_restart() -> None:
    """picamera2 starts its timestamps at 0 on every start (a reconfigure restarts the camera):
    the pts after a restart must keep counting frame intervals, not creep by one tick."""
    source = PicameraSource(PICAMERA, api=stand_in.make_api())
    units: list[AccessUnit] = []
    enough = asyncio.Event()
    target = [10]

    def deliver(au: AccessUnit) -> None:
        units.append(au)
        if len(units) >= target[0]:
            enough.set()

    for round_ in range(2):
        target[0], enough = 10 * (round_ + 1), asyncio.Event()
        await source.start(deliver)
        try:
            await asyncio.wait_for(enough.wait(), 20)
        finally:
            await source.stop()
    pts = [au.pts for au in units]
    assert pts == sorted(set(pts))
    frame_ticks = 90_000 // PICAMERA.framerate  # 3000
    after = [b - a for a, b in itertools.pairwise(pts[10:])]
    # The sensor's pace, from its timestamps (33333 µs -> 2999 or 3000 ticks).
    assert frame_ticks - 2 <= min(after) and max(after) <= frame_ticks + 2, after
