"""Where a camera's sound comes from: ``[[camera]] audio`` (:func:`audio_source_for`)."""

from __future__ import annotations

from .base import AudioSource, AudioSourceUnavailable
from .tone import ToneSource

__all__ = ["AudioSource", "AudioSourceUnavailable", "ToneSource", "audio_source_for"]


def audio_source_for(kind: str) -> tuple[AudioSource | None, str]:
    """The source for a resolved ``audio`` kind (:func:`~ruseon_appliance.audio.choice.
    resolve_audio`), or None and why. An rtsp:// camera's own track ("source") is to be made
    by its video source, not here."""
    if kind == "tone":
        return ToneSource(), ""
    if kind.startswith("alsa:"):
        from .alsa import AlsaSource

        return AlsaSource(kind[5:]), ""
    if kind == "source":
        return None, "an rtsp:// camera's own audio track is not taken yet"
    return None, f"no audio source {kind!r}"
