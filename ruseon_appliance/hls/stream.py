"""The HLS stream: ring → fMP4 segmenter → live window, and the waits LL-HLS clients block on.

One ring reader and one segmenter serve every HLS client (and every HTTP cache in front of the
board): a client costs a few dictionary look-ups and a send, never a packetization or a copy.
Blocking playlist reloads and preload-hinted part requests wait on one shared event that is
replaced each time a part arrives; how many may wait at once is bounded, and every refusal and
timeout is counted.

While nobody asks for HLS (:data:`IDLE_AFTER_S` since the last request, and from start-up) the
stream reads the ring in batches, once every :data:`IDLE_READ_S`, instead of waking for every
frame: the window still holds the last seconds for the first player (its parts are references
into the ring, so this costs no memory), and that player's first request (:meth:`HlsStream.fresh`)
has what is left in the ring read before it is answered. The sound's reader still takes each
AAC frame as it comes (a fragment waits for its sound; sound read late would be taken for sound
that stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.hls.window import (
    TIMESCALE,
    LiveWindow,
    Part,
    PartLayout,
    first_msn_for,
    layout_fits,
    part_layout,
    target_duration_for,
)
from ruseon_appliance.segmenter import (
    AacFeed,
    Fmp4Segmenter,
    Fragment,
    open_audio,
    run_segmenter,
    usable_audio,
)
from ruseon_appliance.tasks import cancel_and_wait

log = logging.getLogger(__name__)


# After a segmenter failure, this long before reading the ring again (a fault that repeats on
# every frame must not spin the event loop).
RESTART_DELAY_S = 0.5
# No HLS request for this long: the ring is read in batches, every IDLE_READ_S (30 frames at
# 30 fps in one wake-up instead of 30; the ring holds 16 s).
IDLE_AFTER_S = 30.0
IDLE_READ_S = 1.0
# How long a request waits for the batch its arrival asked for (a camera without frames has
# nothing to read: the request is answered with what the window has).
FRESH_WAIT_S = 0.25


class _Relayout(Exception):
    """The camera's real frame rate calls for other parts than the configured one."""


class TooManyWaiting(Exception):
    """The bound on outstanding blocking requests is reached."""


class HlsStream:
    """Feeds a :class:`LiveWindow` from the ring and lets requests wait for the live edge."""

    def __init__(
        self,
        ring: RingBuffer,
        *,
        framerate: int,
        keyframe_interval: int,
        part_target_s: float = 0.25,
        window_s: float = 12.0,
        max_waiting: int = 1000,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        audio: AacFeed | None = None,
    ) -> None:
        self.ring = ring
        # The camera's AAC (audio/): muxed into every part and segment as a second track.
        self.audio = usable_audio(audio)
        self.framerate: float = framerate
        self.part_duration_s = part_target_s
        # PART-TARGET follows whole frames (it may come out a little under part_target_s). The
        # configured frame rate is a guess (an IP camera sends what it sends): the first
        # fragment's real rate may still change the layout, before any part is published.
        self.layout = part_layout(part_target_s, framerate)
        self._relayout: PartLayout | None = None
        self.window = LiveWindow(
            target_duration=target_duration_for(keyframe_interval, framerate),
            part_target_s=self.layout.part_target_s,
            window_s=window_s,
            first_msn=first_msn_for(wall_clock()),
        )
        self.segmenter = self._new_segmenter()
        self.max_waiting = max_waiting
        self.clock = clock
        self.waiting = 0
        self.waits_refused = 0
        self.waits_timed_out = 0
        self.waits_satisfied = 0
        self._edge = asyncio.Event()
        # Idle reading: the last request's time, the event a request sets to have the ring read
        # now (replaced, like _edge), and the one set when the reader has caught up with it.
        self._last_request = -math.inf
        self._poke = asyncio.Event()
        self._caught_up = asyncio.Event()
        self.idle_reads = 0
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.last_part_monotonic: float | None = None
        self.failures = 0
        # The RFC 6381 codecs of what the window holds ("avc1.64001f" or, with sound,
        # "avc1.64001f,mp4a.40.2"; kept across a segmenter that was replaced or reset and has
        # not seen its first IDR yet): the multivariant's CODECS.
        self.codec: str | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start reading the ring (from its newest keyframe)."""
        self._stopped = False
        self._task = asyncio.create_task(self._run(), name="hls-segmenter")

    async def stop(self) -> None:
        """Stop reading; waiting requests are woken and find nothing new."""
        self._stopped = True
        await cancel_and_wait(self._task)
        self._task = None
        self._wake()

    async def _run(self) -> None:
        while not self._stopped:
            reader = self.ring.reader("keyframe")
            audio_reader = None
            try:
                if self.audio is not None:
                    # Synchronously after the video's reader: the sound of the pictures from
                    # the ring's past is still in the AAC ring.
                    audio_reader, early = open_audio(self.segmenter, self.audio.aac_ring,
                                                        self.audio)
                    if early:
                        self._sink(early)
                await run_segmenter(reader, self.segmenter, self._sink, audio=audio_reader,
                                    feed=self.audio, between=self._between)
                return  # the ring is closed
            except _Relayout:
                pass
            except Exception:
                # Without this the task would end silently and every HLS request would be held
                # and answered 503 until the service restarted.
                self.failures += 1
                log.exception("HLS segmenter failed (%d so far); starting again at the next "
                              "keyframe", self.failures)
            finally:
                reader.close()
                if audio_reader is not None:
                    audio_reader.close()
            if self._relayout is not None:
                # Nothing was published yet: start over at the next keyframe with parts cut
                # for the real frame rate (PART-TARGET must not change once players saw it).
                self.layout, self._relayout = self._relayout, None
                self.window.part_target_s = self.layout.part_target_s
                self.segmenter.close()
                self.segmenter = self._new_segmenter()
                log.info("HLS: the camera sends %.2f fps, not the configured rate: parts of "
                         "%d frames, PART-TARGET %.3f s", self.framerate, self.layout.frames,
                         self.layout.part_target_s)
                continue
            self.segmenter.reset()
            self.window.mark_break()
            await asyncio.sleep(RESTART_DELAY_S)

    def _new_segmenter(self) -> Fmp4Segmenter:
        """Parts cut for the current layout; a frame that would take a part past PART-TARGET
        (the camera skipped frames before it) starts the next part instead. The parts keep
        their pictures by reference to the ring (one copy of each access unit)."""
        return Fmp4Segmenter(fragment_max_s=self.layout.fragment_max_s,
                             fragment_limit_s=self.layout.part_target_s,
                             audio_config=self.audio.aac_config if self.audio else None,
                             ring=self.ring)

    def _sink(self, fragments: list[Fragment]) -> None:
        if self._relayout is not None:
            return  # cut for the wrong frame rate; the segmenter is being replaced
        if self.window.parts_added == 0 and self._check_layout(fragments[0]):
            raise _Relayout
        init = self.segmenter.init_segment
        self.codec = self.segmenter.codecs or self.codec
        for fragment in fragments:
            if init is not None and fragment.init_generation == self.segmenter.init_generation:
                self.window.add_init(fragment.init_generation, init)
            self.window.add(fragment)
        self.last_part_monotonic = self.clock()
        self._wake()

    def _check_layout(self, fragment: Fragment) -> bool:
        """Does ``fragment`` (the first) show a frame rate that needs other parts? Then the new
        layout is pending."""
        if fragment.duration <= 0 or fragment.frames <= 0:
            return False
        measured = fragment.frames * TIMESCALE / fragment.duration
        if layout_fits(self.layout, measured):
            return False
        self.framerate = measured
        self._relayout = part_layout(self.part_duration_s, measured)
        return True

    def add_fragments(self, fragments: list[Fragment], init: bytes) -> None:
        """Feed fragments directly (benchmarks and tests that bypass the ring)."""
        for fragment in fragments:
            self.window.add_init(fragment.init_generation, init)
            self.window.add(fragment)
        self._wake()

    def _wake(self) -> None:
        edge, self._edge = self._edge, asyncio.Event()
        edge.set()

    # -- idle reading -----------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """Whether nobody asked for HLS lately (the ring is read in batches)."""
        return self.clock() - self._last_request > IDLE_AFTER_S

    async def _between(self, reader: Any) -> None:
        """Before the segmenter's reader waits for the next frame: say it caught up, and while
        idle sleep until the next batch or a request."""
        if reader.lag == 0:
            caught_up, self._caught_up = self._caught_up, asyncio.Event()
            caught_up.set()
        if not self.idle:
            return
        poke = self._poke
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(IDLE_READ_S):
                await poke.wait()
        self.idle_reads += 1

    async def fresh(self) -> None:
        """A request arrived (call before answering it): the stream leaves idle reading, and
        when it was idle, what is left in the ring is read first."""
        was_idle = self.idle
        self._last_request = self.clock()
        if not was_idle or self._task is None or self._task.done():
            return
        caught_up = self._caught_up
        poke, self._poke = self._poke, asyncio.Event()
        poke.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FRESH_WAIT_S):
                await caught_up.wait()

    # -- waiting ----------------------------------------------------------------------------

    @property
    def hold_timeout_s(self) -> float:
        """How long a blocking request may be held: three target durations (RFC 8216bis)."""
        return 3.0 * self.window.target_duration

    async def _wait(self, ready: Callable[[], bool], timeout: float) -> bool:
        if ready():
            return True
        if self.waiting >= self.max_waiting:
            self.waits_refused += 1
            raise TooManyWaiting
        self.waiting += 1
        deadline = self.clock() + timeout
        try:
            while not ready():
                remaining = deadline - self.clock()
                if remaining <= 0 or self._stopped:
                    self.waits_timed_out += 1
                    return False
                edge = self._edge
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await edge.wait()
            self.waits_satisfied += 1
            return True
        finally:
            self.waiting -= 1

    async def wait_for_playlist(self, msn: int, part: int | None, timeout: float) -> bool:
        """Wait until the window holds segment ``msn`` (complete) or part ``part`` of it;
        False on timeout. Raises :class:`TooManyWaiting` when the bound is reached."""
        return await self._wait(lambda: self.window.satisfies(msn, part), timeout)

    async def wait_for_part(self, number: int, timeout: float) -> Part | None:
        """Wait for part ``number`` (the preload hint names one before it exists)."""
        await self._wait(lambda: self.window.part(number) is not None
                         or number < self.window.next_part_number, timeout)
        return self.window.part(number)

    async def wait_for_first_part(self, timeout: float) -> bool:
        """Wait until the window has something to list."""
        return await self._wait(lambda: not self.window.empty, timeout)

    def bit_rates(self) -> tuple[int, int] | None:
        """``(peak, average)`` bits per second of the complete segments in the window (what a
        multivariant playlist's ``BANDWIDTH`` and ``AVERAGE-BANDWIDTH`` are), None before
        the first one."""
        peak = 0.0
        total_bits = total_s = 0.0
        for segment in self.window.segments:
            duration = segment.duration_s
            if not segment.complete or duration <= 0:
                continue
            bits = 8.0 * segment.size
            peak = max(peak, bits / duration)
            total_bits += bits
            total_s += duration
        if total_s <= 0:
            return None
        return math.ceil(peak), math.ceil(total_bits / total_s)

    # -- reporting --------------------------------------------------------------------------

    def _audio_stats(self) -> dict[str, Any] | None:
        """The AAC track's counters (None for a camera without sound)."""
        if self.audio is None:
            return None
        seg = self.segmenter
        return {"codec": "mp4a.40.2", "frames_total": seg.audio_frames,
                "dropped_total": seg.audio_dropped, "reanchored_total": seg.audio_reanchored,
                "waited_out_total": seg.audio_waited_out}

    def stats(self) -> dict[str, Any]:
        """Window, segmenter and waiting counters, for ``/api/status`` and ``/metrics``."""
        window = self.window
        position = window.position
        newest = window.segments[-1] if window.segments else None
        return {
            "run_id": window.run_id,
            "target_duration_s": window.target_duration,
            "part_target_s": window.part_target_s,
            "segments": len(window.segments),
            "window_bytes": window.size,
            # Of those, what the window holds itself: the rest is the ring's own bytes.
            "window_held_bytes": window.held_bytes,
            # Parts copied out of the ring before its writer reached their pictures (a window
            # longer than the ring holds), and parts lost to it all the same.
            "parts_copied_out": window.parts_copied_out,
            "parts_lost": window.parts_lost,
            "media_sequence": window.first_msn,
            "live_msn": position.msn,
            "live_part": position.parts - 1,
            "parts_added": window.parts_added,
            "discontinuities": window.discontinuities,
            "segments_split": window.segments_split,
            "segmenter_failures": self.failures,
            # Parts closed early because the next frame (after skipped ones) would have taken
            # them past PART-TARGET.
            "parts_split_at_target": self.segmenter.split_for_limit,
            # Parts of one frame that outlast PART-TARGET: the camera stalled for longer.
            "parts_over_target": self.segmenter.over_limit,
            "newest_capture_time_us": (newest.parts[-1].capture_time_us
                                       if newest and newest.parts else None),
            "codec": self.segmenter.codec,
            "audio": self._audio_stats(),
            "idle": self.idle,
            # Batches the ring was read in while nobody asked for HLS.
            "idle_reads": self.idle_reads,
            "blocking_waiting": self.waiting,
            "blocking_max": self.max_waiting,
            "blocking_refused": self.waits_refused,
            "blocking_timed_out": self.waits_timed_out,
            "blocking_satisfied": self.waits_satisfied,
        }
