"""A microphone through ALSA (a USB or I2S microphone on a Pi), read with PyAV's alsa demuxer.

``alsa:hw:1,0`` / ``alsa:default``. The device is opened at 48 kHz mono where it can be;
anything else it gives is converted (PyAV's resampler). A chunk's capture time is its arrival
time minus its duration (ALSA hands samples over as soon as a period is full). An unplugged
device makes ``read`` raise :class:`AudioSourceUnavailable`; the pipeline retries.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import av
import numpy as np

from ..format import AUDIO_CLOCK_RATE, PcmChunk
from .base import AudioSourceUnavailable

# Opens the device: returns a PyAV input container with one audio stream.
Opener = Callable[[str], Any]


def open_alsa(device: str) -> Any:
    """PyAV's alsa input for ``device`` (``hw:1,0``, ``default``, ``plughw:...``)."""
    return av.open(device, format="alsa",
                   options={"sample_rate": str(AUDIO_CLOCK_RATE), "channels": "1"})


class AlsaSource:
    """ALSA capture; ``opener`` (default: this module's :func:`open_alsa`, looked up at each
    open) is the seam a test uses to give recorded PCM instead."""

    kind = "alsa"

    def __init__(self, device: str, *, opener: Opener | None = None) -> None:
        self.device = device
        self._opener = opener
        self._container: Any = None
        self._frames: Any = None
        self._resampler: Any = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._reader: int | None = None  # the thread inside read(), if any
        self.opens = 0
        self.frames = 0

    def open(self) -> None:
        """Open the device (AudioSourceUnavailable when it is missing or busy)."""
        self._release()  # what a close from another thread left open
        self._closed.clear()
        try:
            container = (self._opener or open_alsa)(self.device)
            stream = container.streams.audio[0]
        except (OSError, av.FFmpegError, IndexError) as exc:
            raise AudioSourceUnavailable(f"ALSA device {self.device!r} cannot be opened: "
                                         f"{exc}") from exc
        with self._lock:
            self._container = container
            self._frames = container.decode(stream)
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_CLOCK_RATE)
        self.opens += 1

    def read(self) -> PcmChunk | None:
        """The next period of samples, converted to 48 kHz mono s16."""
        with self._lock:  # against a close() from another thread (see close)
            frames = self._frames
            closed = self._closed.is_set() or frames is None
            if not closed:
                self._reader = threading.get_ident()
        if closed:
            self._release()
            return None
        try:
            frame = next(frames)
        except StopIteration as exc:
            if self._closed.is_set():
                return None
            raise AudioSourceUnavailable(f"ALSA device {self.device!r} ended") from exc
        except (OSError, av.FFmpegError) as exc:
            if self._closed.is_set():
                return None
            raise AudioSourceUnavailable(f"ALSA device {self.device!r} failed: {exc}") from exc
        finally:
            with self._lock:
                self._reader = None
        arrived_us = time.time_ns() // 1000
        if self._closed.is_set():
            self._release()
            return None
        pieces = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int16)
        self.frames += 1
        return PcmChunk(samples.astype(np.int16, copy=False),
                        arrived_us - len(samples) * 1_000_000 // AUDIO_CLOCK_RATE)

    def close(self) -> None:
        """Release the device. From another thread (the pipeline's stop) this only asks: the
        reading thread releases it when its blocked read returns (within one ALSA period), as
        closing an FFmpeg input under a read in progress is not safe."""
        with self._lock:
            self._closed.set()
            reading_elsewhere = self._reader not in (None, threading.get_ident())
        if not reading_elsewhere:
            self._release()

    def _release(self) -> None:
        with self._lock:
            container, self._container, self._frames = self._container, None, None
        if container is not None:
            with contextlib.suppress(Exception):  # closing a device that went away
                container.close()

    def stats(self) -> dict[str, Any]:
        """Opens and frames read."""
        return {"device": self.device, "opens": self.opens, "frames": self.frames}
