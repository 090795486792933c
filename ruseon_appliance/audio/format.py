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
class CodedFrame:
    """One packet as the source's own encoder made it (an IP camera's AAC or Opus), carried
    beside its decoded PCM so an output in the same codec can pass it through unchanged.

    ``config`` is the AAC AudioSpecificConfig (b"" for Opus); ``offset`` is where the packet's
    first sample lies in its chunk and ``duration`` its length, both in 1/48000 s."""

    codec: str  # "aac" or "opus"
    data: bytes
    config: bytes
    offset: int
    duration: int


@dataclass(frozen=True, slots=True)
class PcmChunk:
    """Some PCM from a source: ``samples`` is a 1-D int16 ndarray (48 kHz mono);
    ``capture_time_us`` is the wall-clock time (``time.time_ns() // 1000``, the video's clock)
    of its first sample. ``coded``: the source's own packets these samples were decoded from,
    when it has any (see :class:`CodedFrame`)."""

    samples: Any  # numpy.ndarray[int16]
    capture_time_us: int
    coded: tuple[CodedFrame, ...] = ()
