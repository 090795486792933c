"""The monitor as the appliance runs it: a ring reader on the loop, the worker thread, the
bounded backlog (frames it cannot keep up with are skipped and counted, never waited for),
the event store on disk and the bus events."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.events import EventBus
from ruseon_appliance.motion.detector import MotionSettings
from ruseon_appliance.motion.monitor import MotionMonitor
from ruseon_appliance.motion.store import EventStore
from tests.motion.scenes import Scene, Unit, encode, seconds_of

W, H = 320, 180


@pytest.fixture(scope="module")
def crossing() -> list[Unit]:
    return encode(Scene(W, H).crossing(1.0, 2.0), 6, width=W, height=H)


async def drain(monitor: MotionMonitor, analysed: int, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while monitor.analyser.analysed < analysed or monitor.stats()["backlog"]:
            await asyncio.sleep(0.02)


async def test_events_reach_the_bus_and_the_store_with_their_snapshot(
        tmp_path: Path, crossing: list[Unit]) -> None:
    ring = RingBuffer(8 << 20, 1024)
    bus = EventBus()
    seen: list[Any] = []
    bus.subscribe(seen.append)
    store = EventStore(tmp_path / "events", "front")
    monitor = MotionMonitor(ring, MotionSettings(off_delay_s=1.0), camera="front", store=store,
                            publish=bus.publish, max_backlog=len(crossing) + 1)
    await monitor.start()
    for unit in crossing:  # faster than real time: the backlog holds all
        ring.write(AccessUnit(unit.data, unit.pts, unit.keyframe, unit.capture_time_us))
        await asyncio.sleep(0)
    await drain(monitor, 55)
    await asyncio.sleep(0.05)  # the worker's announcements are queued on the loop
    await monitor.stop()
    names = [e.name for e in seen]
    assert names == ["motion_started", "motion_ended"]
    started, ended = seen
    assert started.data["camera"] == "front" and started.data["event_id"].endswith("-front")
    assert ended.data["event_id"] == started.data["event_id"]
    assert 1.0 <= seconds_of(ended.data["start"]) <= 1.5
    assert 2.5 <= seconds_of(ended.data["end"]) <= 3.5
    assert monitor.skipped == 0
    # On disk: the event and the JPEG of its peak, read back as a restart would.
    again = EventStore(tmp_path / "events", "front")
    assert again.load() == 1
    stored = again.get(started.data["event_id"])
    assert stored is not None and stored.end is not None and stored.snapshot
    jpeg = again.snapshot_path(stored.id).read_bytes()
    assert jpeg[:2] == b"\xff\xd8" and jpeg[-2:] == b"\xff\xd9"
    assert ended.data["snapshot"] == f"/api/events/{stored.id}/snapshot.jpg"


async def test_a_worker_that_falls_behind_skips_to_the_next_keyframe_and_counts(
        crossing: list[Unit]) -> None:
    ring = RingBuffer(8 << 20, 1024)
    monitor = MotionMonitor(ring, MotionSettings(), camera="cam", max_backlog=10)
    gate = threading.Event()
    feed = monitor.analyser.feed

    def slow_feed(*args: Any) -> Any:
        gate.wait(30)
        return feed(*args)

    monitor.analyser.feed = slow_feed  # type: ignore[method-assign]
    await monitor.start()
    for unit in crossing[:100]:  # the writer never waits for the detector
        ring.write(AccessUnit(unit.data, unit.pts, unit.keyframe, unit.capture_time_us))
        await asyncio.sleep(0)
    stats = monitor.stats()
    assert stats["skipped"] > 0 and stats["backlog"] <= 10
    gate.set()
    skipped = monitor.skipped
    for written, unit in enumerate(crossing[100:], start=101):  # at a pace it keeps up with
        ring.write(AccessUnit(unit.data, unit.pts, unit.keyframe, unit.capture_time_us))
        async with asyncio.timeout(30):
            while monitor.fed + monitor.skipped < written:
                await asyncio.sleep(0.002)
    await drain(monitor, 1)
    await monitor.stop()
    stats = monitor.stats()
    # Every unit was either taken by the worker or counted as skipped; none waited.
    assert stats["fed"] + stats["skipped"] == len(crossing)
    # Once the worker kept up, only the P-frames before the next keyframe (GOP 30) were
    # skipped, and from that keyframe on every frame decoded.
    assert stats["skipped"] - skipped <= 30
    assert stats["decoded"] >= len(crossing) - 120
    assert stats["decode_errors"] == 0  # it restarted on keyframes, never fed a broken chain


def test_a_torn_last_line_is_skipped_and_old_events_are_pruned(tmp_path: Path) -> None:
    from ruseon_appliance.motion.store import StoredEvent

    now = [999_995.0]
    store = EventStore(tmp_path, "cam", max_age_s=3600, clock=lambda: now[0])
    old = StoredEvent("0000999000000-cam", "cam", "motion", 999_000.0, 999_010.0, 0.1, 999_005.0,
                      snapshot=True)
    store.put(old, b"\xff\xd8old\xff\xd9")
    new = StoredEvent("0000999990000-cam", "cam", "motion", 999_990.0, None, 0.2, 999_991.0)
    store.put(new)
    with store.path.open("a") as f:
        f.write('{"id": "torn')
    again = EventStore(tmp_path, "cam", max_age_s=3600, clock=lambda: now[0])
    assert again.load() == 2
    assert again.snapshot_path(old.id).exists()
    now[0] = 999_010.0 + 3601
    assert again.prune() == 1  # ended more than an hour ago: gone with its picture
    assert not again.snapshot_path(old.id).exists()
    assert [e.id for e in again.query()] == [new.id]
    fresh = EventStore(tmp_path, "cam")
    fresh.load()
    assert [e.id for e in fresh.query()] == [new.id]
    assert fresh.query(until=999_000.0) == [] and fresh.query(since=999_995.0) == [new]


async def test_a_pause_ends_a_lasting_event_and_a_resume_starts_afresh(
        crossing: list[Unit]) -> None:
    ring = RingBuffer(8 << 20, 1024)
    seen: list[str] = []
    monitor = MotionMonitor(ring, MotionSettings(off_delay_s=5.0), camera="cam",
                            publish=lambda name, **_: seen.append(name),
                            max_backlog=len(crossing) + 1)
    await monitor.start()
    for unit in crossing[:75]:  # into the crossing (1 s to 3 s): an event lasts
        ring.write(AccessUnit(unit.data, unit.pts, unit.keyframe, unit.capture_time_us))
        await asyncio.sleep(0)
    await drain(monitor, 20)
    await asyncio.sleep(0.05)
    assert seen == ["motion_started"] and monitor.active
    monitor.set_enabled(False)
    async with asyncio.timeout(10):
        while seen != ["motion_started", "motion_ended"]:
            await asyncio.sleep(0.02)
    fed = monitor.fed
    for unit in crossing[75:90]:
        ring.write(AccessUnit(unit.data, unit.pts, unit.keyframe, unit.capture_time_us))
        await asyncio.sleep(0)
    await asyncio.sleep(0.1)
    assert monitor.fed == fed and not monitor.active and monitor.stats()["enabled"] is False
    monitor.set_enabled(True)
    for unit in crossing[90:]:
        ring.write(AccessUnit(unit.data, unit.pts, unit.keyframe, unit.capture_time_us))
        await asyncio.sleep(0)
    await drain(monitor, monitor.analyser.analysed + 1)
    await monitor.stop()
    assert monitor.fed > fed and monitor.skipped == 0


async def test_announcements_wait_for_start_announcing(crossing: list[Unit]) -> None:
    ring = RingBuffer(8 << 20, 1024)
    seen: list[str] = []
    monitor = MotionMonitor(ring, MotionSettings(off_delay_s=0.5), camera="cam",
                            publish=lambda name, **_: seen.append(name),
                            max_backlog=len(crossing) + 1, announce_at_once=False)
    await monitor.start()
    for unit in crossing:
        ring.write(AccessUnit(unit.data, unit.pts, unit.keyframe, unit.capture_time_us))
        await asyncio.sleep(0)
    await drain(monitor, 55)
    await asyncio.sleep(0.05)
    assert seen == [] and monitor.stats()["events"] == 1  # happened, held back
    monitor.start_announcing()
    assert seen == ["motion_started", "motion_ended"]
    await monitor.stop()
