"""``ruseon check``: diagnose the machine the appliance is about to run on.

Each check prints one line, ``ok``/``warn``/``FAIL`` plus what it found. The machine is healthy
when no check fails; warnings (no camera, so the synthetic source will be used) do not fail it.
"""

from __future__ import annotations

import errno
import glob
import importlib.util
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .capture.sources.rpicam import HELP_TIMEOUT_S, RpicamFeatures, libav_options, parse_help
from .capture.sources.soc import DEVICE_TREE_COMPATIBLE, is_bcm2712
from .config import CameraConfig, Config, HostPort


@dataclass(frozen=True, slots=True)
class Finding:
    """The outcome of one check."""

    name: str
    verdict: str  # "ok", "warn" or "FAIL"
    detail: str


def _needs_pi_camera(camera: CameraConfig) -> bool:
    source = camera.source_kind
    return not (source == "synthetic" or source.startswith(("file:", "rtsp://", "rtsps://")))


def _pi_camera(config: Config) -> CameraConfig:
    """The camera whose source is the Pi's camera stack (the first such), else the default."""
    return next((c for c in config.cameras if _needs_pi_camera(c)), config.default_camera)


def check_camera(config: Config) -> Finding:
    """A Pi camera is present when picamera2 or rpicam-vid exists and a media device is there
    (checked when any camera's source is the Pi's camera stack)."""
    camera = _pi_camera(config)
    source = camera.source_kind
    if not _needs_pi_camera(camera):
        sources = ", ".join(dict.fromkeys(c.source_kind for c in config.cameras))
        return Finding("camera", "ok", f"source is {sources}; no camera needed")
    has_picamera2 = importlib.util.find_spec("picamera2") is not None
    # rpicam_command may carry arguments (e.g. a wrapper): look up its executable.
    argv = shlex.split(camera.rpicam_command)
    rpicam = shutil.which(argv[0]) if argv else None
    media = sorted(glob.glob("/dev/media*"))
    found = []
    if has_picamera2:
        found.append("picamera2 importable")
    if rpicam:
        found.append(f"{camera.rpicam_command} at {rpicam}")
    if media:
        found.append("media devices " + " ".join(media))
    if (has_picamera2 or rpicam) and media:
        return Finding("camera", "ok", "; ".join(found))
    verdict = "FAIL" if source in ("picamera", "rpicam") else "warn"
    what = "; ".join(found) or "no picamera2, no rpicam-vid, no /dev/media*"
    fallback = "" if verdict == "FAIL" else " (the synthetic test camera will be used)"
    return Finding("camera", verdict, f"no camera found: {what}{fallback}")


def _rpicam_features(config: Config) -> RpicamFeatures | None:
    """What ``rpicam-vid --help`` lists, or None without the binary (a CLI: blocking is fine)."""
    argv = shlex.split(_pi_camera(config).rpicam_command)
    if not argv or shutil.which(argv[0]) is None:
        return None
    try:
        result = subprocess.run([*argv, "--help"], capture_output=True, text=True,
                                timeout=HELP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_help(result.stdout + result.stderr)


def _bcm2712_encoder(config: Config, software: str) -> Finding:
    """BCM2712 (Pi 5, CM5, Pi 500): no hardware H.264; say how each source will encode."""
    parts = [f"BCM2712, no hardware H.264: picamera2 uses {software or 'libx264 (missing!)'}"]
    features = _rpicam_features(config)
    if features is not None:
        options = " ".join(libav_options(features)) or "no libav options"
        parts.append(f"rpicam-vid uses libx264 via libav with {options}")
        if not features.low_latency:
            parts.append("rpicam-vid has no --low-latency (rpicam-apps < 1.6.0)"
                         + ("; B-frames off via bf=0" if features.libav_codec_opts else
                            ": libx264 may emit B-frames"))
    verdict = "ok" if software or features is not None else "FAIL"
    return Finding("encoder", verdict, "; ".join(parts))


def check_encoder(config: Config, compatible_path: Path = DEVICE_TREE_COMPATIBLE) -> Finding:
    """Hardware H.264 (V4L2 M2M on Pi 4/3/Zero 2 W) or libx264 through PyAV.

    On BCM2712 boards (device tree ``compatible``) it also says which rpicam-vid options the
    rpicam source will use there, from that binary's ``--help``.
    """
    try:
        import av

        av.codec.Codec("libx264", "w")
        software = "libx264 (PyAV)"
    except Exception as exc:  # any failure means no usable software encoder
        software = ""
        reason = str(exc)
    if is_bcm2712(compatible_path):
        return _bcm2712_encoder(config, software)
    hardware = [d for d in ("/dev/video11",) if os.path.exists(d)]
    if hardware:
        return Finding(
            "encoder", "ok", f"V4L2 M2M encoder {hardware[0]}; software: {software or '-'}"
        )
    if software:
        return Finding("encoder", "ok", software)
    return Finding("encoder", "FAIL", f"no H.264 encoder: {reason}")


def _port_free(kind: int, addr: HostPort) -> str | None:
    family = socket.AF_INET6 if ":" in addr.host else socket.AF_INET
    with socket.socket(family, kind) as sock:
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((addr.host, addr.port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use (is the service already running?)"
            return exc.strerror or str(exc)
    return None


def check_ports(config: Config) -> list[Finding]:
    """The HTTP (TCP) and WebRTC (UDP) ports can be bound."""
    out = []
    for name, kind, addr in (
        ("http port", socket.SOCK_STREAM, config.http.listen),
        ("webrtc port", socket.SOCK_DGRAM, config.webrtc.listen),
    ):
        problem = _port_free(kind, addr)
        out.append(Finding(name, "FAIL" if problem else "ok", f"{addr} {problem or 'free'}"))
    return out


def check_state_dir(config: Config) -> Finding:
    """The state directory exists (or can be created) and is writable."""
    path = Path(config.state.dir)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as exc:
        return Finding("state dir", "FAIL", f"{path}: {exc.strerror or exc}")
    return Finding("state dir", "ok", f"{path} writable")


def check_systemd(_: Config) -> Finding:
    """Whether systemd is the init system, and how the notify protocol will be spoken."""
    if not os.path.isdir("/run/systemd/system"):
        return Finding("systemd", "warn", "not booted with systemd (fine for development)")
    binding = "systemd-python" if importlib.util.find_spec("systemd") else "raw $NOTIFY_SOCKET"
    return Finding("systemd", "ok", f"running under systemd; notify via {binding}")


CHECKS: tuple[Callable[[Config], Finding | list[Finding]], ...] = (
    check_camera,
    check_encoder,
    check_ports,
    check_state_dir,
    check_systemd,
)


def run_checks(config: Config, out: TextIO) -> bool:
    """Run every check, print one line each, return True when none failed."""
    healthy = True
    for check in CHECKS:
        result = check(config)
        for finding in result if isinstance(result, list) else [result]:
            out.write(f"{finding.verdict:<4} {finding.name:<12} {finding.detail}\n")
            healthy = healthy and finding.verdict != "FAIL"
    out.write("healthy\n" if healthy else "NOT healthy\n")
    return healthy
