"""Motion detector cost: CPU µs per analysed frame for each path, on this machine.

- decode path (every source but picamera2): a 720p30 2 Mbit/s libx264 clip (a noisy textured
  scene with an object crossing, ``tests/motion/scenes.py``) fed to ``DecodeAnalyser`` as the
  monitor's worker thread feeds it: every frame decoded (one thread, loop filter skipped),
  ``analysis_fps`` of them scaled down and analysed. Reported: µs per decoded frame, µs per
  analysed frame (all the decoding included), and the share of one core at 30 fps.
- lores path (picamera2): the ISP's 320x240 Y plane of the same pictures, analysed directly
  (``LoresAnalyser``; no decode).

CPU is ``time.thread_time()`` of the feeding thread (the work runs there, as in the worker).
The detector does no crypto, so masking AES (as bench/fanout.py does for a Pi 4's SRTP cost)
does not change these figures.

    .venv/bin/python bench/motion.py                 # 10 s of 720p30, analysis at 10 and 30 fps
    .venv/bin/python bench/motion.py --seconds 20 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ruseon_appliance.motion.analyser import DecodeAnalyser, LoresAnalyser
from ruseon_appliance.motion.detector import MotionSettings
from tests.motion.scenes import Scene, Unit, encode

W, H, FPS = 1280, 720, 30


def decode_path(units: list[Unit], analysis_fps: float) -> tuple[float, float, int, int]:
    """(µs per decoded frame, µs per analysed frame, decoded, analysed)."""
    analyser = DecodeAnalyser(MotionSettings(analysis_fps=analysis_fps))
    start = time.thread_time()
    for unit in units:
        analyser.feed(unit.data, unit.keyframe, unit.capture_time_us)
    cpu = time.thread_time() - start
    return (cpu / analyser.decoded * 1e6, cpu / analyser.analysed * 1e6,
            analyser.decoded, analyser.analysed)


def lores_path(planes: list[np.ndarray], analysis_fps: float) -> float:
    """µs per analysed 320x240 plane."""
    analyser = LoresAnalyser(MotionSettings(analysis_fps=analysis_fps))
    start = time.thread_time()
    for n, plane in enumerate(planes):
        analyser.feed(plane, n / FPS)
    return (time.thread_time() - start) / analyser.analysed * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    scene = Scene(W, H, noise=4.0)
    render = scene.crossing(args.seconds / 3, args.seconds / 3)
    pictures: list[np.ndarray] = []

    def keep(n: int, t: float) -> np.ndarray:
        picture = render(n, t)
        pictures.append(picture)
        return picture

    units = encode(keep, args.seconds, width=W, height=H, fps=FPS, gop=60, bitrate=2_000_000)
    size = sum(len(u.data) for u in units)
    print(f"clip: {len(units)} frames {W}x{H}@{FPS}, {size * 8 / args.seconds / 1e6:.2f} Mbit/s")
    for fps in (10.0, 30.0):
        rows = [decode_path(units, fps) for _ in range(args.repeat)]
        per_decoded = statistics.median(r[0] for r in rows)
        per_analysed = statistics.median(r[1] for r in rows)
        print(f"decode path, analysis at {fps:g} fps: {per_decoded:.0f} µs per decoded frame, "
              f"{per_analysed:.0f} µs per analysed frame ({rows[0][3]} of {rows[0][2]}); "
              f"{per_decoded * FPS / 1e4:.1f} % of one core at {FPS} fps "
              f"(runs: {', '.join(f'{r[1]:.0f}' for r in rows)} µs/analysed)")
    # What the ISP's lores stream would give: 320x240 (picamera2's example size).
    lores = [np.ascontiguousarray(p[::3, ::4][:240, :320]) for p in pictures]
    for fps in (10.0, 30.0):
        runs = [lores_path(lores, fps) for _ in range(args.repeat)]
        per = statistics.median(runs)
        print(f"lores path (320x240 Y), analysis at {fps:g} fps: {per:.0f} µs per analysed "
              f"frame; {per * fps / 1e4:.2f} % of one core "
              f"(runs: {', '.join(f'{r:.0f}' for r in runs)})")


if __name__ == "__main__":
    main()
