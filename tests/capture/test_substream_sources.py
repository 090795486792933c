"""The sub-stream from the sources that encode one themselves: the synthetic camera's second
encoder (same pictures, same clock), picamera2's second encoder on the lores stream (the
stand-in modelled on upstream: V4L2 on a Pi 4, libav on a Pi 5), ``auto``; a second encoder
that cannot open leaves the main stream running."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path

import av
import pytest

from ruseon_appliance.cameras.camera import Camera
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.sources.picamera import PicameraSource
from ruseon_appliance.capture.substream import plan_substream
from ruseon_appliance.config import CameraConfig, SubstreamConfig

from . import picamera2_stand_in as stand_in

MAIN = CameraConfig(source="synthetic", width=320, height=240, framerate=30,
                    keyframe_interval=30, bitrate=300_000, keyframe_request_interval_ms=0,
                    motion=False, substream=SubstreamConfig("on", 160, 120, 15, 100_000))


def hardware() -> bool:
    return False


async def ring_frames(pipeline: CapturePipeline, count: int,
                      timeout: float = 20) -> list[tuple[bytes, int, int, bool]]:
    """(data, pts, capture time, keyframe) of ``count`` frames from the ring's keyframe on."""
    reader = pipeline.ring.reader()
    out = []
    try:
        for _ in range(count):
            view = await asyncio.wait_for(reader.next(), timeout)
            out.append((bytes(view.data), view.pts, view.capture_time_us, view.keyframe))
    finally:
        reader.close()
    return out


def decoded_sizes(frames: list[tuple[bytes, int, int, bool]]) -> list[tuple[int, int]]:
    decoder = av.CodecContext.create("h264", "r")
    sizes = []
    for data, *_ in frames:
        sizes += [(f.width, f.height) for f in decoder.decode(av.Packet(data))]
    return sizes


@pytest.fixture
def camera_stand_in() -> Iterator[None]:
    yield
    stand_in.Picamera2.lores_encoder_busy = False


async def test_synthetic_camera_encodes_the_sub_stream_on_the_same_clock() -> None:
    camera = Camera(MAIN)
    sub = camera.add_substream(plan_substream(MAIN, software_encoder=hardware))
    assert sub is not None and camera.stream("sub") is sub
    assert camera.stream("main") is camera.pipeline
    assert (sub.camera.width, sub.camera.height, sub.camera.framerate) == (160, 120, 15)
    with pytest.raises(ValueError, match="unknown stream 'hd'"):
        camera.stream("hd")
    assert await camera.start()
    try:
        main_frames, sub_frames = await asyncio.gather(ring_frames(camera.pipeline, 40),
                                                       ring_frames(sub, 12))
        assert set(decoded_sizes(main_frames)) == {(320, 240)}
        sizes = decoded_sizes(sub_frames)
        assert len(sizes) >= 11 and set(sizes) == {(160, 120)}
        # Half the frame rate: 2/30 s apart (unless a busy machine skipped a frame).
        steps = {b[1] - a[1] for a, b in itertools.pairwise(sub_frames)}
        assert min(steps) == 6000, steps
        late = camera.pipeline.source.stats()["frames_late"]
        assert late or steps == {6000}, steps
        # The sub-stream's keyframe requests reach its own encoder.
        await ring_frames(sub, 3)
        assert sub.request_keyframe("pli")
        reader = sub.ring.reader("next")
        for _ in range(4):
            view = await asyncio.wait_for(reader.next(), 10)
            if view.keyframe:
                break
        reader.close()
        assert view.keyframe
        status = camera.status(0)["substream"]
        assert status["enabled"] and status["up"] and (status["width"], status["height"]) == (
            160, 120)
    finally:
        await camera.stop()


async def test_sub_frames_share_the_main_streams_timestamps() -> None:
    camera = Camera(MAIN)
    sub = camera.add_substream(plan_substream(MAIN, software_encoder=hardware))
    assert sub is not None
    await camera.start()
    try:
        await camera.pipeline.wait_first_frame(20)
        sub_frames = await ring_frames(sub, 8)
        # Read after: the main ring still holds the frames the sub-stream's came from.
        reader = camera.pipeline.ring.reader("keyframe")
        main_times = set()
        while (view := reader.poll()) is not None:
            main_times.add((view.pts, view.capture_time_us))
        reader.close()
        shared = [(pts, t) in main_times for _, pts, t, _ in sub_frames]
        assert all(shared), (sub_frames[0][1:3], sorted(main_times)[:3])
    finally:
        await camera.stop()


def picamera_camera(api: object, **changes: object) -> Camera:
    config = dataclasses.replace(MAIN, source="picamera",
                                 substream=SubstreamConfig("on", 160, 120, 0, 100_000),
                                 **changes)  # type: ignore[arg-type]
    source = PicameraSource(config, api=api)
    camera = Camera(config, pipeline=CapturePipeline(config, source=source))
    camera.add_substream(plan_substream(config, software_encoder=hardware))
    return camera


@pytest.mark.parametrize("platform", [stand_in.Platform.VC4, stand_in.Platform.PISP],
                         ids=["pi4-v4l2", "pi5-libav"])
async def test_picamera_encodes_the_lores_stream(camera_stand_in: None,
                                                 platform: stand_in.Platform) -> None:
    camera = picamera_camera(stand_in.make_api(platform=platform), motion=True)
    sub = camera.sub
    assert sub is not None and sub.source_kind == "picamera"
    assert await camera.start()
    cam = stand_in.Picamera2.instances[-1]
    try:
        main_frames, sub_frames = await asyncio.gather(ring_frames(camera.pipeline, 20),
                                                       ring_frames(sub, 20))
        assert set(decoded_sizes(main_frames)) == {(320, 240)}
        assert set(decoded_sizes(sub_frames)) == {(160, 120)}
        # The lores stream is the sub-stream's size, YUV420; motion reads that plane too.
        assert cam.config["lores"] == {"size": (160, 120), "format": "YUV420"}
        source = camera.pipeline.source
        assert isinstance(source, PicameraSource) and source.lores_size == (160, 120)
        lores = cam.encoders["lores"]
        assert lores.args["bitrate"] == 100_000 and lores.args["framerate"] == 30
        expected = stand_in.V4L2H264Encoder032 if platform is stand_in.Platform.VC4 else (
            stand_in.LibavH264Encoder032)
        assert isinstance(lores, expected)
        # Keyframes on request, from the lores encoder alone.
        before = len(cam.encoders["main"].outputs_seen)
        assert sub.request_keyframe("pli")
        reader = sub.ring.reader("next")
        for _ in range(10):
            view = await asyncio.wait_for(reader.next(), 10)
            if view.keyframe:
                break
        reader.close()
        assert view.keyframe
        assert len(cam.encoders["main"].outputs_seen) > before
    finally:
        await camera.stop()
    assert cam.closed


async def test_a_busy_second_encoder_leaves_the_main_stream_running(
        camera_stand_in: None) -> None:
    stand_in.Picamera2.lores_encoder_busy = True
    camera = picamera_camera(stand_in.make_api())
    sub = camera.sub
    assert sub is not None
    assert await camera.start()
    cam = stand_in.Picamera2.instances[-1]
    try:
        assert set(decoded_sizes(await ring_frames(camera.pipeline, 15))) == {(320, 240)}
        assert "lores" not in cam.encoders and cam.config["lores"] is None  # motion off here
        assert camera.problem() is None
        problem = camera.sub_problem()
        assert problem is not None and "Device or resource busy" in problem
        status = camera.status(0)
        assert status["up"] and status["substream"]["enabled"]
        assert not status["substream"]["up"] and "busy" in status["substream"]["problem"]
    finally:
        await camera.stop()


async def test_auto_gives_the_chosen_synthetic_camera_the_sub_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ruseon_appliance.capture.sources import auto

    monkeypatch.setattr(auto, "camera_expected", lambda: "")  # a developer machine
    monkeypatch.setattr(auto, "load_picamera2", stand_in_missing)
    monkeypatch.setattr(auto, "rpicam_camera_present", no_rpicam)
    config = dataclasses.replace(MAIN, source="auto")
    camera = Camera(config)
    sub = camera.add_substream(plan_substream(config, software_encoder=hardware))
    assert sub is not None
    await camera.start()
    try:
        assert set(decoded_sizes(await ring_frames(sub, 8))) == {(160, 120)}
        assert sub.source_kind == "synthetic"
    finally:
        await camera.stop()


def stand_in_missing() -> object:
    from ruseon_appliance.capture.sources.base import SourceUnavailable

    raise SourceUnavailable("no picamera2 here")


async def no_rpicam(camera: object, timeout: float = 5.0) -> bool:
    return False


async def test_auto_that_finds_rpicam_has_no_sub_stream(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in rpicam-vid answers ``--list-cameras``; picamera2 is not importable."""
    from ruseon_appliance.capture.sources import auto

    from .test_sources import fake_rpicam_camera

    monkeypatch.setattr(auto, "load_picamera2", stand_in_missing)
    config = dataclasses.replace(fake_rpicam_camera(tmp_path, monkeypatch), source="auto",
                                 width=320, height=240, motion=False,
                                 substream=SubstreamConfig("on", 160, 120))
    camera = Camera(config)
    assert camera.add_substream(plan_substream(config, software_encoder=hardware)) is not None
    await camera.start()
    try:
        assert camera.pipeline.source_kind == "rpicam"
        assert await camera.pipeline.wait_first_frame(20)
        assert camera.sub is None and camera.stream("sub") is None
        assert camera.status(0)["substream"] == {
            "enabled": False,
            "reason": "the rpicam source auto found has none (it runs one encoder)"}
    finally:
        await camera.stop()
