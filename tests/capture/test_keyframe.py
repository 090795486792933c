"""Keyframe request coalescing, on a controlled clock (no wall-clock assertions)."""

from __future__ import annotations

from ruseon_appliance.capture.keyframe import KeyframeCoalescer


def test_at_most_one_forced_idr_per_interval() -> None:
    now = [100.0]
    forced: list[float] = []
    coalescer = KeyframeCoalescer(0.5, lambda: forced.append(now[0]), clock=lambda: now[0])
    # 30 viewers asking within 300 ms, then more over the next second.
    results = []
    for step in range(60):
        now[0] = 100.0 + step * 0.025
        results.append(coalescer.request(f"viewer {step % 30}"))
    assert forced == [100.0, 100.5, 101.0]
    assert results.count(True) == 3 and coalescer.absorbed == 57
    assert (coalescer.requests, coalescer.forced) == (60, 3)


def test_zero_interval_forwards_every_request() -> None:
    calls = []
    coalescer = KeyframeCoalescer(0.0, lambda: calls.append(1), clock=lambda: 5.0)
    assert all(coalescer.request() for _ in range(4))
    assert len(calls) == 4
