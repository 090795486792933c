"""Keyframe request coalescing: many viewers asking, at most one forced IDR per interval."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class KeyframeCoalescer:
    """Forward a keyframe request to ``force`` at most once per ``interval_s``.

    Requests inside the window are absorbed: the IDR forced at its start serves them all (a
    viewer that asked a moment later gets that same keyframe from the ring).
    """

    def __init__(
        self,
        interval_s: float,
        force: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval = interval_s
        self._force = force
        self._clock = clock
        self._last: float | None = None
        self.requests = 0
        self.forced = 0
        self.absorbed = 0

    def request(self, reason: str = "") -> bool:
        """Ask for a keyframe; return True if one was forced now, False if absorbed."""
        self.requests += 1
        now = self._clock()
        if self._last is not None and now - self._last < self._interval:
            self.absorbed += 1
            return False
        self._last = now
        self.forced += 1
        log.debug("forcing a keyframe (%s)", reason or "no reason given")
        self._force()
        return True
