"""Planning an hour's clip: peak Python memory (tracemalloc) and time of ``plan_clip``.

An archive of 60 one-minute segments at 30 fps (108,000 frames: one small 160x96 GOP repeated,
so building it takes seconds) is written to a temporary directory, then ``plan_clip`` plans the
whole hour as progressive MP4 and as fMP4. Prints JSON: frames, peak MiB (traced run), seconds
(untraced run), and the clip's SHA-256 (to compare implementations byte for byte).

    PYTHONPATH=. .venv/bin/python bench/clip_plan.py [--minutes 60]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
import tracemalloc
from pathlib import Path

from ruseon_appliance.recording import Archive, plan_clip
from ruseon_appliance.recording.archive import SEGMENT_SUFFIX, segment_name
from ruseon_appliance.segmenter import Fmp4Segmenter
from tests.segmenter.stream import encode

FPS = 30
START_US = 1_700_000_000_000_000


def build(directory: Path, minutes: int) -> None:
    gop = encode(FPS, fps=FPS, gop=FPS)
    frame_ticks = 90_000 // FPS
    for minute in range(minutes):
        segmenter = Fmp4Segmenter(fragment_max_s=1.0)
        body: list[bytes] = []
        for second in range(60):
            for i, unit in enumerate(gop):
                n = (minute * 60 + second) * FPS + i
                body += [f.data for f in segmenter.push(
                    unit.data, n * frame_ticks, unit.keyframe, START_US + n * 1_000_000 // FPS)]
        body += [f.data for f in segmenter.flush()]
        init = segmenter.init_segment
        assert init is not None
        name = segment_name(START_US + minute * 60_000_000) + SEGMENT_SUFFIX
        (directory / name).write_bytes(init + b"".join(body))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        build(directory, args.minutes)
        archive = Archive(directory)
        archive.scan()
        out = {"segments": len(archive.segments)}
        for fmt in ("mp4", "fmp4"):
            t0 = time.perf_counter()
            clip = plan_clip(archive.segments, START_US, START_US + args.minutes * 60_000_000, fmt)
            untraced = time.perf_counter() - t0
            digest = hashlib.sha256()
            for data in clip.read():
                digest.update(data)
            clip.close()
            tracemalloc.start()
            t0 = time.perf_counter()
            clip = plan_clip(archive.segments, START_US, START_US + args.minutes * 60_000_000, fmt)
            seconds = time.perf_counter() - t0
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            out[fmt] = {"frames": clip.frames, "peak_mib": round(peak / 2**20, 1),
                        "plan_s": round(untraced, 2), "plan_traced_s": round(seconds, 2),
                        "bytes": clip.content_length, "sha256": digest.hexdigest()[:16]}
            clip.close()
        print(json.dumps(out))


if __name__ == "__main__":
    main()
