"""The archive against a wall clock that is wrong or steps, with a clock the test sets.

The recorder sees the wall clock only through its :class:`WallClock` (offset from the monotonic
clock, synchronized or not, steps): here a subclass whose offset and sync state the test sets,
and the access units' capture times follow it, as a camera's do. (The same scenarios against a
real service under a time shim: tests/e2e/test_clock_steps.py.)
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.clock import WallClock, monotonic_us
from ruseon_appliance.recording import Archive, Recorder, RecorderSettings, plan_clip
from ruseon_appliance.recording import recorder as recorder_module
from ruseon_appliance.recording.archive import UNCERTAIN_MARK, Segment
from tests.segmenter.stream import Unit, encode, ffmpeg_errors, probe_frames

FPS, GOP = 30, 15
DAY_US = 86_400_000_000
REAL_OFFSET = 1_800_000_000_000_000 - monotonic_us()  # "now" is 2027-01-15 for these tests


class SetClock(WallClock):
    """A wall clock at ``offset`` µs from the monotonic one, synchronized when told."""

    def __init__(self, offset: int, *, synchronized: bool) -> None:
        self.offset = offset
        self.synced = synchronized
        super().__init__()

    def offset_us(self) -> int:  # type: ignore[override]
        return self.offset

    def now_us(self) -> int:
        return monotonic_us() + self.offset

    def refresh(self) -> bool:
        self._synchronized = self.synced
        return self.synced

    def set(self, offset: int, *, synchronized: bool) -> None:
        self.offset, self.synced = offset, synchronized
        self.refresh()
        self.check_step()


@pytest.fixture(scope="module")
def units() -> list[Unit]:
    """Two seconds of 160x96 video, an IDR every half second."""
    return encode(2 * FPS, width=160, height=96, fps=FPS, gop=GOP)


async def record(ring: RingBuffer, clock: SetClock, units: list[Unit], *,
                 pts0: int, times: int = 1, mono0: int | None = None) -> int:
    """Feed ``units`` (``times`` over, one after the other) captured from ``mono0`` (monotonic
    µs, default now) on ``clock``; returns the next pts. They are fed at once: their capture
    times run ahead of the clock, so a later batch goes on from ``mono0 + ...`` (see
    :func:`mono_after`), as a camera's would."""
    base = (monotonic_us() if mono0 is None else mono0) + clock.offset
    span_pts = units[-1].pts + 3000
    span_us = span_pts * 1_000_000 // 90_000
    for n in range(times):
        for u in units:
            ring.write(AccessUnit(u.data, pts0 + n * span_pts + u.pts, u.keyframe,
                                  base + n * span_us
                                  + (u.capture_time_us - units[0].capture_time_us)))
            await asyncio.sleep(0)
    return pts0 + times * span_pts


def mono_after(mono0: int, pts: int) -> int:
    """Where capture continues after ``pts`` (from 0) fed from ``mono0``."""
    return mono0 + pts * 1_000_000 // 90_000


def recorder(tmp_path: Path, ring: RingBuffer, clock: SetClock, **settings: float) -> Recorder:
    return Recorder(RecorderSettings(directory=tmp_path / "rec", segment_s=2.0,
                                     max_age_s=168 * 3600, **settings),  # type: ignore[arg-type]
                    ring, clock=clock)


def check_disjoint(archive: Archive) -> None:
    for a, b in itertools.pairwise(archive.segments):
        assert a.end_us <= b.start_us, (a, b)


async def a_trusted_archive(tmp_path: Path, units: list[Unit]) -> int:
    """A first run with a right clock, a minute ago (the units are fed at once, so their
    capture times run ahead of the clock); returns where its archive ends."""
    clock = SetClock(REAL_OFFSET - 60_000_000, synchronized=True)
    ring = RingBuffer(8 * 1024 * 1024, 1024)
    rec = recorder(tmp_path, ring, clock)
    await rec.start()
    assert rec.begin(preroll_s=0)
    await record(ring, clock, units, pts0=0, times=2)
    await rec.stop()
    assert rec.archive.segments and not any(s.uncertain for s in rec.archive.segments)
    return rec.archive.end_us


async def test_a_clock_behind_the_archive_records_after_it_and_a_step_retimes(
        tmp_path: Path, units: list[Unit]) -> None:
    archive_end = await a_trusted_archive(tmp_path, units)
    # Power cut; back with the clock 400 days behind, not synchronized.
    clock = SetClock(REAL_OFFSET - 400 * DAY_US, synchronized=False)
    ring = RingBuffer(8 * 1024 * 1024, 1024)
    rec = recorder(tmp_path, ring, clock)
    await rec.start()
    assert rec.begin(preroll_s=0)
    mono0 = monotonic_us()
    pts = await record(ring, clock, units, pts0=0, times=2, mono0=mono0)
    await asyncio.sleep(0.1)
    uncertain = [s for s in rec.archive.segments if s.uncertain]
    assert uncertain and min(s.start_us for s in uncertain) >= archive_end
    assert all(UNCERTAIN_MARK in s.path.name for s in uncertain)
    check_disjoint(rec.archive)
    # Retention must not take the new segments for 400 days old, nor the old for anything.
    assert rec.apply_retention() == []
    # NTP answers: the wall clock steps to the real time, synchronized.
    clock.set(REAL_OFFSET, synchronized=True)
    assert clock.steps_total == 1 and clock.state == "synchronized"
    await record(ring, clock, units, pts0=pts, mono0=mono_after(mono0, pts))
    await rec.end()
    await rec.stop()
    assert rec.segments_retimed >= len(uncertain)
    segments = Archive(tmp_path / "rec")
    segments.scan()
    check_disjoint(segments)
    assert not any(s.uncertain for s in segments.segments), segments.segments
    # Re-timed to their monotonic start plus the new clock: "now", not 400 days ago.
    now = monotonic_us() + REAL_OFFSET
    assert all(now - 60_000_000 < s.start_us <= now + 10_000_000
               for s in segments.segments[-3:]), segments.segments
    assert rec.apply_retention() == [] and rec.segments_deleted == 0


async def test_a_clock_never_set_keeps_order_after_the_archive(
        tmp_path: Path, units: list[Unit]) -> None:
    archive_end = await a_trusted_archive(tmp_path, units)
    for _run in range(2):  # and again after a restart
        clock = SetClock(REAL_OFFSET - 400 * DAY_US, synchronized=False)
        ring = RingBuffer(8 * 1024 * 1024, 1024)
        rec = recorder(tmp_path, ring, clock)
        await rec.start()
        assert rec.begin(preroll_s=0)
        await record(ring, clock, units, pts0=0, times=2)
        await rec.end()
        assert rec.apply_retention() == []
        await rec.stop()
        check_disjoint(rec.archive)
        assert [lo for lo, _hi, uncertain in rec.archive.timed_ranges() if uncertain]
        assert all(s.start_us >= archive_end for s in rec.archive.segments if s.uncertain)


def test_age_retention_trusts_only_what_it_can() -> None:
    clock = SetClock(REAL_OFFSET, synchronized=False)
    rec = Recorder(RecorderSettings(directory=Path("/nonexistent"), max_age_s=3600),
                   RingBuffer(1024 * 1024, 64), clock=clock)
    now = monotonic_us() + REAL_OFFSET
    old = now - 2 * 3_600_000_000
    recorded_now = Segment(Path("a.mp4"), old - 400 * DAY_US, 1_000_000, 1,
                           mono_start_us=monotonic_us() - 2_000_000)
    trusted_old = Segment(Path("b.mp4"), old, 1_000_000, 1)
    uncertain_old = Segment(Path("c.mp4"), old, 1_000_000, 1, uncertain=True)
    ages = rec._age_us
    age = ages(recorded_now)
    assert age is not None and 0 < age < 10_000_000  # monotonic: seconds, not 400 days
    assert ages(trusted_old) is None  # the clock is not synchronized: no wall age
    clock.set(REAL_OFFSET, synchronized=True)
    age = ages(trusted_old)
    assert age is not None and age > 3600 * 1_000_000
    assert ages(uncertain_old) is None
    rec.archive.segments = [recorded_now, trusted_old]
    assert rec.archive.expired(max_bytes=0, max_age_us=3_600_000_000, age_us=ages) == []
    rec.archive.segments = [trusted_old, recorded_now]
    assert rec.archive.expired(max_bytes=0, max_age_us=3_600_000_000,
                               age_us=ages) == [trusted_old]


async def test_a_clip_never_splices_overlapping_recordings_backwards(
        tmp_path: Path, units: list[Unit]) -> None:
    # Two recordings of the same minute (an archive from a clock that stepped back, or from
    # before this version placed segments after the archive).
    for name in ("one", "two"):
        clock = SetClock(REAL_OFFSET, synchronized=True)
        ring = RingBuffer(8 * 1024 * 1024, 1024)
        rec = Recorder(RecorderSettings(directory=tmp_path / name, segment_s=60.0), ring,
                       clock=clock)
        await rec.start()
        assert rec.begin(preroll_s=0)
        await record(ring, clock, units, pts0=0)
        await rec.stop()
    a = Archive(tmp_path / "one")
    a.scan()
    b = Archive(tmp_path / "two")
    b.scan()
    (first,), (second,) = a.segments, b.segments
    second.start_us = first.start_us + 500_000  # overlaps the first by 1.5 s
    clip = plan_clip([first, second], first.start_us, second.end_us + 1_000_000)
    try:
        out = tmp_path / "clip.mp4"
        out.write_bytes(b"".join(clip.read()))
    finally:
        clip.close()
    assert clip.frames == len(units)  # the first recording only
    assert ffmpeg_errors(out) == ""
    times = [t for _, t in probe_frames(out)]
    assert all(y >= x for x, y in itertools.pairwise(times))


async def test_only_the_newest_uncertain_segments_wait_for_a_step(
        tmp_path: Path, units: list[Unit], monkeypatch: pytest.MonkeyPatch) -> None:
    """A board that never gets NTP keeps a bounded list: a late step re-times the newest
    ``MAX_RETIMED``; the older stay uncertain, and the archive stays in order."""
    monkeypatch.setattr(recorder_module, "MAX_RETIMED", 2)
    archive_end = await a_trusted_archive(tmp_path, units)
    clock = SetClock(REAL_OFFSET - 400 * DAY_US, synchronized=False)
    ring = RingBuffer(8 * 1024 * 1024, 1024)
    rec = recorder(tmp_path, ring, clock)
    await rec.start()
    assert rec.begin(preroll_s=0)
    mono0 = monotonic_us()
    pts = await record(ring, clock, units, pts0=0, times=3, mono0=mono0)
    await asyncio.sleep(0.1)
    assert len(rec._uncertain_run) == 2
    clock.set(REAL_OFFSET, synchronized=True)
    await record(ring, clock, units, pts0=pts, mono0=mono_after(mono0, pts))
    await rec.end()
    await rec.stop()
    segments = Archive(tmp_path / "rec")
    segments.scan()
    check_disjoint(segments)
    new = [s for s in segments.segments if s.start_us >= archive_end]
    assert new[0].uncertain and not new[-1].uncertain, new
    assert rec.segments_deleted == 0
