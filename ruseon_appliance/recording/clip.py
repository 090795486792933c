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
from ..segmenter.fmp4 import (
    AAC_FRAME_SAMPLES,
    AUDIO_TIMESCALE,
    NON_SYNC_SAMPLE_FLAGS,
    SYNC_SAMPLE_FLAGS,
    AudioTrackBox,
    av_moof_box,
    moof_box,
    movie_box,
    parse_aac_config,
)
from .archive import CONTIGUOUS_TOLERANCE_US, OPEN_SUFFIX, SEGMENT_SUFFIX, Segment
from .segment_file import SegmentFormatError, init_audio, init_track, read_segment

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
    # RFC 6381, every track ("avc1.64001f" or "avc1.64001f,mp4a.40.2"): what a browser's
    # MediaSource needs to be told before it takes the file (X-Clip-Codecs).
    codecs: str = ""
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
    sound = _Samples()  # the AAC frames (time_us from the segment's timeline; sync unused)
    audio_config: bytes | None = None
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
            seg_audio = init_audio(index.init)
            if track is None:
                init, track, timescale = index.init, seg_track, index.timescale
                audio_config = seg_audio
            elif (seg_track[0] != track[0] or index.timescale != timescale
                  or seg_audio != audio_config):
                break  # new SPS/PPS (or sound that came or went): another clip
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
                run = fragment.audio
                if run is None or audio_config is None:
                    continue
                # The audio's place in µs from the segment's start, as the video's: both
                # tracks' decode times are on one timeline in seconds.
                a = run.decode_time * 1_000_000 * timescale - first * 1_000_000 * AUDIO_TIMESCALE
                offset = run.data_offset
                for duration, size in zip(run.durations, run.sizes, strict=True):
                    sound.append(segment.start_us + a // (AUDIO_TIMESCALE * timescale),
                                 duration, size, True, fd, offset)
                    a += duration * 1_000_000 * timescale
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
                frames=last - first_index, content_type="video/mp4", fds=fds,
                codecs=_codecs(track[0], audio_config))
    chunks = _chunks(samples, first_index, last)
    audio = (_place_audio(sound, clip.start_us, clip.start_us + clip.duration_us)
             if audio_config is not None else None)
    if fmt == "mp4":
        clip.pieces = _progressive(samples, chunks, track, timescale,
                                   audio=(audio_config, sound, audio) if audio_config else None)
    else:
        clip.pieces = _fragmented(samples, chunks, init, audio=(sound, audio) if audio else None)
    return clip


@dataclass
class _AudioPlan:
    """The AAC frames of a clip: which (indices into the audio samples), their durations
    (1/48000, a hole in the recorded sound folded into the frame before it), and where the
    first one starts after the clip's first picture."""

    indices: list[int]
    durations: list[int]
    delay: int  # 1/48000

    def position(self, k: int) -> int:
        """Decode time of the ``k``-th frame (1/48000, from the clip's start)."""
        return self.delay + sum(self.durations[:k])


def _place_audio(sound: _Samples, start_us: int, end_us: int) -> _AudioPlan | None:
    """The AAC frames captured within ``[start_us, end_us)`` (the clip's pictures), laid out
    from the first one's place; None when there are none."""
    indices: list[int] = []
    durations: list[int] = []
    delay = pos = 0
    for i, t in enumerate(sound.time_us):
        if t < start_us:
            continue
        if t >= end_us:
            break
        tick = (t - start_us) * AUDIO_TIMESCALE // 1_000_000
        if not indices:
            delay = pos = tick
        elif tick - pos > AAC_FRAME_SAMPLES:
            durations[-1] += tick - pos  # a hole in the sound: the frame before it lasts longer
            pos = tick
        elif tick < pos - AAC_FRAME_SAMPLES:
            continue  # overlaps what is already placed (segments recorded twice): left out
        indices.append(i)
        durations.append(sound.duration[i] or AAC_FRAME_SAMPLES)
        pos += durations[-1]
    if not indices:
        return None
    return _AudioPlan(indices, durations, delay)


def _codecs(avcc: bytes, audio_config: bytes | None) -> str:
    codecs = f"avc1.{avcc[1:4].hex()}"
    if audio_config is not None:
        try:
            codecs += "," + parse_aac_config(audio_config).codec
        except ValueError:
            codecs += ",mp4a.40.2"
    return codecs


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


def _audio_runs(sound: _Samples, indices: list[int]) -> list[tuple[int, int]]:
    """Runs ``[lo, hi)`` (positions in ``indices``) stored back to back in one file."""
    runs: list[tuple[int, int]] = []
    lo = 0
    for k in range(1, len(indices)):
        i, j = indices[k - 1], indices[k]
        if (sound.fd[i] != sound.fd[j] or sound.offset[i] + sound.size[i] != sound.offset[j]
                or k - lo >= 1024):
            runs.append((lo, k))
            lo = k
    if indices:
        runs.append((lo, len(indices)))
    return runs


def _audio_piece(sound: _Samples, indices: list[int], run: tuple[int, int]) -> _Piece:
    lo, hi = run
    first = indices[lo]
    return _Piece(sound.fd[first], sound.offset[first],
                  sum(sound.size[indices[k]] for k in range(lo, hi)))


def _progressive(samples: _Samples, chunks: list[tuple[int, int]],
                 track: tuple[bytes, int, int], timescale: int, *,
                 audio: tuple[bytes, _Samples, _AudioPlan | None] | None = None,
                 ) -> list[bytes | _Piece]:
    if audio is not None:
        return _progressive_av(samples, chunks, track, timescale, audio)
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


def _progressive_av(samples: _Samples, chunks: list[tuple[int, int]],
                    track: tuple[bytes, int, int], timescale: int,
                    audio: tuple[bytes, _Samples, _AudioPlan | None]) -> list[bytes | _Piece]:
    """The progressive MP4 with the AAC track too: video and audio chunks interleaved by time
    in one mdat (a player reading it front to back finds both as it goes)."""
    config, sound, plan = audio
    first, last = chunks[0][0], chunks[-1][1]
    sizes = samples.size[first:last]
    avcc, width, height = track
    runs = _audio_runs(sound, plan.indices) if plan else []
    # Every chunk of either track, in the order of their first sample's time.
    order: list[tuple[int, int, int]] = [(samples.time_us[lo], 0, n)
                                         for n, (lo, _) in enumerate(chunks)]
    if plan is not None:
        order += [(sound.time_us[plan.indices[lo]], 1, n) for n, (lo, _) in enumerate(runs)]
    order.sort()
    video_sizes = [sum(samples.size[lo:hi]) for lo, hi in chunks]
    audio_pieces = [_audio_piece(sound, plan.indices, r) for r in runs] if plan else []
    data_size = sum(video_sizes) + sum(p.size for p in audio_pieces)
    wide = data_size + 1_000_000 > 0xFFFFFFFF - 64 * 1024 * 1024
    stts = _run_length(samples.duration[first:last])
    stss = array.array("I", (i + 1 for i in range(last - first) if samples.sync[first + i]))
    stsz, stss_table = _big_endian(sizes), _big_endian(stss)

    def stsc(counts: list[int]) -> bytes:
        entries: list[tuple[int, int]] = []
        for number, n in enumerate(counts, start=1):
            if not entries or entries[-1][1] != n:
                entries.append((number, n))
        return full_box(b"stsc", 0, 0, struct.pack(">I", len(entries)),
                        *(struct.pack(">III", f, n, 1) for f, n in entries))

    def offsets(first_offset: int) -> tuple[list[int], list[int]]:
        video = [0] * len(chunks)
        sound_at = [0] * len(runs)
        pos = first_offset
        for _, kind, n in order:
            if kind == 0:
                video[n] = pos
                pos += video_sizes[n]
            else:
                sound_at[n] = pos
                pos += audio_pieces[n].size
        return video, sound_at

    def co(values: list[int]) -> bytes:
        table = array.array("Q" if wide else "I", values)
        return full_box(b"co64" if wide else b"stco", 0, 0, struct.pack(">I", len(table)),
                        _big_endian(table))

    def moov(first_offset: int) -> bytes:
        video_at, sound_at = offsets(first_offset)
        video_tables = b"".join([
            full_box(b"stts", 0, 0, struct.pack(">I", len(stts)),
                     *(struct.pack(">II", n, d) for n, d in stts)),
            full_box(b"stss", 0, 0, struct.pack(">I", len(stss)), stss_table),
            stsc([hi - lo for lo, hi in chunks]),
            full_box(b"stsz", 0, 0, struct.pack(">II", 0, len(sizes)), stsz),
            co(video_at),
        ])
        if plan is None:
            track_box = AudioTrackBox(config)
        else:
            a_stts = _run_length(array.array("I", plan.durations))
            a_sizes = array.array("I", (sound.size[i] for i in plan.indices))
            audio_tables = b"".join([
                full_box(b"stts", 0, 0, struct.pack(">I", len(a_stts)),
                         *(struct.pack(">II", n, d) for n, d in a_stts)),
                stsc([hi - lo for lo, hi in runs]),
                full_box(b"stsz", 0, 0, struct.pack(">II", 0, len(a_sizes)),
                         _big_endian(a_sizes)),
                co(sound_at),
            ])
            track_box = AudioTrackBox(config, duration=sum(plan.durations),
                                      sample_tables=audio_tables,
                                      delay_us=plan.delay * 1_000_000 // AUDIO_TIMESCALE)
        return movie_box([avcc], width, height, timescale,
                         duration=sum(samples.duration[first:last]),
                         sample_tables=video_tables, audio=track_box)

    ftyp = box(b"ftyp", b"isom", struct.pack(">I", 512), b"isom", b"iso2", b"avc1", b"mp41")
    mdat_header = box_header(b"mdat", data_size)
    first_offset = len(ftyp) + len(moov(0)) + len(mdat_header)
    pieces: list[bytes | _Piece] = [ftyp + moov(first_offset) + mdat_header]
    for _, kind, n in order:
        pieces.append(_data_piece(samples, chunks[n]) if kind == 0 else audio_pieces[n])
    return pieces


def _fragmented(samples: _Samples, chunks: list[tuple[int, int]],
                init: bytes, *, audio: tuple[_Samples, _AudioPlan] | None = None,
                ) -> list[bytes | _Piece]:
    if audio is not None:
        return _fragmented_av(samples, chunks, init, *audio)
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


def _fragmented_av(samples: _Samples, chunks: list[tuple[int, int]], init: bytes,
                   sound: _Samples, plan: _AudioPlan) -> list[bytes | _Piece]:
    """The fMP4 clip with sound: each video chunk's moof also runs the AAC frames captured
    from its first picture to the next chunk's (the last: to the clip's end)."""
    pieces: list[bytes | _Piece] = [init]
    decode_time = 0
    k = 0  # the next audio frame of the plan
    audio_pos = plan.delay
    for sequence, (lo, hi) in enumerate(chunks, start=1):
        table = [(samples.duration[i], samples.size[i],
                  SYNC_SAMPLE_FLAGS if samples.sync[i] else NON_SYNC_SAMPLE_FLAGS)
                 for i in range(lo, hi)]
        until = samples.time_us[hi] if sequence < len(chunks) else None
        k_end = k
        while k_end < len(plan.indices) and (
                until is None or sound.time_us[plan.indices[k_end]] < until):
            k_end += 1
        mine = plan.indices[k:k_end]
        run = [(plan.durations[j], sound.size[plan.indices[j]]) for j in range(k, k_end)]
        size = sum(samples.size[lo:hi]) + sum(sound.size[i] for i in mine)
        pieces.append(av_moof_box(sequence, decode_time, table, audio_pos, run)
                      + box_header(b"mdat", size))
        pieces.append(_data_piece(samples, (lo, hi)))
        pieces.extend(_audio_piece(sound, mine, r) for r in _audio_runs(sound, mine))
        audio_pos += sum(d for d, _ in run)
        decode_time += sum(samples.duration[lo:hi])
        k = k_end
    return pieces
