"""Sound and picture of one file, as a player gets them (issue 30): which streams FFmpeg finds,
whether both decode cleanly, how long each lasts, and whether the synthetic camera's beeps (a
1 kHz beep at every whole second of capture time, audio/sources/tone.py) sit where the pictures
stamped with that second do (capture/stamp.py). Shared by the HLS and the recording tests."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from ruseon_appliance.capture.stamp import read_stamp
from tests.tooling import require_tool

# A beep is -6 dBFS, the tone under it -30 dBFS: a sample past this is the beep.
BEEP_LEVEL = 0.25
# Loud samples closer than this belong to one beep (each lasts 100 ms, one a second).
BEEP_GAP_S = 0.5
# A beep whose first loud sample comes within a beep's length (100 ms) and two AAC frames (the
# decoder's warm-up) of the sound's first sample may have begun before it (a clip or a playlist
# cut mid-beep): its onset is not known, so it is not measured.
BEEP_S = 0.1


def streams(path: Path | str) -> list[tuple[str, str]]:
    """``(codec_type, codec_name)`` of every stream, via ffprobe."""
    ffprobe = require_tool("ffprobe", "apt-get install ffmpeg")
    result = subprocess.run(
        [ffprobe, "-v", "error", "-show_entries", "stream=codec_type,codec_name", "-of", "json",
         str(path)], capture_output=True, text=True, timeout=120, check=True)
    return [(s["codec_type"], s["codec_name"]) for s in json.loads(result.stdout)["streams"]]


def decode_errors(path: Path | str, *extra: str) -> str:
    """What ``ffmpeg -v error -i path -f null -`` prints (empty: both streams decoded)."""
    ffmpeg = require_tool("ffmpeg", "apt-get install ffmpeg")
    result = subprocess.run([ffmpeg, "-nostdin", "-v", "error", "-i", str(path), *extra,
                             "-f", "null", "-"],
                            capture_output=True, text=True, timeout=120, check=False)
    return result.stderr + ("" if result.returncode == 0 else f" (exit {result.returncode})")


def stream_spans(path: Path) -> dict[str, tuple[float, float]]:
    """``{"video"|"audio": (first pts, end of the last packet)}`` in seconds, via ffprobe."""
    ffprobe = require_tool("ffprobe", "apt-get install ffmpeg")
    result = subprocess.run(
        [ffprobe, "-v", "error", "-show_entries", "stream=index,codec_type:packet=stream_index,"
         "pts_time,duration_time", "-of", "json", str(path)],
        capture_output=True, text=True, timeout=120, check=True)
    data = json.loads(result.stdout)
    kinds = {s["index"]: s["codec_type"] for s in data["streams"]}
    spans: dict[str, tuple[float, float]] = {}
    for packet in data["packets"]:
        kind = kinds[packet["stream_index"]]
        start = float(packet["pts_time"])
        end = start + float(packet.get("duration_time", 0))
        lo, hi = spans.get(kind, (start, end))
        spans[kind] = (min(lo, start), max(hi, end))
    return spans


@dataclass
class Sync:
    """Where each beep sits in the decoded audio against where its capture second sits in the
    decoded video (seconds on the file's timeline; positive: the sound comes late)."""

    pictures: int
    beeps: list[float]
    errors_s: list[float]


def measure_sync(path: Path) -> Sync:
    """Decode both streams (PyAV, the file's own timestamps) and pair every beep with the
    capture second it was made at: where a picture captured at that instant sits is the
    stamped picture at or after it, less how much later than the second it was captured."""
    pictures: list[tuple[float, int]] = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            stamp = read_stamp(frame)
            assert stamp is not None, "a picture without its stamp"
            assert frame.pts is not None and frame.time_base is not None
            pictures.append((float(frame.pts * frame.time_base), stamp[0]))
    beeps: list[float] = []
    with av.open(str(path)) as container:
        last_loud = -10.0
        first: float | None = None
        for frame in container.decode(audio=0):
            assert frame.pts is not None and frame.time_base is not None
            start = float(frame.pts * frame.time_base)
            first = start if first is None else first
            settled = first + BEEP_S + 2 * 1024 / frame.sample_rate
            samples = frame.to_ndarray()[0]
            for i in np.flatnonzero(np.abs(samples) > BEEP_LEVEL):
                at = start + int(i) / frame.sample_rate
                if at - last_loud > BEEP_GAP_S and at >= settled:
                    beeps.append(at)
                last_loud = at
    assert pictures, "no pictures decoded"
    errors: list[float] = []
    for beep in beeps:
        # The capture second of this beep: what the pictures say was captured then, rounded
        # (the sound would have to be half a second off to pick the wrong one).
        before = [p for p in pictures if p[0] <= beep] or pictures[:1]
        position, capture = before[-1]
        second = round((capture + (beep - position) * 1e6) / 1e6) * 1_000_000
        after = [p for p in pictures if p[1] >= second]
        if not after or after[0][1] - second > 200_000:
            continue  # that second's picture is not in the file (its first or last moment)
        position, capture = after[0]
        errors.append(beep - (position - (capture - second) / 1e6))
    return Sync(len(pictures), beeps, errors)
