"""Small asyncio helpers shared by the rooms (a leaf module: imports nothing of the appliance)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (nothing when None) and wait until it has finished, so whatever it
    holds is let go before the caller goes on; its cancellation is not re-raised here."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
