"""Real H.264 for segmenter and recording tests: libx264 via PyAV, stamped pictures."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av

from ruseon_appliance.capture.access_unit import VIDEO_CLOCK_RATE
from ruseon_appliance.capture.sources.synthetic import X264_PROFILE_TOOLS, MovingPicture
from ruseon_appliance.segmenter import Fmp4Segmenter, Fragment
from tests.tooling import require_tool


@dataclass(frozen=True)
class Unit:
    """One encoded access unit as the ring would hold it."""

    data: bytes
    pts: int
    keyframe: bool
    capture_time_us: int


def encode(frames: int, *, width: int = 160, height: int = 96, fps: int = 30, gop: int = 15,
           first_frame: int = 0, start_us: int = 1_700_000_000_000_000,
           profile: str = "baseline") -> list[Unit]:
    """``frames`` stamped pictures encoded like the synthetic camera (SPS/PPS on every IDR)."""
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.time_base = Fraction(1, fps)
    ctx.framerate = Fraction(fps, 1)
    ctx.gop_size = gop
    ctx.max_b_frames = 0
    params = f"keyint={gop}:min-keyint={gop}:scenecut=0:repeat-headers=1"
    ctx.options = {"preset": "ultrafast", "tune": "zerolatency", "profile": profile, "bf": "0",
                   "threads": "1", "x264-params": X264_PROFILE_TOOLS[profile] + params}
    picture = MovingPicture(width, height)
    units: list[Unit] = []
    for i in range(first_frame, first_frame + frames):
        capture = start_us + i * 1_000_000 // fps
        frame = picture.render(i, capture)
        frame.pts = i
        for packet in ctx.encode(frame):
            units.append(Unit(bytes(packet), packet.pts * VIDEO_CLOCK_RATE // fps,
                              bool(packet.is_keyframe), start_us + packet.pts * 1_000_000 // fps))
    for packet in ctx.encode(None):
        units.append(Unit(bytes(packet), packet.pts * VIDEO_CLOCK_RATE // fps,
                          bool(packet.is_keyframe), start_us + packet.pts * 1_000_000 // fps))
    return units


def segment(units: list[Unit], segmenter: Fmp4Segmenter) -> list[Fragment]:
    """Push every unit and flush; return the fragments in order."""
    out: list[Fragment] = []
    for u in units:
        out.extend(segmenter.push(u.data, u.pts, u.keyframe, u.capture_time_us))
    out.extend(segmenter.flush())
    return out


def ffmpeg_errors(path: Path) -> str:
    """What ``ffmpeg -v error -i path -f null -`` prints (empty for a clean file)."""
    ffmpeg = require_tool("ffmpeg", "apt-get install ffmpeg")
    result = subprocess.run([ffmpeg, "-nostdin", "-v", "error", "-i", str(path), "-f", "null", "-"],
                            capture_output=True, text=True, timeout=120, check=False)
    return (result.stderr + ("" if result.returncode == 0 else f" (exit {result.returncode})"))


def probe_frames(path: Path) -> list[tuple[bool, float]]:
    """``(key_frame, pts_seconds)`` of every decoded frame, via ffprobe."""
    ffprobe = require_tool("ffprobe", "apt-get install ffmpeg")
    result = subprocess.run(
        [ffprobe, "-v", "error", "-select_streams", "v:0", "-show_entries",
         "frame=key_frame,pts_time", "-of", "json", str(path)],
        capture_output=True, text=True, timeout=120, check=True)
    return [(f["key_frame"] == 1, float(f["pts_time"]))
            for f in json.loads(result.stdout).get("frames", [])]


def probe_size(path: Path) -> str:
    """``WIDTHxHEIGHT`` of the first video stream, via ffprobe."""
    ffprobe = require_tool("ffprobe", "apt-get install ffmpeg")
    result = subprocess.run(
        [ffprobe, "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=width,height",
         "-of", "csv=p=0:s=x", str(path)], capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.strip()
