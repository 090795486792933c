"""The whole pipeline with the synthetic camera: real libx264, real PyAV decoding."""

from __future__ import annotations

import asyncio
import dataclasses

from ruseon_appliance.capture.h264 import START_CODE_4
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.stamp import read_stamp
from ruseon_appliance.config import CameraConfig

from .conftest import decode_alone

SMALL = CameraConfig(source="synthetic", width=320, height=240, framerate=30, bitrate=300_000,
                     keyframe_interval=30, ring_bytes=1024 * 1024, ring_slots=256,
                     max_frame_bytes=256 * 1024)


async def test_readers_get_decodable_keyframes_first() -> None:
    pipeline = CapturePipeline(SMALL)
    assert pipeline.source_kind == "synthetic"
    await pipeline.start()
    try:
        assert await pipeline.wait_first_frame(10)
        # Join mid-GOP: wait until a few P frames follow the newest keyframe.
        while (pipeline.ring.newest_seq - (pipeline.ring.newest_keyframe_seq or 0)) < 5:
            await asyncio.sleep(0.02)
        reader = pipeline.ring.reader()
        first = await asyncio.wait_for(reader.next(), 5)
        assert first.keyframe
        data = bytes(first.data)
        sps, pps = pipeline.muxer.sps, pipeline.muxer.pps
        assert sps is not None and pps is not None
        assert data.startswith(START_CODE_4 + sps + START_CODE_4 + pps)
        frames = decode_alone(data)
        assert len(frames) == 1
        stamp = read_stamp(frames[0])
        assert stamp is not None and stamp[0] == first.capture_time_us
        info = pipeline.stream_info
        assert info is not None and (info.width, info.height) == (320, 240)
        assert info.profile_level_id.startswith("42")
        assert not info.may_have_bframes
    finally:
        await pipeline.stop()


async def _collect(pipeline: CapturePipeline, seconds: float) -> list[tuple[int, bool, int]]:
    """(seq, keyframe, size) of every frame written during ``seconds`` of loop time."""
    reader = pipeline.ring.reader("next")
    out: list[tuple[int, bool, int]] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (left := end - loop.time()) > 0:
        try:
            view = await asyncio.wait_for(reader.next(), left)
        except TimeoutError:
            break
        out.append((view.seq, view.keyframe, len(view.data)))
    reader.close()
    return out


async def test_synthetic_meets_configured_rate_and_bitrate() -> None:
    pipeline = CapturePipeline(SMALL)
    await pipeline.start()
    try:
        assert await pipeline.wait_first_frame(10)
        await _collect(pipeline, 0.5)  # let the rate control settle past the first IDR
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        frames = await _collect(pipeline, 4.0)
        elapsed = loop.time() - t0
    finally:
        await pipeline.stop()
    fps = len(frames) / elapsed
    bitrate = sum(size for _, _, size in frames) * 8 / elapsed
    assert 0.8 * SMALL.framerate <= fps <= 1.2 * SMALL.framerate, fps
    assert 0.8 * SMALL.bitrate <= bitrate <= 1.2 * SMALL.bitrate, bitrate
    # GOP of 30 frames: about one keyframe a second, none missing and none extra.
    keyframes = sum(1 for _, k, _ in frames if k)
    assert abs(keyframes - len(frames) / SMALL.keyframe_interval) <= 1
    # Consecutive sequence numbers: nothing dropped on the way to the ring.
    assert [s for s, _, _ in frames] == list(range(frames[0][0], frames[0][0] + len(frames)))
    stats = pipeline.stats()
    assert stats["frames_dropped"] == 0 and stats["width"] == 320 and stats["fps"] > 0


async def test_keyframe_requests_are_honoured_and_coalesced() -> None:
    camera = dataclasses.replace(SMALL, keyframe_interval=600, keyframe_request_interval_ms=60_000)
    pipeline = CapturePipeline(camera)
    await pipeline.start()
    try:
        assert await pipeline.wait_first_frame(10)
        await _collect(pipeline, 0.3)
        reader = pipeline.ring.reader("next")
        assert pipeline.request_keyframe("test viewer 1") is True
        assert pipeline.request_keyframe("test viewer 2") is False  # absorbed
        assert pipeline.request_keyframe("test viewer 3") is False
        seen = []
        for _ in range(10):
            view = await asyncio.wait_for(reader.next(), 5)
            seen.append(view.keyframe)
            if view.keyframe:
                assert len(decode_alone(bytes(view.data))) == 1
                break
        # The forced IDR comes within a frame or two, not at the 20 s GOP boundary.
        assert seen[-1] is True and len(seen) <= 3, seen
        stats = pipeline.stats()
        assert stats["keyframe_requests"] == 3 and stats["keyframes_forced"] == 1
        assert stats["source_keyframes_forced"] == 1
    finally:
        await pipeline.stop()


async def test_profiles_are_what_they_say() -> None:
    for profile, idc in (("main", 77), ("high", 100)):
        pipeline = CapturePipeline(dataclasses.replace(SMALL, profile=profile, width=160,
                                                       height=120, bitrate=100_000))
        await pipeline.start()
        try:
            assert await pipeline.wait_first_frame(10)
            info = pipeline.stream_info
            assert info is not None and info.profile_idc == idc and not info.may_have_bframes
            view = pipeline.ring.reader().poll()
            assert view is not None and len(decode_alone(bytes(view.data))) == 1
        finally:
            await pipeline.stop()
