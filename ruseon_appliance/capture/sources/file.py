"""The file source: replays a recorded ``.h264`` (Annex B) or ``.mp4`` in real time, in a loop.

Useful for demos and for reproducing a field problem with the exact bytes a camera produced.
The file is read and split once at start; playback then runs on the event loop with
``asyncio.sleep`` pacing at ``camera.framerate`` (Annex B carries no timing), and pts keeps
increasing across loops so downstream never sees time go backwards.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from ...config import CameraConfig
from ...tasks import cancel_and_wait
from ..access_unit import VIDEO_CLOCK_RATE, AccessUnit
from ..h264 import AccessUnitSplitter
from .base import Deliver, SourceUnavailable

log = logging.getLogger(__name__)

# Whole-file replay keeps every access unit in memory; refuse files that would hurt a Pi.
MAX_FILE_BYTES = 256 * 1024 * 1024
_CONTAINER_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv")


def read_annex_b_units(path: Path) -> list[tuple[bytes, bool]]:
    """Load ``path`` as ``[(annex_b_access_unit, is_idr), ...]``; raise SourceUnavailable."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise SourceUnavailable(
            f"camera.source file {path} cannot be read: {exc.strerror}"
        ) from None
    if size > MAX_FILE_BYTES:
        raise SourceUnavailable(f"camera.source file {path} is {size} bytes; the file source "
                                f"replays from memory and accepts up to {MAX_FILE_BYTES}")
    if path.suffix.lower() in _CONTAINER_SUFFIXES:
        units = _demux_to_annex_b(path)
    else:
        units = AccessUnitSplitter(max_au_bytes=size + 16).split_all(path.read_bytes())
    if not any(idr for _, idr in units):
        raise SourceUnavailable(f"camera.source file {path} holds no H.264 IDR picture")
    return units


def _demux_to_annex_b(path: Path) -> list[tuple[bytes, bool]]:
    """Container -> Annex B with FFmpeg's ``h264_mp4toannexb`` (adds SPS/PPS to IDRs)."""
    import av
    import av.bitstream

    try:
        container = av.open(str(path))
    except av.FFmpegError as exc:
        raise SourceUnavailable(f"camera.source file {path} cannot be opened: {exc}") from None
    with container:
        streams = [s for s in container.streams.video if s.codec_context.name == "h264"]
        if not streams:
            raise SourceUnavailable(f"camera.source file {path} has no H.264 video stream")
        stream = streams[0]
        bsf = av.bitstream.BitStreamFilterContext("h264_mp4toannexb", stream)
        units: list[tuple[bytes, bool]] = []
        for packet in container.demux(stream):
            for out in bsf.filter(packet if packet.size else None):
                units.append((bytes(out), bool(out.is_keyframe)))
    return units


class FileSource:
    """Replays a recorded H.264 file as if it were a camera, forever."""

    kind = "file"

    def __init__(self, camera: CameraConfig, path: Path) -> None:
        self._camera = camera
        self.path = path
        self._task: asyncio.Task[None] | None = None
        self.loops = 0
        self.frames_sent = 0
        self.keyframe_requests_ignored = 0

    async def start(self, deliver: Deliver) -> None:
        """Load the file (off the loop) and start the paced playback task."""
        if self._task is not None:
            return
        units = await asyncio.to_thread(read_annex_b_units, self.path)
        log.info("file source: %s, %d access units, %d keyframes, at %d fps", self.path,
                 len(units), sum(1 for _, k in units if k), self._camera.framerate)
        self._task = asyncio.create_task(self._play(units, deliver), name="file-source")

    async def stop(self) -> None:
        """Stop playback."""
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def request_keyframe(self) -> None:
        """A recording cannot make a keyframe on demand; viewers wait for the next one."""
        self.keyframe_requests_ignored += 1

    def stats(self) -> dict[str, Any]:
        """Playback counters."""
        return {
            "loops": self.loops,
            "frames_sent": self.frames_sent,
            "keyframe_requests_ignored": self.keyframe_requests_ignored,
        }

    async def _play(self, units: list[tuple[bytes, bool]], deliver: Deliver) -> None:
        fps = self._camera.framerate
        loop = asyncio.get_running_loop()
        first_idr = next(i for i, (_, idr) in enumerate(units) if idr)
        start = loop.time()
        n = 0
        while True:
            # Every lap starts at the first IDR so a decoder can follow the jump back.
            for data, idr in units[first_idr:]:
                delay = start + n / fps - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -1.0:
                    start = loop.time() - n / fps  # the loop was stalled: resync, don't burst
                deliver(AccessUnit(data, n * VIDEO_CLOCK_RATE // fps, idr, time.time_ns() // 1000))
                self.frames_sent += 1
                n += 1
            self.loops += 1
