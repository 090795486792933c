"""The unit of video that flows from a source through the muxer into the ring buffer."""

from __future__ import annotations

from dataclasses import dataclass

# RTP's clock for video; every pts in the capture pipeline is in these units.
VIDEO_CLOCK_RATE = 90_000


@dataclass(frozen=True, slots=True)
class AccessUnit:
    """One encoded picture as Annex B bytes (start codes included).

    ``pts`` is in 1/90000 s and increases monotonically per source; ``capture_time_us`` is the
    wall-clock time (``time.time_ns() // 1000``) at which the picture was captured, used for
    latency measurements. ``keyframe`` is true for IDR pictures.
    """

    data: bytes | bytearray | memoryview
    pts: int
    keyframe: bool
    capture_time_us: int
