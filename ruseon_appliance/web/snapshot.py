"""``/snapshot.jpg``: the newest keyframe from the ring, decoded with PyAV and encoded as JPEG.

A keyframe decodes on its own (the muxer prepends SPS/PPS to every IDR), so no decoder state is
kept. The JPEG is cached per keyframe (by ring sequence number), and a new one is made at most
once per ``min_interval_s`` however often the URL is fetched: between keyframes, or while rate
limited, every request gets the cached bytes. Decoding runs in a worker thread, one at a time.
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ruseon_appliance.capture.pipeline import CapturePipeline

log = logging.getLogger(__name__)

DEFAULT_MIN_INTERVAL_S = 1.0
# mjpeg quantiser range: 2 is near-lossless, 31 is worst; 3-5 looks clean at a modest size.
JPEG_QMIN, JPEG_QMAX = 3, 5


class SnapshotError(Exception):
    """The keyframe could not be turned into a picture."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One encoded JPEG and the keyframe it came from."""

    jpeg: bytes
    keyframe_seq: int
    width: int
    height: int
    capture_time_us: int


def keyframe_to_jpeg(annexb: bytes) -> tuple[bytes, int, int]:
    """Decode one self-contained H.264 keyframe and encode it as JPEG: (jpeg, width, height)."""
    import av  # PyAV loads with the first snapshot, not at start

    decoder = av.CodecContext.create("h264", "r")
    try:
        frames = list(decoder.decode(av.Packet(annexb))) + list(decoder.decode(None))
    except av.FFmpegError as exc:
        raise SnapshotError(f"the keyframe does not decode: {exc}") from exc
    if not frames:
        raise SnapshotError("the keyframe decoded to no picture")
    picture = frames[-1]
    encoder = av.CodecContext.create("mjpeg", "w")
    encoder.width = picture.width
    encoder.height = picture.height
    encoder.pix_fmt = "yuvj420p"
    encoder.time_base = fractions.Fraction(1, 1)
    encoder.qmin, encoder.qmax = JPEG_QMIN, JPEG_QMAX
    packets = list(encoder.encode(picture.reformat(format="yuvj420p")))
    packets += list(encoder.encode(None))
    return b"".join(bytes(p) for p in packets), picture.width, picture.height


class KeyframeSnapshot:
    """Makes and caches the JPEG of the capture ring's newest keyframe."""

    def __init__(
        self, capture: CapturePipeline, *, min_interval_s: float = DEFAULT_MIN_INTERVAL_S
    ) -> None:
        self.capture = capture
        self.min_interval_s = min_interval_s
        self.cached: Snapshot | None = None
        self.decodes = 0
        self._last_decode = -float("inf")
        self._lock = asyncio.Lock()

    async def latest(self) -> Snapshot | None:
        """The newest keyframe's JPEG (or the cached one while rate limited); None if no
        keyframe has been captured yet."""
        async with self._lock:
            ring = self.capture.ring
            newest = ring.newest_keyframe_seq
            if newest is None:
                return self.cached
            if self.cached is not None and (
                self.cached.keyframe_seq == newest
                or time.monotonic() - self._last_decode < self.min_interval_s
            ):
                return self.cached
            reader = ring.reader("keyframe")
            try:
                view = reader.poll()
                if view is None or not view.keyframe:
                    return self.cached
                # Copy before leaving the event loop: the writer may lap the slot meanwhile.
                data, seq, captured = bytes(view.data), view.seq, view.capture_time_us
            finally:
                reader.close()
            self._last_decode = time.monotonic()
            self.decodes += 1
            jpeg, width, height = await asyncio.to_thread(keyframe_to_jpeg, data)
            self.cached = Snapshot(jpeg, seq, width, height, captured)
            return self.cached
