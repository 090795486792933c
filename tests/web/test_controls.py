"""Live camera controls on the real appliance (composition root in-process, synthetic camera):
the decoded picture changes as asked, bad input is a 422 naming the control and its range, the
token is required, a restart-requiring control keeps a real aiortc viewer playing, and the values
survive a restart while the config stays the default."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.cameras.layout import camera_dir
from ruseon_appliance.capture.controls import CONTROLS_FILE, CameraControls
from ruseon_appliance.capture.stamp import read_stamp
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HostPort,
    HttpConfig,
    StateConfig,
    WebRtcConfig,
)
from tests.tooling import free_port
from tests.web.conftest import Viewer

TOKEN = "controls-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ORIENTATIONS = {
    "upright": lambda y: y,
    "hflip": lambda y: y[:, ::-1],
    "vflip": lambda y: y[::-1],
    "both": lambda y: y[::-1, ::-1],
}


def controls_of(appliance: Appliance) -> CameraControls:
    """The default camera's controls (what /api/camera/controls changes)."""
    controls = appliance.cameras.default.controls
    assert controls is not None
    return controls


def controls_file(config: Config) -> Path:
    """Where the default camera saves its controls: its own folder, as every camera's."""
    return camera_dir(Path(config.state.dir), config.cameras[0].name) / CONTROLS_FILE


def config_for(tmp_path: Path) -> Config:
    return dataclasses.replace(
        Config(),
        cameras=(CameraConfig(source="synthetic", width=320, height=240, keyframe_interval=30),),
        http=HttpConfig(listen=HostPort("127.0.0.1", free_port())),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        auth=AuthConfig(token=TOKEN),
        state=StateConfig(dir=str(tmp_path / "state")),
    )


@contextlib.asynccontextmanager
async def appliance_at(config: Config) -> AsyncIterator[tuple[Appliance, aiohttp.ClientSession,
                                                              str]]:
    appliance = Appliance(config)
    try:
        await appliance.start()
        async with aiohttp.ClientSession() as http:
            yield appliance, http, f"http://127.0.0.1:{config.http.listen.port}/api/camera/controls"
    finally:
        await appliance.stop()


async def patch(http: aiohttp.ClientSession, url: str, body: Any, *,
                status: int = 200) -> dict[str, Any]:
    async with http.patch(url, json=body, headers=AUTH) as resp:
        data: dict[str, Any] = await resp.json(content_type=None)
        assert resp.status == status, data
        return data


def orientation(luma: np.ndarray[Any, Any]) -> tuple[str, int] | None:
    """Which way the stamp reads, and its capture time."""
    for name, turn in ORIENTATIONS.items():
        stamp = read_stamp(np.ascontiguousarray(turn(luma)))
        if stamp is not None:
            return name, stamp[0]
    return None


async def pictures_after(appliance: Appliance, since_us: int, count: int = 5
                         ) -> list[tuple[str, float]]:
    """Decode the ring from a keyframe; ``(stamp orientation, mean luma)`` of ``count`` pictures
    captured after ``since_us``."""
    appliance.capture.request_keyframe("test")
    reader = appliance.capture.ring.reader("keyframe")
    decoder = av.CodecContext.create("h264", "r")
    out: list[tuple[str, float]] = []
    try:
        while len(out) < count:
            view = await reader.next()
            for frame in decoder.decode(av.Packet(bytes(view.data))):
                luma = frame.to_ndarray(format="gray")
                found = orientation(luma)
                assert found is not None, "no stamp in any orientation"
                if found[1] > since_us:
                    out.append((found[0], float(luma.mean())))
    finally:
        reader.close()
    return out


def now_us() -> int:
    return time.time_ns() // 1000


async def test_picture_follows_the_controls_and_survives_a_restart(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    async with appliance_at(config) as (appliance, http, url):
        # The token is required for both methods.
        async with http.get(url) as resp:
            assert resp.status == 401
        async with http.patch(url, json={"brightness": 0.5}) as resp:
            assert resp.status == 401
        async with http.get(url, headers=AUTH) as resp:
            described = await resp.json()
        controls = described["controls"]
        assert controls["brightness"] == {"value": 0.0, "live": True, "type": "float",
                                          "default": 0.0, "min": -1.0, "max": 1.0}
        assert controls["framerate"]["live"] is False
        assert "sharpness" in described["unsupported"]

        baseline = await pictures_after(appliance, now_us())
        assert {o for o, _ in baseline} == {"upright"}
        base_luma = np.mean([m for _, m in baseline])

        await patch(http, url, {"brightness": 0.5})
        brighter = np.mean([m for _, m in await pictures_after(appliance, now_us())])
        await patch(http, url, {"brightness": -0.5, "contrast": 0.8})
        darker = np.mean([m for _, m in await pictures_after(appliance, now_us())])
        assert brighter > base_luma + 20 and darker < base_luma - 20, (base_luma, brighter,
                                                                       darker)

        await patch(http, url, {"hflip": True})
        assert {o for o, _ in await pictures_after(appliance, now_us())} == {"hflip"}
        await patch(http, url, {"vflip": True})
        assert {o for o, _ in await pictures_after(appliance, now_us())} == {"both"}
        await patch(http, url, {"hflip": None})  # back to the config's value
        assert {o for o, _ in await pictures_after(appliance, now_us())} == {"vflip"}

    saved = controls_file(config)
    assert saved.stat().st_mode & 0o777 == 0o600
    async with appliance_at(config) as (appliance, http, url):
        async with http.get(url, headers=AUTH) as resp:
            controls = (await resp.json())["controls"]
        assert controls["brightness"]["value"] == -0.5
        assert controls["brightness"]["default"] == 0.0  # the config stays the default
        assert controls["vflip"]["value"] is True and controls["hflip"]["value"] is False
        assert {o for o, _ in await pictures_after(appliance, now_us())} == {"vflip"}


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"brightness": 3}, 422, ["brightness", "-1 to 1"]),
    ({"framerate": 0}, 422, ["framerate", "1 to 120 fps"]),
    ({"framerate": 2.5}, 422, ["framerate", "1 to 120"]),
    ({"hflip": "yes"}, 422, ["hflip", "true or false"]),
    ({"awb": "sunny"}, 422, ["has no awb"]),
    ({"sharpness": 2}, 422, ["synthetic source has no sharpness"]),
    ({"zoom": 2}, 422, ["unknown control 'zoom'", "brightness"]),
    ({"resolution": "999x1"}, 422, ["resolution", "1280x720"]),
    ({"brightness": 0.2, "zoom": 1}, 422, ["zoom"]),
    ({}, 422, ["non-empty JSON object"]),
    ([1, 2], 422, ["JSON object"]),
    ("not json", 400, ["not valid JSON"]),
])
async def test_bad_changes_are_422_and_change_nothing(tmp_path: Path, body: Any, status: int,
                                                      words: list[str]) -> None:
    async with appliance_at(config_for(tmp_path)) as (appliance, http, url):
        if body == "not json":
            async with http.patch(url, data=b"{nope", headers={
                    **AUTH, "Content-Type": "application/json"}) as resp:
                data = await resp.json(content_type=None)
                assert resp.status == status
        else:
            data = await patch(http, url, body, status=status)
        for word in words:
            assert word in data["detail"], data
        assert controls_of(appliance).values["brightness"] == 0.0
        assert not (controls_file(appliance.config)).exists()


async def test_numbers_json_can_spell_are_422_not_500(tmp_path: Path) -> None:
    """JSON has integers of any length, NaN and Infinity (Python's json reads them), and
    true/false are not 1/0: each is a 422 naming the control, never a 500."""
    huge = 10 ** 400
    rows: list[tuple[str, dict[str, Any]]] = [
        ("brightness", {"brightness": huge}), ("brightness", {"brightness": -huge}),
        ("framerate", {"framerate": huge}), ("brightness", {"brightness": "NaN"}),
        ("brightness", {"brightness": "Infinity"}), ("hflip", {"hflip": 1}),
        ("framerate", {"framerate": True}),
    ]
    async with appliance_at(config_for(tmp_path)) as (appliance, http, url):
        for name, body in rows:
            text = json.dumps(body).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
            async with http.patch(url, data=text, headers={
                    **AUTH, "Content-Type": "application/json"}) as resp:
                data = await resp.json(content_type=None)
                assert resp.status == 422, (body, data)
            assert name in data["detail"], data
        assert controls_of(appliance).values["brightness"] == 0.0
        assert not (controls_file(appliance.config)).exists()


async def test_a_bad_saved_file_does_not_stop_start_up(tmp_path: Path) -> None:
    """Whatever the state dir holds (half a file, nonsense values, a leftover temporary file
    from a crash with loose permissions), the appliance starts on the config's values and the
    next save is 0600."""
    config = config_for(tmp_path)
    saved = controls_file(config)
    saved.parent.mkdir(parents=True, exist_ok=True)
    for text in ('{"values": {"brightness": 0.', '[1, 2]', '{"values": 7}',
                 '{"values": {"brightness": 9, "zoom": 1, "hflip": 1, "framerate": NaN}}'):
        saved.write_text(text)
        async with appliance_at(config) as (appliance, http, url):
            assert controls_of(appliance).values["brightness"] == 0.0, text
            assert controls_of(appliance).values["hflip"] is False
    leftover = saved.with_suffix(".tmp")
    leftover.write_text("{}")
    leftover.chmod(0o644)
    async with appliance_at(config) as (appliance, http, url):
        await patch(http, url, {"brightness": 0.25})
    assert saved.stat().st_mode & 0o777 == 0o600
    assert json.loads(saved.read_text())["values"] == {"brightness": 0.25}


async def test_a_camera_that_fails_to_apply_is_503_not_500(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with appliance_at(config_for(tmp_path)) as (appliance, http, url):
        async def refuses(values: Any) -> bool:
            raise RuntimeError("sensor did not come back")

        monkeypatch.setattr(appliance.capture.source, "apply_controls", refuses)
        async with http.patch(url, json={"framerate": 10}, headers=AUTH) as resp:
            data = await resp.json(content_type=None)
            assert resp.status == 503, data
        assert "framerate" in data["detail"] and "sensor did not come back" in data["detail"]
        framerate = appliance.config.default_camera.framerate
        assert controls_of(appliance).values["framerate"] == framerate


async def test_restart_requiring_control_keeps_the_viewer_playing(tmp_path: Path) -> None:
    async with appliance_at(config_for(tmp_path)) as (appliance, http, url):
        assert appliance.engine is not None
        viewer = Viewer()
        try:
            whep = url.replace("/api/camera/controls", "/whep")
            async with http.post(whep, data=await viewer.offer(), headers={
                    **AUTH, "Content-Type": "application/sdp"}) as resp:
                assert resp.status == 201
                await viewer.accept(await resp.text())
            track = await viewer.track

            async def stamped_frames_after(since_us: int, count: int) -> list[int]:
                """Frame numbers of ``count`` decoded pictures captured after ``since_us``."""
                numbers: list[int] = []
                while len(numbers) < count:
                    frame = await track.recv()
                    stamp = read_stamp(frame)
                    if stamp is not None and stamp[0] > since_us:
                        numbers.append(stamp[1])
                return numbers

            before = await stamped_frames_after(0, 40)
            session_ids = set(appliance.engine.sessions)
            data = await patch(http, url, {"framerate": 15, "bitrate": 500_000})
            assert data["restarted"] is True
            # New viewers' frame timing follows the stream; the config stays the default.
            assert appliance.capture.camera.framerate == 15
            assert appliance.config.default_camera.framerate == 30
            # The same session goes on decoding pictures, and they come from the restarted
            # encoder (its frame numbers start again from 0).
            after = await stamped_frames_after(now_us(), 20)
            assert after[0] < before[-1] and after == sorted(after), (before, after)
            assert set(appliance.engine.sessions) == session_ids
            assert viewer.pc.connectionState == "connected"
        finally:
            await viewer.close()


async def test_a_value_the_camera_refuses_is_422_and_the_old_values_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: rpicam-vid (the stand-in) refuses 1280x720. The PATCH answers 422 with
    rpicam-vid's reason, the camera delivers again with the old values, GET shows them, and
    the values file is what the last accepted change wrote."""
    from tests.capture.test_sources import fake_rpicam_camera

    camera = fake_rpicam_camera(tmp_path, monkeypatch, FAKE_RPICAM_REJECT="--width=1280")
    config = dataclasses.replace(config_for(tmp_path), cameras=(camera,))
    async with appliance_at(config) as (appliance, http, url):
        await patch(http, url, {"bitrate": 400_000})
        await controls_of(appliance).flush()
        saved = controls_file(config)
        before = saved.read_bytes()
        data = await patch(http, url, {"resolution": "1280x720"}, status=422)
        assert "resolution='1280x720'" in data["detail"], data
        assert "--width 1280 not supported" in data["detail"], data
        assert "previous values are back" in data["detail"], data
        async with http.get(url, headers=AUTH) as resp:
            controls = (await resp.json())["controls"]
        assert controls["resolution"]["value"] == "320x240"
        assert controls["bitrate"]["value"] == 400_000
        frames = appliance.capture.frames_out
        reader = appliance.capture.ring.reader("next")
        try:
            for _ in range(5):  # the camera runs again
                await asyncio.wait_for(reader.next(), 20)
        finally:
            reader.close()
        assert appliance.capture.frames_out > frames
        await controls_of(appliance).flush()
        assert saved.read_bytes() == before


async def test_a_slow_fsync_does_not_stall_the_video(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: the controls file was written (open, write, fsync, rename) on the event loop
    that sends all video, on every PATCH and MQTT set. With fsync taking 300 ms (a slow SD
    card), 12 PATCHes in a row must not open gaps in a real viewer's pictures: gaps over 8 frame
    intervals (267 ms at 30 fps; each blocked fsync made one of at least 9) stay as rare as
    without PATCHes, and the file ends with the last values (the newest write wins)."""
    import os as os_module

    from ruseon_appliance.capture import controls as controls_module

    real_fsync = os_module.fsync
    fsyncs: list[float] = []

    def slow_fsync(fd: int) -> None:
        time.sleep(0.3)
        fsyncs.append(time.monotonic())
        real_fsync(fd)

    monkeypatch.setattr(controls_module.os, "fsync", slow_fsync)
    interval = 1 / 30
    async with appliance_at(config_for(tmp_path)) as (appliance, http, url):
        viewer = Viewer()
        try:
            whep = url.replace("/api/camera/controls", "/whep")
            async with http.post(whep, data=await viewer.offer(), headers={
                    **AUTH, "Content-Type": "application/sdp"}) as resp:
                assert resp.status == 201
                await viewer.accept(await resp.text())
            track = await viewer.track
            arrivals: list[float] = []

            async def watch() -> None:
                while True:
                    await track.recv()
                    arrivals.append(time.monotonic())

            watcher = asyncio.create_task(watch())
            try:
                while len(arrivals) < 30:  # joined and playing
                    await asyncio.sleep(0.05)
                quiet_from = len(arrivals)
                await asyncio.sleep(2.0)
                busy_from = len(arrivals)
                for n in range(12):
                    await patch(http, url, {"brightness": round(0.05 * (n + 1), 2)})
                    await asyncio.sleep(0.1)
                await controls_of(appliance).flush()
                busy_to = len(arrivals)
            finally:
                watcher.cancel()

            def big_gaps(times: list[float]) -> int:
                return sum(1 for a, b in itertools.pairwise(times)
                           if b - a > 8 * interval)

            quiet = big_gaps(arrivals[quiet_from:busy_from])
            busy = big_gaps(arrivals[busy_from:busy_to])
            assert busy <= quiet + 2, (quiet, busy)
            assert busy_to - busy_from > 30  # pictures kept coming
            assert 1 <= len(fsyncs) < 12  # written off the loop, overtaken writes never made
            saved = json.loads((controls_file(appliance.config)).read_text())
            assert saved["values"] == {"brightness": 0.6}
        finally:
            await viewer.close()


async def test_auto_has_the_chosen_sources_controls_and_keeps_them(tmp_path: Path) -> None:
    """``source = "auto"`` (the image's and ``make run``'s default) had no camera controls at
    all: they were read from the source before it had found a camera. Now they are the chosen
    source's (here the synthetic camera: this is not a Pi), PATCH works, and the saved values
    are applied to the source auto chooses after a restart."""
    config = dataclasses.replace(config_for(tmp_path), cameras=(CameraConfig(
        source="auto", rpicam_command="no-such-rpicam-vid", width=320, height=240,
        keyframe_interval=30),))
    async with appliance_at(config) as (appliance, http, url):
        async with http.get(url, headers=AUTH) as resp:
            described = await resp.json()
        assert described["source"] == "synthetic"
        assert described["controls"]["brightness"]["value"] == 0.0
        await patch(http, url, {"brightness": 0.5, "hflip": True})
        assert {o for o, _ in await pictures_after(appliance, now_us())} == {"hflip"}
    saved = json.loads((controls_file(config)).read_text())
    assert saved["values"] == {"brightness": 0.5, "hflip": True}
    async with appliance_at(config) as (appliance, http, url):
        async with http.get(url, headers=AUTH) as resp:
            controls = (await resp.json())["controls"]
        assert controls["brightness"]["value"] == 0.5 and controls["hflip"]["value"] is True
        assert {o for o, _ in await pictures_after(appliance, now_us())} == {"hflip"}
