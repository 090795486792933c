"""The whole pipeline with the synthetic camera: real libx264, real PyAV decoding."""

from __future__ import annotations

import asyncio

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
