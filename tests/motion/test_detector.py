"""The detector on real H.264 (libx264 from generated pictures, so the truth is known), fed
in-process through the decode path without real-time pacing."""

from __future__ import annotations

import numpy as np
import pytest

from ruseon_appliance.motion.analyser import DecodeAnalyser
from ruseon_appliance.motion.detector import (
    LIGHT_SWITCH_SHARE,
    MotionDetector,
    MotionSettings,
    share_threshold,
)
from ruseon_appliance.motion.tracker import Transition
from ruseon_appliance.motion.zones import Zone
from tests.motion.scenes import Scene, Unit, encode, seconds_of

W, H = 320, 180
OFF_DELAY_S = 2.0
LEFT_HALF = "0,0 0.5,0 0.5,1 0,1"


def run(units: list[Unit], **settings: object) -> tuple[DecodeAnalyser, list[Transition]]:
    """Feed every unit; the started/ended transitions."""
    analyser = DecodeAnalyser(MotionSettings(off_delay_s=OFF_DELAY_S, **settings))  # type: ignore[arg-type]
    for unit in units:
        analyser.feed(unit.data, unit.keyframe, unit.capture_time_us)
    analyser.finish()
    return analyser, [t for t in analyser.transitions if t.kind != "peak"]


@pytest.fixture(scope="module")
def crossing() -> list[Unit]:
    """An object crossing the whole picture from 2 s to 5 s, in a 10 s clip."""
    return encode(Scene(W, H).crossing(2.0, 3.0), 10, width=W, height=H)


@pytest.fixture(scope="module")
def in_left_half() -> list[Unit]:
    """An object moving only inside the left half, from 2 s to 5 s."""
    return encode(Scene(W, H).crossing(2.0, 3.0, x0=0.08, x1=0.4), 9, width=W, height=H)


def test_still_noisy_scene_gives_no_event_over_a_minute() -> None:
    scene = Scene(W, H, noise=6.0)
    analyser, transitions = run(encode(scene.static(), 60, width=W, height=H))
    assert analyser.analysed >= 590  # 10 fps of 60 s were looked at
    assert transitions == []
    # Not by luck: the noise does change some pixels, but far below the threshold.
    assert analyser.detector.score < share_threshold(50) / 2


def test_an_object_crossing_for_3_s_is_one_event_with_the_right_times(
        crossing: list[Unit]) -> None:
    _, transitions = run(crossing)
    assert [t.kind for t in transitions] == ["started", "ended"]
    started, ended = transitions
    event = started.event
    assert 2.0 <= seconds_of(event.start) <= 2.5
    assert seconds_of(started.at) <= 2.5  # announced within 0.5 s of the truth
    assert event.end is not None and 4.5 <= seconds_of(event.end) <= 5.5
    assert 5.0 + OFF_DELAY_S - 0.5 <= seconds_of(ended.at) <= 5.0 + OFF_DELAY_S + 0.5
    assert 2.0 <= seconds_of(event.peak_time) <= 5.0
    assert event.peak_score > share_threshold(50)


def test_a_sudden_global_brightness_change_is_not_motion() -> None:
    units = encode(Scene(W, H).brightness_step(3.0, 70.0), 8, width=W, height=H)
    analyser, transitions = run(units)
    assert transitions == []
    assert analyser.detector.suppressed >= 1  # seen, and held back as a light switch


def test_motion_only_inside_an_excluded_zone_is_no_event(in_left_half: list[Unit]) -> None:
    _, transitions = run(in_left_half, zones=(Zone.parse(LEFT_HALF, include=False),))
    assert transitions == []


def test_the_same_motion_inside_an_include_zone_is_an_event(in_left_half: list[Unit]) -> None:
    # The control for the excluded zone: the clip does hold motion there.
    _, transitions = run(in_left_half, zones=(Zone.parse(LEFT_HALF, include=True),))
    assert [t.kind for t in transitions] == ["started", "ended"]


def test_an_include_zone_elsewhere_sees_nothing(in_left_half: list[Unit]) -> None:
    _, transitions = run(in_left_half, zones=(Zone.parse("0.6,0 1,0 1,1 0.6,1", include=True),))
    assert transitions == []


def test_lower_sensitivity_misses_a_small_object() -> None:
    units = encode(Scene(W, H).crossing(1.0, 2.0, size=0.09), 6, width=W, height=H)
    _, seen = run(units, sensitivity=90)
    _, missed = run(units, sensitivity=10)
    assert [t.kind for t in seen] == ["started", "ended"]
    assert missed == []


def test_a_burst_of_motion_shorter_than_the_minimum_duration_is_no_event(
        crossing: list[Unit]) -> None:
    # 3 s of motion with a 4 s minimum duration
    _, transitions = run(crossing, min_duration_s=4.0)
    assert transitions == []


def test_differences_are_taken_on_floats_not_wrapping_uint8() -> None:
    # picamera2's example subtracts uint8 planes: 10 - 250 wraps to 16 there.
    detector = MotionDetector(MotionSettings())
    dark = np.full((90, 160), 250, dtype=np.uint8)
    detector.analyse(dark, 0.0)
    patch = dark.copy()
    patch[:20, :20] = 10  # 400 of 14400 pixels: 2.8 %
    analysis = detector.analyse(patch, 0.1)
    assert analysis.motion and analysis.score == pytest.approx(400 / 14400)


def test_a_change_of_most_of_the_picture_resets_the_background() -> None:
    detector = MotionDetector(MotionSettings())
    detector.analyse(np.full((90, 160), 60, dtype=np.uint8), 0.0)
    light = detector.analyse(np.full((90, 160), 200, dtype=np.uint8), 0.1)
    assert light.suppressed and not light.motion and light.score > LIGHT_SWITCH_SHARE
    after = detector.analyse(np.full((90, 160), 200, dtype=np.uint8), 0.2)
    assert after.score == 0.0  # the lit room is the background now
