"""Per-viewer objects built ahead, in idle time, and each handed out exactly once.

Answering an offer builds a peer connection with its transceiver, DTLS and ICE transports, RTP
sender and receiver (about 0.2 ms of Python, the same for every viewer). Building them while
the loop has nothing else to do takes that off the path of a burst of offers. Nothing built
here is shared: :meth:`PrebuiltPool.take` removes the object it returns, and the pool never
sees it again.

Filling starts with the first ``take`` (a device nobody watches spends no memory on it: about
35 KB per peer connection), waits for a quiet moment (no ``take`` for
:data:`REFILL_IDLE_S`), then builds one object per loop iteration, so an offer arriving
meanwhile waits for at most one build.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# How long after the last take the pool waits before building again (and it also waits while
# ``busy()``, e.g. offers are being answered): shorter than the gap between viewers joining one
# after another (each takes tens of ms to connect), so the pool is full again for the next one.
REFILL_IDLE_S = 0.02


class PrebuiltPool(Generic[T]):
    """Up to ``capacity`` objects from ``build()``, made when idle, each taken once."""

    def __init__(self, build: Callable[[], T], capacity: int,
                 idle_s: float | None = None, busy: Callable[[], bool] | None = None) -> None:
        self._build = build
        self._busy = busy
        self.capacity = max(0, capacity)
        self._idle_s = REFILL_IDLE_S if idle_s is None else idle_s
        self._ready: list[T] = []
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._running = False
        # Handed out from the pool / built on the spot because it was empty / build failures.
        self.taken_prebuilt = 0
        self.built_inline = 0
        self.build_errors = 0

    @property
    def ready(self) -> int:
        """How many objects wait to be taken."""
        return len(self._ready)

    def start(self) -> None:
        """Allow filling (it begins after the first :meth:`take`)."""
        self._running = True

    def stop(self) -> None:
        """Stop filling and drop what was built (never handed out, so nobody holds it)."""
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._ready.clear()

    def take(self) -> T:
        """A fresh object: one built ahead if there is one, else built now. The pool keeps no
        reference to it."""
        if self._running:
            self._schedule()
        if self._ready:
            self.taken_prebuilt += 1
            return self._ready.pop()
        self.built_inline += 1
        return self._build()

    def stats(self) -> dict[str, int]:
        """Counters for the engine's stats."""
        return {"ready": len(self._ready), "capacity": self.capacity,
                "taken_prebuilt": self.taken_prebuilt, "built_inline": self.built_inline,
                "build_errors": self.build_errors}

    # -- filling ---------------------------------------------------------------------------------

    def _schedule(self) -> None:
        """(Re)start the idle wait: a take during a burst pushes the refill after the burst."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        if len(self._ready) < self.capacity:
            self._timer = asyncio.get_running_loop().call_later(self._idle_s, self._fill_one)

    def _fill_one(self) -> None:
        self._timer = None
        if not self._running or len(self._ready) >= self.capacity:
            return
        if self._busy is not None and self._busy():
            # Not while a burst is being answered: try again after another idle wait.
            self._timer = asyncio.get_running_loop().call_later(self._idle_s, self._fill_one)
            return
        try:
            self._ready.append(self._build())
        except Exception:
            # Not fatal: take() builds on the spot (and raises there, to the offer).
            self.build_errors += 1
            return
        if len(self._ready) < self.capacity:
            # One per loop iteration: whatever became ready meanwhile runs first.
            self._timer = asyncio.get_running_loop().call_soon(self._fill_one)
