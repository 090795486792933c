"""``hil glass``: the rig's clock as stamp pictures, for glass-to-glass latency on a real board.

Point the board's camera at a display showing this output full screen (``python -m hil glass |
ffplay -fs -loglevel error -``). Each picture carries the stamp of ``capture/stamp.py`` with the
rig's wall clock at the moment it was rendered; the camera films it, the device encodes and serves
it, and ``hil run --glass`` reads the stamp back from decoded frames: now - stamp is
glass-to-glass latency (display lag included, which is the honest figure).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ruseon_appliance.capture.stamp import block_size, draw_stamp


def render(output: Path, width: int, height: int, fps: int, seconds: float) -> int:
    """Write a YUV4MPEG2 stream of stamp pictures, paced in real time; returns the exit code."""
    # Make the stamp as large as the picture allows: the camera sees it from a distance.
    stream = sys.stdout.buffer if str(output) == "-" else output.open("wb")
    luma: np.ndarray[Any, Any] = np.full((height, width), 128, dtype=np.uint8)
    chroma = np.full((height // 2) * (width // 2) * 2, 128, dtype=np.uint8).tobytes()
    stream.write(f"YUV4MPEG2 W{width} H{height} F{fps}:1 Ip A1:1 C420jpeg\n".encode())
    interval = 1.0 / fps
    start = time.monotonic()
    index = 0
    if block_size(width) * 18 > width:
        print("hil glass: picture too small for the stamp", file=sys.stderr)
        return 2
    try:
        while seconds <= 0 or index < seconds * fps:
            delay = start + index * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            luma[:] = 128
            draw_stamp(luma, time.time_ns() // 1000, index)
            stream.write(b"FRAME\n" + luma.tobytes() + chroma)
            stream.flush()
            index += 1
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    finally:
        if stream is not sys.stdout.buffer:
            stream.close()
    return 0
