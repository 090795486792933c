"""Where a camera's sound comes from: ``[[camera]] audio`` (:func:`audio_source_for`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..choice import resolve_audio
from .base import AudioSource, AudioSourceUnavailable
from .tone import ToneSource

if TYPE_CHECKING:
    from ...config import CameraConfig

__all__ = ["AudioSource", "AudioSourceUnavailable", "ToneSource", "audio_source_for"]


def audio_source_for(cam: CameraConfig) -> tuple[AudioSource | None, str]:
    """The camera's audio source, or None and why (``audio = "none"``, no microphone...).
    An rtsp:// camera's own track ("source") is made by its video source, not here."""
    kind, why = resolve_audio(cam)
    if kind == "tone":
        return ToneSource(), ""
    if kind.startswith("alsa:"):
        from .alsa import AlsaSource

        return AlsaSource(kind[5:]), ""
    if kind == "source":
        return None, "an rtsp:// camera's own audio track is not taken yet"
    return None, why
