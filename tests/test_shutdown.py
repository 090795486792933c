"""The pieces of ``ruseon_appliance.shutdown`` in-process (the subprocess phases are in
tests/e2e/test_shutdown.py): a stop request wins over a start that never ends, a stop that
swallows its cancel does not hold the caller, and the forced exit names what still runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from ruseon_appliance.shutdown import StopSignals, bounded, until_stopped


async def stubborn(release: asyncio.Event) -> None:
    """Work that swallows every cancel (the ``suppress(CancelledError): await task`` shape)
    until ``release`` is set."""
    while not release.is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await release.wait()


async def let_go(task: asyncio.Future[None], release: asyncio.Event) -> None:
    """End a :func:`stubborn` task, so the test's loop can close."""
    release.set()
    await asyncio.wait({task}, timeout=30)
    assert task.done()


async def test_a_stop_request_cancels_a_start_that_never_ends() -> None:
    stop = asyncio.Event()
    started = asyncio.Event()

    async def start() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.ensure_future(until_stopped(start(), stop, grace_s=5))
    await started.wait()
    stop.set()
    assert await task is False


async def test_a_start_that_completes_or_fails_is_reported() -> None:
    async def ok() -> None:
        await asyncio.sleep(0)

    async def broken() -> None:
        raise RuntimeError("no frame")

    assert await until_stopped(ok(), asyncio.Event(), grace_s=1) is True
    with pytest.raises(RuntimeError, match="no frame"):
        await until_stopped(broken(), asyncio.Event(), grace_s=1)


async def test_a_stop_that_swallows_its_cancel_does_not_hold_the_caller(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "ruseon")
    release = asyncio.Event()
    left = asyncio.ensure_future(stubborn(release))
    left.set_name("stubborn-stop")
    assert await bounded(left, 0.2, "shutdown") is False
    assert "shutdown took longer" in caplog.text and "stubborn-stop" in caplog.text
    assert not left.done()  # still running: the process exit (or the deadline) ends it
    await let_go(left, release)


async def test_the_forced_exit_names_the_tasks_and_threads_left(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "ruseon")
    statuses: list[int] = []
    signals = StopSignals(asyncio.get_running_loop(), hard_s=15, exit_process=statuses.append)
    release = asyncio.Event()
    left = asyncio.ensure_future(stubborn(release))
    left.set_name("stuck-thing")
    await asyncio.sleep(0)
    signals.force("test")
    await let_go(left, release)
    assert statuses == [1]
    assert "exiting without a clean stop: test" in caplog.text
    assert "task stuck-thing at" in caplog.text and "test_shutdown.py" in caplog.text
