"""When the rig itself could not run: CPU starvation of the harness's own process.

A viewer judges the device by the gaps between the pictures it decodes. While the rig's process
waits for a CPU (another program, or on a shared CI machine other jobs, took both cores), no
picture can arrive, be decoded or be timed, however well the device sends: the gap belongs to
the rig. Measured on the simulated rig on a starved 2-core machine: nearly every freeze had
consecutive capture stamps on both sides (the device captured and sent every frame on time), and
lasted about as long as the harness's own event loop had been unable to run (or the access
units had arrived on time and only the harness's decoder thread was late: see
``hil.viewer._freezes``, which times pictures by their arrival).

:class:`StarvationProbe` ticks on the viewer's event loop; a tick that wakes late is charged to
starvation only as far as the process's threads spent that time *runnable but waiting for a
CPU* (Linux ``/proc/self/task/*/schedstat``, second field). A rig that is merely busy (decoding,
or handling a flood the device sent) accrues no run-queue wait, so its lateness stays the
device's. Without schedstat nothing is charged to the rig and every gap counts, as before.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

# How often the probe ticks, and how late a tick must wake before it is looked at.
TICK_S = 0.05
LATE_S = 0.1
_TASKS = "/proc/self/task"


def run_delay_s() -> float | None:
    """Seconds this process's threads have waited on a run queue so far (None: unknown)."""
    total = 0
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total / 1e9


@dataclass
class StarvationProbe:
    """Spans of the rig's own starvation, ``(from, to, share)`` in ``time.monotonic()``, where
    ``share`` is the part of the span the process spent waiting for a CPU."""

    spans: list[tuple[float, float, float]] = field(default_factory=list)

    async def run(self) -> None:
        """Tick until cancelled."""
        while True:
            before = run_delay_s()
            due = time.monotonic() + TICK_S
            await asyncio.sleep(TICK_S)
            woke = time.monotonic()
            late = woke - due
            if late <= LATE_S or before is None:
                continue
            after = run_delay_s()
            if after is None:
                continue
            # Several threads may wait at once: the span can at most be starved throughout.
            share = min(1.0, max(0.0, after - before) / (woke - due + TICK_S))
            if share > 0:
                self.spans.append((due - TICK_S, woke, share))

    def starved_s(self, start: float, end: float) -> float:
        """Seconds of [start, end] the rig spent starved."""
        return sum(share * max(0.0, min(end, b) - max(start, a)) for a, b, share in self.spans)

    def total_s(self) -> float:
        """Seconds starved in all."""
        return sum(share * (b - a) for a, b, share in self.spans)
