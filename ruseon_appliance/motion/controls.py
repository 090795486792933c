"""Motion detection as two more camera controls for Home Assistant: ``motion`` (a switch:
detection on/off) and ``motion_sensitivity`` (a number 0-100), next to the camera's own
controls in the one controls document (mqtt/publisher.py's ``CameraControlsPort``). Live and
saved (motion/saved.py: a restart keeps them), like ``PATCH /api/camera/<camera>/motion``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .monitor import MotionMonitor

MOTION_CONTROLS = ("motion", "motion_sensitivity")


class ControlsPort(Protocol):
    """A camera's controls (capture/controls.py's CameraControls)."""

    def describe(self) -> dict[str, Any]: ...

    async def update(self, changes: Mapping[str, Any]) -> bool: ...


class WithMotionControls:
    """``controls`` (may be None: a source without controls) plus the detector's two."""

    def __init__(self, controls: ControlsPort | None, monitor: MotionMonitor,
                 default_sensitivity: int) -> None:
        self.controls = controls
        self.monitor = monitor
        self.default_sensitivity = default_sensitivity

    def describe(self) -> dict[str, Any]:
        """The camera's description with ``motion`` and ``motion_sensitivity`` added."""
        out = dict(self.controls.describe()) if self.controls is not None else {"controls": {}}
        out["controls"] = {
            **out.get("controls", {}),
            "motion": {"value": self.monitor.enabled, "live": True, "type": "bool",
                       "default": True, "description": "motion detection on"},
            "motion_sensitivity": {"value": self.monitor.settings.sensitivity, "live": True,
                                   "type": "int", "default": self.default_sensitivity,
                                   "min": 0, "max": 100,
                                   "description": "motion sensitivity (0-100)"},
        }
        return out

    async def update(self, changes: Mapping[str, Any]) -> bool:
        """Apply the motion changes here, the others to the camera's controls (ValueError
        naming the control when a value does not fit); True if the camera restarted."""
        ours = {k: v for k, v in changes.items() if k in MOTION_CONTROLS}
        enabled, sensitivity = ours.get("motion"), ours.get("motion_sensitivity")
        if "motion" in ours and not isinstance(enabled, bool):
            raise ValueError(f"motion = {enabled!r}: ON or OFF")
        if "motion_sensitivity" in ours and (isinstance(sensitivity, bool)
                                             or not isinstance(sensitivity, int)
                                             or not 0 <= sensitivity <= 100):
            raise ValueError(f"motion_sensitivity = {sensitivity!r}: a whole number 0 to 100")
        rest = {k: v for k, v in changes.items() if k not in MOTION_CONTROLS}
        restarted = False
        if rest:
            if self.controls is None:
                raise ValueError(f"no camera control {', '.join(rest)}")
            restarted = await self.controls.update(rest)
        if isinstance(sensitivity, int):
            self.monitor.set_sensitivity(sensitivity)
        if isinstance(enabled, bool):
            self.monitor.set_enabled(enabled)
        return restarted
