"""The capture pipeline: source -> muxer -> ring, with keyframe coalescing and stats.

This is the one object the engine and web see of capture (``CONTRACTS.md``). Everything runs on
the event loop thread except what a source does on its own worker thread or child process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..config import CameraConfig
from .access_unit import AccessUnit
from .h264 import StreamInfo
from .keyframe import KeyframeCoalescer
from .muxer import Muxer
from .ring import RingBuffer
from .sources.auto import create_source
from .sources.base import Source

log = logging.getLogger(__name__)

# Measured fps/bitrate are recomputed once this many seconds have passed.
_RATE_WINDOW_S = 2.0


class CapturePipeline:
    """Source + muxer + ring buffer + keyframe coalescer for one camera.

    ``source`` overrides the one ``camera.source`` selects (tests, the HIL rig).
    """

    def __init__(self, camera: CameraConfig, *, source: Source | None = None) -> None:
        self.camera = camera
        self.ring = RingBuffer(camera.ring_arena_bytes, camera.ring_slots)
        self._muxer = Muxer(camera.max_frame_bytes)
        self._source: Source = source if source is not None else create_source(camera)
        self._coalescer = KeyframeCoalescer(
            camera.keyframe_request_interval_ms / 1000, self._source.request_keyframe
        )
        self._first_frame = asyncio.Event()
        self._running = False
        self.last_frame_monotonic: float | None = None
        self._last_keyframe_monotonic: float | None = None
        self.frames_in = 0
        self.frames_out = 0
        self.bytes_in = 0
        self._window_start = time.monotonic()
        self._window_frames = 0
        self._window_bytes = 0
        self._fps = 0.0
        self._bitrate = 0.0

    @property
    def source_kind(self) -> str:
        """The source's kind ("synthetic", "picamera", "rpicam", "file"; "auto" until started)."""
        return self._source.kind

    @property
    def keyframes_on_demand(self) -> bool:
        """Whether the source can make an IDR when asked (picamera2, the synthetic camera).
        When it cannot (rpicam-vid, a file, an IP camera), a viewer's keyframe request is
        answered from this ring for that viewer alone (``stream/cursor.py``), never by
        restarting the encoder for everyone."""
        return bool(getattr(self._source, "keyframes_on_demand", True))

    @property
    def source(self) -> Source:
        """The source this pipeline drives."""
        return self._source

    @property
    def muxer(self) -> Muxer:
        """The SPS/PPS muxer (its counters say what was dropped and why)."""
        return self._muxer

    @property
    def stream_info(self) -> StreamInfo | None:
        """What the current SPS says (profile, level, size), None before the first SPS."""
        return self._muxer.stream_info

    async def start(self) -> None:
        """Start the source; frames flow into the ring from now on."""
        if self._running:
            return
        self._running = True
        self._window_start = time.monotonic()
        log.info("capture starting: source %s, %dx%d@%d, %d bit/s, %s profile", self.source_kind,
                 self.camera.width, self.camera.height, self.camera.framerate,
                 self.camera.bitrate, self.camera.profile)
        await self._source.start(self._deliver)

    async def stop(self) -> None:
        """Stop the source. Readers keep what is in the ring."""
        if not self._running:
            return
        self._running = False
        self._coalescer.cancel()
        await self._source.stop()

    def _deliver(self, au: AccessUnit) -> None:
        """Called by the source on the loop thread for every access unit."""
        if not self._running:
            return
        self.frames_in += 1
        n = len(au.data)
        self.bytes_in += n
        now = time.monotonic()
        self._window_frames += 1
        self._window_bytes += n
        elapsed = now - self._window_start
        if elapsed >= _RATE_WINDOW_S:
            self._fps = self._window_frames / elapsed
            self._bitrate = self._window_bytes * 8 / elapsed
            self._window_start = now
            self._window_frames = self._window_bytes = 0
        out = self._muxer.push(au)
        if out is None:
            return
        if self.ring.write(out) is None:
            return
        self.frames_out += 1
        self.last_frame_monotonic = now
        if out.keyframe:
            self._last_keyframe_monotonic = now
            self._coalescer.keyframe_arrived()
        if not self._first_frame.is_set():
            self._first_frame.set()
            info = self.stream_info
            if info is not None:
                log.info("first frame: %s profile level %s, %dx%d (profile-level-id %s)",
                         info.profile_name, info.level, info.width, info.height,
                         info.profile_level_id)

    def request_keyframe(self, reason: str = "") -> bool:
        """Ask the source for an IDR; coalesced, True if one was forced now."""
        return self._coalescer.request(reason)

    async def wait_first_frame(self, timeout: float) -> bool:
        """Wait until the first frame is in the ring; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._first_frame.wait()
        except TimeoutError:
            return False
        return True

    def stats(self) -> dict[str, Any]:
        """Flat counters and gauges for ``/api/status`` and ``/metrics``."""
        info = self.stream_info
        ring = self.ring.stats()
        now = time.monotonic()
        fps, bitrate = self._fps, self._bitrate
        if fps == 0.0 and self._window_frames:
            # Before the first full window, report what the partial one shows.
            elapsed = max(now - self._window_start, 1e-3)
            fps, bitrate = self._window_frames / elapsed, self._window_bytes * 8 / elapsed
        muxer = self._muxer.counters
        dropped = (self.frames_in - self.frames_out)
        return {
            "source": self.source_kind,
            "running": self._running,
            "frames_in": self.frames_in,
            "frames_out": self.frames_out,
            "frames_dropped": dropped,
            "bytes": self.bytes_in,
            "fps": round(fps, 2),
            "bitrate": round(bitrate),
            "keyframe_age_s": None if self._last_keyframe_monotonic is None
            else round(now - self._last_keyframe_monotonic, 3),
            "profile": info.profile_name if info else None,
            "profile_level_id": info.profile_level_id if info else None,
            "level": info.level if info else None,
            "width": info.width if info else None,
            "height": info.height if info else None,
            "ring_occupancy": round(ring["occupancy"], 4),
            "ring_frames": ring["frames"],
            "ring_rejected": ring["rejected_too_large"],
            "readers": ring["readers"],
            "readers_overrun": ring["readers_overrun"],
            "keyframes_forced": self._coalescer.forced,
            "keyframe_requests": self._coalescer.requests,
            "keyframe_requests_absorbed": self._coalescer.absorbed,
            "keyframes_lost": self._coalescer.lost,
            "keyframe_retries": self._coalescer.retries,
            **{f"muxer_{k}": v for k, v in muxer.items()},
            **{f"source_{k}": v for k, v in self._source.stats().items()},
        }
