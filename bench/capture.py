"""Benchmark: a recorded 720p30 2 Mbit/s stream through muxer -> ring -> 30 readers.

Reports µs per frame for the writer (muxer + ring write) and per reader (poll + touching the
view), and the bytes allocated per frame on the steady-state path, measured with tracemalloc as
the per-frame allocation high-water mark above the baseline (a payload copy would show up as
roughly the frame's size; keyframes are ~10x larger than P frames, so the two classes are
reported apart). Prints a summary and one JSON line.

    .venv/bin/python bench/capture.py [--frames 3000] [--readers 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from fractions import Fraction

import av
import numpy as np

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.h264 import AccessUnitSplitter
from ruseon_appliance.capture.muxer import Muxer
from ruseon_appliance.capture.ring import RingBuffer, RingReader
from ruseon_appliance.capture.sources.synthetic import MovingPicture


def record(width: int, height: int, fps: int, bitrate: int, frames: int, gop: int) -> bytes:
    """Encode the synthetic test picture like the camera would; return Annex B."""
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.time_base = Fraction(1, fps)
    ctx.framerate = Fraction(fps, 1)
    ctx.bit_rate = bitrate
    ctx.gop_size = gop
    ctx.max_b_frames = 0
    ctx.options = {
        "preset": "ultrafast", "tune": "zerolatency", "profile": "baseline",
        "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:repeat-headers=1:"
        f"vbv-maxrate={bitrate // 1000}:vbv-bufsize={bitrate // 1000}",
    }
    picture = MovingPicture(width, height)
    out = bytearray()
    for i in range(frames):
        frame = picture.render(i, 1_700_000_000_000_000 + i * 1_000_000 // fps)
        frame.pts = i
        for packet in ctx.encode(frame):
            out += bytes(packet)
    for packet in ctx.encode(None):
        out += bytes(packet)
    return bytes(out)


def run(units: list[tuple[bytes, bool]], frames: int, readers: int, fps: int,
        measure_alloc: bool) -> dict[str, float]:
    muxer = Muxer(1024 * 1024)
    ring = RingBuffer(8 * 1024 * 1024, 1024)
    cursors: list[RingReader] = [ring.reader() for _ in range(readers)]
    # Preallocated: growing result lists inside the measured window would be counted too.
    writer_ns = [0] * frames
    reader_ns = [0] * frames
    alloc = [0] * frames
    keyflags = [False] * frames
    warmup = min(len(units), frames // 4)
    sink = 0
    perf = time.perf_counter_ns
    for n in range(frames + warmup):
        data, idr = units[n % len(units)]
        au = AccessUnit(data, n * 90_000 // fps, idr, 1_700_000_000_000_000 + n)
        steady = n >= warmup
        if measure_alloc and steady:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        t0 = perf()
        out = muxer.push(au)
        if out is not None:
            ring.write(out)
        t1 = perf()
        for cursor in cursors:
            view = cursor.poll()
            if view is not None:
                sink += view.data[-1]  # touch the payload the way a packetizer would start to
        t2 = perf()
        if steady:
            i = n - warmup
            writer_ns[i] = t1 - t0
            reader_ns[i] = (t2 - t1) // readers
            keyflags[i] = idr
            if measure_alloc:
                alloc[i] = tracemalloc.get_traced_memory()[1] - base
    assert sink >= 0
    alloc_key = [a for a, k in zip(alloc, keyflags, strict=True) if k]
    alloc_p = [a for a, k in zip(alloc, keyflags, strict=True) if not k]
    overruns = sum(c.overruns for c in cursors)
    result = {
        "writer_us_median": statistics.median(writer_ns) / 1000,
        "writer_us_p99": sorted(writer_ns)[int(len(writer_ns) * 0.99)] / 1000,
        "reader_us_median": statistics.median(reader_ns) / 1000,
        "reader_us_p99": sorted(reader_ns)[int(len(reader_ns) * 0.99)] / 1000,
        "overruns": overruns,
    }
    if measure_alloc:
        result.update({
            "alloc_bytes_per_frame_mean": statistics.mean(alloc_key + alloc_p),
            "alloc_bytes_per_keyframe_max": max(alloc_key, default=0),
            "alloc_bytes_per_pframe_max": max(alloc_p, default=0),
        })
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=3000, help="steady-state frames to push")
    parser.add_argument("--readers", type=int, default=30)
    parser.add_argument("--record-frames", type=int, default=120,
                        help="length of the recording (looped)")
    args = parser.parse_args()
    width, height, fps, bitrate, gop = 1280, 720, 30, 2_000_000, 60

    t = time.perf_counter()
    stream = record(width, height, fps, bitrate, args.record_frames, gop)
    units = AccessUnitSplitter().split_all(stream)
    sizes = [len(d) for d, _ in units]
    key_sizes = [len(d) for d, k in units if k]
    p_sizes = [len(d) for d, k in units if not k]
    mbits = sum(sizes) * 8 * fps / len(units) / 1e6
    print(f"recorded {len(units)} frames of {width}x{height}@{fps} in "
          f"{time.perf_counter() - t:.1f}s: {mbits:.2f} Mbit/s, keyframes "
          f"{np.mean(key_sizes):.0f} B, P frames {np.mean(p_sizes):.0f} B")

    timing = run(units, args.frames, args.readers, fps, measure_alloc=False)
    tracemalloc.start()
    alloc = run(units, min(args.frames, 1500), args.readers, fps, measure_alloc=True)
    tracemalloc.stop()
    summary = {
        "bench": "capture",
        "stream": f"{width}x{height}@{fps} {bitrate} bit/s",
        "frames": args.frames,
        "readers": args.readers,
        "mean_frame_bytes": round(float(np.mean(sizes))),
        "mean_keyframe_bytes": round(float(np.mean(key_sizes))),
        **{k: round(v, 2) for k, v in timing.items()},
        **{k: round(v, 1) for k, v in alloc.items() if k.startswith("alloc")},
    }
    print(f"writer (muxer + ring copy): median {timing['writer_us_median']:.2f} µs/frame, "
          f"p99 {timing['writer_us_p99']:.2f} µs")
    print(f"per reader (poll + view):   median {timing['reader_us_median']:.2f} µs/frame, "
          f"p99 {timing['reader_us_p99']:.2f} µs  ({args.readers} readers, "
          f"{timing['overruns']:.0f} overruns)")
    print(f"allocated per frame (tracemalloc high-water above baseline): mean "
          f"{alloc['alloc_bytes_per_frame_mean']:.0f} B; max on a keyframe "
          f"{alloc['alloc_bytes_per_keyframe_max']:.0f} B (frame ~{np.mean(key_sizes):.0f} B), "
          f"max on a P frame {alloc['alloc_bytes_per_pframe_max']:.0f} B")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
