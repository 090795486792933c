"""The synthetic camera's sound: a quiet tone with a loud beep at every whole second of the
capture clock, paced in real time.

The beeps are the audio's stamp (the pictures carry theirs, capture/stamp.py): a beep starts at
the sample whose capture time is a whole second, and the synthetic picture stamped with the same
second was captured then, so a viewer can measure lip sync by comparing when each arrives.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from ..format import AUDIO_CLOCK_RATE, FRAME_SAMPLES, FRAME_US, PcmChunk

BASE_HZ = 440.0
BASE_AMPLITUDE = 0.03  # about -30 dBFS
BEEP_HZ = 1000.0
BEEP_AMPLITUDE = 0.5  # about -6 dBFS
BEEP_US = 100_000  # each beep lasts 100 ms


def tone_samples(capture_time_us: int, count: int) -> Any:
    """``count`` samples of the test signal whose first sample was captured at
    ``capture_time_us``: deterministic in the capture time, so two chunks join seamlessly."""
    t_us: Any = capture_time_us + np.arange(count, dtype=np.int64) * 1_000_000 // AUDIO_CLOCK_RATE
    # Within its second (both tones have whole cycles a second): a wall-clock time in float64
    # seconds is only good to a few tenths of a µs, 40 LSB of phase error at 440 Hz.
    t = (t_us % 1_000_000).astype(np.float64) / 1e6
    beep = (t_us % 1_000_000) < BEEP_US
    signal = np.where(beep, BEEP_AMPLITUDE * np.sin(2 * np.pi * BEEP_HZ * t),
                      BASE_AMPLITUDE * np.sin(2 * np.pi * BASE_HZ * t))
    return (signal * 32767).astype(np.int16)


def beep_onsets_us(capture_start_us: int, capture_end_us: int) -> list[int]:
    """The capture times of the beeps that start in ``[start, end)`` (whole seconds)."""
    first = -(-capture_start_us // 1_000_000) * 1_000_000
    return list(range(first, capture_end_us, 1_000_000))


_SECOND: Any = None


def _one_second() -> Any:
    """The signal's whole second (it repeats every second: 440 and 1000 cycles a second),
    made once per process."""
    global _SECOND
    if _SECOND is None:
        _SECOND = tone_samples(0, AUDIO_CLOCK_RATE)
    return _SECOND


class ToneSource:
    """Test tone, 20 ms a chunk, paced on the monotonic clock and stamped on the wall clock.

    Chunks start on whole 20 ms of the wall clock (a second holds 50 of them), so each is a
    slice of one precomputed second of the signal rather than computed again.
    """

    kind = "tone"

    def __init__(self) -> None:
        self._closed = threading.Event()
        self._start_mono = 0.0
        self._start_wall_us = 0
        self._index = 0
        self.chunks = 0

    def open(self) -> None:
        """Start the clock."""
        self._closed.clear()
        mono = time.monotonic()
        wall_us = time.time_ns() // 1000
        aligned = -(-wall_us // FRAME_US) * FRAME_US  # the next whole 20 ms
        self._start_mono = mono + (aligned - wall_us) / 1e6
        self._start_wall_us = aligned
        self._index = 0

    def read(self) -> PcmChunk | None:
        """The next 20 ms, when it is due."""
        due = self._start_mono + self._index * FRAME_US / 1e6
        delay = due - time.monotonic()
        if delay > 0 and self._closed.wait(delay):
            return None
        if self._closed.is_set():
            return None
        if delay < -1.0:  # fell far behind (a stalled machine): skip ahead, as a device would
            skipped = int(-delay * 1e6 // FRAME_US)
            self._index += skipped
        capture_us = self._start_wall_us + self._index * FRAME_US
        self._index += 1
        self.chunks += 1
        offset = capture_us % 1_000_000 * AUDIO_CLOCK_RATE // 1_000_000
        return PcmChunk(_one_second()[offset:offset + FRAME_SAMPLES].copy(), capture_us)

    def close(self) -> None:
        """Stop; a waiting read returns None."""
        self._closed.set()

    def stats(self) -> dict[str, Any]:
        """Chunks made."""
        return {"chunks": self.chunks}
