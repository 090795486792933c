"""Retention tiers: segments that hold a motion event (its pre- and post-roll) are kept for
``recording.event_max_age_hours`` when that is longer than ``max_age_hours`` (Frigate's
tiers); the size bound takes the oldest either way. The archive's rule on its own here; the
whole appliance (a file camera's real crossing, continuous recording) in
tests/motion/test_event_tiers.py."""

from __future__ import annotations

from pathlib import Path

from ruseon_appliance.motion.store import EventStore, StoredEvent
from ruseon_appliance.recording import Archive
from ruseon_appliance.recording.archive import Segment

HOUR = 3_600_000_000
NOW = 1_800_000_000_000_000


def _archive(*ages_h: float) -> Archive:
    """Closed one-minute segments that ended ``ages_h`` hours ago, oldest first."""
    archive = Archive(Path("/nonexistent"))
    archive.segments = [Segment(Path(f"{i}.mp4"), NOW - round(age * HOUR) - 60_000_000,
                                60_000_000, 1000) for i, age in enumerate(ages_h)]
    return archive


def _age(segment: Segment) -> int:
    return NOW - segment.end_us


def test_event_footage_outlives_the_rest_until_its_own_age() -> None:
    archive = _archive(9, 5, 3, 2.5, 1.5, 0.5)
    held = {archive.segments[1].path, archive.segments[3].path}  # 5 h and 2.5 h old
    held.add(archive.segments[0].path)  # 9 h old: past the event tier too
    gone = archive.expired(max_bytes=0, max_age_us=2 * HOUR, age_us=_age,
                           kept_longer=lambda s: s.path in held, longer_age_us=6 * HOUR)
    assert [s.path.name for s in gone] == ["0.mp4", "2.mp4"]
    # Without the tier every segment over 2 h goes, oldest first, as before.
    gone = archive.expired(max_bytes=0, max_age_us=2 * HOUR, age_us=_age)
    assert [s.path.name for s in gone] == ["0.mp4", "1.mp4", "2.mp4", "3.mp4"]


def test_the_size_bound_takes_the_oldest_even_when_it_holds_an_event() -> None:
    archive = _archive(5, 3, 1)
    gone = archive.expired(max_bytes=2500, max_age_us=24 * HOUR, age_us=_age,
                           kept_longer=lambda s: True, longer_age_us=48 * HOUR)
    assert [s.path.name for s in gone] == ["0.mp4"]


def test_an_untrusted_age_stops_age_retention_as_before() -> None:
    archive = _archive(9, 5)
    gone = archive.expired(max_bytes=0, max_age_us=2 * HOUR, age_us=lambda s: None,
                           kept_longer=lambda s: False, longer_age_us=6 * HOUR)
    assert gone == []


def test_event_windows_merge_and_widen_by_the_rolls(tmp_path: Path) -> None:
    store = EventStore(tmp_path, "porch")
    for i, (start, end) in enumerate([(100.0, 103.0), (106.0, 108.0), (200.0, None)]):
        store.put(StoredEvent(id=f"{int(start * 1000)}-porch", camera="porch", kind="motion",
                              start=start, end=end, peak_score=1.0, peak_time=start))
        assert len(store) == i + 1
    s = 1_000_000
    # 100-103 and 106-108 with 2 s before and after: 98-105 and 104-110 overlap -> one.
    assert store.windows(0, 300 * s, before_s=2, after_s=2) == [(98 * s, 110 * s),
                                                                 (198 * s, 300 * s)]
    assert store.windows(0, 300 * s) == [(100 * s, 103 * s), (106 * s, 108 * s),
                                         (200 * s, 300 * s)]
    assert store.windows(101 * s, 107 * s, before_s=2, after_s=2) == [(101 * s, 107 * s)]
    assert store.windows(120 * s, 190 * s, before_s=2, after_s=2) == []
