"""The file source: replays a recorded ``.h264`` (Annex B) or ``.mp4`` in real time, in a loop.

Useful for demos and for reproducing a field problem with the exact bytes a camera produced.
The file is read and split once at start; playback then runs on the event loop with
``asyncio.sleep`` pacing at ``camera.framerate`` (Annex B carries no timing), and pts keeps
increasing across loops so downstream never sees time go backwards.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

from ...config import CameraConfig
from ...heap import release_free_heap
from ...tasks import cancel_and_wait
from ..access_unit import VIDEO_CLOCK_RATE, AccessUnit
from ..h264 import AccessUnitSplitter
from .base import Deliver, SourceUnavailable

log = logging.getLogger(__name__)

# How soon a file that changed under playback and could not be loaded again is retried.
RELOAD_RETRY_S = 1.0

# Loading holds the whole file in memory (containers: while replaying too); refuse files that
# would hurt a Pi.
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


class PlaybackUnits:
    """The access units a file source replays, in order, as ``(data, is_idr)``.

    A plain Annex B file is not kept in memory (it was: the whole file as one ``bytes`` per
    access unit, 2.3 MiB of RSS for a 10 s 2 Mbit/s clip, issue 19): only each unit's offset
    and length are, and :meth:`read` fetches one with ``os.pread`` when it is due (30 small
    reads a second, from the page cache). Containers (demuxed by FFmpeg) and anything that is
    not a regular file (a FIFO) stay in memory as before.
    """

    def __init__(self, units: list[tuple[bytes, bool]], path: Path | None = None,
                 offsets: list[int] | None = None) -> None:
        self.idr = [idr for _, idr in units]
        self.lengths = [len(data) for data, _ in units]
        self._offsets = offsets
        self._memory: list[bytes] | None = None if offsets is not None else [d for d, _ in units]
        self._fd = os.open(path, os.O_RDONLY) if offsets is not None and path else -1
        # Size and modification time of the file the offsets are for: a file rewritten in place
        # (cp onto it) no longer has those units at those offsets.
        self._stamp = _stamp(os.fstat(self._fd)) if self._fd >= 0 else (0, 0)

    @classmethod
    def load(cls, path: Path) -> PlaybackUnits:
        """Read and split ``path`` (raise :class:`SourceUnavailable`), then keep only the index
        when every unit is found again, byte for byte, at its offset in the file."""
        units = read_annex_b_units(path)
        if path.suffix.lower() in _CONTAINER_SUFFIXES or not path.is_file():
            return cls(units)
        offsets = _offsets_in_file(path, units)
        return cls(units) if offsets is None else cls(units, path, offsets)

    @property
    def in_memory(self) -> bool:
        """Whether the units are held in memory rather than read back from the file."""
        return self._memory is not None

    def __len__(self) -> int:
        return len(self.idr)

    def read(self, index: int) -> bytes:
        """Access unit ``index``'s bytes."""
        if self._memory is not None:
            return self._memory[index]
        assert self._offsets is not None
        if _stamp(os.fstat(self._fd)) != self._stamp:
            raise SourceUnavailable("the file source's file changed while it was replayed")
        data = os.pread(self._fd, self.lengths[index], self._offsets[index])
        if len(data) != self.lengths[index]:
            raise SourceUnavailable("the file source's file changed while it was replayed")
        return data

    def close(self) -> None:
        """Close the file (read-back units only)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _stamp(st: os.stat_result) -> tuple[int, int]:
    return st.st_size, st.st_mtime_ns


def _offsets_in_file(path: Path, units: list[tuple[bytes, bool]]) -> list[int] | None:
    """Where each access unit starts in ``path``: the splitter cuts a file into consecutive
    slices after any leading junk. None if any unit is not found where expected."""
    with path.open("rb") as f:
        head = f.read(max(64 * 1024, len(units[0][0]) + 16))
        start = head.find(units[0][0])
        if start < 0:
            return None
        offsets: list[int] = []
        for data, _ in units:
            f.seek(start)
            if f.read(len(data)) != data:
                return None
            offsets.append(start)
            start += len(data)
    return offsets


class FileSource:
    """Replays a recorded H.264 file as if it were a camera, forever."""

    kind = "file"
    # A recording has its IDRs where it has them: keyframe requests are answered from the ring.
    keyframes_on_demand = False

    def __init__(self, camera: CameraConfig, path: Path) -> None:
        self._camera = camera
        self.path = path
        self._task: asyncio.Task[None] | None = None
        self._units: PlaybackUnits | None = None
        self.loops = 0
        self.reloads = 0
        self.frames_sent = 0
        self.keyframe_requests_ignored = 0

    async def start(self, deliver: Deliver) -> None:
        """Load the file (off the loop) and start the paced playback task."""
        if self._task is not None:
            return
        units = await asyncio.to_thread(PlaybackUnits.load, self.path)
        # The split's temporaries (and the in-memory copy, if only the index is kept) were
        # freed in the loading thread's malloc arena: give the pages back now.
        release_free_heap()
        log.info("file source: %s, %d access units, %d keyframes, at %d fps%s", self.path,
                 len(units), sum(units.idr), self._camera.framerate,
                 "" if units.in_memory else " (read back from the file)")
        self._units = units
        self._task = asyncio.create_task(self._play(units, deliver), name="file-source")

    async def stop(self) -> None:
        """Stop playback."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self._units is not None:
            self._units.close()
            self._units = None

    def request_keyframe(self) -> None:
        """A recording cannot make a keyframe on demand; viewers wait for the next one."""
        self.keyframe_requests_ignored += 1

    def stats(self) -> dict[str, Any]:
        """Playback counters."""
        return {
            "loops": self.loops,
            "reloads": self.reloads,
            "frames_sent": self.frames_sent,
            "keyframe_requests_ignored": self.keyframe_requests_ignored,
        }

    async def _reload(self, units: PlaybackUnits, why: SourceUnavailable) -> PlaybackUnits:
        """Load the file again after it changed (retried while it cannot be: mid-copy)."""
        units.close()
        log.warning("file source: %s: %s; loading it again", self.path, why)
        failures = 0
        while True:
            try:
                fresh = await asyncio.to_thread(PlaybackUnits.load, self.path)
            except SourceUnavailable as exc:
                failures += 1
                log.log(logging.WARNING if failures == 1 else logging.DEBUG,
                        "file source: %s; retrying every %.0f s", exc, RELOAD_RETRY_S)
                await asyncio.sleep(RELOAD_RETRY_S)
                continue
            self._units = fresh
            self.reloads += 1
            return fresh

    async def _play(self, units: PlaybackUnits, deliver: Deliver) -> None:
        fps = self._camera.framerate
        loop = asyncio.get_running_loop()
        first_idr = units.idr.index(True)
        start = loop.time()
        n = 0
        try:
            while True:
                # Every lap starts at the first IDR so a decoder can follow the jump back.
                for i in range(first_idr, len(units)):
                    delay = start + n / fps - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    elif delay < -1.0:
                        start = loop.time() - n / fps  # the loop was stalled: resync
                    try:
                        data = units.read(i)
                    except SourceUnavailable as exc:
                        # Rewritten in place: play the file as it is now, from its first IDR.
                        units = await self._reload(units, exc)
                        first_idr = units.idr.index(True)
                        break
                    deliver(AccessUnit(data, n * VIDEO_CLOCK_RATE // fps, units.idr[i],
                                       time.time_ns() // 1000))
                    self.frames_sent += 1
                    n += 1
                else:
                    self.loops += 1
        finally:
            units.close()  # (stop() too, in case the task never ran)
