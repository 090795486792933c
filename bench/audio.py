"""Audio benchmark: what a camera's sound costs the board, per codec, against what it replaces.

One camera's audio is encoded once (audio/pipeline.py): libopus at 32 kbit/s (20 ms frames) for
WebRTC/RTSP and FFmpeg's AAC-LC at 64 kbit/s for HLS/recordings, 48 kHz mono. This measures the
CPU of each encode (thread CPU time per second of audio = the share of one core) on the test
tone and on noise (the worst case for an encoder), and the whole pipeline thread (tone, clock
alignment, gain, meter, both encoders) running in real time. Side by side: what the naive design
costs, a per-viewer Opus encode (aiortc's default sender encodes for every viewer), so the ratio
for N viewers is printed.

    .venv/bin/python bench/audio.py                # 20 s of audio per case, 5 s real time
    .venv/bin/python bench/audio.py --seconds 60 --viewers 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ruseon_appliance.audio.encoders import aac_encoder, opus_encoder
from ruseon_appliance.audio.format import FRAME_SAMPLES, FRAME_US
from ruseon_appliance.audio.pipeline import AudioPipeline
from ruseon_appliance.audio.sources.tone import ToneSource, tone_samples


def encode_cost(make: object, signal: str, seconds: float) -> float:
    """CPU seconds per second of audio for one encoder over ``seconds`` of ``signal``."""
    encoder = make()  # type: ignore[operator]
    chunks = int(seconds * 1_000_000 / FRAME_US)
    rng = np.random.default_rng(1)
    pcm = [tone_samples(i * FRAME_US, FRAME_SAMPLES) if signal == "tone"
           else rng.integers(-8000, 8000, FRAME_SAMPLES, dtype=np.int16) for i in range(chunks)]
    start = time.thread_time()
    for i, samples in enumerate(pcm):
        encoder.encode(samples, i * FRAME_SAMPLES)
    return (time.thread_time() - start) / seconds


def thread_cpu(tid: int) -> float:
    """CPU seconds of this process's thread ``tid`` (from /proc)."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def pipeline_cost(window: float) -> tuple[float, dict[str, object]]:
    pipeline = AudioPipeline(ToneSource())
    await pipeline.start()
    await asyncio.sleep(0.5)
    thread = pipeline._thread
    assert thread is not None and thread.native_id is not None
    before = thread_cpu(thread.native_id)
    await asyncio.sleep(window)
    used = thread_cpu(thread.native_id) - before
    stats = pipeline.stats()
    await pipeline.stop()
    return used / window, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="audio per encode case")
    parser.add_argument("--window", type=float, default=5.0, help="real-time pipeline window")
    parser.add_argument("--viewers", type=int, default=10, help="viewers for the ratio")
    args = parser.parse_args()
    results: dict[str, float] = {}
    for codec, make in (("opus", opus_encoder), ("aac", aac_encoder)):
        for signal in ("tone", "noise"):
            results[f"{codec}_{signal}"] = encode_cost(make, signal, args.seconds)
    pipeline_share, stats = asyncio.run(pipeline_cost(args.window))
    per_camera = results["opus_tone"] + results["aac_tone"]
    naive = results["opus_tone"] * args.viewers + results["aac_tone"]
    print("audio encode cost, share of one core (CPU s per s of 48 kHz mono audio)")
    for key, value in results.items():
        print(f"  {key:12s} {value * 100:6.2f} %")
    print(f"  pipeline thread in real time (tone + both encoders): {pipeline_share * 100:.2f} %"
          f" ({stats['chunks_in']} chunks)")
    print(f"  one encode per camera: {per_camera * 100:.2f} %; a per-viewer Opus encode for "
          f"{args.viewers} viewers: {naive * 100:.2f} % -> ratio {naive / per_camera:.1f}x")
    print(json.dumps({"results": results, "pipeline": pipeline_share,
                      "viewers": args.viewers}))


if __name__ == "__main__":
    main()
