"""The recorder and the archive, in process: a real ring, real libx264 frames, real files.

Frames are written into the ring as fast as the recorder takes them (no real-time pacing), so
these tests are quick; the media timeline comes from the frames' own pts and capture times.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import types
from pathlib import Path

import av
import pytest

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.capture.stamp import read_stamp
from ruseon_appliance.recording import Archive, ClipError, Recorder, RecorderSettings, plan_clip
from ruseon_appliance.recording import recorder as recorder_module
from ruseon_appliance.recording.archive import OPEN_SUFFIX, SET_ASIDE_DIR
from ruseon_appliance.recording.disk import SegmentFile
from ruseon_appliance.recording.segment_file import read_segment
from tests.segmenter.stream import Unit, encode, ffmpeg_errors, probe_frames

FPS, GOP = 30, 15
FRAME_US = 1_000_000 // FPS


@pytest.fixture(scope="module")
def units() -> list[Unit]:
    """Ten seconds of stamped 160x96 video, an IDR every half second."""
    return encode(10 * FPS, width=160, height=96, fps=FPS, gop=GOP)


async def feed(ring: RingBuffer, units: list[Unit]) -> None:
    for u in units:
        ring.write(AccessUnit(u.data, u.pts, u.keyframe, u.capture_time_us))
        await asyncio.sleep(0)


def recorder_for(tmp_path: Path, ring: RingBuffer, **settings: float) -> Recorder:
    options: dict[str, float] = {"segment_s": 2.0, **settings}
    return Recorder(RecorderSettings(directory=tmp_path / "rec", **options),  # type: ignore[arg-type]
                    ring)


async def recording(tmp_path: Path, **settings: float) -> tuple[RingBuffer, Recorder]:
    """A ring and a recorder that is started and recording it (no pre-roll)."""
    ring = RingBuffer(8 * 1024 * 1024, 1024)
    recorder = recorder_for(tmp_path, ring, **settings)
    await recorder.start()
    assert recorder.begin(preroll_s=0)
    return ring, recorder


def write_clip(tmp_path: Path, segments: list, start_us: int, end_us: int,  # type: ignore[type-arg]
               fmt: str = "mp4") -> Path:
    clip = plan_clip(segments, start_us, end_us, fmt)
    try:
        out = tmp_path / f"clip.{fmt}.mp4"
        out.write_bytes(b"".join(clip.read()))
    finally:
        clip.close()
    assert out.stat().st_size == clip.content_length
    return out


def stamps(path: Path) -> list[int]:
    with av.open(str(path)) as container:
        found = [read_stamp(frame) for frame in container.decode(video=0)]
    assert all(s is not None for s in found)
    return [s[0] for s in found if s is not None]


async def test_segments_cut_at_idr_index_rebuilt_and_clips_hit_the_right_moment(
        tmp_path: Path, units: list[Unit]) -> None:
    ring, recorder = await recording(tmp_path)
    await feed(ring, units)
    assert await recorder.end()
    await recorder.stop()
    files = sorted((tmp_path / "rec").glob("*.mp4"))
    # 10 s in segments of at least 2 s, each starting at an IDR (every 0.5 s here).
    assert len(files) == 5 and not list((tmp_path / "rec").glob("*" + OPEN_SUFFIX))
    total = 0
    for f in files:
        assert ffmpeg_errors(f) == ""
        frames = probe_frames(f)
        assert frames[0][0], f"{f.name} does not start with a keyframe"
        total += len(frames)
    assert total == len(units)
    # The index rebuilt from the files alone says the same as the recorder's.
    archive = Archive(tmp_path / "rec")
    report = archive.scan()
    assert not report.repaired and not report.set_aside
    assert [(s.start_us, s.duration_us) for s in archive.segments] == [
        (s.start_us, s.duration_us) for s in recorder.archive.segments]
    first, last = units[0].capture_time_us, units[-1].capture_time_us + FRAME_US
    [(lo, hi)] = archive.ranges()
    assert lo == first and abs(hi - last) <= 2

    # A clip across a segment boundary: starts at the IDR at or before `start`, ends at `end`.
    start = first + 3_300_000
    end = start + 2_500_000
    for fmt in ("mp4", "fmp4"):
        clip = write_clip(tmp_path, archive.overlapping(start, end), start, end, fmt)
        assert ffmpeg_errors(clip) == ""
        frames = probe_frames(clip)
        assert frames[0][0]
        times = stamps(clip)
        # First frame: the IDR at or before `start` (within one GOP); last: within one frame
        # interval of the end; frame count (so duration) within one GOP of the request.
        assert start - GOP * FRAME_US < times[0] <= start
        assert end - FRAME_US - 2 <= times[-1] < end
        assert len(frames) == len(times) == (times[-1] - times[0]) // FRAME_US + 1
        assert 0 <= len(frames) - (end - start) / FRAME_US <= GOP + 1
    with pytest.raises(ClipError) as nothing:
        plan_clip(archive.overlapping(last + 10_000_000, last + 20_000_000),
                  last + 10_000_000, last + 20_000_000)
    assert nothing.value.status == 404


async def test_preroll_starts_at_a_keyframe_from_the_ring(tmp_path: Path,
                                                          units: list[Unit]) -> None:
    ring = RingBuffer(8 * 1024 * 1024, 1024)
    await feed(ring, units[:90])  # three seconds already in the ring, nobody recording
    recorder = recorder_for(tmp_path, ring)
    await recorder.start()
    recorder.begin(preroll_s=1.0)
    await feed(ring, units[90:120])
    await recorder.end()
    await recorder.stop()
    # The newest frame was 89; one second before it is frame 59; the keyframe at or before: 45.
    segments = recorder.archive.segments
    assert segments[0].start_us == units[45].capture_time_us
    clip = write_clip(tmp_path, segments, segments[0].start_us, segments[-1].end_us)
    times = stamps(clip)
    assert times[0] == units[45].capture_time_us and times[-1] == units[119].capture_time_us
    assert len(times) == 75  # no gap and no overlap between pre-roll and live frames


async def test_retention_deletes_oldest_first_never_the_open_segment(
        tmp_path: Path, units: list[Unit]) -> None:
    ring, recorder = await recording(tmp_path, max_bytes=1)
    await feed(ring, units[:250])
    # Housekeeping applies retention by itself; the open segment shows once its first batch is
    # written (at the latest after the flush interval).
    for _ in range(3000):
        if recorder.segments_deleted >= 3 and recorder.current_segment() is not None:
            break
        await asyncio.sleep(0.01)
    open_part = recorder.current_segment()
    assert open_part is not None
    recorder.apply_retention()
    assert recorder.segments_deleted == 3 and recorder.archive.segments == []
    assert open_part.path.exists()
    await recorder.end()
    await recorder.stop()
    remaining = sorted(p.name for p in (tmp_path / "rec").glob("*.mp4"))
    # The three oldest went; the one being written then is kept (closed now), and what follows.
    assert remaining[0] == open_part.path.name.removesuffix(".part")
    assert len(remaining) == 2


async def test_a_crash_leaves_closed_segments_intact_and_the_open_one_repaired_or_set_aside(
        tmp_path: Path, units: list[Unit]) -> None:
    ring, recorder = await recording(tmp_path)
    await feed(ring, units[:150])
    await recorder.end()
    await recorder.stop()
    rec = tmp_path / "rec"
    closed = sorted(rec.glob("*.mp4"))
    # What a power cut leaves: the last segment unfinished mid-fragment, and a stub of another.
    victim = closed[-1]
    cut = victim.stat().st_size - 500
    part = victim.with_name(victim.name + ".part")
    os.replace(victim, part)
    os.truncate(part, cut)
    stub = rec / ("2030-01-01_00-00-00-000000.mp4" + ".part")
    shutil.copyfile(closed[0], stub)
    os.truncate(stub, 300)  # inside the init segment
    archive = Archive(rec)
    report = archive.scan()
    assert report.repaired == [victim.name]
    assert report.set_aside == [stub.name]
    assert (rec / SET_ASIDE_DIR / stub.name).exists()
    for f in sorted(rec.glob("*.mp4")):
        assert ffmpeg_errors(f) == ""
    assert victim.stat().st_size < cut  # cut back to the last complete fragment
    clip = write_clip(tmp_path, archive.segments, archive.segments[0].start_us,
                      archive.segments[-1].end_us)
    assert ffmpeg_errors(clip) == ""


async def test_the_open_segment_is_made_durable_every_sync_interval_in_whole_fragments(
        tmp_path: Path, units: list[Unit], monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames in real time: with ``sync_interval_s`` 1, fdatasync runs on the open ``.part``
    about every second, each time with the file ending on a whole fragment (what a power cut
    then leaves needs no repair); with 0, never while it is open (only the fsync at close)."""
    calls: list[tuple[str, int, int]] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        real(fd)
        name = os.readlink(f"/proc/self/fd/{fd}")
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            size = os.fstat(f.fileno()).st_size
            calls.append((name, size, read_segment(f, size).valid_end))
    monkeypatch.setattr(os, "fdatasync", fdatasync)

    async def paced(seconds: float, **settings: float) -> Recorder:
        ring, recorder = await recording(tmp_path / str(settings), segment_s=60.0, **settings)
        for u in units[:int(seconds * FPS)]:
            ring.write(AccessUnit(u.data, u.pts, u.keyframe, u.capture_time_us))
            await asyncio.sleep(1 / FPS)
        return recorder

    recorder = await paced(4.5, sync_interval_s=1.0)
    open_syncs = list(calls)
    stats = recorder.stats()
    await recorder.end()
    await recorder.stop()
    assert len(open_syncs) >= 2, open_syncs
    assert all(name.endswith(OPEN_SUFFIX) for name, _, _ in open_syncs), open_syncs
    assert all(size == end for _, size, end in open_syncs), open_syncs  # whole fragments
    sizes = [size for _, size, _ in open_syncs]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0], sizes
    assert stats["syncs_total"] == len(open_syncs) and stats["sync_interval_s"] == 1.0

    calls.clear()
    recorder = await paced(3.0, sync_interval_s=0.0)
    assert calls == [] and recorder.stats()["syncs_total"] == 0
    await recorder.end()
    await recorder.stop()


async def test_a_download_survives_retention_deleting_its_segments(
        tmp_path: Path, units: list[Unit]) -> None:
    ring, recorder = await recording(tmp_path)
    await feed(ring, units[:120])
    await recorder.end()
    segments = list(recorder.archive.segments)
    clip = plan_clip(segments, segments[0].start_us, segments[-1].end_us)
    result = await recorder.delete_range(segments[0].start_us, segments[-1].end_us)
    assert len(result["deleted"]) == len(segments) and not result["kept"]
    assert not result["trimmed"]
    await recorder.stop()
    assert not list((tmp_path / "rec").glob("*.mp4"))
    out = tmp_path / "late.mp4"
    try:
        out.write_bytes(b"".join(clip.read()))
    finally:
        clip.close()
    assert out.stat().st_size == clip.content_length
    assert ffmpeg_errors(out) == ""
    assert len(probe_frames(out)) == 120


async def test_a_media_clock_jump_starts_a_new_segment_and_clips_stay_in_order(
        tmp_path: Path, units: list[Unit]) -> None:
    # A camera restart: its pts start again from 0 while the wall clock runs on.
    ring, recorder = await recording(tmp_path, segment_s=60.0)
    await feed(ring, units[:45])
    await feed(ring, [Unit(u.data, u.pts - units[45].pts, u.keyframe, u.capture_time_us)
                      for u in units[45:90]])
    await recorder.end()
    await recorder.stop()
    segments = recorder.archive.segments
    assert [s.start_us for s in segments] == [units[0].capture_time_us, units[45].capture_time_us]
    clip = write_clip(tmp_path, segments, segments[0].start_us, segments[-1].end_us)
    assert ffmpeg_errors(clip) == ""
    times = stamps(clip)
    assert times == [u.capture_time_us for u in units[:90]]


async def test_a_wall_clock_jump_starts_a_new_segment_named_by_the_new_time(
        tmp_path: Path, units: list[Unit]) -> None:
    # NTP sets the clock an hour ahead mid-recording; the media clock runs on.
    ring, recorder = await recording(tmp_path, segment_s=60.0)
    hour = 3_600_000_000
    await feed(ring, units[:45])
    await feed(ring, [Unit(u.data, u.pts, u.keyframe, u.capture_time_us + hour)
                      for u in units[45:90]])
    await recorder.end()
    await recorder.stop()
    starts = [s.start_us for s in recorder.archive.segments]
    assert starts == [units[0].capture_time_us, units[45].capture_time_us + hour]


async def test_deleting_part_of_segments_cuts_them_at_fragment_boundaries(
        tmp_path: Path, units: list[Unit]) -> None:
    ring = RingBuffer(8 * 1024 * 1024, 1024)
    recorder = recorder_for(tmp_path, ring, segment_s=4.0)
    # A shell's usual umask: the archive must still be private (`ruseon serve --record-dir`).
    umask = os.umask(0o022)
    try:
        await recorder.start()
        recorder.begin(preroll_s=0)
        await feed(ring, units)
        await recorder.end()
        before = list(recorder.archive.segments)
        assert [s.duration_us // 1000 for s in before] == [4000, 4000, 2000]
        t0 = units[0].capture_time_us
        cut_from, cut_to = t0 + 2_500_000, t0 + 5_200_000  # across the first two segments
        result = await recorder.delete_range(cut_from, cut_to)  # writes new pieces
        await recorder.stop()
    finally:
        os.umask(umask)
    assert not result["deleted"] and not result["kept"] and len(result["trimmed"]) == 2
    archive = Archive(tmp_path / "rec")
    report = archive.scan()  # what is on disk agrees, nothing left half-done
    assert not report.repaired and not report.set_aside
    assert [(s.start_us, s.duration_us) for s in archive.segments] == [
        (s.start_us, s.duration_us) for s in recorder.archive.segments]
    assert (tmp_path / "rec").stat().st_mode & 0o777 == 0o700
    for f in sorted((tmp_path / "rec").glob("*.mp4")):
        assert f.stat().st_mode & 0o777 == 0o600, f"{f.name} is readable by others"
        assert ffmpeg_errors(f) == ""
    # Fragments end at every IDR (every 0.5 s here): the head keeps [0, 2.5) s, the second
    # segment continues from its first independent fragment at or after 5.2 s (5.5 s).
    times = []
    for s in archive.segments:
        times += stamps(write_clip(tmp_path, [s], s.start_us, s.end_us))
    kept = [u.capture_time_us for u in units
            if u.capture_time_us < t0 + 2_500_000 or u.capture_time_us >= t0 + 5_500_000]
    assert times == kept


def test_the_write_rate_window_stays_small_when_nobody_reads_the_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A board that records for months with nobody polling /api/status or /metrics."""
    recorder = recorder_for(tmp_path, RingBuffer(1024 * 1024, 64))
    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(recorder_module, "time", types.SimpleNamespace(
        monotonic=lambda: clock.now, time=lambda: clock.now, time_ns=lambda: int(clock.now * 1e9)))
    segment = recorder_module._OpenSegment(SegmentFile(tmp_path / "x", tmp_path / "y"), 0, 0)
    for _ in range(20_000):  # about nine hours of writes at the measured 0.6 write()/s
        clock.now += 1.6
        recorder._written(segment, None, 400_000, 0)
    assert len(recorder._rate) <= recorder_module.RATE_WINDOW_S / 1.6 + 1
    assert recorder.write_rate() == pytest.approx(400_000 / 1.6, rel=0.2)
    recorder._disk.shutdown()


async def test_record_pressed_while_a_stop_is_still_closing_leaves_no_orphan_recording(
        tmp_path: Path, units: list[Unit]) -> None:
    """Stop then Record at once (page button, Home Assistant): the stop is still draining."""
    ring, recorder = await recording(tmp_path)
    await feed(ring, units[:60])
    stopping = asyncio.create_task(recorder.end())
    for _ in range(3):  # end() is now closing the reader and waiting for the segmenter task
        await asyncio.sleep(0)
    assert not stopping.done()
    started_again = recorder.begin(preroll_s=0)
    assert await stopping
    if not started_again:  # refused while stopping: recording is off, and can start now
        assert recorder.state == "stopped"
        assert recorder.begin(preroll_s=0)
    await feed(ring, units[60:120])
    assert await recorder.end()
    await recorder.stop()
    segmenters = [t for t in asyncio.all_tasks()
                  if "run_segmenter" in repr(t.get_coro()) and not t.done()]
    assert not segmenters, "a recording nobody can stop is still running"
    assert recorder.state == "stopped" and not recorder.active
    assert not list((tmp_path / "rec").glob("*" + OPEN_SUFFIX))
    for f in (tmp_path / "rec").glob("*.mp4"):
        assert ffmpeg_errors(f) == ""


async def test_a_failure_inside_the_recording_task_is_reported_and_stop_still_works(
        tmp_path: Path, units: list[Unit], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A bug in segmenting (stood in for by a push that raises) must not end recording
    silently with the state still "recording", nor take the stop (and the service's shutdown)
    down with it."""
    ring, recorder = await recording(tmp_path)
    calls = 0
    real_push = recorder._segmenter.push

    def failing_push(*args: object) -> list[object]:
        nonlocal calls
        calls += 1
        if calls > 40:
            raise RuntimeError("segmenter bug")
        return real_push(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(recorder._segmenter, "push", failing_push)
    await feed(ring, units[:90])
    for _ in range(100):
        if recorder.state == "error":
            break
        await asyncio.sleep(0.01)
    stats = recorder.stats()
    assert stats["state"] == "error" and "segmenter bug" in stats["reason"], stats
    assert "recording stopped: recording failed" in caplog.text
    assert await recorder.end()  # does not raise
    assert recorder.state == "stopped"
    monkeypatch.undo()
    assert recorder.begin(preroll_s=0) is True  # a new recording starts clean
    assert recorder.state == "waiting" and recorder.stats()["reason"] is None
    await recorder.stop()


async def test_housekeeping_outlives_a_failing_round(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Flushing, resuming and retention all live in the housekeeping task: one surprise (a
    retention that raises, here) must not end them for good."""
    monkeypatch.setattr(recorder_module, "HOUSEKEEPING_INTERVAL_S", 0.02)
    monkeypatch.setattr(recorder_module, "RETENTION_INTERVAL_S", 0.0)
    _ring, recorder = await recording(tmp_path)
    calls = 0
    real_retention = recorder.apply_retention

    def flaky_retention() -> list[object]:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise RuntimeError("retention bug")
        return real_retention()  # type: ignore[return-value]

    monkeypatch.setattr(recorder, "apply_retention", flaky_retention)
    try:
        for _ in range(500):
            if calls >= 5:
                break
            await asyncio.sleep(0.01)
        assert calls >= 5, "housekeeping stopped after a failing round"
        assert recorder.stats()["housekeeping_errors_total"] == 2
        assert caplog.text.count("recording housekeeping failed") == 1  # rate-limited
    finally:
        await recorder.end()
        await recorder.stop()
