"""The playback API and recording control over HTTP, on the real synthetic pipeline.

Bad input gets a 400 naming the parameter (never a 500); everything needs the token when auth
is on; a recording started on demand shows up in the list and its clip decodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from ruseon_appliance.recording import Recorder, RecorderSettings
from ruseon_appliance.web.app import make_app
from tests.segmenter.stream import ffmpeg_errors, probe_frames

from .conftest import running_engine, serving, web_config

TOKEN = "recording-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextlib.asynccontextmanager
async def device_with_recorder(
        tmp_path: Path) -> AsyncIterator[tuple[Recorder, TestClient[Any, Any]]]:
    config = web_config(auth={"token": TOKEN, "viewing": "credential"})
    async with running_engine(config, tmp_path) as (capture, engine):
        recorder = Recorder(RecorderSettings(directory=tmp_path / "rec", segment_s=2.0,
                                             preroll_s=2.0), capture.ring)
        try:
            await recorder.start()
            app = make_app(config, engine, capture, started=time.time(), recorder=recorder)
            async with serving(app) as client:
                yield recorder, client
        finally:
            await recorder.stop()


BAD_GETS = [
    ("start=yesterday&duration=5", "start"),
    ("start=2026-11-30T20:45:00&duration=5", "time zone"),
    ("start=../../etc/passwd&duration=5", "start"),
    ("start=2026-11-30T20:45:00Z&duration=-5", "duration"),
    ("start=2026-11-30T20:45:00Z&duration=0", "duration"),
    ("start=2026-11-30T20:45:00Z&duration=nan", "duration"),
    ("start=2026-11-30T20:45:00Z&duration=inf", "duration"),
    ("start=2026-11-30T20:45:00Z&duration=1e308", "duration"),
    ("start=2026-11-30T20:45:00Z&duration=99999", "at most"),
    ("start=2026-11-30T20:45:00Z", "duration is required"),
    ("duration=5", "start is required"),
    ("start=9999-12-31T23:59:59%2B14:00&duration=5", None),  # valid, nothing there: 404
    ("start=2026-11-30T20:45:00Z&duration=5&format=../../x", "format"),
    ("start=2026-11-30T20:45:00Z&duration=5&path=../../etc", "path"),
    ("start=" + "1" * 5000 + "&duration=5", "too long"),
]


async def test_playback_api_bad_input_auth_and_a_clip(tmp_path: Path) -> None:
    async with device_with_recorder(tmp_path) as (recorder, client):
        for path in ("/recordings/list", "/recordings/get?start=2026-11-30T20:45:00Z&duration=5",
                     "/api/recording"):
            assert (await client.get(path)).status == 401, path
        assert (await client.post("/api/recording/start")).status == 401
        assert (await client.delete("/recordings?start=2026-11-30T20:45:00Z&duration=5")
                ).status == 401
        for query, words in BAD_GETS:
            response = await client.get(f"/recordings/get?{query}", headers=AUTH)
            body = await response.json()
            if words is None:
                assert response.status == 404, (query, response.status, body)
            else:
                assert response.status == 400 and words in body["detail"], (query, body)
        response = await client.get("/recordings/get?start=2020-01-01T00:00:00Z&duration=5",
                                    headers=AUTH)
        assert response.status == 404 and "nothing is recorded" in (await response.json())[
            "detail"]
        for bad in ("-1", "nan", "61", "x"):
            response = await client.post(f"/api/recording/start?preroll={bad}", headers=AUTH)
            assert response.status == 400 and "preroll" in (await response.json())["detail"]
        assert await (await client.get("/recordings/list", headers=AUTH)).json() == []

        response = await client.post("/api/recording/start", headers=AUTH)
        assert response.status == 200 and (await response.json())["started"] is True
        ranges: list[dict[str, Any]] = []
        for _ in range(200):  # until about 3 s are on disk (the first batch lands within 2 s)
            ranges = await (await client.get("/recordings/list", headers=AUTH)).json()
            if ranges and ranges[0]["duration"] >= 3:
                break
            await asyncio.sleep(0.1)
        assert len(ranges) == 1 and ranges[0]["duration"] >= 3, ranges
        status = await (await client.get("/api/status", headers=AUTH)).json()
        assert status["recording"]["state"] == "recording"
        assert status["recording"]["bytes_on_disk"] > 0
        metrics = await (await client.get("/metrics", headers=AUTH)).text()
        assert "ruseon_recording_recording 1" in metrics
        assert 'ruseon_recording_states{key="recording"} 1' in metrics

        response = await client.get(ranges[0]["url"], headers=AUTH)
        assert response.status == 200 and response.headers["Content-Type"] == "video/mp4"
        clip = tmp_path / "clip.mp4"
        clip.write_bytes(await response.read())
        assert clip.stat().st_size == int(response.headers["Content-Length"])
        assert ffmpeg_errors(clip) == ""
        frames = probe_frames(clip)
        assert frames[0][0] and len(frames) == int(response.headers["X-Clip-Frames"])

        response = await client.post("/api/recording/stop", headers=AUTH)
        assert response.status == 200 and (await response.json())["state"] == "stopped"
        assert recorder.archive.segments
        start = ranges[0]["start"]
        response = await client.delete(f"/recordings?start={start}&duration=3600", headers=AUTH)
        body = await response.json()
        assert response.status == 200 and body["deleted"] and not body["kept"], body
        assert await (await client.get("/recordings/list", headers=AUTH)).json() == []

        # No pre-roll, however it is written, is a valid request.
        response = await client.post("/api/recording/start?preroll=0.00", headers=AUTH)
        assert response.status == 200 and (await response.json())["started"] is True, (
            await response.text())
        assert (await client.post("/api/recording/stop", headers=AUTH)).status == 200
