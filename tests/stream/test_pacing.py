"""The send budget and the join pacer, alone."""

from __future__ import annotations

import asyncio

import pytest

from ruseon_appliance.stream import pacing
from ruseon_appliance.stream.pacing import BUDGET_BURST_S, BUDGET_FACTOR, JoinPacer, SendBudget


def test_budget_is_a_multiple_of_the_stream_rate_capped_at_its_burst() -> None:
    rate = [100_000.0]
    budget = SendBudget(lambda: rate[0])
    budget.fill(10.0)
    assert budget.tokens == BUDGET_FACTOR * 100_000 * BUDGET_BURST_S
    assert budget.spend(250_000) and not budget.spend(100_000)
    assert budget.tokens == 50_000
    budget.refill(10.1)  # 0.1 s at 300 kB/s
    assert budget.tokens == pytest.approx(80_000)
    budget.refill(100.0)  # a long pause: never more than the burst
    assert budget.tokens == BUDGET_FACTOR * 100_000 * BUDGET_BURST_S
    rate[0] = 10_000.0  # the stream slowed: so does the budget (and its cap)
    budget.refill(100.5)
    assert budget.tokens == BUDGET_FACTOR * 10_000 * BUDGET_BURST_S


def test_an_override_replaces_the_stream_rate_and_can_be_lifted() -> None:
    budget = SendBudget(lambda: 1e6)
    budget.override = 1000.0
    budget.fill(0.0)
    assert budget.rate() == 1000.0 and budget.tokens == 1000.0 * BUDGET_BURST_S
    budget.override = None
    assert budget.rate() == BUDGET_FACTOR * 1e6


async def test_pacer_caps_each_slice_and_gives_back_the_rest() -> None:
    budget = SendBudget(lambda: 1e6)
    budget.fill(0.0)
    start = budget.tokens
    pacer = JoinPacer()
    pacer.start_burst(3)
    assert pacer.bursting(0) and pacer.pacing(2, mid_frame=False)
    assert pacer.pacing(3, mid_frame=True) and not pacer.pacing(3, mid_frame=False)
    assert not pacer.bursting(3)
    woken = asyncio.Event()
    pacer.open_slice(budget)
    assert budget.tokens == pacing.JOIN_PACE_BYTES  # what this call may spend
    budget.tokens -= 10_000  # the sender's loop spent some
    pacer.close_slice(budget, more=True, wake=woken.set)
    assert budget.tokens == start - 10_000  # the rest of the budget is back
    assert pacer.slices == 1
    await asyncio.wait_for(woken.wait(), 5)  # the next slice is due (JOIN_PACE_S later)


async def test_pacer_schedules_one_wake_at_a_time_and_cancels() -> None:
    budget = SendBudget(lambda: 1e6)
    pacer = JoinPacer()
    wakes: list[int] = []
    for _ in range(3):
        pacer.open_slice(budget)
        pacer.close_slice(budget, more=True, wake=lambda: wakes.append(1))
    await asyncio.sleep(pacing.JOIN_PACE_S * 10)
    assert wakes == [1]  # one pending timer, however many slices asked
    pacer.open_slice(budget)
    pacer.close_slice(budget, more=True, wake=lambda: wakes.append(2))
    pacer.cancel()
    await asyncio.sleep(pacing.JOIN_PACE_S * 10)
    assert wakes == [1]
    pacer.open_slice(budget)
    pacer.close_slice(budget, more=False, wake=lambda: wakes.append(3))
    await asyncio.sleep(pacing.JOIN_PACE_S * 10)
    assert wakes == [1] and pacer.slices == 5
