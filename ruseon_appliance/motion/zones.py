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


# What ``PATCH /api/camera/<camera>/motion`` takes (and the saved settings hold) at most.
MAX_ZONES = 16
MAX_POINTS = 64


def zone_to_json(zone: Zone) -> dict[str, Any]:
    """``{"points": [[x, y], ...], "include": bool}`` (the API's and the saved file's form)."""
    return {"points": [[round(x, 4), round(y, 4)] for x, y in zone.points],
            "include": zone.include}


def zones_from_json(value: Any) -> tuple[Zone, ...]:
    """Zones from their JSON form (a list of ``{"points": [[x, y], ...], "include": bool}``;
    ``points`` may also be the configuration's ``"x,y x,y x,y"`` text); ValueError with the
    reason (which zone, which point) for anything else."""
    if not isinstance(value, list):
        raise ValueError('zones must be a list of {"points": [[x, y], ...], "include": true|false}')
    if len(value) > MAX_ZONES:
        raise ValueError(f"{len(value)} zones: at most {MAX_ZONES}")
    zones = []
    for n, item in enumerate(value, 1):
        if not isinstance(item, dict):
            raise ValueError(f"zone {n} is not an object with points and include")
        unknown = set(item) - {"points", "include"}
        if unknown:
            raise ValueError(f"zone {n}: unknown key {', '.join(sorted(unknown))} "
                             "(points and include)")
        include = item.get("include", True)
        if not isinstance(include, bool):
            raise ValueError(f"zone {n}: include = {include!r} must be true or false")
        points = item.get("points")
        if isinstance(points, str):
            try:
                zones.append(Zone(parse_polygon(points), include))
            except ValueError as exc:
                raise ValueError(f"zone {n}: {exc}") from None
            continue
        if not isinstance(points, list):
            raise ValueError(f"zone {n}: points must be a list of [x, y] pairs")
        if len(points) > MAX_POINTS:
            raise ValueError(f"zone {n} has {len(points)} points: at most {MAX_POINTS}")
        parsed: list[Point] = []
        for m, pair in enumerate(points, 1):
            if (not isinstance(pair, list) or len(pair) != 2
                    or any(isinstance(v, bool) or not isinstance(v, int | float) for v in pair)):
                raise ValueError(f"zone {n}, point {m}: {pair!r} is not [x, y] (two numbers)")
            # Compared before float(): a 400-digit JSON integer would overflow it; NaN fails.
            if not all(0 <= v <= 1 for v in pair):
                raise ValueError(f"zone {n}, point {m}: {pair!r} is outside the picture "
                                 "(coordinates are 0 to 1)")
            parsed.append((float(pair[0]), float(pair[1])))
        if len(parsed) < 3:
            raise ValueError(f"zone {n} has {len(parsed)} points; a zone needs at least 3")
        zones.append(Zone(tuple(parsed), include))
    return tuple(zones)
