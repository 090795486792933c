"""Keyframe request coalescing: many viewers asking, at most one forced IDR per interval.

A forced IDR can be lost: at low bitrates the Pi's V4L2 encoder may answer with a buffer holding
only SPS/PPS, which picamera2 drops (``V4L2Encoder._check_for_picture``), and a restarted
``rpicam-vid`` may fail. So the coalescer watches for the keyframe it asked for: when none has
arrived by the end of the window, it forces again (a retry, at most ``max_retries`` in a row).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Schedules ``callback`` after ``delay`` seconds (``loop.call_later``'s shape).
Schedule = Callable[[float, Callable[[], None]], object]


def _call_later_on_running_loop(delay: float, callback: Callable[[], None]) -> object:
    """``call_later`` on the running loop; nothing when called outside one (sync callers)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return loop.call_later(delay, callback)


class KeyframeCoalescer:
    """Forward a keyframe request to ``force`` at most once per ``interval_s``.

    Requests inside the window are absorbed: the IDR forced at its start serves them all (a
    viewer that asked a moment later gets that same keyframe from the ring). The owner calls
    :meth:`keyframe_arrived` for every keyframe the source delivers; a forced request that saw
    none within the window counts as lost and is retried (``retries``), up to ``max_retries``
    times until a keyframe comes.
    """

    def __init__(
        self,
        interval_s: float,
        force: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        *,
        schedule: Schedule = _call_later_on_running_loop,
        max_retries: int = 3,
        min_check_s: float = 0.25,
    ) -> None:
        self._interval = interval_s
        self._force = force
        self._clock = clock
        self._schedule = schedule
        self._max_retries = max_retries
        # A source needs a frame or two (picamera2) or a restart (rpicam-vid) to answer: do not
        # call a request lost sooner than this, however short the window.
        self._min_check = min_check_s
        self._generation = 0  # which force a scheduled check belongs to
        self._last: float | None = None
        self._awaiting = False  # a forced keyframe has not arrived yet
        self._attempt = 0  # forced requests in a row that saw no keyframe
        self.requests = 0
        self.forced = 0
        self.absorbed = 0
        self.lost = 0
        self.retries = 0

    def request(self, reason: str = "") -> bool:
        """Ask for a keyframe; return True if one was forced now, False if absorbed."""
        self.requests += 1
        now = self._clock()
        if self._last is not None and now - self._last < self._interval:
            self.absorbed += 1
            return False
        if self._awaiting:
            # The window's check did not run (no loop) or gave up: the earlier one was lost.
            self.lost += 1
            self.retries += 1
        else:
            self._attempt = 0
        log.debug("forcing a keyframe (%s)", reason or "no reason given")
        self._fire(now)
        return True

    def cancel(self) -> None:
        """Forget what is awaited (the source stopped): scheduled checks then do nothing."""
        self._awaiting = False
        self._attempt = 0
        self._generation += 1

    def keyframe_arrived(self) -> None:
        """A keyframe reached the ring: whatever was asked for is served."""
        self._awaiting = False
        self._attempt = 0

    def _fire(self, now: float) -> None:
        self._last = now
        self.forced += 1
        self._awaiting = True
        self._attempt += 1
        self._generation += 1
        generation = self._generation
        self._force()
        self._schedule(max(self._interval, self._min_check), lambda: self._check(generation))

    def _check(self, generation: int) -> None:
        if not self._awaiting or generation != self._generation:
            return  # served, or a newer force happened meanwhile (its own check follows)
        now = self._clock()
        self.lost += 1
        if self._attempt > self._max_retries:
            log.warning("no keyframe after %d forced requests; waiting for the periodic one",
                        self._attempt)
            self._awaiting = False
            return
        self.retries += 1
        log.info("forced keyframe did not arrive within %.0f ms; asking again",
                 self._interval * 1000)
        self._fire(now)
