"""A process descheduled between the two clock reads of WallClock.offset_us (a loaded board) must
not look like a clock step: CI's run saw "stepped" twice on a clock nobody set."""

from __future__ import annotations

import itertools

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

