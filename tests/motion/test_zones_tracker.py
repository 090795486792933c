"""Zones (parsing, rasterising) and the tracker's timing rules, on exact numbers."""

from __future__ import annotations

import pytest

from ruseon_appliance.motion.detector import Analysis, MotionSettings
from ruseon_appliance.motion.tracker import MotionTracker
from ruseon_appliance.motion.zones import Zone, parse_polygon, polygon_mask, zones_mask


@pytest.mark.parametrize("text, why", [
    ("0,0 1,0", "at least 3"),
    ("0,0 1,0 1,x", "not two numbers"),
    ("0,0 1,0 1.5,1", "outside the picture"),
    ("0,0 1;0 1,1", "not x,y"),
])
def test_bad_polygons_are_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_polygon(text)


def test_a_triangle_covers_half_of_its_square() -> None:
    mask = polygon_mask(parse_polygon("0,0 1,0 1,1"), 100, 100)
    assert 0.48 < mask.mean() < 0.52
    assert mask[10, 90] and not mask[90, 10]  # the upper right half (y down)


def test_include_then_exclude() -> None:
    mask = zones_mask((Zone.parse("0,0 1,0 1,1 0,1", include=True),
                       Zone.parse("0,0 0.25,0 0.25,1 0,1", include=False)), 40, 10)
    assert mask.mean() == pytest.approx(0.75)
    assert zones_mask((), 4, 4).all()


MOTION, STILL = Analysis(0.05, True), Analysis(0.0, False)


def feed(tracker: MotionTracker, frames: list[tuple[float, Analysis]]) -> list[tuple[str, float]]:
    out = []
    for t, analysis in frames:
        out += [(tr.kind, tr.at) for tr in tracker.update(t, analysis) if tr.kind != "peak"]
    return out


def ticks(start: float, end: float, analysis: Analysis, step: float = 0.1
          ) -> list[tuple[float, Analysis]]:
    n = round((end - start) / step)
    return [(round(start + i * step, 3), analysis) for i in range(n)]


def test_min_duration_off_delay_and_a_bounded_storm() -> None:
    tracker = MotionTracker(MotionSettings(min_duration_s=0.3, off_delay_s=1.0, min_gap_s=3.0))
    frames = (ticks(0, 1, MOTION) + ticks(1, 2.5, STILL)     # one event, ends at 2.0
              + ticks(2.5, 3, MOTION) + ticks(3, 6, STILL)   # inside the gap: held, counted
              + ticks(6, 7, MOTION) + ticks(7, 9, STILL))    # after the gap: a new event
    assert feed(tracker, frames) == [("started", 0.3), ("ended", 2.0),
                                     ("started", 6.3), ("ended", 7.9)]
    assert tracker.storm_held == 1 and tracker.events == 2


def test_a_short_blip_breaks_before_the_minimum_duration() -> None:
    tracker = MotionTracker(MotionSettings(min_duration_s=0.3))
    frames = ticks(0, 0.2, MOTION) + ticks(0.2, 0.3, STILL) + ticks(0.3, 0.5, MOTION)
    assert feed(tracker, frames) == []
