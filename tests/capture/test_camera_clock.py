"""The IP camera's frame times (capture/sources/camera_clock.py): the camera's spacing on our
clock, whatever the arrival wobble; start-up bursts close up gently; jumps and broken clocks."""

from __future__ import annotations

import itertools
import random

import pytest

from ruseon_appliance.capture.sources.camera_clock import (
    GIVE_UP_AFTER,
    RISE,
    WINDOW_S,
    CameraClock,
)

STEP = 1 / 15


def steps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_late_and_bunched_arrivals_keep_the_cameras_spacing() -> None:
    clock = CameraClock()
    rng = random.Random(7)
    times, lateness = [], []
    for n in range(300):
        camera = 1000.0 + n * STEP
        # 2-5 ms of network, and now and then a stall of up to 400 ms that releases frames in
        # a bunch (the reader thread waiting for a core).
        late = 0.002 + rng.random() * 0.003
        if 100 <= n % 120 < 106:
            late += 0.4 - (n % 120 - 100) * STEP
        arrival = 50.0 + camera + late
        times.append(clock.time(camera, arrival))
        lateness.append(arrival - times[-1])
    # The first frame sets the line; a promptest frame lowers it by at most its 3 ms.
    assert all(abs(s - STEP) < 0.0031 for s in steps(times)), min(steps(times))
    # Mostly exactly: the line moves only when a prompter frame comes or the least leaves the
    # window (10 s), not with each frame's lateness.
    exact = [s for s in steps(times) if abs(s - STEP) < 1e-6]
    assert len(exact) > 0.9 * (len(times) - 1), len(exact)
    # Every time is at or before its arrival (by what the network and the stalls held it).
    assert min(lateness) >= -1e-9 and max(lateness) > 0.3
    assert clock.resyncs == 0 and not clock.by_arrival
    # Timed by arrival, the same frames came 5 ms apart: what the clock is for.
    assert min(steps([50.0 + 1000.0 + n * STEP for n in range(3)])) > 0.06


def test_a_start_up_burst_closes_up_by_at_most_half_a_step_per_frame() -> None:
    clock = CameraClock()
    # FFmpeg's probe holds 20 frames and hands them over at once, 0.1 ms apart, then live.
    times = [clock.time(n * STEP, 10.0 + n * 0.0001) for n in range(20)]
    times += [clock.time(n * STEP, 10.0 - 20 * STEP + n * STEP + 0.003) for n in range(20, 60)]
    gaps = steps(times)
    assert min(gaps) >= STEP / 2 - 1e-9, min(gaps)
    # It reaches the prompt frames' line and keeps their spacing.
    assert abs(gaps[-1] - STEP) < 1e-9
    assert abs(times[-1] - (10.0 - 20 * STEP + 59 * STEP + 0.003)) < 1e-9


def test_a_camera_slower_than_us_is_followed_and_a_long_stall_hardly_moves_the_line() -> None:
    clock = CameraClock()
    drift = 0.0005  # the camera's second is 0.5 ms longer than ours
    for n in range(2000):
        camera = n * STEP
        arrival = camera * (1 + drift) + 0.002
        at = clock.time(camera, arrival)
    # Behind by what the window holds of the drift, no more.
    assert arrival - at < 0.002 + WINDOW_S * drift * 1.1, "the line followed the camera's drift"
    # A 5 s stall: all of it is lateness, the line rises by RISE per camera second only.
    before = clock.time(2000 * STEP, 2000 * STEP * (1 + drift) + 0.002)
    for n in range(2001, 2076):
        clock.time(n * STEP, 2075 * STEP * (1 + drift) + 0.002 + 5.0 - (2075 - n) * 0.0001)
    after = clock.time(2076 * STEP, 2076 * STEP * (1 + drift) + 0.002)
    assert abs((after - before) - 76 * STEP) <= RISE * 76 * STEP + 76 * STEP * drift + 1e-6


def test_a_jump_or_a_camera_clock_going_back_sets_the_line_anew() -> None:
    clock = CameraClock()
    for n in range(10):
        clock.time(n * STEP, 5.0 + n * STEP)
    # The camera's clock jumps 30 s ahead: the line is set anew at the arrival.
    assert clock.time(30.0, 5.0 + 10 * STEP) == pytest.approx(5.0 + 10 * STEP)
    assert clock.resyncs == 1
    # ... and back (a camera restarting its clock): again at the arrival.
    assert clock.time(0.0, 5.0 + 11 * STEP) == pytest.approx(5.0 + 11 * STEP)
    assert clock.resyncs == 2 and not clock.by_arrival
    # A frame with no time of its own is timed by arrival and leaves the line alone.
    assert clock.time(None, 9.0) == 9.0
    assert clock.time(STEP, 5.0 + 12 * STEP + 0.03) == pytest.approx(5.0 + 12 * STEP)


def test_b_frames_or_a_broken_clock_fall_back_to_arrival() -> None:
    clock = CameraClock()
    order = [0, 3, 1, 2, 6, 4, 5, 9, 7, 8]  # presentation times in decode order
    out = []
    for n in range(40):
        camera = (n // 10 * 10 + order[n % 10]) * STEP
        out.append(clock.time(camera, 3.0 + n * STEP))
    assert clock.by_arrival and clock.resyncs == GIVE_UP_AFTER
    assert out[-1] == 3.0 + 39 * STEP
