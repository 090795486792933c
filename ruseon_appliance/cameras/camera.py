"""A named camera (its pipeline, start-up with retries, up/down) and the ordered set of them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..capture.controls import CameraControls, camera_with
from ..capture.liveness import stale_after_s
from ..capture.pipeline import CapturePipeline
from ..capture.sources.auto import NoCameraDetected
from ..capture.sources.base import Deliver, SourceUnavailable
from ..capture.sources.rtsp import redact
from ..capture.substream import SubstreamPlan, SubstreamTap, plan_substream
from ..config import CameraConfig
from ..events import RecordingWatcher, StallWatcher
from ..hls import HlsStream
from ..recording import Recorder
from ..tasks import cancel_and_wait

if TYPE_CHECKING:
    from ..audio.pipeline import AudioPipeline
    from ..motion.monitor import MotionMonitor
    from ..motion.recording import MotionRecording

log = logging.getLogger(__name__)

# Start-up retries of a camera whose source failed: doubling from the first, up to the last.
RETRY_FIRST_S = 2.0
RETRY_MAX_S = 30.0
# A source that does not recover by itself (picamera2, the synthetic camera; rpicam restarts
# its child and RTSP reconnects on their own) and has sent no frame for this long after it had
# sent some is stopped and started again here, then retried like a failed start.
STALL_RESTART_S = 15.0
# How often a started camera is looked at for that.
SUPERVISE_S = 1.0
# A camera whose stop or start has not returned for this long is stuck (a driver hung in a
# worker thread): only a new process frees it, so the watchdog is withheld (app.py).
STUCK_S = 30.0


class UnavailableSource:
    """Stands in for a source that could not even be built (a missing library or binary):
    every start fails with the reason, so the camera is reported and retried like any other
    failing source while the other cameras run."""

    kind = "unavailable"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def start(self, deliver: Deliver) -> None:
        """Fail with the reason the source could not be built."""
        raise SourceUnavailable(self.reason)

    async def stop(self) -> None:
        """Nothing to release."""

    def request_keyframe(self) -> None:
        """Nothing to ask."""

    def stats(self) -> dict[str, Any]:
        """No counters."""
        return {}


# The streams a camera may have (Camera.stream): the main one, and the smaller sub-stream.
STREAM_NAMES = ("main", "sub")


# Controls that change what the stream is (the engine reads them per viewer from
# ``pipeline.camera``: frame duration, catch-up window), not only how the sensor looks.
STREAM_CONTROLS = ("framerate", "bitrate", "resolution")


class Camera:
    """One configured camera and everything that is its own: the :class:`CapturePipeline`
    (source and ring) and, when the appliance gives them (``cameras/assembly.py``), its live
    controls, recorder, HLS stream and event watchers. Every camera is built, started and
    stopped the same way; none is special (the default camera is only routing: ``CameraSet``).

    :meth:`start` never raises for the source's sake: a failure is kept in :attr:`error` and
    the start is retried in the background with back-off until it works or :meth:`stop`.
    """

    controls: CameraControls | None = None
    recorder: Recorder | None = None
    hls: HlsStream | None = None
    # The sub-stream's HLS rendition (on sub.ring; the sub-stream itself: below).
    sub_hls: HlsStream | None = None
    stall_watcher: StallWatcher | None = None
    recording_watcher: RecordingWatcher | None = None
    motion: MotionMonitor | None = None
    motion_recording: MotionRecording | None = None
    # The sub-stream (capture/substream.py): its own pipeline (source and ring; its ``camera``
    # has the sub's size, frame rate and bitrate), started, supervised and stopped with the
    # main one; None when the camera has none (:attr:`sub_reason` says why).
    sub: CapturePipeline | None = None
    sub_reason: str = "no sub-stream configured"
    # Sound (audio/): None when the camera has none (:attr:`audio_reason` says why). Started
    # and stopped with the camera; its failures (an unplugged microphone) are its own.
    audio: AudioPipeline | None = None
    audio_reason: str = "no audio configured"
    _sub_camera: Camera | None = None

    def __init__(self, config: CameraConfig, *, pipeline: CapturePipeline | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.name = config.name
        if pipeline is None:
            try:
                pipeline = CapturePipeline(config)
            except SourceUnavailable as exc:
                pipeline = CapturePipeline(config, source=UnavailableSource(str(exc)))
        self.pipeline = pipeline
        self.error: str | None = None
        # The failure is "no camera detected" (auto on a Pi or the image): worded for people.
        self.missing = False
        self.start_failures = 0
        self.stall_restarts = 0
        # time.monotonic() of the next start attempt while the source is down.
        self.next_attempt: float | None = None
        self._clock = clock
        self._supervisor: asyncio.Task[None] | None = None
        self._stopped = False
        self._started_at: float | None = None
        self._busy_since: float | None = None  # a stop or start of the source is under way

    def add_substream(self, plan: SubstreamPlan | None = None) -> CapturePipeline | None:
        """Give this camera its sub-stream as ``plan`` (default: :func:`plan_substream` of its
        configuration) says: an rtsp:// camera's ``substream_url`` is a second source of its
        own; otherwise the main source encodes it (picamera2's lores encoder, the synthetic
        camera's second encoder) into a :class:`SubstreamTap`. A source that cannot (rpicam,
        a file, a source that could not be built) leaves :attr:`sub` None with the reason."""
        plan = plan_substream(self.config) if plan is None else plan
        if plan.camera is None:
            self.sub_reason = plan.reason
            return None
        if plan.camera.source != self.config.source:  # its own URL
            try:
                pipeline = CapturePipeline(plan.camera)
            except SourceUnavailable as exc:
                pipeline = CapturePipeline(plan.camera, source=UnavailableSource(str(exc)))
        else:
            attach = getattr(self.pipeline.source, "attach_substream", None)
            if not callable(attach):
                self.sub_reason = f"the {self.pipeline.source_kind} source has no sub-stream"
                return None
            tap = SubstreamTap(plan.camera)
            attach(tap)
            pipeline = CapturePipeline(plan.camera, source=tap)
        self.attach_sub(pipeline)
        return pipeline

    def attach_sub(self, pipeline: CapturePipeline) -> None:
        """Make ``pipeline`` this camera's sub-stream (supervised like the main one, by a
        camera of its own that nothing else sees: its failures are its own)."""
        inner = Camera(pipeline.camera, pipeline=pipeline, clock=self._clock)
        inner.name = f"{self.name}/sub"
        self._sub_camera = inner
        self.sub = pipeline
        self.sub_reason = ""

    async def _drop_unsupported_sub(self) -> None:
        """``auto`` found a source without a second encoder (rpicam-vid): no sub-stream."""
        inner, sub = self._sub_camera, self.sub
        source = sub.source if sub is not None else None
        if inner is None or not isinstance(source, SubstreamTap) or not source.unsupported:
            return
        self._sub_camera, self.sub = None, None
        self.sub_reason = source.error or "the source has no sub-stream"
        with contextlib.suppress(Exception):
            await inner.stop()

    def stream(self, name: str) -> CapturePipeline | None:
        """The pipeline of stream ``name``: "main" (always there) or "sub" (None without a
        sub-stream). Raises ValueError for any other name."""
        if name == "main":
            return self.pipeline
        if name == "sub":
            return self.sub
        raise ValueError(f"unknown stream {name!r}: allowed are " + ", ".join(STREAM_NAMES))

    def sub_problem(self) -> str | None:
        """Why the sub-stream is down (as :meth:`problem` for it), None when it is up or absent."""
        inner = self._sub_camera
        return inner.problem() if inner is not None else None

    async def start(self) -> bool:
        """Restore the saved controls, start the source, then the recorder and HLS stream.

        A source that fails is reported (False) and, either way, supervised in the
        background: retried with back-off while it fails, and restarted if it stops sending
        frames and cannot recover by itself, until :meth:`stop`. The recorder and the HLS
        stream start regardless: they wait on the ring for the first frame."""
        self._stopped = False
        if self.controls is not None:
            await self.controls.restore()
            self.follow_stream_controls()
        started = await self._try_start()
        self._supervisor = asyncio.create_task(self._supervise(),
                                               name=f"camera-{self.name}-supervisor")
        if self._sub_camera is not None:  # never raises; its failures are retried on its own
            await self._sub_camera.start()
        if self.recorder is not None:
            await self.recorder.start()
        for hls in (self.hls, self.sub_hls):
            if hls is not None:
                await hls.start()
        if self.motion is not None:
            await self.motion.start()  # reads the ring like the recorder, from its first frame
        if self.audio is not None:
            await self.audio.start()  # never raises: a missing microphone is retried
        return started

    def start_watching(self) -> None:
        """Start the stall and recording watchers (their events name this camera) and the
        motion detector's announcements; the appliance does so once the event bus's
        subscribers are there."""
        for watcher in (self.stall_watcher, self.recording_watcher):
            if watcher is not None:
                watcher.start()
        if self.motion is not None:
            self.motion.start_announcing()

    def follow_stream_controls(self) -> None:
        """The pipeline's ``camera`` (what the engine, RTSP and HLS read per viewer) follows
        the frame rate, bitrate and size set at run time, not only the configured ones."""
        if self.controls is not None:
            self.pipeline.camera = camera_with(self.config, {
                k: v for k, v in self.controls.values.items() if k in STREAM_CONTROLS})

    async def quiesce(self) -> None:
        """The first half of a stop, before the web server closes: the HLS stream wakes its
        held requests, the watchers stop publishing."""
        for hls in (self.hls, self.sub_hls):
            if hls is not None:
                await hls.stop()
        for watcher in (self.stall_watcher, self.recording_watcher):
            if watcher is not None:
                await watcher.stop()

    async def _try_start(self) -> bool:
        self._busy_since = began = self._clock()
        try:
            await self.pipeline.start()
        except Exception as exc:  # any source failure: this camera only
            self.start_failures += 1
            first = self.error is None
            self.error = str(exc) or type(exc).__name__
            self.missing = isinstance(exc, NoCameraDetected)
            # Once per outage at error level; the retries every RETRY_MAX_S at info.
            log.log(logging.ERROR if first else logging.INFO,
                    "camera %s: source %s failed to start: %s", self.name,
                    redact(self.config.source), self.error,
                    extra={"EVENT": "camera_start_failed", "CAMERA": self.name})
            with contextlib.suppress(Exception):
                await self.pipeline.stop()  # so the next start() starts it again
            return False
        finally:
            self._busy_since = None
        await self._drop_unsupported_sub()  # auto chose its source now
        if self.error is not None:
            log.info("camera %s: source started after %d failed attempts", self.name,
                     self.start_failures, extra={"EVENT": "camera_started", "CAMERA": self.name})
        self.error = None
        self.missing = False
        self.next_attempt = None
        # From before the start was asked for: a source delivers its first frames while its
        # start is still returning (picamera2 under load), and a source that froze then is
        # stalled too (CI's loaded run: frames stopped before start() returned, and the camera
        # was never restarted).
        self._started_at = began
        return True

    async def _supervise(self) -> None:
        delay = RETRY_FIRST_S
        while not self._stopped:
            if self.error is not None:  # down: try again after the back-off
                self.next_attempt = self._clock() + delay
                await asyncio.sleep(delay)
                if self._stopped:
                    return
                started = await self._try_start()
                delay = RETRY_FIRST_S if started else min(delay * 2, RETRY_MAX_S)
                continue
            await asyncio.sleep(SUPERVISE_S)
            if not self._stopped and self._stalled():
                await self._restart_stalled()

    def _stalled(self) -> bool:
        """Frames stopped after this start had sent some, and the source does not recover
        by itself (see :data:`STALL_RESTART_S`)."""
        if getattr(self.pipeline.source, "recovers_by_itself", False):
            return False
        last, started = self.pipeline.last_frame_monotonic, self._started_at
        return (last is not None and started is not None and last >= started
                and self._clock() - last > STALL_RESTART_S)

    async def _restart_stalled(self) -> None:
        self.stall_restarts += 1
        log.warning("camera %s: no frame from the %s source for %.0f s; restarting it",
                    self.name, self.pipeline.source_kind, STALL_RESTART_S,
                    extra={"EVENT": "camera_restart", "CAMERA": self.name})
        self._busy_since = self._clock()
        try:
            with contextlib.suppress(Exception):
                await self.pipeline.stop()
        finally:
            self._busy_since = None
        self._started_at = None
        await self._try_start()  # a failure is retried by _supervise with back-off

    def stuck(self) -> bool:
        """A stop or start of the source has not returned for :data:`STUCK_S` (a hung
        driver thread): a service restart is the only way out."""
        busy = self._busy_since
        if self._sub_camera is not None and self._sub_camera.stuck():
            return True
        return busy is not None and self._clock() - busy > STUCK_S

    async def stop(self) -> None:
        """Stop everything of this camera: :meth:`quiesce` if it was not, motion detection, the
        recorder (it closes its segment), the controls' pending write, the supervision and the
        source."""
        await self.quiesce()
        if self.motion is not None:
            await self.motion.stop()  # a lasting event ends (kept, announced)
        if self.motion_recording is not None:
            await self.motion_recording.stop()
        if self.recorder is not None:
            await self.recorder.stop()
        if self.controls is not None:
            await self.controls.flush()  # the values file is written off the loop
        if self.audio is not None:
            await self.audio.stop()
        self._stopped = True
        task, self._supervisor = self._supervisor, None
        await cancel_and_wait(task)
        if self._sub_camera is not None:
            with contextlib.suppress(Exception):  # the main source stops whatever it does
                await self._sub_camera.stop()
        await self.pipeline.stop()

    def problem(self) -> str | None:
        """Why this camera is down (start failure, no frame yet, no frame lately), else None."""
        if self.error is not None:
            retry = ""
            if self.next_attempt is not None:
                retry = f" in {max(0.0, self.next_attempt - self._clock()):.0f} s"
            if self.missing:
                return f"{self.error}; probing again{retry}"
            return (f"source {redact(self.config.source)} failed to start ({self.error}); "
                    f"retrying{retry}")
        last = self.pipeline.last_frame_monotonic
        kind = self.pipeline.source_kind
        if last is None:
            return f"no frame from the {kind} source yet" + self._source_error()
        age = self._clock() - last
        if age > stale_after_s(self.config.framerate):
            return f"no frame from the {kind} source for {age:.1f} s" + self._source_error()
        return None

    def _source_error(self) -> str:
        """The source's own last error (an IP camera refusing, timing out, sending no H.264),
        redacted by the source, as a suffix; empty when it has none."""
        try:
            error = self.pipeline.source.stats().get("last_error")
        except Exception:  # stats are best effort; the problem line must not fail
            return ""
        return f" ({error})" if error else ""

    def status(self, viewers: int) -> dict[str, Any]:
        """This camera's part of ``/api/status``."""
        stats = self.pipeline.stats()
        info = self.pipeline.stream_info
        problem = self.problem()
        return {
            "name": self.name,
            "source": redact(self.config.source),  # an IP camera's URL may carry a password
            "kind": self.pipeline.source_kind,
            "up": problem is None,
            "problem": problem,
            "start_failures": self.start_failures,
            "missing": self.missing,
            "stall_restarts": self.stall_restarts,
            "width": info.width if info else None,
            "height": info.height if info else None,
            "profile_level_id": info.profile_level_id if info else None,
            "fps": stats.get("fps"),
            "bitrate": stats.get("bitrate"),
            "keyframe_age_s": stats.get("keyframe_age_s"),
            "frames_in": stats.get("frames_in"),
            "frames_dropped": stats.get("frames_dropped"),
            "viewers": viewers,
            "motion": self.motion.stats() if self.motion is not None else None,
            "substream": self.substream_status(),
            "audio": (self.audio.stats() if self.audio is not None
                      else {"enabled": False, "reason": self.audio_reason}),
        }

    def substream_status(self) -> dict[str, Any]:
        """The sub-stream's part of this camera's status: its size (as received, else as
        configured), frame rate, bitrate, up/problem; or why there is none."""
        sub = self.sub
        if sub is None:
            return {"enabled": False, "reason": self.sub_reason}
        stats = sub.stats()
        info = sub.stream_info
        problem = self.sub_problem()
        return {
            "enabled": True,
            "kind": sub.source_kind,
            "source": redact(sub.camera.source),
            "up": problem is None,
            "problem": problem,
            "width": info.width if info else sub.camera.width,
            "height": info.height if info else sub.camera.height,
            "configured_width": sub.camera.width,
            "configured_height": sub.camera.height,
            "framerate": sub.camera.framerate,
            "configured_bitrate": sub.camera.bitrate,
            "fps": stats.get("fps"),
            "bitrate": stats.get("bitrate"),
            "keyframe_age_s": stats.get("keyframe_age_s"),
            "frames_in": stats.get("frames_in"),
        }


class CameraSet:
    """The cameras in configured order, and which one is the default: the camera the unnamed
    routes serve (``/whep``, ``/snapshot.jpg``, ``/hls/``, ``/api/camera/controls``,
    ``rtsp://…/stream``, a relay without ``camera``). Routing is the only thing the default
    camera is: it is built, run, recorded and reported like every other."""

    def __init__(self, cameras: Sequence[Camera], *, default: str = "") -> None:
        if not cameras:
            raise ValueError("at least one camera")
        self._cameras = list(cameras)
        self._by_name = {camera.name: camera for camera in self._cameras}
        if default and default not in self._by_name:
            raise ValueError(f"the default camera {default!r} is not one of "
                             + ", ".join(self._by_name))
        self._default = self._by_name[default] if default else self._cameras[0]

    @classmethod
    def from_configs(cls, configs: Sequence[CameraConfig]) -> CameraSet:
        """One :class:`Camera` per configuration."""
        return cls([Camera(config) for config in configs])

    @classmethod
    def from_pipelines(cls, pipelines: Sequence[CapturePipeline]) -> CameraSet:
        """Cameras around pipelines built already (named by their ``camera.name``)."""
        return cls([Camera(p.camera, pipeline=p) for p in pipelines])

    def __iter__(self) -> Iterator[Camera]:
        return iter(self._cameras)

    def __len__(self) -> int:
        return len(self._cameras)

    @property
    def default(self) -> Camera:
        """The camera the unnamed routes serve (configured, else the first listed)."""
        return self._default

    def resolve(self, name: str = "") -> Camera | None:
        """The camera ``name`` names; the default one for an empty name; None if unknown."""
        return self._by_name.get(name) if name else self._default

    @property
    def names(self) -> list[str]:
        """Names in configured order."""
        return [camera.name for camera in self._cameras]

    def get(self, name: str) -> Camera | None:
        """The camera named ``name``, or None."""
        return self._by_name.get(name)

    def of_feed(self, feed: object) -> Camera | None:
        """The camera whose pipeline (main or sub) ``feed`` is (a session's ``feed``), or None."""
        for camera in self._cameras:
            if camera.pipeline is feed or (camera.sub is not None and camera.sub is feed):
                return camera
        return None

    def stream_of_feed(self, feed: object) -> str:
        """"sub" when ``feed`` is a camera's sub-stream, else "main"."""
        camera = self.of_feed(feed)
        return "sub" if camera is not None and camera.sub is feed else "main"

    async def start(self) -> None:
        """Start every camera at once; failures are kept per camera and retried."""
        await asyncio.gather(*(camera.start() for camera in self._cameras))

    async def stop(self) -> None:
        """Stop every camera."""
        await asyncio.gather(*(camera.stop() for camera in self._cameras),
                             return_exceptions=True)

    async def wait_first_frame(self, timeout: float) -> bool:
        """Wait until any camera has its first frame in its ring; False on timeout."""
        waits = [asyncio.ensure_future(camera.pipeline.wait_first_frame(timeout))
                 for camera in self._cameras]
        try:
            for next_done in asyncio.as_completed(waits):
                if await next_done:
                    return True
            return False
        finally:
            for wait in waits:
                wait.cancel()

    def stuck(self) -> list[str]:
        """Names of the cameras whose stop or start hangs (:meth:`Camera.stuck`)."""
        return [camera.name for camera in self._cameras if camera.stuck()]

    def newest_frame_monotonic(self) -> float | None:
        """``time.monotonic()`` of the newest frame of any camera (the watchdog's clock: it
        fires while any camera delivers)."""
        times = [c.pipeline.last_frame_monotonic for c in self._cameras]
        known = [t for t in times if t is not None]
        return max(known) if known else None

    def down(self) -> list[tuple[str, str]]:
        """``(name, why)`` of every camera that is down."""
        out = []
        for camera in self._cameras:
            problem = camera.problem()
            if problem is not None:
                out.append((camera.name, problem))
        return out
