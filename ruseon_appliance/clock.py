"""The wall clock of a board without a real-time clock: is it right, and when did it step?

A Raspberry Pi starts with the time saved at the last shutdown (timesyncd's clock file) or the
image's build date, and NTP, if it ever answers, *steps* it later: by seconds after a power cut,
by years on a fresh card. Durations are measured on the monotonic clock everywhere; this module
is for what needs the wall time itself (the archive's names and ranges):

- **synchronized**: the kernel's NTP state (``adjtimex``: not ``TIME_ERROR``, no ``STA_UNSYNC``;
  timesyncd, chrony and ntpd all clear it once they have set the clock) or timesyncd's flag file
  ``/run/systemd/timesync/synchronized``. A flag file named by ``recording.clock_sync_file``
  (``RUSEON_RECORDING_CLOCK_SYNC_FILE``) replaces both: the clock counts as synchronized exactly
  while that file exists (tests, or a board whose time comes from elsewhere).
- **steps**: realtime minus monotonic moving by more than :data:`STEP_THRESHOLD_US`; each is
  logged once (``EVENT=clock_step``) and handed to the listeners (the recorders).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TIMESYNCD_FLAG = Path("/run/systemd/timesync/synchronized")
# NTP slews by at most 500 ppm; more than this between two looks is a step.
STEP_THRESHOLD_US = 1_000_000
# An offset read counts when its two monotonic reads are this close (else it is read again, up
# to OFFSET_READS times, and the closest is taken).
OFFSET_SPREAD_NS = 5_000_000
OFFSET_READS = 5
# A step is believed when this many reads in a row agree on it (a clock that was set stays set;
# a lone read off by more than the threshold is a glitch: a time shim or a hypervisor hiccup).
STEP_CONFIRM_READS = 2
# A step is seen within about a second of when it happened (the recorder looks at every
# fragment, the housekeeping every second).
EPOCH_SLACK_US = 2_000_000
TIME_ERROR = 5  # adjtimex's return value when the clock is not synchronized
STA_UNSYNC = 0x0040


class _Timex(ctypes.Structure):
    # struct timex (linux/timex.h) on 64-bit and 32-bit Linux: every field a C long or int,
    # then padding; only `modes` (in) and `status` (out) are used.
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long),
                ("status", ctypes.c_int), ("constant", ctypes.c_long),
                ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long),
                ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long),
                ("shift", ctypes.c_int), ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long),
                ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long),
                ("tai", ctypes.c_int), ("_padding", ctypes.c_int * 11)]


_adjtimex: Any = None


def kernel_synchronized() -> bool | None:
    """The kernel's view (``adjtimex`` read-only), or None where it cannot be asked."""
    global _adjtimex
    if _adjtimex is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _adjtimex = libc.adjtimex
        except (OSError, AttributeError):
            _adjtimex = False
    if _adjtimex is False:
        return None
    buf = _Timex()  # modes = 0: read only
    state = _adjtimex(ctypes.byref(buf))
    if state < 0:
        return None
    return state != TIME_ERROR and not buf.status & STA_UNSYNC


def wall_us() -> int:
    """The wall clock now, in µs since the Unix epoch."""
    return time.time_ns() // 1000


def monotonic_us() -> int:
    """The monotonic clock now, in µs."""
    return time.monotonic_ns() // 1000


@dataclass(frozen=True, slots=True)
class ClockStep:
    """The wall clock moved by ``delta_us`` against the monotonic clock."""

    delta_us: int
    monotonic_us: int  # when it was seen
    wall_us: int  # the wall time just after it


def _rfc3339(us: int) -> str:
    return dt.datetime.fromtimestamp(us / 1e6, tz=dt.UTC).isoformat().replace("+00:00", "Z")


def describe_delta(us: int) -> str:
    """``+400 d 0 h``, ``-15.0 s``: a step in words."""
    sign = "+" if us >= 0 else "-"
    s = abs(us) / 1e6
    # Rounded to the unit shown: a step of 400 days less a few microseconds (the two clock
    # reads are not at one instant) is "+400 d 0 h", not "+399 d 23 h".
    if s >= 86400 - 1800:
        hours = round(s / 3600)
        return f"{sign}{hours // 24} d {hours % 24} h"
    if s >= 3600 - 30:
        minutes = round(s / 60)
        return f"{sign}{minutes // 60} h {minutes % 60} min"
    return f"{sign}{s:.1f} s"


class WallClock:
    """The system's wall clock as the archive sees it: synchronized or not, and its steps.

    :meth:`check_step` is cheap (two clock reads) and runs on the event loop wherever time is
    about to be used; :meth:`refresh` reads the sync state (a syscall and a ``stat``), off the
    loop or rarely. Listeners get each step once, on the thread that saw it (the loop).
    """

    def __init__(self, sync_file: Path | None = None, *,
                 threshold_us: int = STEP_THRESHOLD_US) -> None:
        self.sync_file = sync_file
        self.threshold_us = threshold_us
        self._offset = self._settled_offset()
        # (monotonic µs from which, offset) for the last few steps: a frame captured before a
        # step but handled after it carries a wall time of the old clock.
        self._epochs: list[tuple[int, int]] = [(0, self._offset)]
        self._lock = threading.Lock()
        self._listeners: list[Callable[[ClockStep], None]] = []
        self.steps: list[ClockStep] = []
        self.steps_total = 0
        self._synchronized = False
        self.refresh()

    @staticmethod
    def offset_us() -> int:
        """Realtime minus monotonic, in µs (moves only when the wall clock is set or slewed).

        The wall clock is read between two monotonic reads, and only a read whose two monotonic
        reads are close counts: a process descheduled between the reads (a loaded board; CI's
        run saw it under emulation) would otherwise look like a step of a second or more, and
        another one back at the next look."""
        best: tuple[int, int] | None = None
        for _ in range(OFFSET_READS):
            before = time.monotonic_ns()
            wall = time.time_ns()
            after = time.monotonic_ns()
            offset = wall // 1000 - (before + after) // 2000
            spread = after - before
            if spread <= OFFSET_SPREAD_NS:
                return offset
            if best is None or spread < best[0]:
                best = (spread, offset)
        assert best is not None
        return best[1]

    def _settled_offset(self) -> int:
        """The median of three reads: the start-up offset does not rest on a single read."""
        return sorted(self.offset_us() for _ in range(3))[1]

    def _confirmed(self, offset: int) -> bool:
        """Whether reads taken right after agree with ``offset`` (within the threshold)."""
        return all(abs(self.offset_us() - offset) <= self.threshold_us
                   for _ in range(STEP_CONFIRM_READS))

    @property
    def epoch_offset_us(self) -> int:
        """Realtime minus monotonic as of the last look (steady between looks, unlike
        :meth:`offset_us`, whose two clock reads differ by a µs or so each time)."""
        return self._epochs[-1][1]

    def to_monotonic_us(self, wall: int) -> int:
        """The monotonic µs of a recent wall-clock reading (a capture time), taken with the
        offset of the clock it was read from (before or after a step)."""
        now = monotonic_us()
        epochs = self._epochs
        if len(epochs) == 1:
            return wall - epochs[0][1]
        # A capture is recent (a pre-roll at most a minute): of the clocks it could have been
        # read from, the one that puts it nearest to now, and not before that clock began.
        candidates = [wall - offset for since, offset in epochs
                      if wall - offset >= since - EPOCH_SLACK_US]
        if not candidates:
            return wall - epochs[-1][1]
        return min(candidates, key=lambda mono: abs(mono - now))

    def now_us(self) -> int:
        """The wall clock now, in µs since the Unix epoch."""
        return wall_us()

    def add_listener(self, listener: Callable[[ClockStep], None]) -> None:
        """Call ``listener(step)`` for every step seen from now on."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[ClockStep], None]) -> None:
        """Stop calling ``listener`` (a recorder that stopped)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def refresh(self) -> bool:
        """Read whether the system says the clock is synchronized; returns it."""
        if self.sync_file is not None:
            synced = self.sync_file.exists()
        else:
            synced = TIMESYNCD_FLAG.exists() or bool(kernel_synchronized())
        self._synchronized = synced
        return synced

    @property
    def synchronized(self) -> bool:
        """As of the last :meth:`refresh`."""
        return self._synchronized

    def check_step(self) -> ClockStep | None:
        """Look for a step since the last look; log it and tell the listeners."""
        offset = self.offset_us()
        with self._lock:
            delta = offset - self._offset
            if abs(delta) <= self.threshold_us:
                if delta:
                    self._offset = offset  # follow slewing, so it never adds up to a "step"
                    self._epochs[-1] = (self._epochs[-1][0], offset)
                return None
            if not self._confirmed(offset):
                # The reads disagree: not a step (a step that did happen is seen at the next
                # look, when they agree).
                return None
            self._offset = offset
            step = ClockStep(delta, monotonic_us(), offset + monotonic_us())
            self._epochs = [*self._epochs[-9:], (step.monotonic_us, offset)]
            self.steps = [*self.steps[-9:], step]
            self.steps_total += 1
        log.warning("clock stepped by %s (now %s, %s)", describe_delta(delta),
                    _rfc3339(step.wall_us),
                    "synchronized" if self.refresh() else "not synchronized",
                    extra={"EVENT": "clock_step", "STEP_US": str(delta)})
        for listener in list(self._listeners):
            try:
                listener(step)
            except Exception:
                log.exception("clock step listener failed")
        return step

    @property
    def state(self) -> str:
        """``synchronized``; else ``stepped`` (set, but not by a synchronization the system
        reports) or ``uncertain`` (never set since start-up)."""
        if self._synchronized:
            return "synchronized"
        return "stepped" if self.steps else "uncertain"

    def describe(self) -> dict[str, Any]:
        """For ``/api/status`` and ``/api/recording``."""
        last = self.steps[-1] if self.steps else None
        return {
            "state": self.state,
            "synchronized": self._synchronized,
            "source": str(self.sync_file) if self.sync_file is not None
            else f"adjtimex or {TIMESYNCD_FLAG}",
            "steps_total": self.steps_total,
            "last_step": None if last is None else {
                "by_s": last.delta_us / 1e6, "at": _rfc3339(last.wall_us),
                "ago_s": round((monotonic_us() - last.monotonic_us) / 1e6, 3)},
        }

    def metrics(self) -> dict[str, Any]:
        """For ``/metrics`` (``ruseon_clock_*``)."""
        last = self.steps[-1] if self.steps else None
        return {"synchronized": int(self._synchronized), "steps_total": self.steps_total,
                "last_step_seconds": last.delta_us / 1e6 if last else 0.0,
                "states": {name: int(self.state == name)
                           for name in ("synchronized", "stepped", "uncertain")}}
