"""Clips by time: a progressive MP4 (moov first) or an fMP4, cut from archive segments.

Planning reads only the segments' moof boxes and builds the header; the media is then copied
from the segment files as the response streams, never held in memory. The files are opened
while planning, so retention deleting a segment during a download does not cut it short (the
open descriptor keeps the data); a read that comes back short fails the download instead of
ending it early with a file that looks complete.
"""

from __future__ import annotations

import contextlib
import os
import struct
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


@dataclass(slots=True)
class _Sample:
    time_us: int
    duration: int
    size: int
    sync: bool
    fd: int
    offset: int


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
    samples: list[_Sample] = []
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
                    samples.append(_Sample(segment.start_us + t * 1_000_000 // timescale,
                                           duration, size, sync, fd, offset))
                    t += duration
                    offset += size
            previous_end = segment.start_us + index.duration * 1_000_000 // timescale
    except (OSError, SegmentFormatError) as exc:
        _close(fds)
        raise ClipError(503, f"a segment cannot be read now: {exc}") from exc
    first_index = None
    for i, s in enumerate(samples):
        if s.time_us > start_us and first_index is not None:
            break
        if s.sync and (s.time_us <= start_us or first_index is None):
            first_index = i
    if first_index is None or samples[first_index].time_us >= end_us:
        _close(fds)
        raise ClipError(404, "nothing is recorded in that range")
    chosen = [s for s in samples[first_index:] if s.time_us < end_us]
    assert init is not None and track is not None
    clip = Clip(start_us=chosen[0].time_us,
                duration_us=sum(s.duration for s in chosen) * 1_000_000 // timescale,
                frames=len(chosen), content_type="video/mp4", fds=fds)
    chunks = _chunks(chosen)
    if fmt == "mp4":
        clip.pieces = _progressive(chunks, track, timescale)
    else:
        clip.pieces = _fragmented(chunks, init)
    return clip


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _chunks(samples: list[_Sample]) -> list[list[_Sample]]:
    """Runs of samples stored back to back in one file."""
    chunks: list[list[_Sample]] = []
    for s in samples:
        if chunks:
            last = chunks[-1][-1]
            if last.fd == s.fd and last.offset + last.size == s.offset and len(chunks[-1]) < 1024:
                chunks[-1].append(s)
                continue
        chunks.append([s])
    return chunks


def _data_pieces(chunk: list[_Sample]) -> _Piece:
    return _Piece(chunk[0].fd, chunk[0].offset, sum(s.size for s in chunk))


def _run_length(values: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in values:
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0] + 1, v)
        else:
            out.append((1, v))
    return out


def _progressive(chunks: list[list[_Sample]], track: tuple[bytes, int, int],
                 timescale: int) -> list[bytes | _Piece]:
    samples = [s for c in chunks for s in c]
    data_size = sum(s.size for s in samples)
    avcc, width, height = track
    stts = _run_length([s.duration for s in samples])
    stss = [i + 1 for i, s in enumerate(samples) if s.sync]
    stsc: list[tuple[int, int]] = []  # (first_chunk, samples_per_chunk)
    for number, chunk in enumerate(chunks, start=1):
        if not stsc or stsc[-1][1] != len(chunk):
            stsc.append((number, len(chunk)))
    wide = data_size + 1_000_000 > 0xFFFFFFFF - 64 * 1024 * 1024

    def tables(first_offset: int) -> bytes:
        offsets, pos = [], first_offset
        for chunk in chunks:
            offsets.append(pos)
            pos += sum(s.size for s in chunk)
        if wide:
            co = full_box(b"co64", 0, 0, struct.pack(f">I{len(offsets)}Q", len(offsets), *offsets))
        else:
            co = full_box(b"stco", 0, 0, struct.pack(f">I{len(offsets)}I", len(offsets), *offsets))
        return b"".join([
            full_box(b"stts", 0, 0, struct.pack(">I", len(stts)),
                     *(struct.pack(">II", n, d) for n, d in stts)),
            full_box(b"stss", 0, 0, struct.pack(f">I{len(stss)}I", len(stss), *stss)),
            full_box(b"stsc", 0, 0, struct.pack(">I", len(stsc)),
                     *(struct.pack(">III", first, n, 1) for first, n in stsc)),
            full_box(b"stsz", 0, 0, struct.pack(f">II{len(samples)}I", 0, len(samples),
                                                *(s.size for s in samples))),
            co,
        ])

    ftyp = box(b"ftyp", b"isom", struct.pack(">I", 512), b"isom", b"iso2", b"avc1", b"mp41")
    duration = sum(s.duration for s in samples)
    mdat_header = box_header(b"mdat", data_size)
    sizing = movie_box([avcc], width, height, timescale, duration=duration,
                       sample_tables=tables(0))
    first_offset = len(ftyp) + len(sizing) + len(mdat_header)
    moov = movie_box([avcc], width, height, timescale, duration=duration,
                     sample_tables=tables(first_offset))
    pieces: list[bytes | _Piece] = [ftyp + moov + mdat_header]
    pieces.extend(_data_pieces(c) for c in chunks)
    return pieces


def _fragmented(chunks: list[list[_Sample]], init: bytes) -> list[bytes | _Piece]:
    pieces: list[bytes | _Piece] = [init]
    decode_time = 0
    for sequence, chunk in enumerate(chunks, start=1):
        table = [(s.duration, s.size, SYNC_SAMPLE_FLAGS if s.sync else NON_SYNC_SAMPLE_FLAGS)
                 for s in chunk]
        size = sum(s.size for s in chunk)
        pieces.append(moof_box(sequence, decode_time, table) + box_header(b"mdat", size))
        pieces.append(_data_pieces(chunk))
        decode_time += sum(s.duration for s in chunk)
    return pieces
