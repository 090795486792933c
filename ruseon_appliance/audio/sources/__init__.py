"""Where a camera's sound comes from: ``[[camera]] audio`` (:func:`audio_source_for`)."""

from __future__ import annotations

from .base import AudioSource, AudioSourceUnavailable
from .tone import ToneSource

__all__ = ["AudioSource", "AudioSourceUnavailable", "ToneSource", "audio_source_for"]


def audio_source_for(kind: str, video_source: object = None) -> tuple[AudioSource | None, str]:
    """The source for a resolved ``audio`` kind (:func:`~ruseon_appliance.audio.choice.
    resolve_audio`), or None and why. An rtsp:// camera's own track ("source") is read by its
    video source (``video_source``, which must take an ``audio_sink``)."""
    if kind == "tone":
        return ToneSource(), ""
    if kind.startswith("alsa:"):
        from .alsa import AlsaSource

        return AlsaSource(kind[5:]), ""
    if kind == "source":
        if not hasattr(video_source, "audio_sink"):
            return None, "this camera's video source carries no audio track"
        from .track import TrackSource

        track = TrackSource()
        video_source.audio_sink = track  # type: ignore[union-attr]
        return track, ""
    return None, f"no audio source {kind!r}"
