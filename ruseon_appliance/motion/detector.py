"""The motion algorithm: changed pixels against a slowly adapting background on a small luma
plane, the changed share of the looked-at pixels as the score, and the suppression of a change
of most of the picture at once (lights on, the IR filter switching, a cloud).

The references it follows (see /work/shared/DESIGN.md): rpicam-apps' ``motion_detect`` stage
(a pixel changed when ``|new - old| > m * old + c``, motion when a share of the region
changed), Frigate's detector (a running average as background, a "lightning" share above which
the frame recalibrates instead of counting), picamera2's ``capture_motion.py`` (the lores Y
plane; its ``uint8`` subtraction wraps, so everything here is cast to float first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .zones import Zone, zones_mask

# The plane the detector works on is about this wide (block means of the luma).
PLANE_WIDTH = 160
# A change of more than this share of the looked-at pixels at once is the light, not motion.
LIGHT_SWITCH_SHARE = 0.6
# The relative part of the pixel test: brighter pixels are noisier (rpicam's difference_m).
RELATIVE_DIFFERENCE = 0.05
# Time constant of the background for unchanged pixels, and for changed ones: a parked car
# becomes background after a minute or so, a passer-by does not.
BACKGROUND_TAU_S = 4.0
CHANGED_TAU_S = 60.0


def pixel_threshold(sensitivity: int) -> float:
    """The luma difference (0..255) that counts a pixel as changed: 8 at sensitivity 100,
    24 at the default 50, 40 at 0."""
    return 8.0 + (100 - sensitivity) * 0.32


def share_threshold(sensitivity: int) -> float:
    """The changed share of the looked-at pixels that is motion: 0.2 % at sensitivity 100,
    1.1 % at 50, 2 % at 0."""
    return 0.002 + (100 - sensitivity) / 100 * 0.018


@dataclass(frozen=True, slots=True)
class MotionSettings:
    """One camera's detection settings (``[[camera]] motion_*``)."""

    sensitivity: int = 50
    # Motion must last this long before an event starts (a bird, a leaf, a coding glitch).
    min_duration_s: float = 0.3
    # An event ends this long after the last motion.
    off_delay_s: float = 10.0
    # A new event does not start sooner than this after the previous one ended (a storm of
    # events from a flapping flag is bounded; what it holds back is counted).
    min_gap_s: float = 5.0
    # Frames analysed per second at most (the decode path decodes every frame but looks at
    # these only).
    analysis_fps: float = 10.0
    zones: tuple[Zone, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Analysis:
    """What one frame showed: ``score`` (the changed share, 0..1), ``motion`` (above the
    threshold and not suppressed), ``suppressed`` (a light switch)."""

    score: float
    motion: bool
    suppressed: bool = False


def downscale(luma: Any, width: int = PLANE_WIDTH) -> Any:
    """Block means of a ``uint8`` luma plane down to about ``width`` columns (float32)."""
    h, w = luma.shape
    f = max(1, w // width)
    if f == 1:
        return luma.astype(np.float32, copy=False)
    h2, w2 = h // f, w // f
    blocks = luma[: h2 * f, : w2 * f].astype(np.float32).reshape(h2, f, w2, f)
    return blocks.mean(axis=(1, 3))


class MotionDetector:
    """Scores frames of one camera; call :meth:`analyse` with each small luma plane and the
    frame's time (seconds, any origin, increasing)."""

    def __init__(self, settings: MotionSettings) -> None:
        self.settings = settings
        self._background: Any = None
        self._mask: Any = None
        self._mask_zones: tuple[Zone, ...] | None = None  # the zones _mask was made of
        self._looked_at = 0
        self._last_t: float | None = None
        self.suppressed = 0
        self.score = 0.0

    def reset(self) -> None:
        """Forget the background (a resolution change, a restart of the feed)."""
        self._background = None
        self._last_t = None

    def _prepare(self, shape: tuple[int, int]) -> None:
        h, w = shape
        self._mask_zones = self.settings.zones
        self._mask = zones_mask(self._mask_zones, w, h)
        self._looked_at = int(self._mask.sum())

    def analyse(self, luma: Any, t: float) -> Analysis:
        """Score ``luma`` (a ``uint8`` or float plane; wider than :data:`PLANE_WIDTH` is
        reduced here) taken at ``t``, then let the background follow it."""
        plane = downscale(luma)
        if self._background is None or self._background.shape != plane.shape:
            self._prepare(plane.shape)
            self._background = plane.copy()
            self._last_t = t
            self.score = 0.0
            return Analysis(0.0, False)
        if self._mask_zones is not self.settings.zones:
            self._prepare(plane.shape)  # zones changed while running (the page's editor)
        sensitivity = self.settings.sensitivity
        background = self._background
        difference = np.abs(plane - background)
        changed = difference > pixel_threshold(sensitivity) + RELATIVE_DIFFERENCE * background
        changed &= self._mask
        score = float(changed.sum()) / self._looked_at if self._looked_at else 0.0
        self.score = score
        dt = max(0.0, t - (self._last_t if self._last_t is not None else t))
        self._last_t = t
        if score > LIGHT_SWITCH_SHARE:
            # Most of the picture at once: a new background, not an event.
            self.suppressed += 1
            self._background = plane.copy()
            return Analysis(score, False, True)
        still = 1.0 - math.exp(-dt / BACKGROUND_TAU_S)
        moving = 1.0 - math.exp(-dt / CHANGED_TAU_S)
        alpha = np.where(changed, np.float32(moving), np.float32(still))
        background += alpha * (plane - background)
        return Analysis(score, score >= share_threshold(sensitivity))
