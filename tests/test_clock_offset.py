"""A process descheduled between the two clock reads of WallClock.offset_us (a loaded board) must
not look like a clock step: CI's run saw "stepped" twice on a clock nobody set."""

from __future__ import annotations

import itertools
import time as time_module
from pathlib import Path

import pytest

from ruseon_appliance import clock as clock_module
from ruseon_appliance.clock import WallClock

TRUE_OFFSET_NS = 1_700_000_000_000_000_000  # realtime minus monotonic


def test_a_read_interrupted_between_the_clocks_is_read_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mono = itertools.count(10_000_000_000, 1_000)  # 1 µs per read...
    stalls = iter([2_000_000_000])  # ...but the first read pair is 2 s apart (descheduled)
    now = [0]

    def monotonic_ns() -> int:
        now[0] = next(mono)
        return now[0]

    def time_ns() -> int:
        value = now[0] + TRUE_OFFSET_NS
        for stall in stalls:  # the process sleeps right after reading the wall clock
            for _ in range(stall // 1_000):
                next(mono)
            break
        return value

    monkeypatch.setattr(clock_module.time, "monotonic_ns", monotonic_ns)
    monkeypatch.setattr(clock_module.time, "time_ns", time_ns)
    assert abs(WallClock.offset_us() - TRUE_OFFSET_NS // 1000) <= 1



def test_a_lone_read_off_by_days_is_not_a_step(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """A time shim that races (libfaketime's file parse: one read in a thousand came back as the
    real time, measured) or a hypervisor hiccup gives one read far off; a clock that was set
    stays set. Only reads that agree make a step; a real step is seen at the next look."""
    wall_offset = [TRUE_OFFSET_NS]
    glitches: list[int] = []

    def time_ns() -> int:
        if glitches:
            return time_module.monotonic_ns() + glitches.pop()
        return time_module.monotonic_ns() + wall_offset[0]

    monkeypatch.setattr(clock_module.time, "time_ns", time_ns)
    clock = WallClock(tmp_path / "no-sync-flag")  # never synchronized
    seen: list[object] = []
    clock.add_listener(seen.append)
    glitches.append(TRUE_OFFSET_NS + 400 * 86400 * 10**9)  # one read 400 days ahead
    assert clock.check_step() is None
    assert clock.check_step() is None
    assert clock.state == "uncertain" and clock.steps_total == 0 and not seen
    wall_offset[0] += 400 * 86400 * 10**9  # now the clock is set, for good
    step = clock.check_step()
    assert step is not None and abs(step.delta_us - 400 * 86400 * 10**6) < 1_000_000
    assert clock.state == "stepped" and clock.steps_total == 1 and seen == [step]
