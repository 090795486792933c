"""Where events come from: the engine's sessions, the capture pipeline's frame flow, the
recorder. Each producer is a small adapter that ``app.py`` connects to the bus."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..capture.liveness import stale_after_s
from ..tasks import cancel_and_wait
from .bus import EventBus

log = logging.getLogger(__name__)

# How often the watcher looks at the pipeline's newest frame time.
STALL_POLL_S = 0.5
# A camera that has sent no frame at all this long after the watcher first looked is stalled.
FIRST_FRAME_GRACE_S = 10.0


def session_listener(bus: EventBus, viewers: Callable[[], int]) -> Callable[[str, Any], None]:
    """An engine listener (``Engine.add_listener``) that publishes ``viewer_joined`` and
    ``viewer_left``. Only an 8-character prefix of the session id goes out: the full id is the
    session's capability URL."""

    def listener(event: str, session: Any) -> None:
        short = str(session.id)[:8]
        if event == "session-started":
            bus.publish("viewer_joined", session=short, viewers=viewers())
        elif event == "session-ended":
            bus.publish("viewer_left", session=short, viewers=viewers(),
                        reason=getattr(session, "end_reason", "") or "unknown")

    return listener


def recording_listener(bus: EventBus) -> Callable[[str, Mapping[str, Any]], None]:
    """The seam for the recorder: call the returned function with ``("started", info)`` or
    ``("stopped", info)`` and it publishes ``recording_started`` / ``recording_stopped`` with
    ``info`` (file name, reason...) as data."""

    def listener(state: str, info: Mapping[str, Any]) -> None:
        if state in ("started", "stopped"):
            bus.publish(f"recording_{state}", **dict(info))

    return listener


class _Poller:
    """What both watchers share: a task on the running loop calling ``check()`` every
    ``poll_s`` (the first at once when ``_check_first``, else after one interval)."""

    _task_name = "poller"
    _check_first = False

    def __init__(self, poll_s: float) -> None:
        self._poll_s = poll_s
        self._task: asyncio.Task[None] | None = None

    def check(self) -> None:
        """Look once; publish on a change."""
        raise NotImplementedError

    def start(self) -> None:
        """Begin watching on the running loop."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._task_name)

    async def stop(self) -> None:
        """Stop watching."""
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        if self._check_first:
            self.check()
        while True:
            await asyncio.sleep(self._poll_s)
            self.check()


class RecordingWatcher(_Poller):
    """Publishes ``recording_started`` / ``recording_stopped`` when ``active()`` (the recorder's
    ``active``) changes, whoever started it: the API, the MQTT button, continuous mode. It polls,
    so the recorder needs no hook for it."""

    _task_name = "recording-watcher"
    _check_first = True

    def __init__(self, bus: EventBus, active: Callable[[], bool], state: Callable[[], str],
                 *, poll_s: float = STALL_POLL_S, camera: str = "") -> None:
        super().__init__(poll_s)
        self._listener = recording_listener(bus)
        self._names = {"camera": camera} if camera else {}
        self._active = active
        self._state = state
        self.recording = False

    def check(self) -> None:
        """Look once; publish on a change."""
        active = bool(self._active())
        if active != self.recording:
            self.recording = active
            self._listener("started" if active else "stopped",
                           {"state": self._state(), **self._names})


class StallWatcher(_Poller):
    """Publishes ``camera_stalled`` when frames stop and ``camera_recovered`` when they flow
    again, from ``last_frame`` (the pipeline's ``last_frame_monotonic``)."""

    _task_name = "stall-watcher"

    def __init__(
        self,
        bus: EventBus,
        last_frame: Callable[[], float | None],
        *,
        framerate: int,
        source: str,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = STALL_POLL_S,
        camera: str = "",
    ) -> None:
        super().__init__(poll_s)
        self._bus = bus
        # Each camera's watcher names its camera in its events (empty: tests without one).
        self._names = {"camera": camera} if camera else {}
        self._last_frame = last_frame
        self.limit_s = stale_after_s(framerate)
        self._source = source
        self._clock = clock
        self.stalled = False
        self._stalled_since = 0.0
        self._first_look: float | None = None
        self.stalls = 0

    def check(self) -> None:
        """Look once; publish on a change of state (called by the loop, and by tests)."""
        last = self._last_frame()
        if last is None:
            # No frame yet: a camera missing from the start (a loose ribbon cable) is stalled
            # too, once a camera that is there would have sent its first frame.
            now = self._clock()
            if self._first_look is None:
                self._first_look = now
            if now - self._first_look <= max(self.limit_s, FIRST_FRAME_GRACE_S):
                return
            last = self._first_look
        age = self._clock() - last
        if not self.stalled and age > self.limit_s:
            self.stalled = True
            self.stalls += 1
            self._stalled_since = last
            log.warning("camera %sstalled: no frame from the %s source for %.1f s",
                        f"{self._names['camera']} " if self._names else "", self._source, age)
            self._bus.publish("camera_stalled", source=self._source, frame_age_s=round(age, 3),
                              **self._names)
        elif self.stalled and age <= self.limit_s:
            self.stalled = False
            gap = last - self._stalled_since
            log.info("camera %srecovered after %.1f s",
                     f"{self._names['camera']} " if self._names else "", gap)
            self._bus.publish("camera_recovered", source=self._source,
                              stalled_for_s=round(gap, 3), **self._names)
