"""File, rpicam and picamera sources, and ``auto`` selection, through the real pipeline."""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

import av
import pytest

from ruseon_appliance.capture.h264 import START_CODE_4
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.ring import FrameView
from ruseon_appliance.capture.sources.auto import create_source
from ruseon_appliance.capture.sources.base import SourceUnavailable
from ruseon_appliance.capture.sources.file import FileSource
from ruseon_appliance.capture.sources.picamera import (
    KeyframeStream,
    Picamera2Api,
    PicameraSource,
)
from ruseon_appliance.capture.sources.rpicam import RpicamSource, rpicam_command
from ruseon_appliance.capture.sources.synthetic import SyntheticSource
from ruseon_appliance.config import CameraConfig

from .conftest import CAM_STREAM, MP4_CLIP, ONCE_STREAM, decode_alone, split_file

FAKE_RPICAM = Path(__file__).parent / "fake_rpicam_vid.py"
CAMERA = CameraConfig(width=320, height=240, framerate=30, bitrate=250_000, keyframe_interval=30,
                      ring_bytes=1024 * 1024, ring_slots=256, max_frame_bytes=256 * 1024)


async def read_frames(pipeline: CapturePipeline, count: int, timeout: float = 10) -> list[bytes]:
    reader = pipeline.ring.reader()
    frames = []
    for _ in range(count):
        view: FrameView = await asyncio.wait_for(reader.next(), timeout)
        frames.append(bytes(view.data))
    reader.close()
    return frames


def assert_decodable_sequence(frames: list[bytes]) -> None:
    """First frame an IDR with SPS+PPS that decodes alone; the whole run decodes in order."""
    assert frames[0].startswith(START_CODE_4 + b"\x67")
    assert len(decode_alone(frames[0])) == 1
    decoder = av.CodecContext.create("h264", "r")
    decoded = 0
    for data in frames:
        decoded += len(decoder.decode(av.Packet(data)))
    assert decoded >= len(frames) - 1


# -- file ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [ONCE_STREAM, MP4_CLIP])
async def test_file_source_loops_with_monotonic_pts(path: Path) -> None:
    camera = dataclasses.replace(CAMERA, source=f"file:{path}", framerate=120)
    pipeline = CapturePipeline(camera)
    assert pipeline.source_kind == "file"
    await pipeline.start()
    try:
        total = len(split_file(path)) if path.suffix == ".h264" else 45
        reader = pipeline.ring.reader()
        views = []
        for _ in range(total + 25):  # past the end of the file: it must loop
            view = await asyncio.wait_for(reader.next(), 10)
            views.append((view.pts, view.keyframe, bytes(view.data)))
        pts = [p for p, _, _ in views]
        assert pts == sorted(set(pts))  # strictly increasing across the loop
        assert views[0][1] and views[total][1]  # the loop restarts at a keyframe
        assert_decodable_sequence([d for _, _, d in views])
        stats = pipeline.stats()
        assert stats["source_loops"] >= 1 and stats["frames_dropped"] == 0
    finally:
        await pipeline.stop()


async def test_file_source_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    source = FileSource(CAMERA, tmp_path / "nope.h264")
    with pytest.raises(SourceUnavailable, match="cannot be read"):
        await source.start(lambda au: None)
    junk = tmp_path / "junk.h264"
    junk.write_bytes(b"\x00" * 1000)
    with pytest.raises(SourceUnavailable, match=r"no H\.264 IDR"):
        await FileSource(CAMERA, junk).start(lambda au: None)


# -- rpicam -------------------------------------------------------------------------------------


def fake_rpicam_camera(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       **env: str) -> CameraConfig:
    monkeypatch.setenv("FAKE_RPICAM_STREAM", str(CAM_STREAM))
    monkeypatch.setenv("FAKE_RPICAM_LOG", str(tmp_path / "starts.log"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_RPICAM))}"
    return dataclasses.replace(CAMERA, source="rpicam", rpicam_command=command)


def test_rpicam_command_line() -> None:
    camera = dataclasses.replace(CAMERA, hflip=True, exposure_us=10_000, gain=2.0, awb="daylight",
                                 profile="main")
    argv = rpicam_command(camera, pi5=True)
    joined = " ".join(argv)
    for part in ("--inline --flush", "--intra 30", "--profile main", "--width 320",
                 "--height 240", "--framerate 30", "--bitrate 250000", "--hflip",
                 "--shutter 10000", "--gain 2.0", "--awb daylight", "--low-latency"):
        assert part in joined
    assert argv[-2:] == ["-o", "-"] and "--vflip" not in argv
    assert "--low-latency" not in rpicam_command(CAMERA, pi5=False)


async def test_rpicam_source_delivers_and_survives_child_death(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    camera = fake_rpicam_camera(tmp_path, monkeypatch, FAKE_RPICAM_EXIT_AFTER="20")
    source = RpicamSource(camera, backoff_s=(0.05, 0.2))
    pipeline = CapturePipeline(camera, source=source)
    await pipeline.start()
    try:
        frames = await read_frames(pipeline, 15)
        assert_decodable_sequence(frames)
        # The stand-in dies mid-frame after 20 frames; frames keep coming after restarts.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while source.starts < 3 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert source.starts >= 3 and source.crashes >= 2
        before = pipeline.frames_out
        frames = await read_frames(pipeline, 5)  # the newest GOP: from the latest restart
        assert_decodable_sequence(frames)
        while pipeline.frames_out <= before + 5 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert pipeline.frames_out > before + 5
        logged = (tmp_path / "starts.log").read_text().splitlines()
        assert len(logged) >= 3 and "--inline --flush" in logged[0]
        # The half-written frame of each crash was never passed on as a picture.
        assert pipeline.stats()["muxer_invalid_nal"] == 0
    finally:
        await pipeline.stop()
    assert source.stats()["starts"] == source.starts


async def test_rpicam_keyframe_request_restarts_child_rate_limited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    camera = fake_rpicam_camera(tmp_path, monkeypatch)
    source = RpicamSource(camera, keyframe_restart_interval_s=60)
    pipeline = CapturePipeline(dataclasses.replace(camera, keyframe_request_interval_ms=0),
                               source=source)
    await pipeline.start()
    try:
        await read_frames(pipeline, 35)  # past the first IDR and into the next GOP
        reader = pipeline.ring.reader("next")
        assert pipeline.request_keyframe("viewer") is True
        assert pipeline.request_keyframe("viewer") is True  # coalescer window 0 ...
        view = await asyncio.wait_for(reader.next(), 10)
        while not view.keyframe:
            view = await asyncio.wait_for(reader.next(), 10)
        assert len(decode_alone(bytes(view.data))) == 1
        assert source.keyframe_restarts == 1  # ... but the source limits restarts itself
        assert source.keyframe_requests_ignored == 1
        assert source.crashes == 0 and source.starts == 2
    finally:
        await pipeline.stop()


# -- picamera (stand-in camera replaying recorded encoder output) ------------------------------


class StandInOutput:
    """The shape of ``picamera2.outputs.Output`` this source relies on."""

    def __init__(self) -> None:
        self.recording = False

    def outputframe(self, frame: Any, keyframe: bool = True, timestamp: int | None = None,
                    packet: Any = None, audio: bool = False) -> None:
        raise NotImplementedError


class StandInEncoder:
    """Replays the recording like the V4L2 encoder: SPS+PPS in IDR buffers, µs timestamps."""

    def __init__(self, bitrate: int, repeat: bool = False, iperiod: int | None = None,
                 framerate: float | None = None, profile: str | None = None) -> None:
        self.args = {"bitrate": bitrate, "repeat": repeat, "iperiod": iperiod,
                     "framerate": framerate, "profile": profile}
        self.units = split_file(CAM_STREAM)
        self.forced = threading.Event()
        self.force_calls = 0

    def force_key_frame(self) -> None:
        self.force_calls += 1
        self.forced.set()

    def run(self, output: StandInOutput, stop: threading.Event, fps: int) -> None:
        start = time.monotonic()
        i = n = 0
        while not stop.is_set():
            if stop.wait(max(0.0, start + n / fps - time.monotonic())):
                break
            if self.forced.is_set():
                # A real encoder makes the next picture an IDR: jump to the recording's next one.
                self.forced.clear()
                i = next(k for k in range(i, i + len(self.units))
                         if self.units[k % len(self.units)][1]) % len(self.units)
            data, idr = self.units[i % len(self.units)]
            # picamera2 hands a buffer view that the encoder reuses after the call returns.
            buffer = bytearray(data)
            output.outputframe(memoryview(buffer), idr, timestamp=5_000_000 + n * 33_333)
            buffer[:] = b"\xee" * len(buffer)
            i += 1
            n += 1


class StandInPicamera2:
    instances: list[StandInPicamera2] = []

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}
        self.closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        StandInPicamera2.instances.append(self)

    @staticmethod
    def global_camera_info() -> list[dict[str, Any]]:
        return [{"Model": "imx708", "Num": 0}]

    def create_video_configuration(self, **kwargs: Any) -> dict[str, Any]:
        return kwargs

    def configure(self, config: dict[str, Any]) -> None:
        self.config = config

    def start_recording(self, encoder: StandInEncoder, output: StandInOutput) -> None:
        self.encoder = encoder
        fps = int(self.config["controls"]["FrameRate"])
        self._thread = threading.Thread(target=encoder.run, args=(output, self._stop, fps))
        self._thread.start()

    def stop_recording(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        self.closed = True


class StandInTransform:
    def __init__(self, hflip: int = 0, vflip: int = 0) -> None:
        self.hflip, self.vflip = hflip, vflip


class StandInControls:
    class AwbModeEnum:
        Auto = 0
        Daylight = 5


STAND_IN_API = Picamera2Api(StandInPicamera2, StandInEncoder, StandInOutput,
                            Transform=StandInTransform, controls=StandInControls)


async def test_picamera_source_with_stand_in_camera() -> None:
    camera = dataclasses.replace(CAMERA, source="picamera", vflip=True, exposure_us=8000,
                                 awb="daylight", keyframe_request_interval_ms=0)
    source = PicameraSource(camera, api=STAND_IN_API, pi5=False)
    pipeline = CapturePipeline(camera, source=source)
    assert pipeline.source_kind == "picamera"
    await pipeline.start()
    cam = StandInPicamera2.instances[-1]
    try:
        frames = await read_frames(pipeline, 40)
        # Buffers were copied before the encoder reused them (it scribbles 0xee after the call).
        assert_decodable_sequence(frames)
        assert not any(f.startswith(START_CODE_4 + b"\xee") for f in frames)
        controls = cam.config["controls"]
        assert controls["FrameRate"] == 30.0 and controls["ExposureTime"] == 8000
        assert controls["AeEnable"] is False and controls["AwbMode"] == 5
        assert cam.config["main"]["size"] == (320, 240)
        assert (cam.config["transform"].hflip, cam.config["transform"].vflip) == (0, 1)
        assert cam.encoder.args == {"bitrate": 250_000, "repeat": True, "iperiod": 30,
                                    "framerate": 30, "profile": "baseline"}
        reader = pipeline.ring.reader("next")
        await read_frames(pipeline, 3)  # mid-GOP
        assert pipeline.request_keyframe("pli") is True
        count = 0
        view = await asyncio.wait_for(reader.next(), 5)
        while not view.keyframe:
            count += 1
            view = await asyncio.wait_for(reader.next(), 5)
        assert count <= 2 and cam.encoder.force_calls == 1
        assert len(decode_alone(bytes(view.data))) == 1
    finally:
        await pipeline.stop()
    assert cam.closed


def test_picamera_missing_is_a_clear_error() -> None:
    with pytest.raises(SourceUnavailable, match="python3-picamera2"):
        create_source(dataclasses.replace(CAMERA, source="picamera"))


def test_libav_keyframe_fix_forces_idr_with_real_pyav() -> None:
    """The Pi 5 fix: PictureType.I through the stream proxy really yields an IDR (PyAV >= 14)."""
    container = av.open("/dev/null", "w", format="null")
    stream = container.add_stream("libx264", rate=30)
    stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
    stream.codec_context.options = {"tune": "zerolatency", "preset": "ultrafast"}
    proxy = KeyframeStream(stream)
    keyframes = []
    for i in range(10):
        frame = av.VideoFrame(64, 64, "yuv420p")
        frame.pts = i
        if i == 5:
            proxy.pending = True
        keyframes += [p.is_keyframe for p in proxy.encode(frame)]
    container.close()
    assert keyframes == [True, False, False, False, False, True, False, False, False, False]
    assert proxy.forced == 1


# -- auto ---------------------------------------------------------------------------------------


def test_auto_falls_back_to_synthetic(caplog: pytest.LogCaptureFixture) -> None:
    camera = dataclasses.replace(CAMERA, source="auto", rpicam_command="no-such-rpicam-vid")
    with caplog.at_level("INFO"):
        source = create_source(camera)
    assert isinstance(source, SyntheticSource)
    assert "synthetic" in caplog.text


def test_auto_picks_rpicam_when_binary_and_camera_present(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    camera = dataclasses.replace(fake_rpicam_camera(tmp_path, monkeypatch), source="auto")
    assert isinstance(create_source(camera), RpicamSource)
    monkeypatch.setenv("FAKE_RPICAM_NO_CAMERA", "1")
    assert isinstance(create_source(camera), SyntheticSource)


def test_explicit_rpicam_without_binary_is_a_clear_error() -> None:
    with pytest.raises(SourceUnavailable, match="rpicam-apps"):
        create_source(dataclasses.replace(CAMERA, source="rpicam", rpicam_command="nope-vid"))
