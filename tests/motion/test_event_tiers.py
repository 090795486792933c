"""The whole appliance with continuous recording and motion: a file camera's crossing (the
clip of tests/motion/test_appliance.py) makes a real event; ``/recordings/list?events=motion``
lists only the footage around it (pre- and post-roll), and age retention deletes the segments
after it while the event's own segments outlive ``max_age_hours`` under
``event_max_age_hours``."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import aiohttp
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.clock import monotonic_us
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    RecordingConfig,
    StateConfig,
    WebRtcConfig,
)
from tests.motion.test_appliance import AUTH, TOKEN, H, W, get_json, write_clip
from tests.tooling import free_port

ROLL_S = 2.0
MAX_AGE_S = 3.6  # 0.001 hours: the segments after the event are soon past it


def _us(text: str) -> int:
    return round(dt.datetime.fromisoformat(text).timestamp() * 1_000_000)


@pytest.mark.slow
async def test_event_ranges_are_listed_alone_and_kept_longer(tmp_path: Path) -> None:
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
        recording=RecordingConfig(continuous=True, segment_s=2.0, preroll_s=ROLL_S,
                                  postroll_s=ROLL_S, max_age_hours=MAX_AGE_S / 3600,
                                  event_max_age_hours=1.0),
    )
    base = f"http://127.0.0.1:{config.http.listen.port}"
    app = Appliance(config)
    try:
        await app.start()
        camera = app.cameras.resolve("porch")
        assert camera is not None and camera.recorder is not None
        recorder = camera.recorder
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(40):
                while True:
                    events = (await get_json(http, f"{base}/api/events"))["events"]
                    if events and events[0]["end"] is not None:
                        break
                    await asyncio.sleep(0.2)
            event = events[0]
            window = (round((event["start"] - ROLL_S) * 1e6), round((event["end"] + ROLL_S) * 1e6))
            # Age retention runs (here: asked) until it has taken segments after the event.
            async with asyncio.timeout(40):
                while not recorder.stats()["segments_deleted_total"]:
                    recorder.apply_retention()
                    await asyncio.sleep(0.5)
            now = monotonic_us()
            kept = [s for s in recorder.archive.segments if not s.open]
            old = [s for s in kept if s.mono_start_us is not None
                   and now - s.mono_start_us - s.duration_us > MAX_AGE_S * 1e6]
            # Every segment past max_age that is still there holds the event's footage...
            assert old, kept
            assert all(s.start_us < window[1] and s.end_us > window[0] for s in old), (
                old, window)
            # ...and the first segment, recorded before the event's pre-roll ended, is one.
            assert kept[0].start_us < window[0] + 2_500_000, (kept[0], window)

            listed = await get_json(http, f"{base}/recordings/list?events=motion")
            full = await get_json(http, f"{base}/recordings/list")
            assert len(listed) == 1, listed
            lo = _us(listed[0]["start"])
            hi = lo + round(listed[0]["duration"] * 1e6)
            first_recorded = _us(full[0]["start"])
            assert lo == max(window[0], first_recorded), (lo, window, full)
            assert abs(hi - window[1]) <= 1, (hi, window)
            assert sum(r["duration"] for r in full) > listed[0]["duration"]
            async with http.get(f"{base}/recordings/list?events=all", headers=AUTH) as resp:
                assert resp.status == 400 and "motion" in (await resp.json())["detail"]
            # The event's footage plays.
            async with http.get(base + listed[0]["url"], headers=AUTH) as resp:
                assert resp.status == 200 and len(await resp.read()) > 10_000
    finally:
        await app.stop()
