"""Every camera keeps its files in the same shape (``cameras/<name>/`` under the archive and the
state directory), and what the single-camera layout left at the top moves there once: an archive
recorded by that layout (real segments from the real recorder) is listed and served unchanged
after the upgrade, its saved controls still apply, and nothing is lost or overwritten."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import aiohttp
import av

from ruseon_appliance.app import Appliance
from ruseon_appliance.cameras.layout import camera_dir, migrate_top_level
from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.controls import CONTROLS_FILE
from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.config import CameraConfig, RecordingConfig, StateConfig
from ruseon_appliance.recording import Archive, Recorder, RecorderSettings
from ruseon_appliance.recording.archive import OPEN_SUFFIX, SET_ASIDE_DIR, rfc3339
from tests.segmenter.stream import encode
from tests.web.conftest import ADMIN, web_config

FPS = 30


async def record_top_level(directory: Path, seconds: int) -> list[dict[str, Any]]:
    """Record ``seconds`` of real H.264 the way the single-camera layout did (the recorder
    writing straight into the archive directory); returns what ``/recordings/list`` listed."""
    ring = RingBuffer(8 * 1024 * 1024, 1024)
    recorder = Recorder(RecorderSettings(directory=directory, segment_s=2.0), ring)
    await recorder.start()
    assert recorder.begin(preroll_s=0)
    for unit in encode(seconds * FPS, width=160, height=96, fps=FPS, gop=15):
        ring.write(AccessUnit(unit.data, unit.pts, unit.keyframe, unit.capture_time_us))
        await asyncio.sleep(0)
    await recorder.stop()
    archive = Archive(directory)
    archive.scan()
    return [{"start": rfc3339(lo), "duration": round((hi - lo) / 1e6, 6)}
            for lo, hi, _ in archive.timed_ranges()]


def test_migration_moves_only_what_the_old_layout_made_and_never_overwrites(
        tmp_path: Path) -> None:
    archive, state = tmp_path / "rec", tmp_path / "state"
    (archive / SET_ASIDE_DIR).mkdir(parents=True)
    state.mkdir()
    closed = archive / "2026-01-02_03-04-05-000000.mp4"
    uncertain = archive / "2026-01-02_03-05-05-000000~uncertain.mp4"
    open_part = archive / ("2026-01-02_03-06-05-000000" + OPEN_SUFFIX)
    for path in (closed, uncertain, open_part):
        path.write_bytes(path.name.encode())
    (archive / SET_ASIDE_DIR / "2026-01-01_00-00-00-000000.mp4.part").write_bytes(b"aside")
    (archive / "notes.txt").write_text("the user's own file")  # not ours: stays
    (state / CONTROLS_FILE).write_text('{"values": {"brightness": 0.5}}')
    # A file of one name already in the camera's folder: the old one stays, nothing is lost.
    target = camera_dir(archive, "front")
    target.mkdir(parents=True)
    (target / closed.name).write_bytes(b"already here")

    result = migrate_top_level(archive, state, "front")

    assert sorted(p.name for p in target.iterdir()) == sorted(
        [closed.name, uncertain.name, open_part.name, SET_ASIDE_DIR])
    assert (target / closed.name).read_bytes() == b"already here"
    assert closed.read_bytes() == closed.name.encode()  # left at the top, reported
    assert result.left == [str(closed)]
    assert (target / uncertain.name).read_bytes() == uncertain.name.encode()
    assert (target / SET_ASIDE_DIR / "2026-01-01_00-00-00-000000.mp4.part").read_bytes() == b"aside"
    assert not (archive / SET_ASIDE_DIR).exists()
    assert (archive / "notes.txt").exists()
    assert json.loads((camera_dir(state, "front") / CONTROLS_FILE).read_text()) == {
        "values": {"brightness": 0.5}}
    assert not (state / CONTROLS_FILE).exists()
    # Once: a second run finds nothing more to move.
    again = migrate_top_level(archive, state, "front")
    assert again.moved == [] and again.left == [str(closed)]


async def test_an_archive_of_the_single_camera_layout_is_served_after_the_upgrade(
        tmp_path: Path) -> None:
    config = web_config()
    config = dataclasses.replace(
        config,
        cameras=(dataclasses.replace(config.default_camera, name="front"),
                 CameraConfig(name="yard", source="synthetic", width=160, height=96,
                              keyframe_interval=30)),
        recording=RecordingConfig(dir=str(tmp_path / "recordings"), continuous=False),
        state=StateConfig(dir=str(tmp_path / "state")))
    archive, state = Path(config.recording.dir), Path(config.state.dir)
    listed_before = await record_top_level(archive, 6)
    assert listed_before and sum(r["duration"] for r in listed_before) > 4
    state.mkdir(parents=True)
    (state / CONTROLS_FILE).write_text('{"values": {"brightness": 0.25}}')

    base = f"http://127.0.0.1:{config.http.listen.port}"
    for run in range(2):  # the upgrade, then an ordinary restart: the same answers
        appliance = Appliance(config)
        await appliance.start()
        try:
            async with aiohttp.ClientSession(headers=ADMIN) as http:
                async with http.get(f"{base}/recordings/list?path=front") as resp:
                    assert resp.status == 200
                    listed = await resp.json()
                assert [{k: r[k] for k in ("start", "duration")} for r in listed] == \
                    listed_before, run
                # The default camera's, as always, without ?path=.
                async with http.get(f"{base}/recordings/list") as resp:
                    assert [r["start"] for r in await resp.json()] == \
                        [r["start"] for r in listed_before]
                async with http.get(f"{base}/recordings/list?path=yard") as resp:
                    assert await resp.json() == []  # the other camera has its own archive
                async with http.get(base + listed[0]["url"]) as resp:
                    assert resp.status == 200
                    clip = tmp_path / f"clip{run}.mp4"
                    clip.write_bytes(await resp.read())
                with av.open(str(clip)) as container:
                    frames = sum(1 for _ in container.decode(video=0))
                assert frames >= FPS * 3, frames
                async with http.get(f"{base}/api/camera/front/controls") as resp:
                    controls = (await resp.json())["controls"]
                assert controls["brightness"]["value"] == 0.25
                async with http.get(f"{base}/api/camera/yard/controls") as resp:
                    assert (await resp.json())["controls"]["brightness"]["value"] == 0.0
        finally:
            await appliance.stop()
        assert not any(p.suffix == ".mp4" for p in archive.iterdir() if p.is_file())
        assert not (state / CONTROLS_FILE).exists()
        assert camera_dir(archive, "front").is_dir()  # (a recorder makes its own when it records)
        assert camera_dir(state, "front").is_dir() and camera_dir(state, "yard").is_dir()


async def test_taking_the_first_camera_out_of_the_config_leaves_the_others_as_they_were(
        tmp_path: Path) -> None:
    """Nothing of a camera depends on its place in the list: the second camera's recordings
    and controls are its own, and stay so when the first camera is removed."""
    config = web_config()
    yard = CameraConfig(name="yard", source="synthetic", width=160, height=96,
                        keyframe_interval=30)
    both = dataclasses.replace(
        config, cameras=(dataclasses.replace(config.default_camera, name="front"), yard),
        recording=RecordingConfig(dir=str(tmp_path / "recordings"), continuous=False),
        state=StateConfig(dir=str(tmp_path / "state")))
    base = f"http://127.0.0.1:{config.http.listen.port}"
    appliance = Appliance(both)
    await appliance.start()
    try:
        async with aiohttp.ClientSession(headers=ADMIN) as http:
            async with http.patch(f"{base}/api/camera/yard/controls",
                                  json={"brightness": 0.5}) as resp:
                assert resp.status == 200, await resp.text()
            async with http.post(f"{base}/api/recording/start?path=yard&preroll=0") as resp:
                assert resp.status == 200, await resp.text()
            listed: list[dict[str, Any]] = []
            for _ in range(200):
                async with http.get(f"{base}/recordings/list?path=yard") as resp:
                    listed = await resp.json()
                if listed and listed[-1]["duration"] > 2:
                    break
                await asyncio.sleep(0.1)
            assert listed and listed[-1]["duration"] > 2, listed
            async with http.post(f"{base}/api/recording/stop?path=yard") as resp:
                assert resp.status == 200
            async with http.get(f"{base}/recordings/list?path=yard") as resp:
                recorded = [r["start"] for r in await resp.json()]
            async with http.get(f"{base}/recordings/list?path=front") as resp:
                assert await resp.json() == []
    finally:
        await appliance.stop()

    alone = dataclasses.replace(both, cameras=(yard,))
    appliance = Appliance(alone)
    await appliance.start()
    try:
        async with aiohttp.ClientSession(headers=ADMIN) as http:
            # yard is now the default camera: the unnamed routes are its, as are its own.
            for query in ("", "?path=yard"):
                async with http.get(f"{base}/recordings/list{query}") as resp:
                    assert [r["start"] for r in await resp.json()] == recorded
            async with http.get(f"{base}/api/camera/controls") as resp:
                assert (await resp.json())["controls"]["brightness"]["value"] == 0.5
            async with http.get(f"{base}/recordings/list?path=front") as resp:
                assert resp.status == 404  # not a camera any more; its files are left alone
    finally:
        await appliance.stop()
    assert camera_dir(Path(both.state.dir), "front").is_dir()
