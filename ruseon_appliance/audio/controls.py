"""The sound as two more camera controls for Home Assistant: ``microphone`` (a switch: on =
not muted) and ``audio_gain_db`` (a number -60..30), next to the camera's own controls in the
one controls document (mqtt/publisher.py's ``CameraControlsPort``), like
``PATCH /api/camera/<camera>/audio``. Live, not saved (as the API)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .pipeline import AudioPipeline

AUDIO_CONTROLS = ("microphone", "audio_gain_db")


class ControlsPort(Protocol):
    """A camera's controls (capture/controls.py's CameraControls, or motion's wrapper)."""

    def describe(self) -> dict[str, Any]: ...

    async def update(self, changes: Mapping[str, Any]) -> bool: ...


class WithAudioControls:
    """``controls`` (may be None) plus the sound's two."""

    def __init__(self, controls: ControlsPort | None, audio: AudioPipeline, *,
                 default_gain_db: float = 0.0, default_muted: bool = False) -> None:
        self.controls = controls
        self.audio = audio
        self.default_gain_db = default_gain_db
        self.default_muted = default_muted

    def describe(self) -> dict[str, Any]:
        """The camera's description with ``microphone`` and ``audio_gain_db`` added."""
        out = dict(self.controls.describe()) if self.controls is not None else {"controls": {}}
        out["controls"] = {
            **out.get("controls", {}),
            "microphone": {"value": not self.audio.muted, "live": True, "type": "bool",
                           "default": not self.default_muted,
                           "description": "sound on (off: muted)"},
            "audio_gain_db": {"value": self.audio.gain_db, "live": True, "type": "float",
                              "default": self.default_gain_db, "min": -60.0, "max": 30.0,
                              "unit": "dB", "description": "gain of the sound"},
        }
        return out

    async def update(self, changes: Mapping[str, Any]) -> bool:
        """Apply the sound's changes here, the others to the wrapped controls (ValueError
        naming the control when a value does not fit); True if the camera restarted."""
        on, gain = changes.get("microphone"), changes.get("audio_gain_db")
        if "microphone" in changes and not isinstance(on, bool):
            raise ValueError(f"microphone = {on!r}: ON or OFF")
        if "audio_gain_db" in changes and (isinstance(gain, bool)
                                           or not isinstance(gain, int | float)
                                           or not math.isfinite(gain)
                                           or not -60 <= gain <= 30):
            raise ValueError(f"audio_gain_db = {gain!r}: a number -60 to 30")
        rest = {k: v for k, v in changes.items() if k not in AUDIO_CONTROLS}
        restarted = False
        if rest:
            if self.controls is None:
                raise ValueError(f"no camera control {', '.join(rest)}")
            restarted = await self.controls.update(rest)
        if isinstance(gain, int | float) and not isinstance(gain, bool):
            self.audio.set_gain_db(float(gain))
        if isinstance(on, bool):
            self.audio.set_muted(not on)
        return restarted
