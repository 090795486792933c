"""The one PCM format inside the appliance: 48 kHz, mono, signed 16-bit, 20 ms chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Opus's native rate, and RTP's clock for Opus (RFC 7587); every audio pts is in these units.
AUDIO_CLOCK_RATE = 48_000
CHANNELS = 1
# 20 ms: Opus's usual frame, WebRTC's packetization time.
FRAME_SAMPLES = 960
FRAME_US = FRAME_SAMPLES * 1_000_000 // AUDIO_CLOCK_RATE
# AAC-LC's frame (HLS, recordings).
AAC_FRAME_SAMPLES = 1024


@dataclass(frozen=True, slots=True)
class PcmChunk:
    """Some PCM from a source: ``samples`` is a 1-D int16 ndarray (48 kHz mono);
    ``capture_time_us`` is the wall-clock time (``time.time_ns() // 1000``, the video's clock)
    of its first sample."""

    samples: Any  # numpy.ndarray[int16]
    capture_time_us: int
