"""The rpicam source: ``rpicam-vid ... --inline --flush -o -`` as a supervised child process.

For boards where picamera2 is not importable but rpicam-apps are installed. stdout carries Annex B
(SPS/PPS inline before every IDR); it is split into access units here. If the child dies it is
restarted with exponential backoff; a keyframe request restarts it (rate-limited), since a
running ``rpicam-vid`` cannot be asked for an IDR.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...config import CameraConfig
from ..access_unit import VIDEO_CLOCK_RATE, AccessUnit
from ..h264 import AccessUnitSplitter
from .base import Deliver

log = logging.getLogger(__name__)

_DEVICE_MODEL = Path("/proc/device-tree/model")


def is_pi5(model_path: Path = _DEVICE_MODEL) -> bool:
    """True on a Raspberry Pi 5 (no hardware H.264: rpicam-vid uses libx264 there)."""
    try:
        return "Raspberry Pi 5" in model_path.read_text(errors="replace")
    except OSError:
        return False


def rpicam_command(camera: CameraConfig, *, pi5: bool | None = None) -> list[str]:
    """The full ``rpicam-vid`` argument list for ``camera``."""
    argv = [
        *shlex.split(camera.rpicam_command),
        "-t", "0", "-n",
        "--codec", "h264",
        "--inline", "--flush",
        "--intra", str(camera.keyframe_interval),
        "--profile", camera.profile,
        "--width", str(camera.width),
        "--height", str(camera.height),
        "--framerate", str(camera.framerate),
        "--bitrate", str(camera.bitrate),
    ]  # fmt: skip
    if camera.hflip:
        argv.append("--hflip")
    if camera.vflip:
        argv.append("--vflip")
    if camera.exposure_us:
        argv += ["--shutter", str(camera.exposure_us)]
    if camera.gain:
        argv += ["--gain", str(camera.gain)]
    if camera.awb and camera.awb != "auto":
        argv += ["--awb", camera.awb]
    if is_pi5() if pi5 is None else pi5:
        argv.append("--low-latency")  # otherwise libx264 on the Pi 5 emits B-frames
    return [*argv, "-o", "-"]


class RpicamSource:
    """Supervises ``rpicam-vid``; delivers what it writes as access units.

    ``backoff_s`` is the first and the largest delay between restarts after a crash;
    ``keyframe_restart_interval_s`` the shortest time between restarts made for keyframes.
    """

    kind = "rpicam"

    def __init__(
        self,
        camera: CameraConfig,
        *,
        argv: Sequence[str] | None = None,
        backoff_s: tuple[float, float] = (0.5, 10.0),
        keyframe_restart_interval_s: float = 10.0,
    ) -> None:
        self._camera = camera
        self.argv = list(argv) if argv is not None else rpicam_command(camera)
        self._backoff = backoff_s
        self._keyframe_restart_interval = keyframe_restart_interval_s
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._wake = asyncio.Event()
        self._restart_for_keyframe = False
        self._last_keyframe_restart: float | None = None
        self._t0 = 0.0
        self._last_pts = -1
        self._stderr_tail: deque[str] = deque(maxlen=5)
        self.starts = 0
        self.crashes = 0
        self.keyframe_restarts = 0
        self.keyframe_requests_ignored = 0
        self.frames = 0
        self.discarded_bytes = 0

    async def start(self, deliver: Deliver) -> None:
        """Start the supervisor task (which spawns the child)."""
        if self._task is not None:
            return
        self._stopping = False
        self._wake = asyncio.Event()
        self._t0 = time.monotonic()
        self._task = asyncio.create_task(self._supervise(deliver), name="rpicam-supervisor")

    async def stop(self) -> None:
        """Stop the child and the supervisor."""
        self._stopping = True
        self._wake.set()
        await self._terminate()
        task, self._task = self._task, None
        if task is None:
            return
        # Let the supervisor wind down by itself: cancelling it while it spawns a child would
        # leave that child to be reaped behind asyncio's back.
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def request_keyframe(self) -> None:
        """Restart the child for an immediate IDR, at most once per the restart interval."""
        now = time.monotonic()
        last = self._last_keyframe_restart
        if self._proc is None or (last is not None and
                                  now - last < self._keyframe_restart_interval):
            self.keyframe_requests_ignored += 1
            return
        self._last_keyframe_restart = now
        self._restart_for_keyframe = True
        self.keyframe_restarts += 1
        log.info("restarting rpicam-vid for a keyframe")
        asyncio.get_running_loop().create_task(self._terminate())

    def stats(self) -> dict[str, Any]:
        """Supervision counters."""
        return {
            "starts": self.starts,
            "crashes": self.crashes,
            "keyframe_restarts": self.keyframe_restarts,
            "keyframe_requests_ignored": self.keyframe_requests_ignored,
            "frames": self.frames,
            "discarded_bytes": self.discarded_bytes,
        }

    async def _supervise(self, deliver: Deliver) -> None:
        loop = asyncio.get_running_loop()
        delay = self._backoff[0]
        while not self._stopping:
            began = loop.time()
            returncode: int | None = None
            try:
                returncode = await self._run_once(deliver)
            except OSError as exc:
                log.error("cannot run %s: %s", self.argv[0], exc)
            if self._stopping:
                return
            if self._restart_for_keyframe:
                self._restart_for_keyframe = False
                continue
            self.crashes += 1
            if loop.time() - began > 30:
                delay = self._backoff[0]  # it ran fine for a while: start the backoff afresh
            log.warning("rpicam-vid exited (code %s%s); restarting in %.1f s", returncode,
                        f", stderr: {' | '.join(self._stderr_tail)}" if self._stderr_tail else "",
                        delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)  # stop() cuts the wait short
            delay = min(delay * 2, self._backoff[1])

    async def _run_once(self, deliver: Deliver) -> int | None:
        proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._proc = proc
        self.starts += 1
        self._stderr_tail.clear()
        if self._stopping:
            await self._terminate()
        assert proc.stdout is not None and proc.stderr is not None
        stderr_task = asyncio.create_task(self._drain_stderr(proc.stderr))
        splitter = AccessUnitSplitter(max_au_bytes=self._camera.max_frame_bytes)
        # rpicam-vid --flush writes each frame at once: a pause of a third of a frame interval
        # means the pending access unit is complete, so emit it without waiting for the next.
        idle = max(0.005, 1.0 / self._camera.framerate / 3)
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(proc.stdout.read(256 * 1024), idle)
                except TimeoutError:
                    unit = splitter.flush()
                    if unit is not None:
                        self._emit(deliver, *unit)
                    continue
                if not chunk:
                    break
                for data, idr in splitter.feed(chunk):
                    self._emit(deliver, data, idr)
            unit = splitter.flush()
            if unit is not None:
                self._emit(deliver, *unit)
        finally:
            self.discarded_bytes += splitter.discarded_bytes
            await self._terminate()
            stderr_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stderr_task
            self._proc = None
        return proc.returncode

    def _emit(self, deliver: Deliver, data: bytes, idr: bool) -> None:
        # Annex B carries no timestamps: stamp arrival time, strictly increasing across restarts.
        pts = int((time.monotonic() - self._t0) * VIDEO_CLOCK_RATE)
        pts = max(pts, self._last_pts + 1)
        self._last_pts = pts
        self.frames += 1
        deliver(AccessUnit(data, pts, idr, time.time_ns() // 1000))

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self._stderr_tail.append(line.decode(errors="replace").strip())

    async def _terminate(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 3)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
