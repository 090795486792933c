"""Keyframe request coalescing, on a controlled clock (no wall-clock assertions)."""

from __future__ import annotations

from collections.abc import Callable

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


class ManualSchedule:
    """Collects scheduled callbacks; the test runs them when it moves the clock."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, Callable[[], None]]] = []

    def __call__(self, delay: float, callback: Callable[[], None]) -> None:
        self.pending.append((delay, callback))

    def run_all(self) -> None:
        pending, self.pending = self.pending, []
        for _, callback in pending:
            callback()


def test_forced_keyframe_that_never_came_is_retried_once_per_window() -> None:
    now = [10.0]
    forced: list[float] = []
    schedule = ManualSchedule()
    coalescer = KeyframeCoalescer(0.5, lambda: forced.append(now[0]), clock=lambda: now[0],
                                  schedule=schedule, max_retries=2)
    assert coalescer.request("viewer 1")
    now[0] = 10.1
    assert not coalescer.request("viewer 2")  # absorbed: the IDR forced at 10.0 serves it
    assert [delay for delay, _ in schedule.pending] == [0.5]
    now[0] = 10.5
    schedule.run_all()  # the window ends with no keyframe: the IDR was lost, ask again
    assert forced == [10.0, 10.5] and (coalescer.lost, coalescer.retries) == (1, 1)
    now[0] = 10.6
    coalescer.keyframe_arrived()
    now[0] = 11.0
    schedule.run_all()  # served: no further retry
    assert forced == [10.0, 10.5] and (coalescer.lost, coalescer.retries) == (1, 1)


def test_retries_stop_after_max_retries() -> None:
    now = [0.0]
    forced: list[float] = []
    schedule = ManualSchedule()
    coalescer = KeyframeCoalescer(0.5, lambda: forced.append(now[0]), clock=lambda: now[0],
                                  schedule=schedule, max_retries=2)
    coalescer.request()
    for step in range(1, 6):
        now[0] = step * 0.5
        schedule.run_all()
    assert forced == [0.0, 0.5, 1.0]  # the request and two retries, then the periodic IDR
    assert coalescer.retries == 2 and coalescer.lost == 3 and not schedule.pending


def test_cancel_stops_pending_retries() -> None:
    forced: list[int] = []
    schedule = ManualSchedule()
    coalescer = KeyframeCoalescer(0.5, lambda: forced.append(1), clock=lambda: 0.0,
                                  schedule=schedule)
    coalescer.request()
    coalescer.cancel()  # the pipeline stopped: no retry may reach the stopped source
    schedule.run_all()
    assert forced == [1] and coalescer.retries == 0
