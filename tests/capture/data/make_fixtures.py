"""Regenerate the recorded H.264 fixtures in this folder (libx264 via PyAV).

Run from the repo root: ``.venv/bin/python tests/capture/data/make_fixtures.py``. The files are
committed so tests replay exactly the same bytes; this script documents how they were made.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from ruseon_appliance.capture.h264 import nal_spans

HERE = Path(__file__).parent


def frames(width: int, height: int, count: int) -> list[np.ndarray]:
    """A moving block texture as yuv420p arrays (deterministic)."""
    rng = np.random.default_rng(7)
    cells = rng.integers(30, 220, size=(height // 8 + 1, width // 8 + 1 + count), dtype=np.uint8)
    tex = np.repeat(np.repeat(cells, 8, axis=0), 8, axis=1)
    out = []
    for i in range(count):
        buf = np.full((height * 3 // 2, width), 128, dtype=np.uint8)
        buf[:height] = tex[:height, i * 2 : i * 2 + width]
        out.append(buf)
    return out


def strip_parameter_sets(au: bytes) -> bytes:
    """Remove SPS and PPS NAL units from an Annex B access unit."""
    return b"".join(
        b"\x00\x00\x00\x01" + au[s:e] for s, e in nal_spans(au) if au[s] & 0x1F not in (7, 8)
    )


def encode(width: int, height: int, count: int, *, profile: str, gop: int, bitrate: int,
           repeat_headers: bool) -> list[tuple[bytes, bool]]:
    """Encode with the appliance's settings; return ``[(annex_b_au, is_keyframe), ...]``.

    Without ``repeat_headers`` only the first IDR keeps its SPS/PPS, like most files.
    """
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.time_base = Fraction(1, 30)
    ctx.framerate = Fraction(30, 1)
    ctx.bit_rate = bitrate
    ctx.gop_size = gop
    ctx.max_b_frames = 0
    ctx.options = {
        "preset": "ultrafast", "tune": "zerolatency", "profile": profile, "threads": "1",
        "x264-params": ("" if profile == "baseline" else "cabac=1:")
        + f"keyint={gop}:min-keyint={gop}:scenecut=0:repeat-headers=1",
    }
    out = []
    for i, arr in enumerate(frames(width, height, count)):
        frame = av.VideoFrame.from_ndarray(arr, format="yuv420p")
        frame.pts = i
        out.extend((bytes(p), bool(p.is_keyframe)) for p in ctx.encode(frame))
    out.extend((bytes(p), bool(p.is_keyframe)) for p in ctx.encode(None))
    if not repeat_headers:
        out = [out[0]] + [(strip_parameter_sets(d), k) for d, k in out[1:]]
    return out


def write_mp4(path: Path, width: int, height: int, count: int) -> None:
    """An .mp4 (AVCC inside, SPS/PPS in extradata) for the file source's conversion path."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.options = {
            "preset": "ultrafast", "tune": "zerolatency", "profile": "main",
            "x264-params": "cabac=1:keyint=15:scenecut=0",
        }
        for arr in frames(width, height, count):
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="yuv420p")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


def main() -> None:
    # The camera shape: SPS+PPS inside every IDR, constrained baseline, GOP 30.
    units = encode(320, 240, 90, profile="baseline", gop=30, bitrate=250_000, repeat_headers=True)
    (HERE / "cam_320x240_baseline.h264").write_bytes(b"".join(u for u, _ in units))
    # Headers only once at the start (most files/encoders): the muxer must add them to IDRs.
    units = encode(160, 120, 60, profile="main", gop=20, bitrate=120_000, repeat_headers=False)
    (HERE / "once_160x120_main.h264").write_bytes(b"".join(u for u, _ in units))
    write_mp4(HERE / "clip_176x144_main.mp4", 176, 144, 45)


if __name__ == "__main__":
    main()
