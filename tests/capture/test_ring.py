"""The ring buffer: one copy in, views out, keyframe starts, overrun recovery, no polling."""

from __future__ import annotations

import asyncio

import pytest

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.ring import RingBuffer


def au(n: int, size: int = 100, keyframe: bool = False) -> AccessUnit:
    return AccessUnit(bytes([n % 256]) * size, pts=n * 3000, keyframe=keyframe,
                      capture_time_us=1_000_000 + n)


def fill(ring: RingBuffer, count: int, gop: int = 10, size: int = 100) -> None:
    for n in range(ring.newest_seq + 1, ring.newest_seq + 1 + count):
        ring.write(au(n, size, keyframe=n % gop == 0))


def test_write_and_read_back_without_copy() -> None:
    ring = RingBuffer(10_000, 16)
    assert ring.newest_seq == -1 and ring.newest_keyframe_seq is None
    assert ring.write(au(0, keyframe=True)) == 0
    reader = ring.reader()
    view = reader.poll()
    assert view is not None
    assert (view.seq, view.pts, view.keyframe, view.capture_time_us) == (0, 0, True, 1_000_000)
    assert bytes(view.data) == b"\x00" * 100
    assert isinstance(view.data, memoryview)
    # A view into the arena, not a copy: the ring's next writes show through.
    assert view.data.obj is ring._arena
    assert reader.poll() is None


def test_new_reader_starts_at_newest_keyframe() -> None:
    ring = RingBuffer(100_000, 64)
    fill(ring, 25, gop=10)  # keyframes at 0, 10, 20
    reader = ring.reader()
    seqs = [v.seq for v in iter(reader.poll, None)]
    assert seqs == [20, 21, 22, 23, 24]
    late = ring.reader("next")
    assert late.poll() is None
    fill(ring, 1)
    view = late.poll()
    assert view is not None and view.seq == 25


def test_reader_before_any_keyframe_waits_for_one() -> None:
    ring = RingBuffer(100_000, 64)
    ring.write(au(0))
    reader = ring.reader()
    ring.write(au(1))
    assert reader.poll() is None  # P frames without a keyframe are useless to a decoder
    ring.write(au(2, keyframe=True))
    view = reader.poll()
    assert view is not None and view.seq == 2


def test_overrun_reader_resumes_at_keyframe_and_is_counted() -> None:
    ring = RingBuffer(1000, 64)  # 10 frames of 100 bytes fit
    fill(ring, 1, gop=5)
    reader = ring.reader()
    assert reader.poll() is not None
    fill(ring, 30, gop=5)  # laps the reader several times over
    assert ring.oldest_seq > 1
    view = reader.poll()
    assert view is not None and view.keyframe
    assert view.seq == ring.newest_keyframe_seq
    assert reader.overruns == 1
    assert ring.stats()["readers_overrun"] == 1
    # After recovery it reads on in order.
    rest = [v.seq for v in iter(reader.poll, None)]
    assert rest == list(range(view.seq + 1, ring.newest_seq + 1))


def test_slot_table_limits_history() -> None:
    ring = RingBuffer(1_000_000, 16)
    fill(ring, 40, gop=100)
    assert ring.oldest_seq == 40 - 16
    assert ring.frame(40 - 17) is None
    assert ring.frame(39) is not None


def test_wraparound_keeps_data_intact() -> None:
    ring = RingBuffer(1000, 64)
    sizes = [130, 270, 90, 333, 410, 77, 250, 199, 300, 64, 500, 120] * 5
    for n, size in enumerate(sizes):
        ring.write(AccessUnit(bytes([n % 251]) * size, n, n % 4 == 0, n))
        for seq in range(ring.oldest_seq, ring.newest_seq + 1):
            view = ring.frame(seq)
            assert view is not None
            assert bytes(view.data) == bytes([seq % 251]) * sizes[seq]
        assert ring.oldest_seq <= ring.newest_seq
    assert ring.stats()["bytes_used"] <= 1000


def test_an_empty_frame_at_the_write_offset_does_not_hide_overwritten_ones() -> None:
    """Hypothesis found it: 14 empty AUs, an empty keyframe, a 1-byte AU, a 4096-byte AU, polling
    after every second write. The 4096 bytes wrap to offset 0 and overwrite the 1-byte frame; the
    empty frames in front of it (also at offset 0) once stopped the invalidation walk, and poll()
    served seq 15 with the new frame's byte instead of lapping the reader."""
    ring = RingBuffer(4096, 16)
    reader = ring.reader()
    writes = [(0, False)] * 14 + [(0, True), (1, False), (4096, False)]
    served: list[tuple[int, bytes]] = []
    for i, (size, key) in enumerate(writes):
        assert ring.write(AccessUnit(bytes([i]) * size, i, key, i)) == i
        if i % 2 == 0:
            while (view := reader.poll()) is not None:
                served.append((view.seq, bytes(view.data)))
    assert served == [(14, b"")]  # 15 was overwritten before the next poll: lapped, not served
    assert ring.oldest_seq == 16 and ring.frame(15) is None
    assert reader.poll() is None  # lapped, waiting for a keyframe: not seq 15 with byte 16
    assert reader.overruns == 1
    assert ring.stats()["bytes_used"] == 4096 and ring.stats()["frames"] == 1


def test_an_empty_frame_at_the_head_survives_the_next_write() -> None:
    """The same offset in the current lap is not overwritten: no spurious overrun."""
    ring = RingBuffer(100, 16)
    reader = ring.reader()
    ring.write(AccessUnit(b"k" * 60, 0, True, 0))
    ring.write(AccessUnit(b"", 1, False, 1))  # empty, at offset 60
    assert [v.seq for v in iter(reader.poll, None)] == [0, 1]
    ring.write(AccessUnit(b"x" * 40, 2, False, 2))  # 60..100, exactly after the empty frame
    assert ring.oldest_seq == 0 and bytes(ring.frame(0).data) == b"k" * 60  # type: ignore[union-attr]
    ring.write(AccessUnit(b"", 3, False, 3))  # empty at the end of the arena
    ring.write(AccessUnit(b"y", 4, False, 4))  # wraps: overwrites the keyframe's first byte
    assert ring.oldest_seq == 1
    assert [(v.seq, bytes(v.data)) for v in iter(reader.poll, None)] == [
        (2, b"x" * 40), (3, b""), (4, b"y")]
    assert reader.overruns == 0
    assert ring.stats()["bytes_used"] == 41


def test_oversized_unit_is_rejected_and_counted() -> None:
    ring = RingBuffer(1000, 16)
    assert ring.write(au(0, size=1001, keyframe=True)) is None
    assert ring.stats()["rejected_too_large"] == 1
    assert ring.newest_seq == -1
    assert ring.write(au(1, size=1000, keyframe=True)) == 0


async def test_readers_wait_without_polling_and_all_wake() -> None:
    ring = RingBuffer(100_000, 64)
    readers = [ring.reader() for _ in range(5)]
    tasks = [asyncio.create_task(r.next()) for r in readers]
    await asyncio.sleep(0)
    assert not any(t.done() for t in tasks)
    ring.write(au(0, keyframe=True))
    views = await asyncio.gather(*tasks)
    assert [v.seq for v in views] == [0] * 5


async def test_cancelled_reader_does_not_disturb_others() -> None:
    ring = RingBuffer(100_000, 64)
    a, b = ring.reader(), ring.reader()
    ta, tb = asyncio.create_task(a.next()), asyncio.create_task(b.next())
    await asyncio.sleep(0)
    ta.cancel()
    await asyncio.sleep(0)
    ring.write(au(0, keyframe=True))
    assert (await tb).seq == 0
    with pytest.raises(asyncio.CancelledError):
        await ta


async def test_close_ends_a_waiting_reader() -> None:
    ring = RingBuffer(100_000, 64)
    reader = ring.reader()
    task = asyncio.create_task(reader.next())
    await asyncio.sleep(0)
    reader.close()
    with pytest.raises(EOFError):
        await task
    assert ring.stats()["readers"] == 0
