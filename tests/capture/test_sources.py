"""File, rpicam and picamera sources, and ``auto`` selection, through the real pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path

import av
import pytest

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.h264 import START_CODE_4, AccessUnitSplitter
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.ring import FrameView
from ruseon_appliance.capture.sources.auto import (
    AutoSource,
    choose_source,
    create_source,
    rpicam_camera_present,
)
from ruseon_appliance.capture.sources.base import SourceUnavailable
from ruseon_appliance.capture.sources.file import FileSource, PlaybackUnits
from ruseon_appliance.capture.sources.picamera import KeyframeStream
from ruseon_appliance.capture.sources.rpicam import (
    RpicamFeatures,
    RpicamSource,
    parse_help,
    rpicam_command,
)
from ruseon_appliance.capture.sources.soc import is_bcm2712
from ruseon_appliance.capture.sources.synthetic import SyntheticSource
from ruseon_appliance.config import CameraConfig

from .conftest import CAM_STREAM, MP4_CLIP, ONCE_STREAM, decode_alone, split_file

FAKE_RPICAM = Path(__file__).parent / "fake_rpicam_vid.py"
# What boost prints for rpicam-vid 1.9's --help (excerpt; option names as in video_options.hpp).
FAKE_HELP_1_9 = """Valid options are:
  -h [ --help ] [=arg(=1)] (=0)         Print this help message
  --libav-video-codec-opts arg          Sets the libav video codec options to use.
  --libav-format arg                    Sets the libav encoder output format to use. Leave
                                        blank to try and deduce this from the filename.
  --low-latency [=arg(=1)] (=0)         Enables the libav/libx264 low latency presets for
                                        video encoding.
"""
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


def test_file_source_reads_annex_b_back_from_the_file(tmp_path: Path) -> None:
    """Issue 19 (memory): a plain .h264 file is indexed, not held in memory; every unit read
    back is the splitter's, also after leading junk; a container stays in memory."""
    expected = split_file(ONCE_STREAM)
    junked = tmp_path / "junk-first.h264"
    junked.write_bytes(b"\x17" * 1000 + ONCE_STREAM.read_bytes())
    for path in (ONCE_STREAM, junked):
        units = PlaybackUnits.load(path)
        try:
            assert not units.in_memory
            assert [(units.read(i), units.idr[i]) for i in range(len(units))] == expected
        finally:
            units.close()
    clip = PlaybackUnits.load(MP4_CLIP)
    assert clip.in_memory and len(clip) == 45 and clip.idr[0]


async def test_file_source_plays_on_when_its_file_is_rewritten_in_place(tmp_path: Path) -> None:
    # Units are read back from the file when due, so a file overwritten in place (cp onto it:
    # truncated, then written) must not stop the camera for good nor feed it stale offsets:
    # playback goes on with the new file's pictures.
    path = tmp_path / "clip.h264"
    path.write_bytes(CAM_STREAM.read_bytes())
    old = {data for data, _ in split_file(CAM_STREAM)}
    new = {data for data, _ in split_file(ONCE_STREAM)}
    delivered: list[AccessUnit] = []
    source = FileSource(CAMERA, path)
    await source.start(delivered.append)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while len(delivered) < 5:
            assert loop.time() < deadline, "no frames from the file source"
            await asyncio.sleep(0.05)
        assert source._units is not None and not source._units.in_memory
        with path.open("r+b") as f:  # as cp does: the same file, truncated, then written
            f.truncate(0)
            f.write(ONCE_STREAM.read_bytes())
        changed_at = len(delivered)
        deadline = loop.time() + 30
        while sum(bytes(au.data) in new for au in delivered[changed_at:]) < 20:
            assert source._task is not None and not source._task.done(), \
                "the file source's playback ended"
            assert loop.time() < deadline, "the new file's pictures never came"
            await asyncio.sleep(0.05)
        after = [bytes(au.data) for au in delivered[changed_at:]]
        # Nothing but whole pictures of one file or the other (never bytes from stale offsets),
        # and once the new file's began, only those.
        assert all(data in old or data in new for data in after)
        first_new = next(i for i, data in enumerate(after) if data in new)
        assert all(data in new for data in after[first_new:])
        assert source.stats()["reloads"] >= 1
        pts = [au.pts for au in delivered]
        assert pts == sorted(pts) and len(set(pts)) == len(pts)
    finally:
        await source.stop()


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
    argv = rpicam_command(camera)
    joined = " ".join(argv)
    for part in ("--inline", "--flush", "--intra 30", "--profile main", "--width 320",
                 "--height 240", "--framerate 30", "--bitrate 250000", "--hflip",
                 "--shutter 10000", "--gain 2.0", "--awb daylight"):
        assert part in joined
    assert argv[-2:] == ["-o", "-"] and "--vflip" not in argv
    assert "--low-latency" not in argv and "--libav-format" not in argv


def test_rpicam_command_line_on_bcm2712_follows_what_help_lists() -> None:
    new = parse_help(FAKE_HELP_1_9)
    assert new == RpicamFeatures(low_latency=True, libav_format=True, libav_codec_opts=True)
    argv = rpicam_command(CAMERA, bcm2712=True, features=new)
    joined = " ".join(argv)
    assert "--libav-format h264" in joined and "--low-latency" in argv
    # libav ignores --inline/--flush: nothing may depend on them there.
    assert "--inline" not in argv and "--flush" not in argv
    old = RpicamFeatures(low_latency=False, libav_format=True, libav_codec_opts=True)
    argv = rpicam_command(CAMERA, bcm2712=True, features=old)
    assert "--low-latency" not in argv
    assert "--libav-video-codec-opts bf=0" in " ".join(argv)  # no B-frames without it either


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


async def test_rpicam_keyframe_request_never_restarts_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24: a keyframe request restarted rpicam-vid for everyone (every viewer froze, the
    recording split, HLS got a discontinuity). rpicam-vid cannot make an IDR on request, so the
    source says so (keyframes_on_demand) and the engine answers from the ring; the child runs
    on."""
    camera = fake_rpicam_camera(tmp_path, monkeypatch)
    source = RpicamSource(camera)
    pipeline = CapturePipeline(dataclasses.replace(camera, keyframe_request_interval_ms=0),
                               source=source)
    assert pipeline.keyframes_on_demand is False
    await pipeline.start()
    try:
        await read_frames(pipeline, 5)
        for _ in range(5):
            pipeline.request_keyframe("viewer")
        await read_frames(pipeline, 35)
        assert source.keyframe_requests_ignored >= 5
        assert source.crashes == 0 and source.starts == 1
    finally:
        await pipeline.stop()


PI5_COMPATIBLE = b"raspberrypi,5-model-b\0brcm,bcm2712\0"
CM5_COMPATIBLE = b"raspberrypi,5-compute-module\0brcm,bcm2712\0"  # model: "...Compute Module 5"
PI4_COMPATIBLE = b"raspberrypi,4-model-b\0brcm,bcm2711\0"


def write_compatible(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "compatible"
    path.write_bytes(content)
    return path


def test_soc_detection_reads_the_device_tree(tmp_path: Path) -> None:
    assert is_bcm2712(write_compatible(tmp_path, CM5_COMPATIBLE))
    assert is_bcm2712(write_compatible(tmp_path, PI5_COMPATIBLE))
    assert not is_bcm2712(write_compatible(tmp_path, PI4_COMPATIBLE))
    assert not is_bcm2712(tmp_path / "absent")


def picture_types(frames: list[bytes]) -> str:
    """The decoded pictures' types in output order, e.g. "IPPBP"."""
    decoder = av.CodecContext.create("h264", "r")
    pictures = [f for data in frames for f in decoder.decode(av.Packet(data))]
    pictures += decoder.decode(None)
    return "".join(av.video.frame.PictureType(f.pict_type).name for f in pictures)


def run_fake(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FAKE_RPICAM), *args], capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**os.environ, "FAKE_RPICAM_STREAM": str(CAM_STREAM), **env})


def run_fake_stdout(args: list[str], frames: int = 40, **env: str) -> bytes:
    """The first ``frames`` frames' worth of what the stand-in writes to stdout."""
    proc = subprocess.Popen([sys.executable, str(FAKE_RPICAM), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={**os.environ, **env})
    assert proc.stdout is not None
    data = b""
    try:
        while data.count(b"\x00\x00\x01") < frames * 1.2:  # slices, plus SPS/PPS/SEI
            chunk = proc.stdout.read1(65536)
            assert chunk, "the stand-in stopped writing"
            data += chunk
    finally:
        proc.kill()
        proc.wait()
    return data


def split_units(data: bytes) -> list[bytes]:
    return [unit for unit, _ in AccessUnitSplitter().split_all(data)]


def test_fake_rpicam_vid_fails_like_upstream() -> None:
    """The stand-in keeps upstream's argument rules, so the source is tested against them."""
    base = ["-t", "0", "-n", "--codec", "h264", "--framerate", "30", "-o", "-"]
    result = run_fake(*base, FAKE_RPICAM_SOC="bcm2712")
    assert result.returncode == 255 and result.stdout == ""
    assert ("ERROR: *** libav: cannot allocate output context, try setting with --libav-format "
            "***") in result.stderr
    result = run_fake(*base, "--low-latency", FAKE_RPICAM_VERSION="1.5.0")
    assert result.returncode == 255
    assert "ERROR: *** unrecognised option '--low-latency' ***" in result.stderr
    result = run_fake(*base, "--libav-format", "h264", FAKE_RPICAM_VERSION="1.7.0",
                      FAKE_RPICAM_LIBAV="0")
    assert result.returncode == 255
    assert "unrecognised option '--libav-format'" in result.stderr
    result = run_fake(*base, "--awb", "sunny")
    assert result.returncode == 255 and "Invalid AWB mode: sunny" in result.stderr
    # libx264 as rpicam-apps' libav encoder sets it up: B-frames, unless --low-latency or bf=0.
    libav = [*base[:-2], "--profile", "main", "--width", "160", "--height", "120",
             "--libav-format", "h264", "-o", "-"]
    for extra, has_b in (([], True), (["--low-latency"], False),
                         (["--libav-video-codec-opts", "bf=0"], False)):
        out = run_fake_stdout([*libav, *extra], FAKE_RPICAM_SOC="bcm2712")
        assert ("B" in picture_types(split_units(out))) is has_b, extra
    assert parse_help(run_fake("--help", FAKE_RPICAM_VERSION="1.5.0").stdout) == RpicamFeatures(
        low_latency=False, libav_format=True, libav_codec_opts=True)
    assert parse_help(run_fake("--help", FAKE_RPICAM_VERSION="1.4.0").stdout) == RpicamFeatures(
        low_latency=False, libav_format=True, libav_codec_opts=False)


@pytest.mark.parametrize(
    ("compatible", "env", "expect", "absent"),
    [
        # Pi 5 and CM5 (whose model string has no "Pi 5"), current rpicam-apps.
        (PI5_COMPATIBLE, {"FAKE_RPICAM_SOC": "bcm2712"}, ["--libav-format h264", "--low-latency"],
         ["--inline", "--flush"]),
        (CM5_COMPATIBLE, {"FAKE_RPICAM_SOC": "bcm2712"}, ["--libav-format h264", "--low-latency"],
         ["--inline", "--flush"]),
        # A BCM2712 board with rpicam-apps 1.5 (no --low-latency): bf=0 through codec options.
        (CM5_COMPATIBLE, {"FAKE_RPICAM_SOC": "bcm2712", "FAKE_RPICAM_VERSION": "1.5.0"},
         ["--libav-format h264", "--libav-video-codec-opts bf=0"], ["--low-latency"]),
        # A Pi 4 whose rpicam-apps was built without libav: no libav option at all.
        (PI4_COMPATIBLE, {"FAKE_RPICAM_VERSION": "1.7.0", "FAKE_RPICAM_LIBAV": "0"},
         ["--inline", "--flush"], ["--libav-format", "--low-latency"]),
    ],
    ids=["pi5", "cm5", "cm5-rpicam-apps-1.5", "pi4-without-libav"],
)
async def test_rpicam_source_starts_on_each_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compatible: bytes, env: dict[str, str],
    expect: list[str], absent: list[str],
) -> None:
    # Main profile: libx264 on BCM2712 makes B-frames unless told not to (baseline never has).
    camera = dataclasses.replace(fake_rpicam_camera(tmp_path, monkeypatch, **env),
                                 profile="main")
    source = RpicamSource(camera, compatible_path=write_compatible(tmp_path, compatible),
                          backoff_s=(0.05, 0.2))
    pipeline = CapturePipeline(camera, source=source)
    await pipeline.start()
    try:
        frames = await read_frames(pipeline, 20)
        assert_decodable_sequence(frames)
        assert "B" not in picture_types(frames)
        assert source.crashes == 0 and source.starts == 1
        logged = (tmp_path / "starts.log").read_text()
        for part in expect:
            assert part in logged
        for part in absent:
            assert part not in logged
        assert source.stats()["bcm2712"] is (compatible != PI4_COMPATIBLE)
    finally:
        await pipeline.stop()


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


async def test_auto_falls_back_to_synthetic(caplog: pytest.LogCaptureFixture) -> None:
    camera = dataclasses.replace(CAMERA, source="auto", rpicam_command="no-such-rpicam-vid")
    with caplog.at_level("INFO"):
        source = await choose_source(camera)
    assert isinstance(source, SyntheticSource)
    assert "synthetic" in caplog.text


async def test_auto_picks_rpicam_when_binary_and_camera_present(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    camera = dataclasses.replace(fake_rpicam_camera(tmp_path, monkeypatch), source="auto")
    assert isinstance(await choose_source(camera), RpicamSource)
    monkeypatch.setenv("FAKE_RPICAM_NO_CAMERA", "1")
    assert isinstance(await choose_source(camera), SyntheticSource)


async def test_auto_probes_for_the_camera_without_blocking_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-in's --list-cameras answers only once the loop has run a callback."""
    release = tmp_path / "loop-ran"
    camera = dataclasses.replace(
        fake_rpicam_camera(tmp_path, monkeypatch, FAKE_RPICAM_LIST_WAIT_FOR=str(release)),
        source="auto")
    asyncio.get_running_loop().call_soon(release.touch)
    pipeline = CapturePipeline(camera)  # probing here (on the loop) would starve that callback
    await pipeline.start()
    try:
        assert pipeline.source_kind == "rpicam"
        assert_decodable_sequence(await read_frames(pipeline, 5))
    finally:
        await pipeline.stop()


async def test_auto_stopped_while_probing_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = tmp_path / "release"
    camera = dataclasses.replace(
        fake_rpicam_camera(tmp_path, monkeypatch, FAKE_RPICAM_LIST_WAIT_FOR=str(release)),
        source="auto")
    source = create_source(camera)
    assert isinstance(source, AutoSource) and source.kind == "auto"
    starting = asyncio.create_task(source.start(lambda au: None))
    await asyncio.sleep(0)  # the probe is under way
    await source.stop()  # e.g. SIGTERM during start-up
    release.touch()
    await asyncio.wait_for(starting, 30)
    try:
        assert isinstance(source.chosen, RpicamSource) and source.kind == "rpicam"
        assert source.chosen.argv == []  # built by RpicamSource.start(), which never ran
    finally:
        if source.chosen is not None:
            await source.chosen.stop()


def _children() -> set[int]:
    """This process's child processes (every thread's ``children``). A thread may end between
    listing and reading (asyncio's child-watcher threads come and go: seen as
    FileNotFoundError under load); it has no children left then."""
    children: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            children.update(int(child) for child in (task / "children").read_text().split())
    return children


async def test_a_cancelled_camera_probe_leaves_no_child_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while ``auto`` still waits for ``rpicam-vid --list-cameras``: the probe goes too."""
    camera = fake_rpicam_camera(tmp_path, monkeypatch,
                                FAKE_RPICAM_LIST_WAIT_FOR=str(tmp_path / "never"))
    before = _children()
    probe = asyncio.create_task(rpicam_camera_present(camera, timeout=60))
    for _ in range(500):
        if _children() - before:
            break
        await asyncio.sleep(0.02)
    started = _children() - before
    assert started, "the probe never started"
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    alive = [pid for pid in started if Path(f"/proc/{pid}").exists()]
    assert not alive, f"probe child(ren) {alive} still running after the cancel"


def test_explicit_rpicam_without_binary_is_a_clear_error() -> None:
    with pytest.raises(SourceUnavailable, match="rpicam-apps"):
        create_source(dataclasses.replace(CAMERA, source="rpicam", rpicam_command="nope-vid"))


async def test_rpicam_pts_keep_pace_across_stop_and_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    camera = fake_rpicam_camera(tmp_path, monkeypatch)
    source = RpicamSource(camera)
    units: list[AccessUnit] = []
    for round_ in range(2):
        target, enough = 10 * (round_ + 1), asyncio.Event()

        def deliver(au: AccessUnit, target: int = target, enough: asyncio.Event = enough) -> None:
            units.append(au)
            if len(units) >= target:
                enough.set()

        await source.start(deliver)
        try:
            await asyncio.wait_for(enough.wait(), 20)
        finally:
            await source.stop()
    pts = [au.pts for au in units][:20]
    assert pts == sorted(set(pts))
    # Arrival times at 30 fps: about 3000 ticks a frame on average (not 1 tick: clamped).
    assert (pts[-1] - pts[10]) / 9 > 500, pts
