"""A missing camera is reported, never faked, and picked up when it comes (issue 24).

On a Raspberry Pi (the device tree says so; here a model file the test writes) ``auto`` never
falls back to the synthetic test picture: with the picamera2 stand-in unplugged the appliance
starts, ``/healthz`` is 503 saying what was probed, the stall (Home Assistant problem) sensor
turns on, the watchdog stays fed, and once the stand-in is plugged in a viewer that joined while
there was no camera decodes pictures, without a restart. With an explicit IP camera that is not
there yet, ``ruseon serve`` stays up (no exit, so systemd never counts a failed start) and
streams once the camera answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import aioice.ice
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.cameras import camera as camera_module
from ruseon_appliance.capture.sources import auto, board
from ruseon_appliance.capture.sources.synthetic import SyntheticSource
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HostPort,
    HttpConfig,
    StateConfig,
    WebRtcConfig,
)
from ruseon_appliance.events import producers
from tests.capture import picamera2_stand_in as stand_in
from tests.capture.test_rtsp import RtspServer, recording  # noqa: F401 (a fixture)
from tests.tooling import IN_CI, free_port
from tests.web.conftest import Viewer

TOKEN = "missing-camera-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(autouse=True)
def loopback_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Client peers gather one host candidate, 127.0.0.1 (as tests/web/conftest.py)."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


def test_a_raspberry_pi_or_the_image_expects_a_camera(tmp_path: Path) -> None:
    model = tmp_path / "model"
    marker = tmp_path / "image-release"
    assert board.camera_expected((model,), marker) == ""  # a developer machine
    model.write_bytes(b"Raspberry Pi 4 Model B Rev 1.5\0")
    assert board.camera_expected((tmp_path / "absent", model), marker) == \
        "Raspberry Pi 4 Model B Rev 1.5"
    model.write_bytes(b"QEMU Virtual Machine\0")
    marker.write_text("ruseon 0.1 built 2026-12-01\n")
    assert board.camera_expected((model,), marker) == f"the RUSEON image ({marker})"


async def test_auto_on_a_developer_machine_keeps_the_test_picture() -> None:
    """``make run``: nothing says a camera belongs here, so the synthetic camera stands in."""
    camera = CameraConfig(source="auto", rpicam_command="no-such-rpicam-vid")
    source = auto.AutoSource(camera, expected="")
    chosen = await auto.choose_source(camera, expected=source.expected)
    assert isinstance(chosen, SyntheticSource)


@pytest.fixture
def on_a_pi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This machine is a Raspberry Pi 4 whose picamera2 (the stand-in) has no camera plugged
    in; retries and the stall grace are shortened so the test takes seconds."""
    model = tmp_path / "model"
    model.write_bytes(b"Raspberry Pi 4 Model B Rev 1.5\0")
    real = board.camera_expected
    monkeypatch.setattr(auto, "camera_expected",
                        lambda: real((model,), tmp_path / "no-image-release"))
    monkeypatch.setattr(auto, "load_picamera2", stand_in.make_api)
    monkeypatch.setattr(camera_module, "RETRY_FIRST_S", 0.3)
    monkeypatch.setattr(camera_module, "RETRY_MAX_S", 0.6)
    monkeypatch.setattr(producers, "FIRST_FRAME_GRACE_S", 1.0)
    stand_in.Picamera2.unplugged = True
    try:
        yield
    finally:
        stand_in.Picamera2.unplugged = False


async def test_auto_on_a_pi_without_a_camera_says_so_and_picks_it_up(
        tmp_path: Path, on_a_pi: None) -> None:
    port = free_port()
    config = Config(
        cameras=(CameraConfig(source="auto", rpicam_command="no-such-rpicam-vid", width=320,
                            height=240, framerate=30, keyframe_interval=30),),
        http=HttpConfig(listen=HostPort("127.0.0.1", port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        auth=AuthConfig(token=TOKEN),
        state=StateConfig(dir=str(tmp_path / "state")))
    app = Appliance(config)
    base = f"http://127.0.0.1:{port}"
    viewer = Viewer()
    await app.start()  # READY without a camera: nothing to wait for
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as response:
                assert response.status == 503
                detail = (await response.json(content_type=None))["detail"]
            assert "no camera detected" in detail, detail
            assert "picamera2 lists no camera" in detail and "not installed" in detail, detail
            assert "Raspberry Pi 4 Model B" in detail and "probing again" in detail, detail
            async with http.get(f"{base}/api/cameras", headers=AUTH) as response:
                row = (await response.json())["cameras"][0]
            assert row["up"] is False and row["missing"] is True, row
            assert row["kind"] == "auto" and row["frames_in"] == 0  # never the test picture
            # Home Assistant's problem sensor turns on; the watchdog is still fed.
            deadline = time.monotonic() + 30
            while not app.cameras.default.stall_watcher.stalled:
                assert time.monotonic() < deadline, "the stall sensor never turned on"
                await asyncio.sleep(0.1)
            assert app._sensor_state()["stalled"] is True
            assert app.cameras.stuck() == []
            failures = app.cameras.default.start_failures

            # A viewer is refused with the reason (the page shows it and retries).
            offer = await viewer.offer()
            async with http.post(f"{base}/whep", data=offer, headers={
                    **AUTH, "Content-Type": "application/sdp"}) as response:
                assert response.status == 503
                assert response.headers["Retry-After"]
                detail = (await response.json(content_type=None))["detail"]
            assert "no camera detected" in detail, detail
            await asyncio.sleep(1.0)  # a few more probes fail
            assert app.cameras.default.start_failures > failures
            # The ribbon cable is pushed in: the next probe finds the camera.
            stand_in.Picamera2.unplugged = False
            async with http.post(f"{base}/whep", data=offer, headers={
                    **AUTH, "Content-Type": "application/sdp"}) as response:
                assert response.status == 201, await response.text()
                await viewer.accept(await response.text())
            track = await asyncio.wait_for(viewer.track, 30)
            pictures = 0
            while pictures < 10:
                frame = await asyncio.wait_for(track.recv(), 30)
                assert frame.width == 320 and frame.height == 240
                pictures += 1
            assert app.capture.source_kind == "picamera"
            async with http.get(f"{base}/healthz") as response:
                assert response.status == 200, await response.text()
            deadline = time.monotonic() + 30
            while app.cameras.default.stall_watcher.stalled:
                assert time.monotonic() < deadline, "the stall sensor never turned off"
                await asyncio.sleep(0.1)
    finally:
        await viewer.close()
        await app.stop()


@pytest.fixture
def rtsp_server_tool() -> None:
    check = subprocess.run(["/usr/bin/python3", "-c", "import gi; gi.require_version("
                            "'GstRtspServer', '1.0')"], capture_output=True, text=True)
    if check.returncode != 0:
        message = ("GStreamer's RTSP server is not installed (python3-gi, "
                   "gir1.2-gst-rtsp-server-1.0: scripts/install-system-deps)")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


async def test_serve_stays_up_for_an_ip_camera_that_answers_later(
        tmp_path: Path, recording: Path, rtsp_server_tool: None) -> None:  # noqa: F811
    """``ruseon serve`` with an explicit camera that is not there: it does not exit (a failed
    start is what exhausts systemd's StartLimitBurst), /healthz is 503 naming the camera's
    error, and once the camera answers a real aiortc viewer decodes its pictures, same
    process."""
    http_port, rtsp_port = free_port(), free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ruseon_appliance", "serve", "--config", "/dev/null",
         "--source", f"rtsp://127.0.0.1:{rtsp_port}/cam", "--http", f"127.0.0.1:{http_port}",
         "--rtc", "127.0.0.1:0", "--advertise", "127.0.0.1", "--state-dir",
         str(tmp_path / "state")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "RUSEON_AUTH_TOKEN": TOKEN})
    base = f"http://127.0.0.1:{http_port}"
    camera = RtspServer(recording, rtsp_port)
    viewer = Viewer()
    try:
        async with aiohttp.ClientSession() as http:
            detail = ""
            deadline = time.monotonic() + 120  # bounds a broken run; nothing is timed
            while "connection refused" not in detail.lower():
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, (detail, (tmp_path / "serve.log").read_text())
                try:
                    async with http.get(f"{base}/healthz") as response:
                        assert response.status == 503, await response.text()
                        detail = (await response.json(content_type=None))["detail"]
                except aiohttp.ClientConnectionError:
                    pass  # not listening yet
                await asyncio.sleep(0.2)
            await asyncio.sleep(25)  # past the 20 s start-up wait for a first frame
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()

            await asyncio.to_thread(camera.start)  # the camera answers now
            deadline = time.monotonic() + 120
            while True:
                async with http.get(f"{base}/healthz") as response:
                    if response.status == 200:
                        break
                    text = await response.text()
                assert time.monotonic() < deadline, (text, (tmp_path / "serve.log").read_text())
                await asyncio.sleep(0.2)
            async with http.post(f"{base}/whep", data=await viewer.offer(), headers={
                    **AUTH, "Content-Type": "application/sdp"}) as response:
                assert response.status == 201, await response.text()
                await viewer.accept(await response.text())
            track = await asyncio.wait_for(viewer.track, 60)
            for _ in range(10):
                frame = await asyncio.wait_for(track.recv(), 60)
                assert (frame.width, frame.height) == (192, 112)
    finally:
        await viewer.close()
        camera.kill()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
    text = (tmp_path / "serve.log").read_text()
    assert proc.returncode == 0, text
    assert "ready: open" in text and "start-up failed" not in text, text


async def _restarted_after_freeze(camera: Any, frozen: Any) -> None:
    """The camera delivers again after ``frozen`` froze: reopened once, same process."""
    await asyncio.sleep(0.2)
    frames = camera.pipeline.frames_out
    # A liveness bound, not a timing claim: the restart takes a second or two.
    deadline = time.monotonic() + 60
    while camera.pipeline.frames_out < frames + 10 or camera.problem() is not None:
        assert time.monotonic() < deadline, (
            camera.problem(), camera.stall_restarts, camera.start_failures,
            camera.pipeline.frames_out - frames, len(stand_in.Picamera2.instances))
        await asyncio.sleep(0.1)
    assert camera.stall_restarts == 1
    assert stand_in.Picamera2.instances[-1] is not frozen and frozen.closed
    assert not camera.stuck()


def _supervised_picamera(monkeypatch: pytest.MonkeyPatch) -> Any:
    from ruseon_appliance.cameras import Camera
    from ruseon_appliance.capture.pipeline import CapturePipeline
    from ruseon_appliance.capture.sources.picamera import PicameraSource

    monkeypatch.setattr(camera_module, "STALL_RESTART_S", 1.0)
    monkeypatch.setattr(camera_module, "SUPERVISE_S", 0.1)
    config = CameraConfig(source="picamera", width=320, height=240, framerate=30)
    source = PicameraSource(config, api=stand_in.make_api())
    return Camera(config, pipeline=CapturePipeline(config, source=source))


async def test_a_camera_that_stops_sending_is_restarted_in_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog no longer restarts the service for a silent camera; the camera's own
    supervisor restarts a source that cannot recover by itself (picamera2): the stand-in's
    sensor freezes, and the camera is reopened and delivers again, same process."""
    camera = _supervised_picamera(monkeypatch)
    assert await camera.start()
    try:
        assert await camera.pipeline.wait_first_frame(20)
        frozen = stand_in.Picamera2.instances[-1]
        frozen.freeze()
        await _restarted_after_freeze(camera, frozen)
    finally:
        await camera.stop()


async def test_a_camera_that_freezes_while_its_start_returns_is_restarted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames that came and stopped before the source's start returned (picamera2 on a loaded
    board: CI's run) are this start's frames: the freeze is seen and the camera reopened. It
    was not: the stall rule only counted frames after start() had returned, and the camera
    stayed down for good."""
    camera = _supervised_picamera(monkeypatch)
    start = camera.pipeline.start
    frozen: list[Any] = []

    async def start_that_returns_late() -> None:
        await start()
        if not frozen:  # the first start only: the sensor freezes before start() returns
            assert await camera.pipeline.wait_first_frame(20)
            frozen.append(stand_in.Picamera2.instances[-1])
            frozen[0].freeze()
            await asyncio.sleep(0.3)

    monkeypatch.setattr(camera.pipeline, "start", start_that_returns_late)
    assert await camera.start()
    try:
        await _restarted_after_freeze(camera, frozen[0])
    finally:
        await camera.stop()


async def test_a_camera_whose_start_hangs_is_stuck_and_withholds_the_watchdog(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The one camera trouble a service restart is for: a driver call that never returns
    (here opening the stand-in blocks). A camera that is merely missing is not stuck."""
    import threading

    from ruseon_appliance.cameras import Camera, CameraSet
    from ruseon_appliance.capture.pipeline import CapturePipeline
    from ruseon_appliance.capture.sources.picamera import PicameraSource

    monkeypatch.setattr(camera_module, "STUCK_S", 0.5)
    config = CameraConfig(source="picamera", width=320, height=240, framerate=30)
    stand_in.Picamera2.unplugged = True
    missing = Camera(config, pipeline=CapturePipeline(
        config, source=PicameraSource(config, api=stand_in.make_api())))
    assert not await missing.start()
    hang = stand_in.Picamera2.hang_open = threading.Event()
    hung = Camera(dataclasses.replace(config, name="hung"), pipeline=CapturePipeline(
        config, source=PicameraSource(config, api=stand_in.make_api())))
    starting = asyncio.create_task(hung.start())
    cameras = CameraSet([missing, hung])
    try:
        await asyncio.sleep(1.0)
        assert cameras.stuck() == ["hung"]  # the watchdog's check (app.py)
    finally:
        stand_in.Picamera2.hang_open = None
        stand_in.Picamera2.unplugged = False
        hang.set()
        await starting
        await cameras.stop()
    assert cameras.stuck() == []


async def test_an_explicit_rpicam_without_a_camera_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``source = "rpicam"`` with the camera unplugged: the start does not fail (rpicam-vid is
    restarted with back-off by its supervisor), and the problem line carries rpicam-vid's own
    words; plugged in, it delivers."""
    from ruseon_appliance.cameras import Camera
    from ruseon_appliance.capture.pipeline import CapturePipeline
    from ruseon_appliance.capture.sources.rpicam import RpicamSource
    from tests.capture.test_sources import fake_rpicam_camera

    unplugged = tmp_path / "unplugged"
    unplugged.write_text("")
    config = fake_rpicam_camera(tmp_path, monkeypatch, FAKE_RPICAM_UNPLUGGED=str(unplugged))
    source = RpicamSource(config, backoff_s=(0.1, 0.3))
    camera = Camera(config, pipeline=CapturePipeline(config, source=source))
    assert await camera.start()
    try:
        deadline = time.monotonic() + 30
        while "no cameras available" not in (camera.problem() or ""):
            assert time.monotonic() < deadline, camera.problem()
            await asyncio.sleep(0.05)
        assert "rpicam-vid exited with status 255" in (camera.problem() or "")
        unplugged.unlink()
        assert await camera.pipeline.wait_first_frame(30)
        deadline = time.monotonic() + 30
        while camera.problem() is not None:
            assert time.monotonic() < deadline, camera.problem()
            await asyncio.sleep(0.05)
        assert source.stats()["last_error"] == ""
    finally:
        await camera.stop()
