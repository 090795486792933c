"""Choosing a source from ``camera.source``, including ``auto`` detection.

``auto`` probes for a camera (importing picamera2 and asking libcamera, or running
``rpicam-vid --list-cameras``), which takes from a fraction of a second to several on a Pi.
That happens in :meth:`AutoSource.start`, in a worker thread and an asynchronous child process,
so the event loop keeps serving while the camera is looked for.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...config import CameraConfig
from ..controls import ControllableSource
from .base import Deliver, Source, SourceUnavailable
from .board import camera_expected
from .file import FileSource
from .picamera import PicameraSource, camera_present, load_picamera2
from .rpicam import RpicamSource, command_output
from .rtsp import RtspSource

if TYPE_CHECKING:
    from ..substream import SubstreamTap

log = logging.getLogger(__name__)


async def rpicam_camera_present(camera: CameraConfig, timeout: float = 5.0) -> bool:
    """Whether the rpicam binary exists and lists at least one camera (without blocking)."""
    argv = shlex.split(camera.rpicam_command)
    if not argv or shutil.which(argv[0]) is None:
        return False
    try:
        text = await command_output([*argv, "--list-cameras"], timeout)
    except (OSError, TimeoutError):
        return False
    return "Available cameras" in text and "No cameras available" not in text


class NoCameraDetected(SourceUnavailable):
    """``auto`` found no camera where one is expected (a Raspberry Pi, the image); ``str``
    says what was probed. The camera is probed again with back-off (cameras/camera.py)."""


async def choose_source(camera: CameraConfig, *, expected: str = "") -> Source:
    """``auto``: picamera2 with a camera, else rpicam-vid with a camera, else synthetic.

    ``expected`` (:func:`board.camera_expected`): why a real camera belongs here; then no
    camera is :class:`NoCameraDetected`, never the test picture.
    """
    try:
        api = await asyncio.to_thread(load_picamera2)
    except SourceUnavailable:
        api = None
    if api is not None and await asyncio.to_thread(camera_present, api):
        log.info("camera.source = auto: using picamera2")
        return PicameraSource(camera, api=api)
    if await rpicam_camera_present(camera):
        log.info("camera.source = auto: picamera2 unavailable, using %s", camera.rpicam_command)
        return RpicamSource(camera)
    argv = shlex.split(camera.rpicam_command)
    probed = (f"picamera2 {'lists no camera' if api else 'not importable'}, "
              f"{camera.rpicam_command} "
              f"{'lists no camera' if argv and shutil.which(argv[0]) else 'not installed'}")
    if expected:
        raise NoCameraDetected(f"no camera detected (probed: {probed}) on {expected}")
    log.info("camera.source = auto: no camera found (%s); using the synthetic test camera",
             probed)
    return synthetic_source(camera)


def synthetic_source(camera: CameraConfig) -> Source:
    """The synthetic test camera, imported only when chosen: it draws its pictures with numpy
    and encodes them with PyAV, which a camera or file source never needs (numpy alone is
    ~20 MiB of RSS)."""
    from .synthetic import SyntheticSource

    return SyntheticSource(camera)


class AutoSource:
    """``camera.source = auto``: finds the camera in :meth:`start`, then is that source.

    Where a camera is expected (``expected``, :func:`board.camera_expected` by default) and
    none answers, :meth:`start` raises :class:`NoCameraDetected` and the next start probes
    again, so a camera plugged in later is found without a restart.
    """

    def __init__(self, camera: CameraConfig, *, expected: str | None = None) -> None:
        self._camera = camera
        self.expected = camera_expected() if expected is None else expected
        self.chosen: Source | None = None
        self._stopped = False
        # Camera controls set before a source was chosen (the saved ones at start-up).
        self._control_values: dict[str, Any] = {}
        self.substream: SubstreamTap | None = None

    def attach_substream(self, tap: SubstreamTap) -> None:
        """The sub-stream, for the source chosen at start (picamera2 and the synthetic camera
        encode one; rpicam-vid cannot: the tap then says so)."""
        self.substream = tap

    @property
    def kind(self) -> str:
        """The chosen source's kind; "auto" until :meth:`start` has chosen."""
        return self.chosen.kind if self.chosen is not None else "auto"

    async def start(self, deliver: Deliver) -> None:
        """Probe (off the loop) on the first start, then start the chosen source."""
        self._stopped = False
        if self.chosen is None:
            chosen = await choose_source(self._camera, expected=self.expected)
            if isinstance(chosen, ControllableSource) and self._control_values:
                await chosen.apply_controls({k: v for k, v in self._control_values.items()
                                             if k in chosen.controls})
            tap = self.substream
            if tap is not None:
                attach = getattr(chosen, "attach_substream", None)
                tap.main_kind = chosen.kind
                if callable(attach):
                    attach(tap)
                else:
                    tap.refuse(f"the {chosen.kind} source auto found has none (it runs one "
                               "encoder)")
            self.chosen = chosen
            if self._stopped:  # stop() came while the camera was being looked for
                return
        await self.chosen.start(deliver)

    async def stop(self) -> None:
        """Stop the chosen source, if any (or keep a probe under way from starting it)."""
        self._stopped = True
        if self.chosen is not None:
            await self.chosen.stop()

    @property
    def controls(self) -> Mapping[str, bool]:
        """The chosen source's camera controls (none before one is chosen)."""
        chosen = self.chosen
        return chosen.controls if isinstance(chosen, ControllableSource) else {}

    async def apply_controls(self, values: Mapping[str, Any]) -> bool:
        """The chosen source's; before one is chosen, kept for it (applied before it starts)."""
        chosen = self.chosen
        restarted = False
        if isinstance(chosen, ControllableSource):
            restarted = await chosen.apply_controls({k: v for k, v in values.items()
                                                     if k in chosen.controls})
        self._control_values = dict(values)  # not when refused (raised above)
        return restarted

    @property
    def recovers_by_itself(self) -> bool:
        """The chosen source's (see cameras/camera.py); False before one is chosen."""
        return bool(getattr(self.chosen, "recovers_by_itself", False))

    @property
    def keyframes_on_demand(self) -> bool:
        """Whether the chosen source can make an IDR when asked (True before one is)."""
        return bool(getattr(self.chosen, "keyframes_on_demand", True))

    def request_keyframe(self) -> None:
        """Forward to the chosen source (nothing to do before one is chosen)."""
        if self.chosen is not None:
            self.chosen.request_keyframe()

    def stats(self) -> dict[str, Any]:
        """The chosen source's counters."""
        return self.chosen.stats() if self.chosen is not None else {}


def create_source(camera: CameraConfig) -> Source:
    """Build the source ``camera.source`` names; ``auto`` picks the best one present at start.

    Raises :class:`SourceUnavailable` when an explicitly chosen source cannot run here.
    """
    kind = camera.source_kind  # picamera:1 -> picamera (the index is camera.sensor_index)
    if kind == "synthetic":
        return synthetic_source(camera)
    if kind.startswith("file:"):
        return FileSource(camera, Path(kind[5:]))
    if kind.startswith(("rtsp://", "rtsps://")):
        return RtspSource(camera, kind)
    if kind == "rpicam":
        argv = shlex.split(camera.rpicam_command)
        if not argv or shutil.which(argv[0]) is None:
            raise SourceUnavailable(f"camera.source = rpicam needs {camera.rpicam_command!r} "
                                    "(install rpicam-apps, or set camera.rpicam_command)")
        return RpicamSource(camera)
    if kind == "picamera":
        load_picamera2()  # fail now, with the install hint, rather than at start()
        return PicameraSource(camera)
    if kind != "auto":
        raise SourceUnavailable(f"camera.source = {kind!r} is not a known source")
    return AutoSource(camera)
