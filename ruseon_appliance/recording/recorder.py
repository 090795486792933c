"""The recorder: reads the ring like any viewer, segments it to fMP4 and keeps the archive.

Modes: continuous (from start-up) and on demand (:meth:`Recorder.begin` / :meth:`Recorder.end`,
behind ``POST /api/recording/start|stop``). An on-demand recording begins with the ring's last
``preroll_s`` seconds, from a keyframe. Segments are cut at the first IDR after ``segment_s``.
The event loop only segments (a few µs per access unit) and batches; files are written by one
worker thread in large sequential writes. Every ``sync_interval_s`` the batch written is followed
by ``fdatasync`` on that thread, so whole fragments of the open segment are durable within
seconds: a power cut loses at most that interval (and the fragment being built), and start-up
cuts the ``.part`` back to its last whole fragment (:meth:`Archive.repair`). A full or read-only
disk stops writing with a clear state and one journal line; the live view does not notice, and
recording resumes by itself once the disk takes data again.

Time (a board without a real-time clock, see ``clock.py``): a segment is placed at the wall time
of its first frame, but never before the end of what is already recorded: a clock behind the
archive (a power cut, a clock never set) puts new segments after it, shifted, marked
``~uncertain``. When the clock steps, the open segment is cut and the uncertain segments recorded
since the last trusted one are re-timed (renamed) to their monotonic start plus the new clock. Age
retention measures a segment recorded since start-up on the monotonic clock, an older one on the
wall clock only while that is synchronized and the segment's time was trusted.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..capture.ring import RingBuffer, RingReader
from ..clock import ClockStep, WallClock, monotonic_us
from ..logs import RateLimit
from ..segmenter import (
    AacFeed,
    Fmp4Segmenter,
    Fragment,
    open_audio,
    run_segmenter,
    usable_audio,
)
from ..tasks import cancel_and_wait
from .archive import (
    OPEN_SUFFIX,
    SEGMENT_SUFFIX,
    Archive,
    Segment,
    cut_segment,
    rfc3339,
    segment_name,
)
from .disk import SegmentFile, classify, disk_size, free_bytes, unlink_all, writable
from .segment_file import SegmentFormatError

log = logging.getLogger(__name__)

# A batch goes to the disk once it holds this much, or has waited this long.
BATCH_BYTES = 1024 * 1024
FLUSH_INTERVAL_S = 2.0
# Media per fragment in the archive (a clip can start at any IDR; fragments never span one).
FRAGMENT_S = 1.0
HOUSEKEEPING_INTERVAL_S = 1.0
# At most one journal line per this many seconds about failing housekeeping rounds.
HOUSEKEEPING_LOG_INTERVAL_S = 60.0
RETENTION_INTERVAL_S = 10.0
# While stopped by a disk error: how often to try again, and how much must be free before
# resuming (5 % of the file system, at least 512 KiB, at most 64 MiB), so it does not flap.
RESUME_CHECK_S = 3.0
RESUME_MIN_FREE = 512 * 1024
RESUME_MAX_FREE = 64 * 1024 * 1024
RESUME_PROBE_BYTES = 64 * 1024
RATE_WINDOW_S = 10.0
MAX_PREROLL_S = 60.0
# Wall clock and media clock drifting apart by more than this within a segment is a clock jump.
CLOCK_JUMP_US = 2_000_000
# A new segment starting this much before the previous one's end means the clock is behind the
# archive (less is the camera's clock against the system's: the segment just follows on).
BEHIND_US = 500_000
# At most this many uncertain segments wait to be re-timed by a step (a board that never gets
# NTP would otherwise keep one record per segment for ever); older ones stay as they are.
MAX_RETIMED = 10_000


@dataclass(frozen=True, slots=True)
class RecorderSettings:
    """What the recorder needs from ``[recording]`` (the composition root fills it in)."""

    directory: Path
    continuous: bool = False
    segment_s: float = 60.0
    preroll_s: float = 5.0
    max_bytes: int = 0
    max_age_s: float = 0.0
    # Segments that hold an event (Recorder.event_windows) expire by age after this instead,
    # when it is longer than max_age_s (0: no longer tier).
    event_max_age_s: float = 0.0
    # Whole fragments of the open segment are made durable (fdatasync) at least this often;
    # 0: only when the segment closes.
    sync_interval_s: float = 5.0


@dataclass
class _OpenSegment:
    file: SegmentFile
    start_us: int
    generation: int
    mono_start_us: int = 0  # monotonic µs of its first frame
    first_capture_us: int = 0  # the wall clock's capture time of its first frame
    uncertain: bool = False
    segment: Segment | None = None  # once closed and indexed
    media_ticks: int = 0
    next_pts: int = 0  # where the next fragment should start if the clock runs on
    first_pts: int = 0
    pending: list[bytes] = field(default_factory=list)
    pending_bytes: int = 0
    pending_ticks: int = 0
    last_submit: float = field(default_factory=time.monotonic)
    last_sync: float = field(default_factory=time.monotonic)  # when a sync was last asked for
    unsynced: bool = False  # batches were written since then
    written_bytes: int = 0
    written_ticks: int = 0
    has_init: bool = False


class Recorder:
    """Continuous and on-demand recording of one ring into an :class:`Archive`."""

    def __init__(self, settings: RecorderSettings, ring: RingBuffer, *,
                 clock: WallClock | None = None, audio: AacFeed | None = None) -> None:
        self.settings = settings
        self.ring = ring
        # The camera's AAC (audio/): a second track in every segment, in sync by capture time.
        self.audio = audio = usable_audio(audio)
        # The event windows (µs, merged, with their pre- and post-roll) overlapping a range:
        # set by the camera's assembly when it detects motion. Retention keeps those segments
        # for settings.event_max_age_s; /recordings/list?events=motion lists only them.
        self.event_windows: Callable[[int, int], list[tuple[int, int]]] | None = None
        self.clock = clock or WallClock()
        self.clock.add_listener(self._on_clock_step)
        self.archive = Archive(settings.directory)
        # Where the newest segment (closed, closing or open) ends: no new one starts before it.
        self._timeline_end_us = 0
        # Added to the wall clock while it is behind the archive (reset when the clock steps).
        self._shift_us = 0
        # The uncertain segments since the last trusted one (the ones a step re-times), and
        # where the segment before them ended.
        self._uncertain_run: list[_OpenSegment] = []
        self._run_floor_us = 0
        self._cut = False  # a clock step: cut the open segment at the next IDR
        self.segments_retimed = 0
        self._disk = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="recording-disk")
        self._segmenter = Fmp4Segmenter(
            fragment_max_s=FRAGMENT_S, audio_config=audio.aac_config if audio else None)
        self._timescale = self._segmenter.timescale
        self._segment_ticks = int(settings.segment_s * self._timescale)
        self._active = False
        # end() is closing the last recording: begin() waits for it to finish (it shares the
        # segmenter and the open segment with the recording being closed).
        self._ending = False
        self._task: asyncio.Task[None] | None = None
        self._reader: RingReader | None = None
        self._audio_reader: RingReader | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        self._current: _OpenSegment | None = None
        self._inflight: set[asyncio.Future[Any]] = set()
        self._blocked: str | None = None  # disk_full / read_only / error
        self._blocked_reason = ""
        # Why the recording's segmenter task ended by itself (a bug, not the disk), if it did.
        self._failed: str | None = None
        self._last_resume_check = 0.0
        self._last_retention = 0.0
        self._rate: collections.deque[tuple[float, int]] = collections.deque()
        self._disk_free: int | None = None
        self.started_at: float | None = None
        self.bytes_written = 0
        self.writes = 0
        self.syncs = 0
        self.segments_closed = 0
        self.segments_repaired = 0
        self.segments_set_aside = 0
        self.segments_deleted = 0
        self.write_errors = 0
        self.fragments_dropped = 0
        self.resumed = 0
        self.housekeeping_errors = 0

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Rebuild the index (repairing what a crash left), then record if continuous."""
        loop = asyncio.get_running_loop()
        try:
            report = await loop.run_in_executor(self._disk, self.archive.scan)
        except OSError as exc:
            self._block(exc)
        else:
            self._timeline_end_us = max(self._timeline_end_us, self.archive.end_us)
            self.segments_repaired += len(report.repaired)
            self.segments_set_aside += len(report.set_aside)
            log.info("recording: %d segments in %s (%d repaired, %d set aside)",
                     len(report.segments), self.settings.directory, len(report.repaired),
                     len(report.set_aside), extra={"EVENT": "recording_index"})
        self._disk_free = await loop.run_in_executor(self._disk, free_bytes,
                                                     self.settings.directory)
        await asyncio.to_thread(self.clock.refresh)
        self._housekeeping = asyncio.create_task(self._housekeeping_loop())
        if self.settings.continuous:
            self.begin(preroll_s=0.0)

    async def stop(self) -> None:
        """Stop recording, close the open segment durably, stop the disk thread."""
        await self.end()
        await cancel_and_wait(self._housekeeping)
        self._housekeeping = None
        self.clock.remove_listener(self._on_clock_step)
        await self._drain()
        self._disk.shutdown(wait=True)

    # -- control ---------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Recording was asked for (it may still wait for a keyframe or for the disk)."""
        return self._active

    @property
    def closing(self) -> bool:
        """A stop is still closing the recording: its last segment is not in the archive yet
        (``active`` is already False by then)."""
        return self._ending

    def begin(self, preroll_s: float | None = None) -> bool:
        """Start recording with up to ``preroll_s`` seconds from the ring; False if already on,
        or if a stop is still closing the previous recording (ask again in a moment)."""
        if self._active or self._ending:
            return False
        self._active = True
        self._failed = None
        self.started_at = time.time()
        seconds = self.settings.preroll_s if preroll_s is None else preroll_s
        seconds = max(0.0, min(seconds, MAX_PREROLL_S))
        self._segmenter.reset()
        self._segmenter.flush()
        reader = self.ring.reader("next")
        self._reader = reader
        fragments: list[Fragment] = []
        audio_reader = None
        if self.audio is not None:
            # The sound the AAC ring still holds goes in first, so the pre-roll has it too.
            audio_reader, fragments = open_audio(self._segmenter, self.audio.aac_ring,
                                                     self.audio)
        self._audio_reader = audio_reader
        # The pre-roll is pushed now, synchronously: nothing can be written to the ring between
        # choosing the frames and the reader's start, so there is no gap and no overlap.
        first = self._preroll_start(seconds) if seconds > 0 else None
        if first is not None:
            for seq in range(first, reader.position):
                view = self.ring.frame(seq)
                if view is not None:
                    fragments += self._segmenter.push(view.data, view.pts, view.keyframe,
                                                      view.capture_time_us)
        if fragments:
            self._on_fragments(fragments)
        self._task = asyncio.create_task(run_segmenter(reader, self._segmenter,
                                                       self._on_fragments, audio=audio_reader,
                                                       feed=self.audio))
        self._task.add_done_callback(self._segmenter_ended)
        log.info("recording started (pre-roll %.1f s)", seconds,
                 extra={"EVENT": "recording_started"})
        return True

    async def end(self) -> bool:
        """Stop recording and close the open segment; False if it was not recording."""
        if not self._active or self._ending:
            return False
        self._ending = True
        try:
            await self._end()
        finally:
            self._ending = False
        return True

    def _segmenter_ended(self, task: asyncio.Task[None]) -> None:
        """Say so when the recording's task dies of an exception (else it would end silently,
        with the state still "recording" and nothing written)."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        self._failed = f"recording failed: {exc!r}"
        log.error("recording stopped: %s (the live view continues; stop and start recording "
                  "to try again)", self._failed, exc_info=exc,
                  extra={"EVENT": "recording_error", "DIRECTORY": str(self.settings.directory)})

    async def _end(self) -> None:
        reader = self._reader
        # Let the segmenter take what the ring already holds (it is on the loop, scheduled).
        for _ in range(100):
            if reader is None or not reader.lag or self._task is None or self._task.done():
                break
            await asyncio.sleep(0.01)
        self._active = False
        if reader is not None:
            reader.close()  # run_segmenter flushes the last fragment and returns
        if self._task is not None:
            try:
                async with asyncio.timeout(5):
                    await self._task
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
            except Exception:  # logged by _segmenter_ended; stopping goes on
                pass
            self._task = None
        self._reader = None
        if self._audio_reader is not None:
            self._audio_reader.close()
            self._audio_reader = None
        self._close_current()
        await self._drain()
        log.info("recording stopped", extra={"EVENT": "recording_stopped"})

    def _preroll_start(self, seconds: float) -> int | None:
        """The newest keyframe at least ``seconds`` before the newest frame, or the oldest
        keyframe still in the ring (the pre-roll is bounded by what the ring holds)."""
        ring = self.ring
        newest = ring.frame(ring.newest_seq)
        if newest is None:
            return None
        cutoff = newest.capture_time_us - int(seconds * 1_000_000)
        oldest_key = None
        for seq in range(ring.newest_seq, ring.oldest_seq - 1, -1):
            if ring.is_keyframe(seq):
                view = ring.frame(seq)
                if view is None:
                    break
                oldest_key = seq
                if view.capture_time_us <= cutoff:
                    return seq
        return oldest_key

    # -- fragments to disk -----------------------------------------------------------------

    def _on_fragments(self, fragments: list[Fragment]) -> None:
        now = time.monotonic()
        self.clock.check_step()  # a step is handled before any segment is placed with it
        for f in fragments:
            if self._blocked is not None:
                self.fragments_dropped += 1
                continue
            cur = self._current
            # A jump in the media clock (camera restart, ring overrun) also starts a new segment:
            # within one segment, time is its start plus the media clock.
            # So does a jump of the wall clock (NTP setting a Pi's clock after boot): a segment's
            # name is the wall-clock time of its first frame, and the rest follows the media clock.
            jumped = cur is not None and (
                self._cut or abs(f.start_pts - cur.next_pts) > self._timescale // 10
                or abs(f.capture_time_us - cur.first_capture_us - (f.start_pts - cur.first_pts)
                       * 1_000_000 // self._timescale) > CLOCK_JUMP_US)
            if cur is not None and f.independent and (
                    jumped or cur.media_ticks >= self._segment_ticks
                    or f.init_generation != cur.generation):
                self._close_current()
                self._cut = False
                cur = None
            if cur is None:
                init = self._segmenter.init_segment_for(f.init_generation)
                if not f.independent or init is None:
                    self.fragments_dropped += 1
                    continue
                cur = self._open_segment(f, init)
            cur.pending.append(f.data)
            cur.pending_bytes += len(f.data)
            cur.pending_ticks += f.duration
            cur.media_ticks += f.duration
            cur.next_pts = f.start_pts + f.duration
            if (cur.pending_bytes >= BATCH_BYTES or now - cur.last_submit >= FLUSH_INTERVAL_S
                    or self._sync_due(cur, now)):
                self._submit(cur)

    def _open_segment(self, first: Fragment, init: bytes) -> _OpenSegment:
        # No stat() here (the loop sends video): the start is after everything recorded, so
        # the name is new; the disk thread's O_EXCL open would refuse it otherwise.
        offset = self.clock.epoch_offset_us
        mono = self.clock.to_monotonic_us(first.capture_time_us)
        start, uncertain = self._place(mono, self._timeline_end_us, offset)
        cur = _OpenSegment(self._segment_file(start, uncertain), start, first.init_generation,
                           mono_start_us=mono, first_capture_us=first.capture_time_us,
                           uncertain=uncertain, next_pts=first.start_pts,
                           first_pts=first.start_pts)
        if uncertain:
            if not self._uncertain_run:
                self._run_floor_us = self._timeline_end_us
            self._uncertain_run.append(cur)
            if len(self._uncertain_run) > MAX_RETIMED:
                oldest = self._uncertain_run.pop(0)
                self._run_floor_us = oldest.start_us + (
                    oldest.media_ticks * 1_000_000 // self._timescale)
        else:
            self._uncertain_run = []  # what came before stays as it is: uncertain, in order
        self._current = cur
        self._track(self._disk_call(cur.file.append, init, init=True),
                    lambda ok: self._written(cur, ok, len(init), 0))
        return cur

    def _segment_file(self, start_us: int, uncertain: bool) -> SegmentFile:
        name = segment_name(start_us, uncertain)
        directory = self.settings.directory
        return SegmentFile(directory / (name + OPEN_SUFFIX), directory / (name + SEGMENT_SUFFIX))

    def _place(self, mono_us: int, floor_us: int, offset_us: int) -> tuple[int, bool]:
        """Where a segment whose first frame was at ``mono_us`` (monotonic) starts, never before
        ``floor_us``, with the wall clock at ``offset_us`` from the monotonic one; and whether
        that time is uncertain."""
        start = mono_us + offset_us + self._shift_us
        if start < floor_us:
            if floor_us - start > BEHIND_US:
                self._shift_us += floor_us - start  # the clock is behind the archive
            start = floor_us
        return start, self._shift_us > 0 or not self.clock.synchronized

    def _on_clock_step(self, step: ClockStep) -> None:
        """Cut the open segment; re-time the uncertain ones recorded since the last trusted one
        with the new clock (renamed on the disk thread, in order with their writes)."""
        self._cut = self._current is not None
        self._shift_us = 0
        self._retime_run()

    def _retime_run(self) -> None:
        run, floor = self._uncertain_run, self._run_floor_us
        if not run:
            return
        moves: list[tuple[_OpenSegment, int, bool]] = []
        end = floor
        offset = self.clock.epoch_offset_us
        for rec in run:
            start, uncertain = self._place(rec.mono_start_us, end, offset)
            moves.append((rec, start, uncertain))
            end = start + (rec.media_ticks * 1_000_000 // self._timescale)
        self._timeline_end_us = max(end, floor)
        # What is still uncertain (the clock is still behind, or not synchronized) stays the
        # run a later step re-times: the trailing uncertain ones, after the last trusted one.
        self._uncertain_run, self._run_floor_us = [], floor
        for rec, start, uncertain in moves:
            if uncertain:
                self._uncertain_run.append(rec)
            else:
                self._uncertain_run = []
                self._run_floor_us = start + rec.media_ticks * 1_000_000 // self._timescale
        directory = self.settings.directory
        renames = []
        for rec, start, uncertain in moves:
            if (start, uncertain) == (rec.start_us, rec.uncertain):
                continue
            rec.start_us, rec.uncertain = start, uncertain  # the loop's view, at once
            name = segment_name(start, uncertain)
            renames.append((rec, start, uncertain, directory / (name + OPEN_SUFFIX),
                            directory / (name + SEGMENT_SUFFIX)))

        def rename_all() -> int:
            done = 0
            for rec, _start, _uncertain, part, final in renames:
                try:
                    done += rec.file.rename(part, final)
                except OSError as exc:
                    log.error("recording: re-timing %s failed: %s", rec.file.final.name, exc)
            return done

        def renamed(future: asyncio.Future[Any]) -> None:
            for rec, start, uncertain, _part, final in renames:
                if rec.segment is not None and rec.file.final == final:
                    rec.segment.path, rec.segment.start_us = final, start
                    rec.segment.uncertain = uncertain
            self.archive.resort()
            if not future.cancelled() and future.exception() is None:
                self.segments_retimed += future.result()
        if renames:
            log.warning("recording: re-timing %d segments after the clock step (%s)",
                        len(renames), "still uncertain" if self._uncertain_run
                        else "their time is now trusted", extra={"EVENT": "recording_retimed"})
            future = self._disk_call(rename_all)
            self._inflight.add(future)
            future.add_done_callback(self._inflight.discard)
            future.add_done_callback(renamed)

    def _sync_due(self, cur: _OpenSegment, now: float) -> bool:
        """Whether the open segment has data that is not durable and its sync interval is up."""
        interval = self.settings.sync_interval_s
        return (interval > 0 and (bool(cur.pending) or cur.unsynced)
                and now - cur.last_sync >= interval)

    def _submit(self, cur: _OpenSegment) -> None:
        now = time.monotonic()
        sync = self._sync_due(cur, now)
        cur.last_submit = now
        if sync:
            cur.last_sync, cur.unsynced = now, False
        if not cur.pending:
            if sync:  # written already, not yet durable
                self._track(self._disk_call(cur.file.sync),
                            lambda ok: self._written(cur, ok, 0, 0, synced=True))
            return
        data = b"".join(cur.pending)
        ticks = cur.pending_ticks
        cur.pending, cur.pending_bytes, cur.pending_ticks = [], 0, 0
        cur.unsynced = cur.unsynced or not sync
        self._track(self._disk_call(cur.file.append, data, sync=sync),
                    lambda ok: self._written(cur, ok, len(data), ticks, synced=sync))

    def _written(self, cur: _OpenSegment, error: BaseException | None, size: int,
                 ticks: int, *, synced: bool = False) -> None:
        if error is not None:
            # Whether or not that segment is still the open one (a batch is often written as
            # its segment closes), the disk refused data: stop until it takes data again.
            self._block(error)
            # Close the open segment (this one, or the next if this one was closing already)
            # with what it has: it is then a valid, closed segment, not a .part left behind.
            current, self._current = self._current, None
            if current is not None:
                current.pending.clear()
                self._close_segment(current)
            return
        if synced:
            self.syncs += 1
        if not size:
            return
        cur.written_bytes += size
        cur.written_ticks += ticks
        self.bytes_written += size
        self.writes += 1
        now = time.monotonic()
        self._rate.append((now, size))
        self._trim_rate(now)

    def _close_current(self) -> None:
        cur, self._current = self._current, None
        if cur is None:
            return
        self._submit(cur)
        self._close_segment(cur)

    def _close_segment(self, cur: _OpenSegment) -> None:
        end = cur.start_us + cur.media_ticks * 1_000_000 // self._timescale
        self._timeline_end_us = max(self._timeline_end_us, end)

        def closed(future: asyncio.Future[Any]) -> None:
            if future.cancelled() or future.exception() is not None:
                return
            segment = future.result()
            if segment is not None:
                segment.mono_start_us = cur.mono_start_us
                cur.segment = segment
                self.archive.add(segment)
                self.segments_closed += 1
        future = self._disk_call(cur.file.close)
        self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)
        future.add_done_callback(closed)

    def _disk_call(self, fn: Any, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._disk, lambda: fn(*args, **kwargs))

    def _track(self, future: asyncio.Future[Any], done: Any) -> None:
        self._inflight.add(future)

        def finished(f: asyncio.Future[Any]) -> None:
            self._inflight.discard(f)
            done(None if f.cancelled() else f.exception())
        future.add_done_callback(finished)

    async def _drain(self) -> None:
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)

    def _block(self, exc: BaseException) -> None:
        kind = classify(exc)
        self.write_errors += 1
        if self._blocked is not None:
            return
        self._blocked = kind
        what = {"disk_full": "the disk is full", "read_only": "the disk is read-only"}.get(
            kind, "the disk failed")
        self._blocked_reason = f"{what}: {exc}"
        log.error("recording stopped: %s (the live view continues; recording resumes by itself "
                  "when the disk takes data again)", self._blocked_reason,
                  extra={"EVENT": "recording_" + kind, "DIRECTORY": str(self.settings.directory)})

    # -- housekeeping ----------------------------------------------------------------------

    async def _housekeeping_loop(self) -> None:
        # Flushing, resuming and retention must outlive a surprise in one round: a dead
        # housekeeping task would stop all three silently while recording carried on.
        failure_log = RateLimit(HOUSEKEEPING_LOG_INTERVAL_S)
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL_S)
            try:
                await self._housekeeping_round()
            except Exception:
                self.housekeeping_errors += 1
                if failure_log.ready():
                    log.exception("recording housekeeping failed (tried again every %.0f s)",
                                  HOUSEKEEPING_INTERVAL_S)

    async def _housekeeping_round(self) -> None:
        """One round: flush an old batch, refresh disk free, try to resume, apply retention."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        await asyncio.to_thread(self.clock.refresh)
        self.clock.check_step()
        if self.clock.synchronized and self._uncertain_run and not self._shift_us:
            # Synchronized since (without a step, or just after one): their times were right.
            self._retime_run()
        cur = self._current
        flush = cur is not None and bool(cur.pending) and (
            now - cur.last_submit >= FLUSH_INTERVAL_S)
        if cur is not None and (flush or self._sync_due(cur, now)):
            self._submit(cur)
        self._disk_free = await loop.run_in_executor(self._disk, free_bytes,
                                                     self.settings.directory)
        if self._blocked is not None and now - self._last_resume_check >= RESUME_CHECK_S:
            self._last_resume_check = now
            ok = await loop.run_in_executor(self._disk, writable, self.settings.directory,
                                            RESUME_PROBE_BYTES)
            free = self._disk_free or 0
            size = await loop.run_in_executor(self._disk, disk_size, self.settings.directory)
            need = min(RESUME_MAX_FREE, max(RESUME_MIN_FREE, size // 20))
            if ok and free >= need and self._blocked is not None:
                log.warning("recording resumed: the disk takes data again",
                            extra={"EVENT": "recording_resumed"})
                self._blocked = None
                self._blocked_reason = ""
                self.resumed += 1
        if now - self._last_retention >= RETENTION_INTERVAL_S:
            self._last_retention = now
            self.apply_retention()

    def apply_retention(self) -> list[Segment]:
        """Delete the oldest closed segments beyond the size or age limit (never the open one)."""
        s = self.settings
        cur = self._current
        windows = self.event_windows
        longer = windows is not None and s.event_max_age_s > s.max_age_s > 0
        expired = self.archive.expired(
            max_bytes=s.max_bytes, max_age_us=int(s.max_age_s * 1_000_000),
            age_us=self._age_us,
            open_bytes=(cur.written_bytes + cur.pending_bytes) if cur else 0,
            kept_longer=(lambda seg: bool(windows(seg.start_us, seg.end_us)))
            if longer and windows is not None else None,
            longer_age_us=int(s.event_max_age_s * 1_000_000))
        if expired:
            self._forget_and_delete(expired, "retention")
        return expired

    def _age_us(self, segment: Segment) -> int | None:
        """How long ago ``segment`` ended, on a clock that can be trusted; None if none can."""
        if segment.mono_start_us is not None:  # recorded since start-up
            return monotonic_us() - segment.mono_start_us - segment.duration_us
        if segment.uncertain or self._shift_us or not self.clock.synchronized:
            return None
        return self.clock.now_us() - segment.end_us

    async def delete_range(self, start_us: int, end_us: int) -> dict[str, list[Segment]]:
        """Delete what is recorded in ``[start_us, end_us)``, never the open segment.

        Closed segments wholly inside are deleted; those partly inside are cut: what stays is
        the fragments wholly before the range and what follows the first IDR at or after its end
        (so up to a GOP inside the range may stay at its end).
        Returns ``deleted``, ``trimmed`` (the new pieces) and ``kept`` (the open segment).
        """
        hit = self.archive.overlapping(start_us, end_us, self.current_segment())
        deleted = [x for x in hit if not x.open and x.start_us >= start_us and x.end_us <= end_us]
        partial = [x for x in hit if not x.open and x not in deleted]
        kept = [x for x in hit if x.open]
        if deleted:
            self._forget_and_delete(deleted, "request")
        pieces: list[Segment] = []
        if partial:
            self.archive.forget(partial)
            loop = asyncio.get_running_loop()
            for segment in partial:
                try:
                    made = await loop.run_in_executor(self._disk, cut_segment, segment,
                                                      start_us, end_us)
                except (OSError, SegmentFormatError) as exc:
                    log.error("recording: cutting %s failed: %s", segment.path.name, exc)
                    self.archive.add(segment)
                    kept.append(segment)
                    continue
                for piece in made:
                    self.archive.add(piece)
                pieces.extend(made)
        return {"deleted": deleted, "trimmed": pieces, "kept": kept}

    def _forget_and_delete(self, segments: list[Segment], why: str) -> None:
        self.archive.forget(segments)
        self.segments_deleted += len(segments)
        log.info("recording: deleting %d segments (%s)", len(segments), why,
                 extra={"EVENT": "recording_deleted"})
        future = self._disk_call(unlink_all, [x.path for x in segments])
        self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)

    # -- reporting -------------------------------------------------------------------------

    def current_segment(self) -> Segment | None:
        """The segment being written, as far as it is on disk (None when there is none)."""
        cur = self._current
        if cur is None or cur.written_ticks <= 0:
            return None
        return Segment(cur.file.part, cur.start_us,
                       cur.written_ticks * 1_000_000 // self._timescale, cur.written_bytes,
                       open=True, uncertain=cur.uncertain, mono_start_us=cur.mono_start_us)

    @property
    def state(self) -> str:
        """stopped, waiting (for a keyframe), recording, disk_full, read_only or error."""
        if not self._active:
            return "stopped"
        if self._blocked is not None:
            return self._blocked
        if self._failed is not None:
            return "error"
        return "recording" if self._current is not None else "waiting"

    def _trim_rate(self, now: float) -> None:
        # Trimmed on every write, not only when someone reads the rate: a board nobody polls
        # would otherwise keep one entry per write for as long as it records.
        while self._rate and now - self._rate[0][0] > RATE_WINDOW_S:
            self._rate.popleft()

    def write_rate(self) -> float:
        """Bytes per second written over the last few seconds."""
        self._trim_rate(time.monotonic())
        return sum(n for _, n in self._rate) / RATE_WINDOW_S

    def stats(self) -> dict[str, Any]:
        """For ``/api/status`` (everything) and ``/metrics`` (the numbers)."""
        cur = self.current_segment()
        segments = self.archive.with_open(cur)
        state = self.state
        return {
            "state": state,
            "reason": self._blocked_reason or self._failed or None,
            "mode": "continuous" if self.settings.continuous else "on_demand",
            "recording": 1 if state == "recording" else 0,
            "states": {name: int(state == name) for name in (
                "stopped", "waiting", "recording", "disk_full", "read_only", "error")},
            "directory": str(self.settings.directory),
            "segments": len(segments),
            "segments_uncertain": sum(1 for x in segments if x.uncertain),
            "segments_retimed_total": self.segments_retimed,
            "bytes_on_disk": sum(x.size for x in segments),
            "oldest": rfc3339(segments[0].start_us) if segments else None,
            "newest": rfc3339(segments[-1].end_us) if segments else None,
            "oldest_unix_s": segments[0].start_us / 1e6 if segments else 0,
            "newest_unix_s": segments[-1].end_us / 1e6 if segments else 0,
            "write_bytes_per_s": round(self.write_rate(), 1),
            "bytes_written_total": self.bytes_written,
            "writes_total": self.writes,
            "syncs_total": self.syncs,
            "segments_closed_total": self.segments_closed,
            "segments_repaired_total": self.segments_repaired,
            "segments_set_aside_total": self.segments_set_aside,
            "segments_deleted_total": self.segments_deleted,
            "write_errors_total": self.write_errors,
            "resumed_total": self.resumed,
            "housekeeping_errors_total": self.housekeeping_errors,
            "fragments_dropped_total": self.fragments_dropped,
            "disk_free_bytes": self._disk_free if self._disk_free is not None else -1,
            "segment_s": self.settings.segment_s,
            "sync_interval_s": self.settings.sync_interval_s,
            "preroll_s": self.settings.preroll_s,
            "max_bytes": self.settings.max_bytes,
            "max_age_s": self.settings.max_age_s,
            "event_max_age_s": self.settings.event_max_age_s,
            # The AAC track (only for a camera with sound).
            "audio": None if self.audio is None else {
                "codec": "mp4a.40.2", "frames_total": self._segmenter.audio_frames,
                "dropped_total": self._segmenter.audio_dropped,
                "reanchored_total": self._segmenter.audio_reanchored},
        }
