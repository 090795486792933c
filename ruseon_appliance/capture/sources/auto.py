"""Choosing a source from ``camera.source``, including ``auto`` detection."""

from __future__ import annotations

import logging
import shlex
import shutil
import subprocess
from pathlib import Path

from ...config import CameraConfig
from .base import Source, SourceUnavailable
from .file import FileSource
from .picamera import PicameraSource, camera_present, load_picamera2
from .rpicam import RpicamSource
from .synthetic import SyntheticSource

log = logging.getLogger(__name__)


def rpicam_camera_present(camera: CameraConfig, timeout: float = 5.0) -> bool:
    """Whether the rpicam binary exists and lists at least one camera."""
    argv = shlex.split(camera.rpicam_command)
    if not argv or shutil.which(argv[0]) is None:
        return False
    try:
        result = subprocess.run([*argv, "--list-cameras"], capture_output=True, text=True,
                                timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = result.stdout + result.stderr
    return "Available cameras" in text and "No cameras available" not in text


def create_source(camera: CameraConfig) -> Source:
    """Build the source ``camera.source`` names; ``auto`` picks the best one present.

    Raises :class:`SourceUnavailable` when an explicitly chosen source cannot run here.
    """
    kind = camera.source
    if kind == "synthetic":
        return SyntheticSource(camera)
    if kind.startswith("file:"):
        return FileSource(camera, Path(kind[5:]))
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
    try:
        api = load_picamera2()
    except SourceUnavailable:
        api = None
    if api is not None and camera_present(api):
        log.info("camera.source = auto: using picamera2")
        return PicameraSource(camera, api=api)
    if rpicam_camera_present(camera):
        log.info("camera.source = auto: picamera2 unavailable, using %s", camera.rpicam_command)
        return RpicamSource(camera)
    log.info("camera.source = auto: no camera found (picamera2 %s, %s %s); using the synthetic "
             "test camera", "importable" if api else "not importable", camera.rpicam_command,
             "present" if shutil.which(shlex.split(camera.rpicam_command)[0] if
                                       camera.rpicam_command.strip() else "") else "absent")
    return SyntheticSource(camera)
