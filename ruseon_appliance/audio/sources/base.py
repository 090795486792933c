"""The one interface every audio source has (a pattern to copy, as capture/sources/base.py)."""

from __future__ import annotations

from typing import Any, Protocol

from ..format import PcmChunk


class AudioSourceUnavailable(RuntimeError):
    """The source cannot run (no device, unplugged, missing library); ``str`` says why. The
    pipeline reports it and tries again later; video is never touched."""


class AudioSource(Protocol):
    """Blocking PCM reader, driven by the audio pipeline's worker thread.

    ``open()`` acquires the device (raises :class:`AudioSourceUnavailable`); ``read()`` blocks
    until the next chunk (about 20 ms; any length) and returns it, or ``None`` when ``close()``
    was called; it raises :class:`AudioSourceUnavailable` when the device goes away. ``close()``
    may be called from another thread and makes a blocked ``read()`` return soon.
    """

    @property
    def kind(self) -> str:
        """"tone", "alsa", "rtsp" (a plain class attribute will do)."""

    def open(self) -> None:
        """Acquire the device."""

    def read(self) -> PcmChunk | None:
        """The next chunk (blocking), None once closed."""

    def close(self) -> None:
        """Release the device; a blocked read returns."""

    def stats(self) -> dict[str, Any]:
        """Source-specific counters."""
