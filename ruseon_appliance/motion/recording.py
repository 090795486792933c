"""``[recording] mode = "motion"``: a camera records around its motion events.

On ``motion_started`` the camera's recorder begins with the pre-roll its ring holds; on
``motion_ended`` it ends ``postroll_s`` later, unless another event starts meanwhile (then the
recording goes on: overlapping events make one recording). A recording someone else began
(the API, the MQTT button) is left alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..events import Event
from ..tasks import cancel_and_wait

log = logging.getLogger(__name__)

# A recorder still closing the previous recording refuses begin(); asked again this often,
# for at most this long.
BEGIN_RETRY_S = 0.1
BEGIN_PATIENCE_S = 5.0


class Recording(Protocol):
    """What is needed of recording/recorder.py's ``Recorder``."""

    @property
    def active(self) -> bool: ...

    def begin(self, preroll_s: float | None = None) -> bool: ...

    def end(self) -> Awaitable[bool]: ...


class MotionRecording:
    """Begins and ends ``recorder``'s recordings on camera ``camera``'s motion events (an
    event bus subscriber: :meth:`on_event`)."""

    def __init__(self, recorder: Recording, *, camera: str, preroll_s: float,
                 postroll_s: float, clock: Callable[[], float] | None = None) -> None:
        self.recorder = recorder
        self.camera = camera
        self.preroll_s = preroll_s
        self.postroll_s = postroll_s
        self._ours = False  # the recording running was begun here
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.recordings = 0
        self.extended = 0  # events that started while a recording was in its post-roll

    def on_event(self, event: Event) -> None:
        """Bus subscriber: this camera's ``motion_started`` / ``motion_ended``."""
        if self._stopped or event.data.get("camera") != self.camera:
            return
        if event.name == "motion_started":
            self._replace(self._begin())
        elif event.name == "motion_ended" and self._ours:
            self._replace(self._end_after_postroll())

    def _replace(self, work: Any) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
        self._task = asyncio.get_running_loop().create_task(work, name=f"motion-rec-{self.camera}")

    async def _begin(self) -> None:
        if self._ours and self.recorder.active:
            self.extended += 1  # still recording (the post-roll was cancelled): one recording
            return
        if self.recorder.active:
            return  # someone else's recording: it covers the event
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BEGIN_PATIENCE_S
        while not self.recorder.begin(self.preroll_s):
            if self.recorder.active or loop.time() > deadline:
                return
            await asyncio.sleep(BEGIN_RETRY_S)  # the previous recording is still closing
        self._ours = True
        self.recordings += 1
        log.info("camera %s: recording on motion", self.camera,
                 extra={"EVENT": "motion_recording", "CAMERA": self.camera})

    async def _end_after_postroll(self) -> None:
        await asyncio.sleep(self.postroll_s)
        self._ours = False
        await self.recorder.end()

    async def stop(self) -> None:
        """Forget a pending post-roll (the recorder's own stop closes the recording)."""
        self._stopped = True
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def stats(self) -> dict[str, Any]:
        """Recordings begun on motion, events that extended one."""
        return {"recordings": self.recordings, "extended": self.extended}
