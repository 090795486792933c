"""Small asyncio helpers shared by the rooms (a leaf module: imports nothing of the appliance)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

# How long cancel_and_wait gives a cancelled task before cancelling it again.
RECANCEL_S = 1.0


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (nothing when None) and wait until it has finished, so whatever it
    holds is let go before the caller goes on; its cancellation is not re-raised here.

    On Python 3.11 ``asyncio.wait_for`` (which third-party code such as aiomqtt and aioice still
    awaits with) returns normally when the cancel arrives in the same loop iteration as the
    result it waits for: the task runs on as if never cancelled, and a plain ``await task``
    would wait for ever. So the task is cancelled again every :data:`RECANCEL_S` until it ends
    (the rooms' own code uses ``asyncio.timeout``, which does not lose cancels)."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=RECANCEL_S)
    with contextlib.suppress(asyncio.CancelledError):
        task.result()
