"""``hil glass``: the rig's clock as glass patterns, for glass-to-glass latency on a real board.

Point the board's camera at a display showing this output full screen (``python -m hil glass |
ffplay -fs -loglevel error -``). Each picture is the glass pattern of ``capture/stamp.py`` (the
stamp's 112 bits framed by four finder marks, so it can be found wherever the camera sees it)
carrying the rig's wall clock at the moment it was rendered; the camera films it, the device
encodes and serves it, and ``hil run --glass`` finds and reads the pattern in decoded frames:
now - stamp is glass-to-glass latency (display lag included, which is the honest figure).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from ruseon_appliance.capture.stamp import draw_glass_pattern, glass_module


def render(output: Path, width: int, height: int, fps: int, seconds: float) -> int:
    """Write a YUV4MPEG2 stream of glass patterns, paced in real time; returns the exit code."""
    if glass_module(width, height) < 4:
        print("hil glass: picture too small for the glass pattern", file=sys.stderr)
        return 2
    stream = sys.stdout.buffer if str(output) == "-" else output.open("wb")
    chroma = np.full((height // 2) * (width // 2) * 2, 128, dtype=np.uint8).tobytes()
    stream.write(f"YUV4MPEG2 W{width} H{height} F{fps}:1 Ip A1:1 C420jpeg\n".encode())
    interval = 1.0 / fps
    start = time.monotonic()
    index = 0
    try:
        while seconds <= 0 or index < seconds * fps:
            delay = start + index * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            # The clock is read as the picture is drawn (about a millisecond before it is sent).
            luma = draw_glass_pattern(width, height, time.time_ns() // 1000, index)
            stream.write(b"FRAME\n" + luma.tobytes() + chroma)
            stream.flush()
            index += 1
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    finally:
        if stream is not sys.stdout.buffer:
            stream.close()
    return 0
