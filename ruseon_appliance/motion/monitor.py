"""One camera's motion detection at run time: a reader of the camera's ring (like any other
consumer), a worker thread that decodes and analyses (:class:`DecodeAnalyser`), the event
store, and the bus events ``motion_started`` / ``motion_ended``.

The live path never waits for the detector: the ring reader copies each access unit into a
bounded backlog and returns to the loop; when the worker falls behind by more than the
backlog, what is queued is dropped, the frames up to the next keyframe are skipped (a
P-frame without its references would decode to garbage) and all of them are counted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from .analyser import DecodeAnalyser, LoresAnalyser
from .detector import MotionSettings, share_threshold
from .saved import MotionFile, SavedMotion
from .store import EventStore, StoredEvent
from .tracker import MotionEvent, Transition
from .zones import Zone

if TYPE_CHECKING:
    from ..capture.ring import RingBuffer

log = logging.getLogger(__name__)

# Access units the worker may be behind before frames are skipped (one second at 30 fps).
MAX_BACKLOG = 30
# The window the analysed frame rate is measured over.
FPS_WINDOW_S = 5.0

Publish = Callable[..., Any]  # EventBus.publish(name, **data)


class LoresSource(Protocol):
    """A source whose ISP makes a small Y plane per frame (capture/sources/picamera.py): it
    calls ``lores_sink(copy_plane, t)`` on its camera thread for every frame."""

    lores_sink: Callable[[Callable[[], Any], float], None] | None


@dataclass(slots=True)
class _Plane:
    luma: Any
    t: float


@dataclass(slots=True)
class _Unit:
    data: bytes
    keyframe: bool
    capture_time_us: int
    after_gap: bool


def event_id(start: float, camera: str) -> str:
    """``<start in ms>-<camera>``: unique per camera, sortable, URL-safe."""
    return f"{int(start * 1000):013d}-{camera}"


class MotionMonitor:
    """Motion detection for the camera whose ring is ``ring`` (named ``camera``): from the
    ring's H.264 (decoded), or with ``lores`` from the Y planes that source offers.

    ``stream`` names which of the camera's streams ``ring`` is (``main``, or ``sub`` where the
    camera has a sub-stream: far cheaper to decode; zones are in picture fractions, so they
    apply to either); it is only reported."""

    def __init__(self, ring: RingBuffer, settings: MotionSettings, *, camera: str,
                 store: EventStore | None = None, publish: Publish | None = None,
                 max_backlog: int = MAX_BACKLOG, lores: LoresSource | None = None,
                 announce_at_once: bool = True, stream: str = "main",
                 saved: MotionFile | None = None) -> None:
        self.ring = ring
        self.camera = camera
        self.stream = stream
        self.store = store
        self._publish = publish
        self.max_backlog = max_backlog
        self.lores = lores
        self.analyser: DecodeAnalyser | LoresAnalyser = (
            LoresAnalyser(settings, self._on_transition) if lores is not None
            else DecodeAnalyser(settings, self._on_transition))
        self.path = "lores" if lores is not None else "decode"
        self._queue: collections.deque[_Unit | _Plane] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._waiting_keyframe = False
        self._thread: threading.Thread | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids: dict[int, str] = {}
        self._analysed_at: collections.deque[float] = collections.deque()
        self.fed = 0  # access units the worker took
        self.skipped = 0
        self.overruns = 0
        self.cpu_s = 0.0
        self.current_event: str | None = None
        self.enabled = True  # False: detection paused (admin), frames are not looked at
        self._paused_pending = False  # a pause the worker has not acted on yet
        # Announcements wait here until the bus has its subscribers (start_announcing).
        self._announcing = announce_at_once
        self._held: list[tuple[str, dict[str, Any]]] = []
        # The configuration's settings (what a null change returns to) and what was changed
        # at run time, kept in ``saved`` (motion/saved.py) and loaded again by start().
        self.configured = settings
        self.saved_file = saved
        self.saved = SavedMotion()

    @property
    def settings(self) -> MotionSettings:
        """The settings in force."""
        return self.analyser.settings

    def _apply(self, settings: MotionSettings) -> None:
        # One reference swapped: the worker's next frame reads the new settings whole.
        self.analyser.detector.settings = settings
        self.analyser.tracker.settings = settings

    def _remember(self, **changes: Any) -> None:
        self.saved = replace(self.saved, **changes)
        if self.saved_file is not None:
            self.saved_file.save(self.saved)

    def set_sensitivity(self, sensitivity: int | None) -> None:
        """Change the sensitivity while running (the next analysed frame uses it); None: back
        to the configuration's. Saved (a restart keeps it)."""
        value = self.configured.sensitivity if sensitivity is None else sensitivity
        self._apply(replace(self.settings, sensitivity=value))
        self._remember(sensitivity=sensitivity)

    def set_zones(self, zones: tuple[Zone, ...] | None) -> None:
        """Change the zones while running (the next analysed frame looks through them); None:
        back to the configuration's. Saved."""
        value = self.configured.zones if zones is None else zones
        self._apply(replace(self.settings, zones=value))
        self._remember(zones=zones)

    def set_enabled(self, enabled: bool | None) -> None:
        """Pause or resume detection while running (None: on, as configured); a pause ends a
        lasting event (in the worker, which owns the analyser) and a resume starts from a
        fresh background. Saved."""
        self._remember(enabled=enabled)
        self._set_enabled(True if enabled is None else enabled)

    def _set_enabled(self, enabled: bool) -> None:
        with self._cond:
            if enabled == self.enabled:
                return
            self.enabled = enabled
            self._queue.clear()
            self._waiting_keyframe = False  # a resumed decoder waits for a keyframe itself
            self._paused_pending = not enabled
            self._cond.notify()

    async def start(self) -> None:
        """Load the saved settings (over the configuration's) and the stored events, start
        the worker thread and the ring reader."""
        if self.saved_file is not None:
            saved = self.saved = await asyncio.to_thread(self.saved_file.load)
            self._apply(replace(
                self.configured,
                sensitivity=(self.configured.sensitivity if saved.sensitivity is None
                             else saved.sensitivity),
                zones=self.configured.zones if saved.zones is None else saved.zones))
            if saved.enabled is not None:
                self._set_enabled(saved.enabled)
        if self.store is not None:
            count = await asyncio.to_thread(self.store.load)
            log.debug("camera %s: %d motion events loaded", self.camera, count)
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name=f"motion-{self.camera}",
                                        daemon=True)
        self._thread.start()
        if self.lores is not None:
            self.lores.lores_sink = self._offer_plane
        else:
            self._reader_task = asyncio.create_task(self._read(), name=f"motion-{self.camera}")

    async def stop(self) -> None:
        """Stop reading, let the worker finish what it holds, end a lasting event."""
        if self.lores is not None:
            self.lores.lores_sink = None
        task, self._reader_task = self._reader_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with self._cond:
            self._stopping = True
            self._cond.notify()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join)
        await asyncio.to_thread(self.analyser.finish)
        if self.saved_file is not None:
            await self.saved_file.flush()

    async def _read(self) -> None:
        reader = self.ring.reader("keyframe")
        overruns = 0
        gap = False
        try:
            while True:
                view = await reader.next()
                if reader.overruns != overruns:  # lapped: the reader jumped to a keyframe
                    self.overruns += reader.overruns - overruns
                    overruns = reader.overruns
                    gap = True
                self._offer(_Unit(bytes(view.data), view.keyframe, view.capture_time_us, gap))
                gap = False
        finally:
            reader.close()

    def _offer(self, unit: _Unit) -> None:
        """Queue ``unit`` for the worker, or skip it (counted) when the worker is behind."""
        with self._cond:
            if not self.enabled:
                return
            if self._waiting_keyframe:
                if not unit.keyframe:
                    self.skipped += 1
                    return
                self._waiting_keyframe = False
                unit.after_gap = True
            elif len(self._queue) >= self.max_backlog:
                self.skipped += len(self._queue)
                self._queue.clear()
                if not unit.keyframe:
                    self.skipped += 1
                    self._waiting_keyframe = True
                    return
                unit.after_gap = True
            self._queue.append(unit)
            self._cond.notify()

    def _offer_plane(self, copy_plane: Callable[[], Any], t: float) -> None:
        """The lores path (camera thread): take the plane if it is due and the worker has room;
        a frame it has no room for is skipped and counted."""
        analyser = self.analyser
        with self._cond:
            if not self.enabled or not analyser.due(t):
                return
            if len(self._queue) >= self.max_backlog:
                self.skipped += 1
                return
        plane = copy_plane()  # the request's buffer is the camera's again after this call
        with self._cond:
            self._queue.append(_Plane(plane, t))
            self._cond.notify()

    def _work(self) -> None:
        analyser = self.analyser
        while True:
            with self._cond:
                while not self._queue and not self._stopping and not self._paused_pending:
                    self._cond.wait()
                paused, self._paused_pending = self._paused_pending, False
                unit = self._queue.popleft() if self._queue else None
            if paused:
                analyser.finish()  # a lasting event ends now
                analyser.detector.reset()
                if isinstance(analyser, DecodeAnalyser):
                    analyser.restart()
            if unit is None:
                if self._stopping:
                    return
                continue
            self.fed += 1
            try:
                result = self._analyse(unit)
            except Exception:  # a detector bug must not end detection for good
                log.exception("camera %s: motion analysis failed", self.camera)
                if isinstance(analyser, DecodeAnalyser):
                    analyser.restart()
                result = None
            if result is not None:
                now = time.monotonic()
                self._analysed_at.append(now)
                while self._analysed_at and self._analysed_at[0] < now - FPS_WINDOW_S:
                    self._analysed_at.popleft()
            self.cpu_s = time.thread_time()

    def _analyse(self, item: _Unit | _Plane) -> Any:
        analyser = self.analyser
        if isinstance(item, _Plane):
            assert isinstance(analyser, LoresAnalyser)
            return analyser.analyse(item.luma, item.t)
        assert isinstance(analyser, DecodeAnalyser)
        if item.after_gap:
            analyser.restart()
        return analyser.feed(item.data, item.keyframe, item.capture_time_us)

    def _on_transition(self, transition: Transition,
                       snapshot: Callable[[], bytes] | None) -> None:
        """In the worker thread: keep the event (and its peak picture) and announce it."""
        if transition.kind == "peak":
            return
        event = transition.event
        key = id(event)
        if transition.kind == "started":
            self._ids[key] = event_id(event.start, self.camera)
        name = self._ids.get(key) or event_id(event.start, self.camera)
        if transition.kind == "ended":
            self._ids.pop(key, None)
        jpeg = b""
        if snapshot is not None:
            try:
                jpeg = snapshot()
            except Exception:  # a picture that does not encode loses the snapshot only
                log.exception("camera %s: motion snapshot failed", self.camera)
        stored = self._stored(name, event, has_snapshot=bool(jpeg) or self._had_snapshot(name))
        if self.store is not None:
            self.store.put(stored, jpeg or None)
        self.current_event = name if transition.kind == "started" else None
        data = {"camera": self.camera, "event_id": name,
                "score": round(event.peak_score, 4), "start": round(event.start, 3),
                "snapshot": stored.to_json()["snapshot"]}
        if event.end is not None:
            data["end"] = round(event.end, 3)
        self._announce(f"motion_{transition.kind}", data)

    def _had_snapshot(self, name: str) -> bool:
        known = self.store.get(name) if self.store is not None else None
        return bool(known and known.snapshot)

    def _stored(self, name: str, event: MotionEvent, *, has_snapshot: bool) -> StoredEvent:
        return StoredEvent(id=name, camera=self.camera, kind="motion",
                           start=round(event.start, 3),
                           end=None if event.end is None else round(event.end, 3),
                           peak_score=round(event.peak_score, 4),
                           peak_time=round(event.peak_time, 3), snapshot=has_snapshot)

    def start_announcing(self) -> None:
        """Publish from now on, first what was held since :meth:`start` (the appliance calls
        this once MQTT and webhooks subscribe: an event in the first seconds reaches them)."""
        self._announcing = True
        held, self._held = self._held, []
        for name, data in held:
            if self._publish is not None:
                self._publish(name, **data)

    def _announce(self, name: str, data: dict[str, Any]) -> None:
        if self._publish is None:
            return
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._deliver(name, data)
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody to tell
            loop.call_soon_threadsafe(self._deliver, name, data)

    def _deliver(self, name: str, data: dict[str, Any]) -> None:
        """On the loop: publish, or hold until :meth:`start_announcing`."""
        if not self._announcing:
            self._held.append((name, data))
        elif self._publish is not None:
            self._publish(name, **data)

    @property
    def active(self) -> bool:
        """Whether an event lasts."""
        return self.analyser.tracker.event is not None

    def meter(self) -> dict[str, Any]:
        """The live meter (the page's tuner, the event stream): the current score (0 while
        paused), the score that is motion at the sensitivity in force, whether an event
        lasts. Cheap: no counters are summed."""
        return {"score": round(self.analyser.detector.score, 4) if self.enabled else 0.0,
                "threshold": round(share_threshold(self.settings.sensitivity), 4),
                "active": self.active, "enabled": self.enabled}

    def stats(self) -> dict[str, Any]:
        """Counters and state for ``/api/status``, ``/metrics`` and MQTT."""
        analyser = self.analyser
        now = time.monotonic()
        recent = [t for t in list(self._analysed_at) if t >= now - FPS_WINDOW_S]
        return {
            "enabled": self.enabled,
            "active": self.active,
            "event": self.current_event,
            "score": round(analyser.detector.score, 4),
            "sensitivity": self.settings.sensitivity,
            "zones": len(self.settings.zones),
            "fps": round(len(recent) / FPS_WINDOW_S, 2),
            "path": self.path,
            "stream": self.stream,
            # The decoded pictures' size (the decode path), None before the first.
            "picture": list(picture) if (picture := getattr(analyser, "picture", None)) else None,
            "fed": self.fed,
            "decoded": getattr(analyser, "decoded", 0),
            "analysed": analyser.analysed,
            "skipped": self.skipped,
            "overruns": self.overruns,
            "decode_errors": getattr(analyser, "decode_errors", 0),
            "suppressed": analyser.detector.suppressed,
            "events": analyser.tracker.events,
            "storm_held": analyser.tracker.storm_held,
            "stored_events": len(self.store) if self.store is not None else 0,
            "cpu_seconds": round(self.cpu_s, 3),
            "backlog": len(self._queue),
        }
