"""Zones: polygons in normalised picture coordinates (0..1, x to the right, y down), written
as ``"x,y x,y x,y ..."`` in the configuration, rasterised onto the detector's small plane.

An *include* zone limits detection to its inside (several: their union); an *exclude* zone
(a mask) is never looked at. Without include zones the whole picture is looked at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Point = tuple[float, float]


def parse_polygon(text: str) -> tuple[Point, ...]:
    """``"x,y x,y x,y"`` -> points; ValueError with the reason for anything else (fewer than
    three points, a coordinate outside 0..1, not a number)."""
    points: list[Point] = []
    for pair in text.split():
        x_text, sep, y_text = pair.partition(",")
        if not sep:
            raise ValueError(f"{pair!r} is not x,y")
        try:
            x, y = float(x_text), float(y_text)
        except ValueError:
            raise ValueError(f"{pair!r} is not two numbers") from None
        if not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
            raise ValueError(f"{pair!r} is outside the picture (coordinates are 0 to 1)")
        points.append((x, y))
    if len(points) < 3:
        raise ValueError(f"{text!r} has {len(points)} points; a zone needs at least 3")
    return tuple(points)


@dataclass(frozen=True, slots=True)
class Zone:
    """One polygon; ``include`` (look only here) or not (an exclusion mask)."""

    points: tuple[Point, ...]
    include: bool = True

    @classmethod
    def parse(cls, text: str, *, include: bool) -> Zone:
        """A zone from its configuration text (see :func:`parse_polygon`)."""
        return cls(parse_polygon(text), include)


def polygon_mask(points: Sequence[Point], width: int, height: int) -> Any:
    """A ``(height, width)`` bool array: which pixel centres lie inside the polygon (even-odd
    rule, so any simple polygon works)."""
    import numpy as np

    xs = (np.arange(width, dtype=np.float64) + 0.5) / width
    ys = (np.arange(height, dtype=np.float64) + 0.5) / height
    px: Any
    py: Any
    px, py = np.meshgrid(xs, ys)
    inside: Any = np.zeros((height, width), dtype=bool)
    n = len(points)
    for i in range(n):
        x1, y1 = points[i]
        x2, y2 = points[(i + 1) % n]
        if y1 == y2:
            continue
        crosses = (py >= min(y1, y2)) & (py < max(y1, y2))
        x_at = x1 + (py - y1) * (x2 - x1) / (y2 - y1)
        inside ^= crosses & (px < x_at)
    return inside


def zones_mask(zones: Sequence[Zone], width: int, height: int) -> Any:
    """The pixels the detector looks at: the union of the include zones (all pixels without
    any), less the union of the exclude zones."""
    import numpy as np

    includes = [z for z in zones if z.include]
    if includes:
        mask: Any = np.zeros((height, width), dtype=bool)
        for zone in includes:
            mask |= polygon_mask(zone.points, width, height)
    else:
        mask = np.ones((height, width), dtype=bool)
    for zone in zones:
        if not zone.include:
            mask &= ~polygon_mask(zone.points, width, height)
    return mask
