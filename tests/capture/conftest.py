"""Shared fixtures for capture tests: the recorded streams and a PyAV decoder."""

from __future__ import annotations

from pathlib import Path

import av
import pytest

from ruseon_appliance.capture.h264 import AccessUnitSplitter

DATA = Path(__file__).parent / "data"
CAM_STREAM = DATA / "cam_320x240_baseline.h264"  # SPS+PPS in every IDR, GOP 30, 90 frames
ONCE_STREAM = DATA / "once_160x120_main.h264"  # SPS+PPS only before the first IDR, GOP 20
MP4_CLIP = DATA / "clip_176x144_main.mp4"


def split_file(path: Path) -> list[tuple[bytes, bool]]:
    """The recorded stream as ``[(access_unit, is_idr), ...]``."""
    return AccessUnitSplitter().split_all(path.read_bytes())


def decode_alone(data: bytes) -> list[av.VideoFrame]:
    """Decode ``data`` with a fresh PyAV decoder (no earlier state); raise if it fails."""
    decoder = av.CodecContext.create("h264", "r")
    frames = list(decoder.decode(av.Packet(data)))
    frames.extend(decoder.decode(None))
    return frames


@pytest.fixture(scope="session")
def cam_units() -> list[tuple[bytes, bool]]:
    """Access units of the camera-shaped recording."""
    return split_file(CAM_STREAM)


@pytest.fixture(scope="session")
def once_units() -> list[tuple[bytes, bool]]:
    """Access units of the headers-once recording."""
    return split_file(ONCE_STREAM)
