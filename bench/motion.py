"""Motion detector cost: CPU µs per analysed frame for each path, on this machine.

- decode path (every source but picamera2): a 720p30 2 Mbit/s libx264 clip (a noisy textured
  scene with an object crossing, ``tests/motion/scenes.py``) fed to ``DecodeAnalyser`` as the
  monitor's worker thread feeds it: every frame decoded (one thread, loop filter skipped),
  ``analysis_fps`` of them scaled down and analysed. Reported: µs per decoded frame, µs per
  analysed frame (all the decoding included), and the share of one core at 30 fps.
- the same on the sub-stream: the same pictures at 640x360 and 500 kbit/s, which is what the
  detector decodes on a camera with a sub-stream (issue 29); printed beside the main figure.
- lores path (picamera2): the ISP's 320x240 Y plane of the same pictures, analysed directly
  (``LoresAnalyser``; no decode).

CPU is ``time.thread_time()`` of the feeding thread (the work runs there, as in the worker).
The detector does no crypto, so masking AES (as bench/fanout.py does for a Pi 4's SRTP cost)
does not change these figures.

    .venv/bin/python bench/motion.py                 # 10 s of 720p30, analysis at 10 and 30 fps
    .venv/bin/python bench/motion.py --seconds 20 --repeat 5
    .venv/bin/python bench/motion.py --fanout 10     # also: fan-out µs/packet, detection off/on

``--fanout N`` runs bench/fanout.py's server (720p30 file source, fan-out send path, N real
aiortc viewers) without and with a motion detector on its ring: the live path's µs per packet
per viewer must not change (the detector's own CPU is part of the idle rate subtracted).
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
    parser.add_argument("--fanout", type=int, default=0, metavar="N",
                        help="also measure the fan-out with N viewers, detection off and on")
    parser.add_argument("--window", type=float, default=8.0)
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
    # The sub-stream (issue 29): the same pictures at 640x360, 500 kbit/s, as a camera with a
    # sub-stream gives the detector instead of the main stream.
    sub_units = encode(lambda n, _t: np.ascontiguousarray(pictures[n][::2, ::2]), args.seconds,
                       width=W // 2, height=H // 2, fps=FPS, gop=60, bitrate=500_000)
    for fps in (10.0, 30.0):
        main_rows = [decode_path(units, fps) for _ in range(args.repeat)]
        sub_rows = [decode_path(sub_units, fps) for _ in range(args.repeat)]
        main_us = statistics.median(r[0] for r in main_rows)
        sub_us = statistics.median(r[0] for r in sub_rows)
        print(f"decode path, analysis at {fps:g} fps: main {W}x{H} {main_us:.0f} µs, "
              f"sub {W // 2}x{H // 2} {sub_us:.0f} µs per decoded frame "
              f"({main_us * FPS / 1e4:.1f} % vs {sub_us * FPS / 1e4:.1f} % of one core at "
              f"{FPS} fps; sub/main {sub_us / main_us:.2f}x; sub runs: "
              f"{', '.join(f'{r[0]:.0f}' for r in sub_rows)} µs/decoded)")
    # What the ISP's lores stream would give: 320x240 (picamera2's example size).
    lores = [np.ascontiguousarray(p[::3, ::4][:240, :320]) for p in pictures]
    for fps in (10.0, 30.0):
        runs = [lores_path(lores, fps) for _ in range(args.repeat)]
        per = statistics.median(runs)
        print(f"lores path (320x240 Y), analysis at {fps:g} fps: {per:.0f} µs per analysed "
              f"frame; {per * fps / 1e4:.2f} % of one core "
              f"(runs: {', '.join(f'{r:.0f}' for r in runs)})")
    if args.fanout:
        fanout_with_motion(args.fanout, args.window)


def fanout_with_motion(viewers: int, window: float) -> None:
    """bench/fanout.py's figure with the detector off, then on."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fanout  # bench/fanout.py

    fanout.recorded_stream()
    rows = {}
    for label, motion in (("off", False), ("on", True)):
        row = fanout.measure("fanout", viewers, window, "asyncio", motion=motion)
        rows[label] = row
        print(f"fan-out N={viewers} motion {label:3}: "
              f"{row['cpu_us_per_packet_per_viewer']:.2f} µs/packet/viewer "
              f"(server load {row['server_cpu_load']:.2f}, idle {row['idle_cpu_per_s']:.3f}, "
              f"{row['connected']} connected)", flush=True)
    ratio = rows["on"]["cpu_us_per_packet_per_viewer"] / rows["off"]["cpu_us_per_packet_per_viewer"]
    print(f"fan-out µs/packet with motion on / off: {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    main()
