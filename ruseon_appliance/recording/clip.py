"""Clips by time: a progressive MP4 (moov first) or an fMP4, cut from archive segments.

Planning reads only the segments' moof boxes and builds the header; the media is then copied
from the segment files as the response streams, never held in memory. The files are opened
while planning, so retention deleting a segment during a download does not cut it short (the
open descriptor keeps the data); a read that comes back short fails the download instead of
ending it early with a file that looks complete.
"""

from __future__ import annotations

import array
import contextlib
import os
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..segmenter.boxes import box, box_header, full_box
from ..segmenter.fmp4 import NON_SYNC_SAMPLE_FLAGS, SYNC_SAMPLE_FLAGS, moof_box, movie_box
from .archive import CONTIGUOUS_TOLERANCE_US, OPEN_SUFFIX, SEGMENT_SUFFIX, Segment
from .segment_file import SegmentFormatError, init_track, read_segment

READ_CHUNK = 1024 * 1024
# A segment starting more than this before the previous one ended overlaps it.
OVERLAP_US = 50_000
FORMATS = ("mp4", "fmp4")


class ClipError(Exception):
    """A clip cannot be made; ``status`` is the HTTP status that says why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Piece:
    """Bytes from an open segment file."""

    fd: int
    offset: int
    size: int


@dataclass
class Clip:
    """A planned clip: header bytes and file ranges, in order, and their total length."""

    start_us: int  # capture time of the first frame (the IDR at or before the request)
    duration_us: int
    frames: int
    content_type: str
    pieces: list[bytes | _Piece] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)

    @property
    def content_length(self) -> int:
        """Total bytes the clip streams."""
        return sum(len(p) if isinstance(p, bytes) else p.size for p in self.pieces)

    def read(self) -> Iterator[bytes]:
        """The clip's bytes in order (blocking reads; iterate off the event loop)."""
        for piece in self.pieces:
            if isinstance(piece, bytes):
                yield piece
                continue
            offset, left = piece.offset, piece.size
            while left:
                data = os.pread(piece.fd, min(left, READ_CHUNK), offset)
                if not data:
                    raise OSError("a segment ended before its indexed data")
                offset += len(data)
                left -= len(data)
                yield data

    def close(self) -> None:
        """Close the segment files."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


class _Samples:
    """Every frame of a plan, one column per field (``array``): about 29 bytes a frame, where
    an object per frame took about 250 (an hour at 30 fps is 108,000 frames)."""

    def __init__(self) -> None:
        self.time_us = array.array("q")
        self.duration = array.array("I")
        self.size = array.array("I")
        self.offset = array.array("q")
        self.fd = array.array("i")
        self.sync = bytearray()

    def __len__(self) -> int:
        return len(self.time_us)

    def append(self, time_us: int, duration: int, size: int, sync: bool, fd: int,
               offset: int) -> None:
        self.time_us.append(time_us)
        self.duration.append(duration)
        self.size.append(size)
        self.offset.append(offset)
        self.fd.append(fd)
        self.sync.append(sync)


def _open(segment: Segment) -> int:
    try:
        return os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not segment.path.name.endswith(OPEN_SUFFIX):
            raise
        # Closed (renamed) since the index was read.
        final = segment.path.name.removesuffix(OPEN_SUFFIX) + SEGMENT_SUFFIX
        return os.open(Path(segment.path.parent, final), os.O_RDONLY | os.O_CLOEXEC)


def plan_clip(segments: Sequence[Segment], start_us: int, end_us: int, fmt: str = "mp4") -> Clip:
    """Plan the clip ``[start_us, end_us)`` from ``segments`` (oldest first, overlapping it).

    It starts at the IDR at or before ``start_us`` and stops at the end, at a gap in the
    recording, or where the stream's parameters change. Blocking: call off the event loop.
    """
    if fmt not in FORMATS:
        raise ClipError(400, f"format must be one of {', '.join(FORMATS)}")
    fds: list[int] = []
    samples = _Samples()
    init: bytes | None = None
    track: tuple[bytes, int, int] | None = None
    timescale = 90_000
    previous_end: int | None = None
    try:
        for segment in segments:
            if previous_end is not None and segment.start_us - previous_end > (
                    CONTIGUOUS_TOLERANCE_US):
                break  # a gap: the clip is one continuous stretch
            if previous_end is not None and segment.start_us < previous_end - OVERLAP_US:
                # Overlapping recordings (an archive from a clock that stepped back): the clip
                # stops rather than splicing them with time running backwards.
                break
            try:
                fd = _open(segment)
            except FileNotFoundError:
                continue  # deleted by retention while planning
            fds.append(fd)
            with os.fdopen(os.dup(fd), "rb") as f:
                index = read_segment(f, os.fstat(fd).st_size)
            seg_track = init_track(index.init)
            if track is None:
                init, track, timescale = index.init, seg_track, index.timescale
            elif seg_track[0] != track[0] or index.timescale != timescale:
                break  # new SPS/PPS: another clip
            first = index.first_decode_time
            for fragment in index.fragments:
                t = fragment.decode_time - first
                offset = fragment.data_offset
                for duration, size, sync in zip(fragment.durations, fragment.sizes,
                                                fragment.sync, strict=True):
                    samples.append(segment.start_us + t * 1_000_000 // timescale,
                                   duration, size, sync, fd, offset)
                    t += duration
                    offset += size
            previous_end = segment.start_us + index.duration * 1_000_000 // timescale
    except (OSError, SegmentFormatError) as exc:
        _close(fds)
        raise ClipError(503, f"a segment cannot be read now: {exc}") from exc
    times, syncs = samples.time_us, samples.sync
    first_index = None
    for i, t in enumerate(times):
        if t > start_us and first_index is not None:
            break
        if syncs[i] and (t <= start_us or first_index is None):
            first_index = i
    if first_index is None or times[first_index] >= end_us:
        _close(fds)
        raise ClipError(404, "nothing is recorded in that range")
    last = first_index  # times never decrease: the clip is [first_index, last)
    while last < len(times) and times[last] < end_us:
        last += 1
    assert init is not None and track is not None
    clip = Clip(start_us=times[first_index],
                duration_us=sum(samples.duration[first_index:last]) * 1_000_000 // timescale,
                frames=last - first_index, content_type="video/mp4", fds=fds)
    chunks = _chunks(samples, first_index, last)
    if fmt == "mp4":
        clip.pieces = _progressive(samples, chunks, track, timescale)
    else:
        clip.pieces = _fragmented(samples, chunks, init)
    return clip


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _chunks(samples: _Samples, first: int, last: int) -> list[tuple[int, int]]:
    """Runs ``[lo, hi)`` of samples stored back to back in one file (at most 1024 each)."""
    chunks: list[tuple[int, int]] = []
    fd, offset, size = samples.fd, samples.offset, samples.size
    lo = first
    for i in range(first + 1, last):
        if fd[i] != fd[i - 1] or offset[i - 1] + size[i - 1] != offset[i] or i - lo >= 1024:
            chunks.append((lo, i))
            lo = i
    if last > first:
        chunks.append((lo, last))
    return chunks


def _data_piece(samples: _Samples, chunk: tuple[int, int]) -> _Piece:
    lo, hi = chunk
    return _Piece(samples.fd[lo], samples.offset[lo], sum(samples.size[lo:hi]))


def _run_length(values: array.array[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in values:
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0] + 1, v)
        else:
            out.append((1, v))
    return out


def _big_endian(values: array.array[int]) -> bytes:
    if sys.byteorder == "little":
        values = array.array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _progressive(samples: _Samples, chunks: list[tuple[int, int]],
                 track: tuple[bytes, int, int], timescale: int) -> list[bytes | _Piece]:
    first, last = chunks[0][0], chunks[-1][1]
    sizes = samples.size[first:last]
    data_size = sum(sizes)
    avcc, width, height = track
    stts = _run_length(samples.duration[first:last])
    stss = array.array("I", (i + 1 for i in range(last - first) if samples.sync[first + i]))
    stsc: list[tuple[int, int]] = []  # (first_chunk, samples_per_chunk)
    for number, (lo, hi) in enumerate(chunks, start=1):
        if not stsc or stsc[-1][1] != hi - lo:
            stsc.append((number, hi - lo))
    chunk_sizes = [sum(samples.size[lo:hi]) for lo, hi in chunks]
    wide = data_size + 1_000_000 > 0xFFFFFFFF - 64 * 1024 * 1024
    stsz = _big_endian(sizes)
    stss_table = _big_endian(stss)

    def tables(first_offset: int) -> bytes:
        offsets = array.array("Q" if wide else "I")
        pos = first_offset
        for size in chunk_sizes:
            offsets.append(pos)
            pos += size
        co = full_box(b"co64" if wide else b"stco", 0, 0, struct.pack(">I", len(offsets)),
                      _big_endian(offsets))
        return b"".join([
            full_box(b"stts", 0, 0, struct.pack(">I", len(stts)),
                     *(struct.pack(">II", n, d) for n, d in stts)),
            full_box(b"stss", 0, 0, struct.pack(">I", len(stss)), stss_table),
            full_box(b"stsc", 0, 0, struct.pack(">I", len(stsc)),
                     *(struct.pack(">III", first, n, 1) for first, n in stsc)),
            full_box(b"stsz", 0, 0, struct.pack(">II", 0, len(sizes)), stsz),
            co,
        ])

    ftyp = box(b"ftyp", b"isom", struct.pack(">I", 512), b"isom", b"iso2", b"avc1", b"mp41")
    duration = sum(samples.duration[first:last])
    mdat_header = box_header(b"mdat", data_size)
    sizing = movie_box([avcc], width, height, timescale, duration=duration,
                       sample_tables=tables(0))
    first_offset = len(ftyp) + len(sizing) + len(mdat_header)
    moov = movie_box([avcc], width, height, timescale, duration=duration,
                     sample_tables=tables(first_offset))
    pieces: list[bytes | _Piece] = [ftyp + moov + mdat_header]
    pieces.extend(_data_piece(samples, c) for c in chunks)
    return pieces


def _fragmented(samples: _Samples, chunks: list[tuple[int, int]],
                init: bytes) -> list[bytes | _Piece]:
    pieces: list[bytes | _Piece] = [init]
    decode_time = 0
    for sequence, (lo, hi) in enumerate(chunks, start=1):
        table = [(samples.duration[i], samples.size[i],
                  SYNC_SAMPLE_FLAGS if samples.sync[i] else NON_SYNC_SAMPLE_FLAGS)
                 for i in range(lo, hi)]
        size = sum(samples.size[lo:hi])
        pieces.append(moof_box(sequence, decode_time, table) + box_header(b"mdat", size))
        pieces.append(_data_piece(samples, (lo, hi)))
        decode_time += sum(samples.duration[lo:hi])
    return pieces
