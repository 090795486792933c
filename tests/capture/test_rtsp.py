"""The RTSP source against a real RTSP server (GStreamer's gst-rtsp-server from Debian, started
by the test on loopback inside the test run's network namespace)."""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import itertools
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest

from ruseon_appliance.capture.h264 import AccessUnitSplitter
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.sources.rtsp import RtspSource, nal_types, redact
from ruseon_appliance.capture.stamp import draw_stamp, read_stamp
from ruseon_appliance.config import CameraConfig, validate_camera
from tests.tooling import IN_CI, free_port

from .conftest import decode_alone

SERVER = Path(__file__).parent / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"
WIDTH, HEIGHT, FPS, SECONDS = 192, 112, 15, 30


def slices(annexb: bytes) -> list[bytes]:
    """The coded slice NAL units (types 1 and 5) of an Annex B buffer, start codes removed."""
    parts = [p for p in annexb.split(b"\x00\x00\x01") if p]
    return [p.rstrip(b"\x00") for p in parts if p[0] & 0x1F in (1, 5)]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stamped libx264 recording (VUI timing at FPS, an IDR every second)."""
    return record(tmp_path_factory.mktemp("rtsp") / "stamped.h264", WIDTH, HEIGHT)


def record(path: Path, width: int, height: int) -> Path:
    """``SECONDS`` of stamped libx264 at ``FPS`` (an IDR every second) into ``path``."""
    encoder = av.CodecContext.create("libx264", "w")
    encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuv420p"
    encoder.time_base, encoder.framerate = fractions.Fraction(1, FPS), FPS
    encoder.options = {"tune": "zerolatency", "preset": "ultrafast", "g": str(FPS),
                       "profile": "baseline", "bf": "0"}
    with path.open("wb") as out:
        for n in range(FPS * SECONDS):
            luma = np.full((height, width), 60 + n % 40, np.uint8)
            draw_stamp(luma, n * 1_000_000 // FPS, n)
            frame = av.VideoFrame(width, height, "yuv420p")
            frame.planes[0].update(luma.tobytes())
            frame.pts = n
            for packet in encoder.encode(frame):
                out.write(bytes(packet))
        for packet in encoder.encode(None):
            out.write(bytes(packet))
    return path


def timed(recording: Path, fps: int = FPS) -> Path:
    """The Annex B ``recording`` in MPEG-TS (made once beside it), each access unit stamped
    ``n / fps`` at 90 kHz, so the camera's RTP timestamps advance as a real camera's do. (From
    the bare ``.h264`` GStreamer's h264parse makes no timestamps: every frame went out with one
    RTP timestamp, and the appliance fell back to timing them by arrival.)"""
    out = recording.with_suffix(".ts")
    if out.exists() and out.stat().st_mtime_ns >= recording.stat().st_mtime_ns:
        return out
    partial = out.with_suffix(".ts.partial")
    rate = fractions.Fraction(1, 90_000)
    with av.open(str(recording), format="h264") as source, \
            av.open(str(partial), "w", format="mpegts") as sink:
        stream = sink.add_stream("h264", rate=fps)
        stream.width, stream.height = source.streams.video[0].codec_context.width, \
            source.streams.video[0].codec_context.height
        stream.time_base = rate
        for n, packet in enumerate(p for p in source.demux(video=0) if p.size):
            packet.stream = stream
            packet.time_base = rate
            packet.pts = packet.dts = n * 90_000 // fps + 90_000
            sink.mux(packet)
    partial.replace(out)
    return out


class RtspServer:
    """gst-rtsp-server in a child process of Debian's Python (python3-gi)."""

    def __init__(self, recording: Path, port: int, audio: str = "none") -> None:
        self.recording, self.port, self.audio = recording, port, audio
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([SYSTEM_PYTHON, str(SERVER), str(self.port), "/cam",
                                      str(timed(self.recording)), self.audio],
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line == "ready", line + self.proc.stdout.read()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def server(recording: Path) -> Iterator[RtspServer]:
    require_rtsp_server()
    running = RtspServer(recording, free_port())
    running.start()
    yield running
    running.kill()


def require_rtsp_server() -> None:
    """Fail in CI (skip elsewhere) without GStreamer's RTSP server."""
    check = subprocess.run([SYSTEM_PYTHON, "-c", "import gi; gi.require_version("
                            "'GstRtspServer', '1.0')"], capture_output=True, text=True)
    if check.returncode != 0:
        message = ("GStreamer's RTSP server is not installed (python3-gi, "
                   "gir1.2-gst-rtsp-server-1.0: scripts/install-system-deps)")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


async def read_units(pipeline: CapturePipeline, count: int, timeout: float = 30) -> list[
        tuple[bytes, int, bool]]:
    """The next ``count`` access units the ring gets: (data, pts, keyframe)."""
    reader = pipeline.ring.reader("next")
    out = []
    try:
        while len(out) < count:
            view = await asyncio.wait_for(reader.next(), timeout)
            out.append((bytes(view.data), view.pts, view.keyframe))
    finally:
        reader.close()
    return out


async def wait_until(predicate: object, timeout: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_redact_and_config() -> None:
    assert redact("rtsp://admin:secret@192.0.2.3:554/s1") == "rtsp://***@192.0.2.3:554/s1"
    assert redact("rtsp://admin:p@ss@192.0.2.3/s1") == "rtsp://***@192.0.2.3/s1"
    assert redact("rtsp://192.0.2.3/s1?user=a@b") == "rtsp://192.0.2.3/s1?user=a@b"
    validate_camera(CameraConfig(name="gate", source="rtsp://192.0.2.3:554/s1"))


async def test_a_refused_camera_is_retried_and_its_password_never_shown() -> None:
    url = f"rtsp://admin:secret@127.0.0.1:{free_port()}/cam"
    camera = CameraConfig(name="gate", source=url, framerate=FPS)
    source = RtspSource(camera, url, backoff_s=(0.1, 0.2))
    await source.start(lambda au: None)
    try:
        await wait_until(lambda: source.disconnects >= 2)  # refused, retried, refused again
        stats = source.stats()
        assert stats["connected"] is False and stats["last_error"]
        assert "secret" not in str(stats) and "***@127.0.0.1" in stats["url"]
    finally:
        await source.stop()


async def test_passes_the_cameras_h264_through_and_reconnects(
        server: RtspServer, recording: Path) -> None:
    url = f"rtsp://127.0.0.1:{server.port}/cam"
    camera = CameraConfig(name="gate", source=url, framerate=FPS, width=WIDTH, height=HEIGHT)
    source = RtspSource(camera, url, backoff_s=(0.2, 1.0))
    pipeline = CapturePipeline(camera, source=source)
    assert pipeline.source_kind == "rtsp"
    recorded = [s for unit, _ in AccessUnitSplitter().split_all(recording.read_bytes())
                for s in slices(unit)]
    await pipeline.start()
    try:
        units = await read_units(pipeline, 2 * FPS)
        # Timed by the camera's own clock (its RTP timestamps): most steps are the camera's
        # 1/FPS s (GStreamer rounds a tick now and then), whatever the arrival jitter; a
        # start-up burst may close a few up.
        stats = source.stats()
        assert stats["frame_times"] == "camera" and stats["clock_resyncs"] == 0, stats
        steps = [b[1] - a[1] for a, b in itertools.pairwise(units)]
        assert sum(abs(step - 90_000 // FPS) <= 2 for step in steps) >= 0.7 * len(steps), steps
        # Passed through: every slice is byte for byte one the recording has, in its order.
        got = [s for data, _, _ in units for s in slices(data)]
        start = recorded.index(got[0])
        assert got == recorded[start:start + len(got)]
        info = pipeline.stream_info
        assert info is not None and (info.width, info.height) == (WIDTH, HEIGHT)
        # The ring's keyframes decode alone (parameter sets in front of each IDR).
        keyframe = next(data for data, _, key in units if key)
        assert nal_types(keyframe)[:3].count(7) >= 1
        (frame,) = decode_alone(keyframe)
        stamp = read_stamp(frame)
        assert stamp is not None and (frame.width, frame.height) == (WIDTH, HEIGHT)
        before = units[-1][1]

        server.kill()  # the camera drops off the network
        await wait_until(lambda: source.disconnects >= 1 and not source.connected)
        assert source.stats()["last_error"]
        server.start()  # and comes back on the same address
        await wait_until(lambda: source.connects >= 2)
        again = await read_units(pipeline, FPS)
        assert all(pts > before for _, pts, _ in again)  # pts carry on across the reconnect
        pts = [p for _, p, _ in units + again]
        assert pts == sorted(pts) and len(set(pts)) == len(pts)
        again_slices = [s for data, _, _ in again for s in slices(data)]
        start = recorded.index(again_slices[0])
        assert again_slices == recorded[start:start + len(again_slices)]
        assert source.stats()["connected"] is True
    finally:
        await pipeline.stop()


def test_cameras_that_never_answer_neither_starve_the_executor_nor_hold_up_exit() -> None:
    """An RTSP server that accepts TCP and never answers (a hung camera): more such cameras than
    the default executor has workers all try at once, the executor stays free for everyone else,
    and stop() plus asyncio.run's exit (which waits for the default executor) return long before
    FFmpeg's open timeout would let go."""
    count = min(32, (os.cpu_count() or 1) + 4) + 2  # one more than the default executor's workers
    listener = socket.create_server(("127.0.0.1", 0), backlog=count)
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []

    def accept() -> None:  # read nothing, answer nothing
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    outcome: dict[str, object] = {}

    async def scenario() -> None:
        url = f"rtsp://user:pw@127.0.0.1:{port}/cam"
        sources = [RtspSource(CameraConfig(name=f"c{i}", source=url), url,
                              timeout_s=(600.0, 600.0)) for i in range(count)]
        for source in sources:
            await source.start(lambda au: None)
        await wait_until(lambda: len(accepted) >= count)  # every camera is connecting at once
        outcome["executor"] = await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 30)
        await asyncio.wait_for(asyncio.gather(*(s.stop() for s in sources)), 60)
        outcome["stopped"] = True
        outcome["connected"] = any(s.connected for s in sources)

    def run() -> None:
        asyncio.run(scenario())
        outcome["exited"] = True

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(120)  # far below the 600 s FFmpeg would wait for the answer
    assert outcome == {"executor": "free", "stopped": True, "connected": False, "exited": True}
    listener.close()
    for conn in accepted:
        conn.close()  # the left-over readers fail and end


async def test_a_down_ip_camera_says_why_in_its_problem() -> None:
    """status/healthz name the camera's own error (refused, timed out, no H.264), not only
    'no frame yet': an RTSP source never fails its start, so this is all the user sees."""
    from ruseon_appliance.cameras import Camera

    url = f"rtsp://admin:secret@127.0.0.1:{free_port()}/cam"
    config = CameraConfig(name="gate", source=url, framerate=FPS)
    source = RtspSource(config, url, backoff_s=(0.1, 0.2))
    camera = Camera(config, pipeline=CapturePipeline(config, source=source))
    assert await camera.start()
    try:
        await wait_until(lambda: source.disconnects >= 1)
        problem = camera.problem()
        assert problem is not None and source.last_error in problem
        assert "secret" not in problem and "secret" not in str(camera.status(0))
    finally:
        await camera.stop()


async def test_an_ip_cameras_substream_url_is_a_second_source_passed_through(
        server: RtspServer, tmp_path: Path) -> None:
    """An IP camera's main and sub profiles (two gst-rtsp-servers, two sizes): the camera's
    ``substream_url`` is a second RTSP source, its H.264 passed through; the sub-stream going
    away leaves the main one running, and its password is never shown."""
    from ruseon_appliance.cameras.camera import Camera

    small = RtspServer(record(tmp_path / "small.h264", 160, 96), free_port())
    small.start()
    try:
        camera = Camera(CameraConfig(
            name="gate", source=f"rtsp://127.0.0.1:{server.port}/cam", framerate=FPS,
            width=WIDTH, height=HEIGHT,
            substream_url=f"rtsp://admin:hunter2@127.0.0.1:{small.port}/cam"))
        sub = camera.add_substream()
        assert sub is not None and sub.camera.source.endswith(f"{small.port}/cam")
        await camera.start()
        try:
            main_units, sub_units = await asyncio.gather(read_units(camera.pipeline, FPS),
                                                         read_units(sub, FPS))
            for units, size in ((main_units, (WIDTH, HEIGHT)), (sub_units, (160, 96))):
                keyframe = next(data for data, _, key in units if key)
                (frame,) = decode_alone(keyframe)
                assert (frame.width, frame.height) == size
            status = camera.status(0)["substream"]
            assert status["up"] and (status["width"], status["height"]) == (160, 96)
            assert status["kind"] == "rtsp" and "hunter2" not in str(status)
            assert status["source"] == f"rtsp://***@127.0.0.1:{small.port}/cam"

            small.kill()  # the camera's sub profile stops answering
            await wait_until(lambda: camera.sub_problem() is not None, 30)
            assert camera.problem() is None
            await read_units(camera.pipeline, FPS)  # main carries on
            problem = camera.sub_problem()
            assert problem is not None and "hunter2" not in problem
            assert "no frame from the rtsp source" in problem
        finally:
            await camera.stop()
    finally:
        small.kill()
