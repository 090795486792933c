"""Recordings with sound (issue 30): the synthetic camera's tone is muxed as AAC into its
archive segments, and ``/recordings/get`` clips (progressive MP4 and fMP4) carry it: FFmpeg
finds one H.264 and one AAC stream, decodes both without an error, both last as long, and
every beep sits within 40 ms of the picture captured at the same second. A camera without sound
records video only. Through the real appliance (continuous recording), real synthetic cameras
(libx264, FFmpeg's AAC), real HTTP and files, FFmpeg and PyAV as the players.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HostPort,
    HttpConfig,
    RecordingConfig,
    StateConfig,
    WebRtcConfig,
)
from ruseon_appliance.recording.archive import rfc3339
from ruseon_appliance.web.recordings import parse_time
from tests.av_sync import decode_errors, measure_sync, stream_spans, streams
from tests.tooling import free_port

FPS = 15
SYNC_S = 0.040
ADMIN = {"Authorization": "Bearer audio-clips-admin-secret-0123456789"}


@contextlib.asynccontextmanager
async def appliance(tmp_path: Path) -> AsyncIterator[tuple[str, Appliance]]:
    """"front" (synthetic, its tone) and "mute" (audio = none), both recording continuously."""
    common: dict[str, Any] = {"source": "synthetic", "framerate": FPS, "keyframe_interval": FPS,
                              "width": 320, "height": 240, "bitrate": 400_000, "motion": False}
    port = free_port()
    config = Config(
        cameras=(CameraConfig(name="front", **common),
                 CameraConfig(name="mute", audio="none", **common)),
        http=HttpConfig(listen=HostPort("127.0.0.1", port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        auth=AuthConfig(token=ADMIN["Authorization"][7:]),
        recording=RecordingConfig(dir=str(tmp_path / "rec"), continuous=True, segment_s=2.0),
    )
    app = Appliance(config)
    await app.start()
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        await app.stop()


async def clip(http: aiohttp.ClientSession, base: str, camera: str, fmt: str,
               path: Path) -> tuple[Path, str]:
    """Four seconds of the first recorded range, from 1.5 s into it (the first whole second
    of capture time in it may be a picture's first moment)."""
    for _ in range(60):
        async with http.get(f"{base}/recordings/list?path={camera}", headers=ADMIN) as r:
            assert r.status == 200
            ranges = await r.json()
        if ranges and ranges[0]["duration"] >= 6.5:
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError(f"{camera}: not 6.5 s recorded")
    start = ranges[0]["start"]
    begin = rfc3339(parse_time("start", start) + 1_500_000)
    async with http.get(f"{base}/recordings/get", headers=ADMIN,
                        params={"path": camera, "start": begin, "duration": "4",
                                "format": fmt}) as r:
        body = await r.read()
        assert r.status == 200, body[:300]
        codecs = r.headers["X-Clip-Codecs"]
    path.write_bytes(body)
    return path, codecs


async def test_clips_of_a_camera_with_its_tone_have_aac_in_sync_and_a_silent_one_has_none(
        tmp_path: Path) -> None:
    async with appliance(tmp_path) as (base, app), aiohttp.ClientSession() as http:
        for fmt in ("mp4", "fmp4"):
            media, codecs = await clip(http, base, "front", fmt, tmp_path / f"front.{fmt}.mp4")
            # What the page's MediaSource is told: both tracks.
            assert re.fullmatch(r"avc1\.[0-9a-f]{6},mp4a\.40\.2", codecs), codecs
            assert await asyncio.to_thread(streams, media) == [("video", "h264"),
                                                               ("audio", "aac")], fmt
            assert await asyncio.to_thread(decode_errors, media) == "", fmt
            spans = await asyncio.to_thread(stream_spans, media)
            video = spans["video"][1] - spans["video"][0]
            audio = spans["audio"][1] - spans["audio"][0]
            assert video >= 3.9, (fmt, spans)
            assert abs(audio - video) <= 1 / FPS, (fmt, spans)
            assert 0 <= spans["audio"][0] - spans["video"][0] <= 1024 / 48_000 + 2e-3, (fmt,
                                                                                        spans)
            sync = await asyncio.to_thread(measure_sync, media)
            # Four beeps: one near the clip's start may have begun before its sound
            # (measure_sync leaves it out), one near the end may have no picture of its second.
            assert len(sync.errors_s) >= 2, (fmt, sync)
            assert all(abs(e) <= SYNC_S for e in sync.errors_s), (fmt, sync)
        # The archive's own segments (what a clip is cut from) play with both streams too.
        segment = sorted((tmp_path / "rec").rglob("front/*.mp4"))[0]
        assert await asyncio.to_thread(streams, segment) == [("video", "h264"), ("audio", "aac")]
        assert await asyncio.to_thread(decode_errors, segment) == ""
        front = app.cameras.get("front")
        assert front is not None and front.recorder is not None
        stats = front.recorder.stats()
        assert stats["audio"]["frames_total"] > 0, stats

        silent, codecs = await clip(http, base, "mute", "mp4", tmp_path / "mute.mp4")
        assert re.fullmatch(r"avc1\.[0-9a-f]{6}", codecs), codecs
        assert await asyncio.to_thread(streams, silent) == [("video", "h264")]
        assert await asyncio.to_thread(decode_errors, silent) == ""
