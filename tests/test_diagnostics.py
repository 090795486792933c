"""``ruseon check``'s encoder line on a BCM2712 board (device tree and rpicam-vid stood in for)."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

import pytest

from ruseon_appliance.config import Config
from ruseon_appliance.diagnostics import check_camera, check_encoder

FAKE_RPICAM = Path(__file__).parent / "capture" / "fake_rpicam_vid.py"


def config_with_fake_rpicam() -> Config:
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_RPICAM))}"
    config = Config()
    return dataclasses.replace(config, cameras=(dataclasses.replace(config.default_camera,
                                                                   rpicam_command=command),))


@pytest.mark.parametrize(("version", "expect"), [
    ("1.9.0", "--libav-format h264 --low-latency"),
    ("1.5.0", "no --low-latency (rpicam-apps < 1.6.0); B-frames off via bf=0"),
])
def test_check_reports_the_bcm2712_encoder_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, expect: str
) -> None:
    monkeypatch.setenv("FAKE_RPICAM_VERSION", version)
    compatible = tmp_path / "compatible"
    compatible.write_bytes(b"raspberrypi,5-compute-module\0brcm,bcm2712\0")
    finding = check_encoder(config_with_fake_rpicam(), compatible_path=compatible)
    assert finding.verdict == "ok"
    assert finding.detail.startswith("BCM2712, no hardware H.264: picamera2 uses libx264")
    assert expect in finding.detail
    compatible.write_bytes(b"raspberrypi,4-model-b\0brcm,bcm2711\0")
    assert "BCM2712" not in check_encoder(config_with_fake_rpicam(),
                                          compatible_path=compatible).detail


def test_check_camera_finds_an_rpicam_command_with_arguments() -> None:
    config = config_with_fake_rpicam()  # "python .../fake_rpicam_vid.py"
    finding = check_camera(config)
    assert f"{config.default_camera.rpicam_command} at {sys.executable}" in finding.detail
