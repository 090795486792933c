"""The ring buffer: a fixed arena of access units that any number of readers follow.

The writer (on the event loop thread) copies each access unit into the arena once; readers are
cursors (sequence numbers) that get ``memoryview`` slices of the arena, so a frame is never copied
per viewer. The arena and the slot table are allocated once and never grow.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
from array import array
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .access_unit import AccessUnit

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FrameView:
    """One access unit as a reader sees it.

    ``data`` is a view into the ring's arena: valid until the writer laps it. Copy it
    (``bytes(view.data)``) before awaiting anything long.
    """

    seq: int
    data: memoryview
    pts: int
    keyframe: bool
    capture_time_us: int


def zeroed_buffer(size: int) -> mmap.mmap:
    """A fixed, writable, zeroed buffer of ``size`` bytes whose pages take memory only once
    written: an anonymous mapping. (``bytearray(size)`` zero-fills, so all of it is resident
    from the start: the 8 MiB ring arena and the muxer's 1 MiB frame buffer were, issue 19.)"""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)  # anonymous, not shared memory


class RingPin(Protocol):
    """A holder of references to a ring's frames (the HLS window's parts, the segmenter's
    samples): :meth:`RingBuffer.write` calls ``before_lap(oldest)`` before it overwrites a frame
    older than ``oldest`` while ``seq``, the oldest frame the holder refers to, is one of them;
    the holder copies those frames out then (they are still intact during the call)."""

    @property
    def seq(self) -> int: ...

    def before_lap(self, oldest: int) -> None: ...


class RingBuffer:
    """Fixed arena plus fixed slot table; sequence numbers start at 0 and only grow.

    Slot ``seq % slots`` holds the start, length, pts, keyframe flag and capture time of frame
    ``seq``. Frames ``oldest_seq..newest_seq`` are intact; older ones were overwritten (by bytes or
    by slot reuse). ``write`` must be called on the event loop thread the readers await on.

    A frame's start is an absolute position in the stream of bytes ever written (the tail skipped
    at a wrap counts too), so its arena offset is ``start % arena_bytes`` and "which lap" is never
    ambiguous: frame ``s`` is gone once a write ends past ``start[s] + arena_bytes``, whatever its
    length. (With arena offsets alone, an empty frame at the write offset looked untouched, and
    the oldest-first walk stopped there, before the overwritten frames behind it.)
    """

    def __init__(self, arena_bytes: int, slots: int) -> None:
        if arena_bytes <= 0 or slots <= 0:
            raise ValueError("arena_bytes and slots must be positive")
        self._arena = zeroed_buffer(arena_bytes)
        self._view = memoryview(self._arena)
        self._slots = slots
        self._seq = array("q", [-1]) * slots
        self._start = array("q", [0]) * slots  # absolute position (see the class docstring)
        self._length = array("q", [0]) * slots
        self._pts = array("q", [0]) * slots
        self._capture = array("q", [0]) * slots
        self._keyframe = bytearray(slots)
        self._head = 0  # absolute position of the next write (arena offset: % arena_bytes)
        self._next_seq = 0
        self._oldest = 0  # oldest intact seq (== _next_seq when empty)
        self._newest_keyframe = -1
        self._waiter: asyncio.Future[None] | None = None
        self._readers: set[RingReader] = set()
        self._pins: list[RingPin] = []
        self.rejected_too_large = 0
        self.bytes_written = 0
        self.overruns_closed = 0  # overruns of readers already closed, so stats stay monotonic

    @property
    def arena_bytes(self) -> int:
        """Size of the arena in bytes."""
        return len(self._arena)

    @property
    def slots(self) -> int:
        """Number of slots in the slot table."""
        return self._slots

    @property
    def newest_seq(self) -> int:
        """Sequence number of the newest frame, -1 before the first write."""
        return self._next_seq - 1

    @property
    def oldest_seq(self) -> int:
        """Sequence number of the oldest frame still intact (== newest_seq + 1 when empty)."""
        return self._oldest

    @property
    def newest_keyframe_seq(self) -> int | None:
        """Sequence number of the newest keyframe still intact, or None."""
        k = self._newest_keyframe
        return k if k >= self._oldest else None

    def write(self, au: AccessUnit) -> int | None:
        """Copy one access unit into the arena; return its seq, or None if it cannot fit at all."""
        n = len(au.data)
        arena_size = len(self._arena)
        if n > arena_size:
            self.rejected_too_large += 1
            if self.rejected_too_large == 1:
                log.warning("ring rejected a %d-byte access unit (arena is %d bytes); further "
                            "ones only counted", n, arena_size)
            return None
        seq = self._next_seq
        start = self._head
        off = start % arena_size
        if off + n > arena_size:
            # A frame is never split: skip the tail, the next lap starts at offset 0.
            start += arena_size - off
            off = 0
        end = off + n
        stop = start + n
        # Invalidate, oldest first, every frame this write overwrites: the arena held frame s at
        # start[s]..start[s]+arena_bytes of the byte stream, and this write reaches ``stop``.
        # Starts only grow with seq, so the first frame still intact ends the walk. An empty frame
        # inside the overwritten region goes too (the ones after it were overwritten), and on a
        # wrap so does the old lap's tail beyond the previous head (older than what is reused).
        oldest = self._oldest
        slots = self._slots
        if seq - oldest >= slots:
            oldest = seq - slots + 1
        first_kept = stop - arena_size
        while oldest < seq and self._start[oldest % slots] < first_kept:
            oldest += 1
        if self._pins and oldest > self._oldest:
            self._tell_pins(oldest)
        self._oldest = oldest
        i = seq % slots
        self._view[off:end] = au.data
        self._seq[i] = seq
        self._start[i] = start
        self._length[i] = n
        self._pts[i] = au.pts
        self._capture[i] = au.capture_time_us
        self._keyframe[i] = 1 if au.keyframe else 0
        if au.keyframe:
            self._newest_keyframe = seq
        self._head = stop
        self._next_seq = seq + 1
        self.bytes_written += n
        self._wake()
        return seq

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def frame(self, seq: int) -> FrameView | None:
        """Return frame ``seq`` if it is still intact, else None."""
        if seq < self._oldest or seq >= self._next_seq:
            return None
        i = seq % self._slots
        off = self._start[i] % len(self._arena)
        return FrameView(
            seq,
            self._view[off : off + self._length[i]],
            self._pts[i],
            bool(self._keyframe[i]),
            self._capture[i],
        )

    def _tell_pins(self, oldest: int) -> None:
        """Frames before ``oldest`` are about to be overwritten (still intact during this)."""
        for pin in list(self._pins):
            try:
                if pin.seq < oldest:
                    pin.before_lap(oldest)
            except Exception:  # a holder's bug must not cost the camera its frames
                log.exception("a holder of ring references failed to copy them out; it is "
                              "no longer told (what it refers to may be refused)")
                self.unpin(pin)

    def pin(self, holder: RingPin) -> None:
        """Have ``holder`` told before the frames it refers to are overwritten (:class:`RingPin`);
        :meth:`unpin` ends it."""
        if holder not in self._pins:
            self._pins.append(holder)

    def unpin(self, holder: RingPin) -> None:
        """Stop telling ``holder``."""
        if holder in self._pins:
            self._pins.remove(holder)

    def is_keyframe(self, seq: int) -> bool:
        """Whether intact frame ``seq`` is a keyframe (False if not intact)."""
        return self._oldest <= seq < self._next_seq and bool(self._keyframe[seq % self._slots])

    def next_keyframe_seq(self, after: int) -> int | None:
        """The first intact keyframe with seq >= ``after``, or None."""
        for seq in range(max(after, self._oldest), self._next_seq):
            if self._keyframe[seq % self._slots]:
                return seq
        return None

    async def wait(self) -> None:
        """Wait until the next write. All waiting readers share one future."""
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.get_running_loop().create_future()
        # Shielded: one reader being cancelled must not cancel the future the others share.
        await asyncio.shield(self._waiter)

    @property
    def reader_count(self) -> int:
        """Readers open now (a producer may skip work nobody reads; any thread may ask)."""
        return len(self._readers)

    def reader(self, start: Literal["keyframe", "next"] = "keyframe") -> RingReader:
        """A new cursor: at the newest keyframe (a picture at once), or at the next write."""
        reader = RingReader(self, start)
        self._readers.add(reader)
        return reader

    def _forget(self, reader: RingReader) -> None:
        if reader in self._readers:
            self._readers.discard(reader)
            self.overruns_closed += reader.overruns

    def stats(self) -> dict[str, Any]:
        """Occupancy and counters for status pages."""
        frames = self._next_seq - self._oldest
        # From the oldest intact frame's start to the head (a skipped tail counts as used).
        used = self._head - self._start[self._oldest % self._slots] if frames else 0
        return {
            "arena_bytes": len(self._arena),
            "slots": self._slots,
            "frames": frames,
            "bytes_used": used,
            "occupancy": used / len(self._arena),
            "newest_seq": self.newest_seq,
            "newest_keyframe_seq": self.newest_keyframe_seq,
            "bytes_written": self.bytes_written,
            "rejected_too_large": self.rejected_too_large,
            "readers": len(self._readers),
            "readers_overrun": self.overruns_closed + sum(r.overruns for r in self._readers),
        }


class RingReader:
    """A cursor into a :class:`RingBuffer`.

    When the writer laps it, the reader jumps to the newest intact keyframe (or waits for the
    next one) and counts an overrun; it never returns a frame that cannot be decoded after the
    ones it returned before.
    """

    __slots__ = ("_closed", "_need_keyframe", "_next", "_ring", "overruns")

    def __init__(self, ring: RingBuffer, start: Literal["keyframe", "next"] = "keyframe") -> None:
        self._ring = ring
        self.overruns = 0
        self._closed = False
        if start == "keyframe":
            k = ring.newest_keyframe_seq
            self._next = ring.newest_seq + 1 if k is None else k
            self._need_keyframe = True
        elif start == "next":
            self._next = ring.newest_seq + 1
            self._need_keyframe = False
        else:
            raise ValueError(f"start must be 'keyframe' or 'next', not {start!r}")

    @property
    def position(self) -> int:
        """The seq this reader will return next (if it is still intact by then)."""
        return self._next

    @property
    def lag(self) -> int:
        """Frames written but not yet read."""
        return max(0, self._ring.newest_seq + 1 - self._next)

    def poll(self) -> FrameView | None:
        """Return the next frame without waiting, or None if there is none yet."""
        ring = self._ring
        if self._closed:
            return None
        if self._next < ring.oldest_seq:
            # Lapped: what we would read next is gone; resume where a decoder can restart.
            self.overruns += 1
            k = ring.newest_keyframe_seq
            self._next = ring.newest_seq + 1 if k is None else k
            self._need_keyframe = True
        if self._need_keyframe:
            k = ring.next_keyframe_seq(self._next)
            if k is None:
                self._next = max(self._next, ring.newest_seq + 1)
                return None
            self._next = k
            self._need_keyframe = False
        view = ring.frame(self._next)
        if view is not None:
            self._next += 1
        return view

    async def next(self) -> FrameView:
        """Wait for and return the next frame (no polling: waits on the ring's future)."""
        while True:
            view = self.poll()
            if view is not None:
                return view
            if self._closed:
                raise EOFError("reader closed")
            await self._ring.wait()

    def close(self) -> None:
        """Detach from the ring; pending and later ``next()`` calls raise EOFError."""
        if not self._closed:
            self._closed = True
            self._ring._forget(self)
            self._ring._wake()
