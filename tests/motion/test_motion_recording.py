"""``[recording] mode = "motion"``: the file camera's crossing is recorded from the pre-roll
before the event to the post-roll after it, and nothing before; ffmpeg decodes the segment
without a word. Plus the tracker-free rules of MotionRecording (overlapping events make one
recording; someone else's recording is left alone)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    ConfigError,
    HlsConfig,
    HostPort,
    HttpConfig,
    RecordingConfig,
    StateConfig,
    WebRtcConfig,
    validate,
)
from ruseon_appliance.events import EventBus
from ruseon_appliance.motion.recording import MotionRecording
from tests.motion.test_appliance import TOKEN, H, W, get_json, write_clip
from tests.segmenter.stream import ffmpeg_errors
from tests.tooling import free_port

PREROLL_S, POSTROLL_S = 2.0, 2.0


@pytest.mark.slow
async def test_motion_recordings_cover_preroll_to_postroll(tmp_path: Path) -> None:
    clip = tmp_path / "crossing.h264"
    write_clip(clip)
    config = Config(
        cameras=(CameraConfig(name="porch", source=f"file:{clip}", width=W, height=H,
                              framerate=30, keyframe_interval=30, motion_off_delay_s=1.0),),
        http=HttpConfig(listen=HostPort("127.0.0.1", free_port())),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        auth=AuthConfig(token=TOKEN),
        state=StateConfig(dir=str(tmp_path / "state")),
        hls=HlsConfig(enable=False),
        recording=RecordingConfig(mode="motion", preroll_s=PREROLL_S, postroll_s=POSTROLL_S),
    )
    base = f"http://127.0.0.1:{config.http.listen.port}"
    app = Appliance(config)
    try:
        await app.start()
        camera = app.cameras.resolve("porch")
        assert camera is not None and camera.recorder is not None
        recorder = camera.recorder
        async with aiohttp.ClientSession() as http:
            assert not recorder.active  # nothing recorded before motion
            async with asyncio.timeout(40):
                while True:
                    events = (await get_json(http, f"{base}/api/events"))["events"]
                    if events and events[0]["end"] is not None:
                        break
                    await asyncio.sleep(0.2)
            event = events[0]
            assert recorder.active  # in its post-roll
            # Until the stop has closed the segment into the archive: `active` goes False
            # before that, and an open segment whose writes are still queued has no size yet.
            async with asyncio.timeout(20):
                while (recorder.active or recorder.closing
                       or recorder.current_segment() is not None):
                    await asyncio.sleep(0.1)
        segments = list(recorder.archive.segments)
        assert len(segments) == 1, segments
        segment = segments[0]
        start, end = segment.start_us / 1e6, segment.end_us / 1e6
        # The pre-roll came from before the event (the ring's keyframe at least PREROLL_S
        # before the begin, which followed the event's start by its minimum duration).
        assert event["start"] - PREROLL_S - 1.5 <= start <= event["start"] - 1.0, (start, event)
        assert end >= event["end"] + POSTROLL_S - 0.6, (end, event)
        assert ffmpeg_errors(segment.path) == ""
        assert camera.motion_recording is not None
        assert camera.motion_recording.stats()["recordings"] == 1
    finally:
        await app.stop()


class FakeRecorder:
    """Records begin/end calls (the real one is exercised above)."""

    def __init__(self) -> None:
        self.active = False
        self.calls: list[Any] = []

    def begin(self, preroll_s: float | None = None) -> bool:
        if self.active:
            return False
        self.active = True
        self.calls.append(("begin", preroll_s))
        return True

    async def end(self) -> bool:
        self.active = False
        self.calls.append("end")
        return True


async def test_overlapping_events_make_one_recording_and_others_are_left_alone() -> None:
    bus = EventBus()
    recorder = FakeRecorder()
    rec = MotionRecording(recorder, camera="porch", preroll_s=5.0, postroll_s=0.2)
    bus.subscribe(rec.on_event)
    bus.publish("motion_started", camera="porch")
    await asyncio.sleep(0.05)
    bus.publish("motion_ended", camera="porch")
    await asyncio.sleep(0.05)
    bus.publish("motion_started", camera="porch")  # within the post-roll
    bus.publish("motion_started", camera="yard")  # another camera's
    await asyncio.sleep(0.4)
    assert recorder.calls == [("begin", 5.0)] and rec.stats() == {"recordings": 1,
                                                                  "extended": 1}
    bus.publish("motion_ended", camera="porch")
    await asyncio.sleep(0.4)
    assert recorder.calls == [("begin", 5.0), "end"]
    # A recording someone began by hand is not ended by motion.
    recorder.begin(0.0)
    bus.publish("motion_started", camera="porch")
    await asyncio.sleep(0.05)
    bus.publish("motion_ended", camera="porch")
    await asyncio.sleep(0.4)
    assert recorder.calls[-1] == ("begin", 0.0) and recorder.active
    await rec.stop()


def test_recording_mode_is_checked() -> None:
    validate(dataclasses.replace(Config(), recording=RecordingConfig(mode="motion")))
    with pytest.raises(ConfigError, match=r"recording\.mode"):
        validate(dataclasses.replace(Config(), recording=RecordingConfig(mode="sometimes")))
    assert RecordingConfig(continuous=True).records_continuously
    assert not RecordingConfig(continuous=True, mode="motion").records_continuously
