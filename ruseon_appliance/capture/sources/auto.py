"""Choosing a source from ``camera.source``, including ``auto`` detection."""

from __future__ import annotations

import logging

from ...config import CameraConfig
from .base import Source, SourceUnavailable
from .synthetic import SyntheticSource

log = logging.getLogger(__name__)


def create_source(camera: CameraConfig) -> Source:
    """Build the source ``camera.source`` names; ``auto`` picks the best one present."""
    kind = camera.source
    if kind == "synthetic":
        return SyntheticSource(camera)
    if kind == "auto":
        log.info("camera.source = auto: no camera found, using the synthetic test camera")
        return SyntheticSource(camera)
    raise SourceUnavailable(f"camera.source = {kind!r} is not available yet")
