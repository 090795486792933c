"""The rpicam source: ``rpicam-vid ... -o -`` as a supervised child process.

For boards where picamera2 is not importable but rpicam-apps are installed. stdout carries Annex B
(SPS/PPS before every IDR); it is split into access units here. If the child dies it is
restarted with exponential backoff. A running ``rpicam-vid`` cannot be asked for an IDR, and a
keyframe request no longer restarts it (that froze every viewer, split the recording and put a
discontinuity into HLS, for one viewer's PLI): ``keyframes_on_demand`` is False, so the engine
answers a viewer's PLI/FIR for that viewer alone from the ring (``stream/cursor.py``).

Two encoder paths, as rpicam-apps chooses them (``encoder/encoder.cpp``, ``h264_codec_select``):
- VC4 boards (Pi 4, 3, Zero 2 W): the V4L2 hardware encoder; ``--inline`` repeats SPS/PPS before
  every IDR and ``--flush`` writes each frame at once.
- BCM2712 boards (Pi 5, CM5, Pi 500): libx264 through libav (``encoder/libav_encoder.cpp``). It
  picks an output format by itself only for an empty, ``tcp://`` or ``udp://`` output; for
  ``-o -`` it throws "libav: cannot allocate output context, try setting with --libav-format", so
  ``--libav-format h264`` is passed there (and only there: rpicam-apps before 1.8.1 built without
  libav reject the option). ``--inline``/``--flush`` do nothing on that path (libav writes the
  stream; libx264 without a global header repeats SPS/PPS itself). ``--low-latency`` (rpicam-apps
  1.6.0+) turns off libx264's B-frames; it is passed only when ``--help`` lists it, otherwise
  ``--libav-video-codec-opts bf=0`` (1.4.1+) does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shlex
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...config import CameraConfig
from ..access_unit import VIDEO_CLOCK_RATE, AccessUnit
from ..controls import RESTART_PROOF_S, ControlRejected, camera_with, frames_arrived
from ..h264 import AccessUnitSplitter
from .base import Deliver
from .soc import DEVICE_TREE_COMPATIBLE, is_bcm2712

log = logging.getLogger(__name__)

# How long ``rpicam-vid --help`` may take (it starts no camera, but a loaded board is slow).
HELP_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class RpicamFeatures:
    """The options this ``rpicam-vid`` build accepts (from its ``--help``) that vary by version."""

    low_latency: bool = False  # --low-latency: rpicam-apps 1.6.0+
    libav_format: bool = False  # --libav-format: libav builds; every build from 1.8.1
    libav_codec_opts: bool = False  # --libav-video-codec-opts: libav builds from 1.4.1


def parse_help(text: str) -> RpicamFeatures:
    """Read :class:`RpicamFeatures` from ``rpicam-vid --help`` output (boost's option list)."""

    def has(option: str) -> bool:
        return re.search(rf"(?m)^\s*{re.escape(option)}(?![\w-])", text) is not None

    return RpicamFeatures(
        low_latency=has("--low-latency"),
        libav_format=has("--libav-format"),
        libav_codec_opts=has("--libav-video-codec-opts"),
    )


async def command_output(argv: Sequence[str], timeout: float) -> str:
    """What ``argv`` prints (stdout and stderr, stdin closed), run without blocking the loop.

    Raises ``OSError`` when it cannot be started and ``TimeoutError`` when it has not finished
    within ``timeout`` seconds. The child is killed then, and also when the caller is cancelled
    (a stop while ``auto`` still probes), so no probe outlives the one who asked.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return out.decode(errors="replace")


async def probe_features(command: Sequence[str],
                         timeout: float = HELP_TIMEOUT_S) -> RpicamFeatures | None:
    """Run ``command --help`` without blocking the loop; None if it cannot be run or read."""
    try:
        text = await command_output([*command, "--help"], timeout)
    except OSError as exc:
        log.warning("cannot run %s --help: %s", command[0] if command else "rpicam-vid", exc)
        return None
    except TimeoutError:
        log.warning("%s --help did not answer within %.0f s", command[0], timeout)
        return None
    return parse_help(text)


def libav_options(features: RpicamFeatures | None) -> list[str]:
    """The options a BCM2712 board's libav encoder path needs, as far as this build has them."""
    options = []
    if features is None or features.libav_format:
        options += ["--libav-format", "h264"]
    if features is not None and features.low_latency:
        options.append("--low-latency")  # otherwise libx264 there emits B-frames
    elif features is not None and features.libav_codec_opts:
        options += ["--libav-video-codec-opts", "bf=0"]
    return options


def rpicam_command(camera: CameraConfig, *, bcm2712: bool = False,
                   features: RpicamFeatures | None = None) -> list[str]:
    """The full ``rpicam-vid`` argument list for ``camera``.

    ``bcm2712``: the board has no hardware encoder (libav path); ``features``: what this
    rpicam-vid accepts (None: unknown, assume the least).
    """
    argv = [
        *shlex.split(camera.rpicam_command),
        "-t", "0", "-n",
        "--codec", "h264",
        "--intra", str(camera.keyframe_interval),
        "--profile", camera.profile,
        "--width", str(camera.width),
        "--height", str(camera.height),
        "--framerate", str(camera.framerate),
        "--bitrate", str(camera.bitrate),
    ]  # fmt: skip
    if camera.sensor_index:
        argv += ["--camera", str(camera.sensor_index)]  # rpicam:N: the Nth CSI camera
    if bcm2712:
        argv += libav_options(features)
    else:
        argv += ["--inline", "--flush"]
    if camera.hflip:
        argv.append("--hflip")
    if camera.vflip:
        argv.append("--vflip")
    # Each manual setting alone: --shutter leaves the gain automatic and --gain the exposure
    # (rpicam-apps sets ExposureTimeMode / AnalogueGainMode manual only for what is given).
    if camera.exposure_us:
        argv += ["--shutter", str(camera.exposure_us)]
    if camera.gain:
        argv += ["--gain", str(camera.gain)]
    if camera.awb and camera.awb != "auto":
        argv += ["--awb", camera.awb]
    return [*argv, "-o", "-"]


class RpicamSource:
    """Supervises ``rpicam-vid``; delivers what it writes as access units.

    ``backoff_s`` is the first and the largest delay between restarts after a crash.
    """

    kind = "rpicam"
    # It restarts its own child / reconnects with back-off: the camera's supervisor leaves a
    # stall to it (cameras/camera.py).
    recovers_by_itself = True
    # No IDR on request: keyframe requests are answered from the ring, per viewer.
    keyframes_on_demand = False
    # Live camera controls (capture/controls.py): rpicam-vid takes everything on its command
    # line, so every change restarts the child (the ring, and so every viewer, carries on; the
    # new child starts with an IDR, timestamps stay increasing).
    controls = {name: False for name in (
        "exposure_us", "analogue_gain", "awb", "brightness", "contrast", "saturation",
        "sharpness", "hflip", "vflip", "bitrate", "framerate", "resolution")}

    def __init__(
        self,
        camera: CameraConfig,
        *,
        argv: Sequence[str] | None = None,
        compatible_path: Path = DEVICE_TREE_COMPATIBLE,
        backoff_s: tuple[float, float] = (0.5, 10.0),
    ) -> None:
        self._camera = camera
        self._configured = camera
        # --brightness/--contrast/--saturation/--sharpness away from neutral (live controls).
        self._tone: list[str] = []
        self.control_restarts = 0
        # Built in start() (it needs the SoC and, on BCM2712, a --help probe), unless given.
        self.argv: list[str] = list(argv) if argv is not None else []
        self._argv_given = argv is not None
        self._compatible_path = compatible_path
        self.bcm2712: bool | None = None
        self.features: RpicamFeatures | None = None
        self._backoff = backoff_s
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._wake = asyncio.Event()
        self._planned_restart = False
        self._t0 = 0.0
        self._last_pts = -1
        self._stderr_tail: deque[str] = deque(maxlen=5)
        self.starts = 0
        self.crashes = 0
        self.keyframe_requests_ignored = 0
        self.controls_rejected = 0
        self.frames = 0
        self._frames_this_start = 0
        # (start number, exit status, stderr's last lines, argv) of the newest child that ended.
        self._last_exit: tuple[int, int | None, str, list[str]] | None = None
        self._child_argv: list[str] = []  # the running (or last) child's arguments
        self.discarded_bytes = 0

    async def start(self, deliver: Deliver) -> None:
        """Start the supervisor task (which spawns the child)."""
        if self._task is not None:
            return
        if not self._argv_given and not self.argv:
            await self._build_argv()
        self._stopping = False
        self._wake = asyncio.Event()
        if not self._t0:  # once: pts keep counting across stop()/start()
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

    async def _build_argv(self) -> None:
        """Pick the encoder path's arguments: SoC from the device tree, options from --help."""
        bcm2712 = await asyncio.to_thread(is_bcm2712, self._compatible_path)
        features = None
        if bcm2712:
            features = await probe_features(shlex.split(self._camera.rpicam_command))
            if features is None or not features.low_latency:
                log.warning(
                    "%s has no --low-latency (rpicam-apps < 1.6.0)%s", self._camera.rpicam_command,
                    "; passing --libav-video-codec-opts bf=0 so libx264 makes no B-frames"
                    if features is not None and features.libav_codec_opts else
                    ": libx264 on this BCM2712 board may emit B-frames (upgrade rpicam-apps)")
        self.bcm2712, self.features = bcm2712, features
        self.argv = self._with_tone(rpicam_command(self._camera, bcm2712=bcm2712,
                                                   features=features))
        log.info("rpicam-vid on %s: %s", "BCM2712 (libx264 via libav)" if bcm2712 else
                 "a board with the hardware encoder", shlex.join(self.argv))

    def _with_tone(self, argv: list[str]) -> list[str]:
        """``argv`` with the tone options before its final ``-o -``."""
        return [*argv[:-2], *self._tone, *argv[-2:]] if self._tone else argv

    async def apply_controls(self, values: Mapping[str, Any]) -> bool:
        """New arguments for rpicam-vid; restart the running child if they changed (True).

        Proven: True only once a child started with the new arguments delivered a frame. A
        child that exits first (rpicam-vid refusing a value) or sends nothing within
        :data:`RESTART_PROOF_S` puts the previous arguments back, restarted, and raises
        :class:`ControlRejected` with rpicam-vid's own words."""
        previous = (self._camera, self._tone, self.argv)
        self._camera = camera_with(self._configured, values)
        self._tone = []
        for name, neutral in (("brightness", 0.0), ("contrast", 1.0), ("saturation", 1.0),
                              ("sharpness", 1.0)):
            if name in values and float(values[name]) != neutral:
                self._tone += [f"--{name}", f"{float(values[name]):g}"]
        if self._argv_given or self.bcm2712 is None:
            return False  # fixed argv (tests), or not started: start() builds it
        argv = self._with_tone(rpicam_command(self._camera, bcm2712=self.bcm2712,
                                              features=self.features))
        if argv == self.argv:
            return False
        if self._task is None:
            self.argv = argv  # stopped: the next start() uses them
            return False
        log.info("restarting rpicam-vid for new camera controls: %s", shlex.join(argv))
        failure = await self._restart_with(argv)
        if failure is None:
            self.control_restarts += 1
            return True
        self.controls_rejected += 1
        self._camera, self._tone = previous[0], previous[1]
        log.warning("rpicam-vid did not run with the new camera controls (%s); restarting it "
                    "with the previous ones", failure)
        again = await self._restart_with(previous[2])
        raise ControlRejected(
            f"rpicam-vid did not run with them: {failure}; "
            + ("the previous values are back" if again is None else
               f"and the previous values did not run either ({again})"))

    async def _restart_with(self, argv: list[str]) -> str | None:
        """Restart the child with ``argv``: None once it delivered a frame, else why not."""
        self.argv = argv
        before = self.starts
        if self._proc is not None:
            self._planned_restart = True  # a planned restart, not a crash
        await self._terminate()
        self._wake.set()  # a child in its crash back-off starts now (the supervisor clears it)

        # Only a child started with ``argv`` counts, either way (the supervisor may have been
        # spawning one with the arguments before when they changed).
        def frames() -> int:
            return (self._frames_this_start
                    if self.starts > before and self._child_argv == argv else 0)

        def failed() -> str | None:
            exit_ = self._last_exit
            if exit_ is None or exit_[0] <= before or exit_[3] != argv:
                return None
            return f"exited with status {exit_[1]}" + (f" ({exit_[2]})" if exit_[2] else "")

        return await frames_arrived(frames, 0, RESTART_PROOF_S, failed)

    def request_keyframe(self) -> None:
        """Nothing to do: rpicam-vid makes an IDR only every ``--intra`` frames (counted)."""
        self.keyframe_requests_ignored += 1

    def stats(self) -> dict[str, Any]:
        """Supervision counters."""
        return {
            "starts": self.starts,
            "crashes": self.crashes,
            "control_restarts": self.control_restarts,
            "controls_rejected": self.controls_rejected,
            "keyframe_requests_ignored": self.keyframe_requests_ignored,
            "frames": self.frames,
            "discarded_bytes": self.discarded_bytes,
            "bcm2712": self.bcm2712,
            "low_latency": "--low-latency" in self.argv,
            # Why the camera is not delivering (its problem line names it): the newest child's
            # exit, while no child since has sent a frame ("" while frames flow).
            "last_error": self._last_error(),
        }

    def _last_error(self) -> str:
        exit_ = self._last_exit
        if exit_ is None or self._frames_this_start or self._stopping:
            return ""
        return f"rpicam-vid exited with status {exit_[1]}" + (f": {exit_[2]}" if exit_[2] else "")

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
            if self._planned_restart:
                self._planned_restart = False
                continue
            self.crashes += 1
            if loop.time() - began > 30:
                delay = self._backoff[0]  # it ran fine for a while: start the backoff afresh
            log.warning("rpicam-vid exited (code %s%s); restarting in %.1f s", returncode,
                        f", stderr: {' | '.join(self._stderr_tail)}" if self._stderr_tail else "",
                        delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):  # stop() (or a control change) cuts it short
                    await self._wake.wait()
            if not self._stopping:
                self._wake.clear()
            delay = min(delay * 2, self._backoff[1])

    async def _run_once(self, deliver: Deliver) -> int | None:
        argv = list(self.argv)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._proc = proc
        self.starts += 1
        self._child_argv = argv
        self._frames_this_start = 0
        self._stderr_tail.clear()
        if self._stopping:
            await self._terminate()
        assert proc.stdout is not None and proc.stderr is not None
        stderr_task = asyncio.create_task(self._drain_stderr(proc.stderr))
        splitter = AccessUnitSplitter(max_au_bytes=self._camera.max_frame_bytes)
        # rpicam-vid --flush writes each frame at once (libav on BCM2712 writes each packet): a
        # pause of a third of a frame interval means the pending access unit is complete, so
        # emit it without waiting for the next.
        idle = max(0.005, 1.0 / self._camera.framerate / 3)
        try:
            while True:
                try:
                    async with asyncio.timeout(idle):
                        chunk = await proc.stdout.read(256 * 1024)
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
            # Its last words (why it refused an option) come after it exited: read them.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(0.5):
                    await asyncio.shield(stderr_task)
            stderr_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stderr_task
            self._last_exit = (self.starts, proc.returncode, " | ".join(self._stderr_tail), argv)
            self._proc = None
        return proc.returncode

    def _emit(self, deliver: Deliver, data: bytes, idr: bool) -> None:
        # Annex B carries no timestamps: stamp arrival time, strictly increasing across restarts.
        pts = int((time.monotonic() - self._t0) * VIDEO_CLOCK_RATE)
        pts = max(pts, self._last_pts + 1)
        self._last_pts = pts
        self.frames += 1
        self._frames_this_start += 1
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
            async with asyncio.timeout(3):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
