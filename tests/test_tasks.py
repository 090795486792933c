"""tasks.cancel_and_wait ends a task even when its cancel is swallowed (Python 3.11's
asyncio.wait_for), and the package itself awaits with asyncio.timeout, which loses no cancel."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import pytest

from ruseon_appliance import tasks
from ruseon_appliance.tasks import cancel_and_wait

PACKAGE = Path(__file__).resolve().parent.parent / "ruseon_appliance"


async def test_a_swallowed_cancel_still_ends_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "RECANCEL_S", 0.05)
    wake = asyncio.Event()
    rounds = 0

    async def worker() -> None:  # what aiomqtt's publish/subscribe do, in a loop
        nonlocal rounds
        while True:
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), 30)
            rounds += 1

    task = asyncio.create_task(worker())
    await asyncio.sleep(0)  # the worker is waiting
    wake.set()  # its wait completes in the same loop iteration as the cancel below
    async with asyncio.timeout(20) as limit:
        await cancel_and_wait(task)
    # Ended by cancel_and_wait itself, not by this test's limit cancelling everything.
    assert not limit.expired() and task.cancelled()
    if sys.version_info < (3, 12):
        assert rounds == 1, "the first cancel was not swallowed: the test did not reproduce it"


async def test_exceptions_other_than_the_cancel_still_propagate() -> None:
    async def broken() -> None:
        raise ValueError("boom")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="boom"):
        await cancel_and_wait(task)


def test_the_package_does_not_await_with_asyncio_wait_for() -> None:
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{number}"
                 for path in sorted(PACKAGE.rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if "asyncio.wait_for(" in line and not line.lstrip().startswith("#")]
    assert not offenders, ("use `async with asyncio.timeout(...)` instead (wait_for loses "
                           f"cancels on Python 3.11): {offenders}")
