"""Reading an archive segment: one fMP4 file (init segment, then moof+mdat fragments).

Only box headers and the small moof boxes are read; media data is never loaded. A file cut short
(power loss while it was written) reads as far as its last complete fragment, and
:attr:`SegmentIndex.valid_end` says where that is, so the tail can be cut off.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import BinaryIO

from ..segmenter.boxes import find_box, iter_boxes, read_top_level
from ..segmenter.fmp4 import AUDIO_TRACK_ID

SYNC_FLAGS_MASK = 0x00010000  # sample_is_non_sync_sample


class SegmentFormatError(ValueError):
    """The file does not start with an init segment this archive can read."""


@dataclass(frozen=True, slots=True)
class AudioRun:
    """A fragment's AAC frames (the second track, 1/48000): where they are and their timing."""

    decode_time: int
    data_offset: int
    durations: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FragmentIndex:
    """Where one fragment's samples are in the file, and their timing."""

    decode_time: int  # tfdt, in the track's timescale
    data_offset: int  # file offset of the first sample's data
    durations: tuple[int, ...]
    sizes: tuple[int, ...]
    sync: tuple[bool, ...]
    offset: int = 0  # file offset of its moof
    end: int = 0  # file offset just past its mdat
    audio: AudioRun | None = None  # its AAC run, when the segment has sound

    @property
    def duration(self) -> int:
        """Sum of the sample durations."""
        return sum(self.durations)


@dataclass(frozen=True, slots=True)
class SegmentIndex:
    """A parsed segment: its init segment and every complete fragment."""

    init: bytes  # ftyp + moov, as written
    timescale: int
    fragments: tuple[FragmentIndex, ...]
    init_end: int  # file offset where the first fragment starts
    valid_end: int  # end of the last complete fragment (== init_end when there is none)

    @property
    def duration(self) -> int:
        """Media duration, in ``timescale`` units."""
        return sum(f.duration for f in self.fragments)

    @property
    def first_decode_time(self) -> int:
        """tfdt of the first fragment (0 when there is none)."""
        return self.fragments[0].decode_time if self.fragments else 0


def _timescale(moov: bytes) -> int:
    found = find_box(moov, [b"moov", b"trak", b"mdia", b"mdhd"])
    if found is None:
        raise SegmentFormatError("no mdhd in moov")
    pos = found[0]
    version = moov[pos]
    timescale: int = struct.unpack_from(">I", moov, pos + (20 if version == 1 else 12))[0]
    if timescale <= 0:
        raise SegmentFormatError("timescale 0")
    return timescale


def _parse_moof(moof: bytes, moof_offset: int) -> FragmentIndex | None:
    """The video's track run (the first traf) and, when there is one, the AAC run (track 2)."""
    video: tuple[int, int, tuple[int, ...], tuple[int, ...], tuple[bool, ...]] | None = None
    audio: AudioRun | None = None
    for kind, start, end in iter_boxes(moof, 8):
        if kind != b"traf":
            continue
        run = _parse_traf(moof, start, end, moof_offset)
        if run is None:
            return None
        track, decode_time, data_offset, durations, sizes, sync = run
        if video is None:
            video = (decode_time, data_offset, durations, sizes, sync)
        elif track == AUDIO_TRACK_ID and audio is None:
            audio = AudioRun(decode_time, data_offset, durations, sizes)
    if video is None:
        return None
    return FragmentIndex(*video, audio=audio)


def _parse_traf(moof: bytes, traf_start: int, traf_end: int, moof_offset: int,
                ) -> tuple[int, int, int, tuple[int, ...], tuple[int, ...],
                           tuple[bool, ...]] | None:
    """``(track_ID, decode time, data offset, durations, sizes, sync)`` of a traf's first run."""
    base = moof_offset
    default_duration = default_size = default_flags = 0
    decode_time = 0
    track = 0
    run: tuple[int, int] | None = None
    for kind, start, end in iter_boxes(moof, traf_start, traf_end):
        if kind == b"tfhd":
            flags = int.from_bytes(moof[start + 1 : start + 4], "big")
            track = struct.unpack_from(">I", moof, start + 4)[0]
            pos = start + 8  # version/flags, track_ID
            if flags & 0x01:
                base = struct.unpack_from(">Q", moof, pos)[0]
                pos += 8
            if flags & 0x02:
                pos += 4
            if flags & 0x08:
                default_duration = struct.unpack_from(">I", moof, pos)[0]
                pos += 4
            if flags & 0x10:
                default_size = struct.unpack_from(">I", moof, pos)[0]
                pos += 4
            if flags & 0x20:
                default_flags = struct.unpack_from(">I", moof, pos)[0]
        elif kind == b"tfdt":
            version = moof[start]
            decode_time = (struct.unpack_from(">Q", moof, start + 4)[0] if version == 1
                           else struct.unpack_from(">I", moof, start + 4)[0])
        elif kind == b"trun" and run is None:
            run = (start, end)
    if run is None:
        return None
    start, end = run
    flags = int.from_bytes(moof[start + 1 : start + 4], "big")
    count = struct.unpack_from(">I", moof, start + 4)[0]
    pos = start + 8
    data_offset = 0
    if flags & 0x001:
        data_offset = struct.unpack_from(">i", moof, pos)[0]
        pos += 4
    first_flags = None
    if flags & 0x004:
        first_flags = struct.unpack_from(">I", moof, pos)[0]
        pos += 4
    fields = sum(4 for bit in (0x100, 0x200, 0x400, 0x800) if flags & bit)
    if count * fields > end - pos or count > 1_000_000:
        return None
    durations, sizes, sync = [], [], []
    for i in range(count):
        duration = size = 0
        sample_flags = default_flags
        if flags & 0x100:
            duration = struct.unpack_from(">I", moof, pos)[0]
            pos += 4
        else:
            duration = default_duration
        if flags & 0x200:
            size = struct.unpack_from(">I", moof, pos)[0]
            pos += 4
        else:
            size = default_size
        if flags & 0x400:
            sample_flags = struct.unpack_from(">I", moof, pos)[0]
            pos += 4
        elif i == 0 and first_flags is not None:
            sample_flags = first_flags
        if flags & 0x800:
            pos += 4
        durations.append(duration)
        sizes.append(size)
        sync.append(not sample_flags & SYNC_FLAGS_MASK)
    return (track, decode_time, base + data_offset, tuple(durations), tuple(sizes),
            tuple(sync))


def read_segment(f: BinaryIO, size: int) -> SegmentIndex:
    """Index an open segment file of ``size`` bytes (complete fragments only).

    Raises :class:`SegmentFormatError` when the file does not begin with ftyp + moov.
    """
    boxes = read_top_level(f, size)
    first = next(boxes, None)
    second = next(boxes, None)
    if first is None or second is None or first[0] != b"ftyp" or second[0] != b"moov":
        raise SegmentFormatError("the file does not start with ftyp and moov")
    init_end = second[1] + second[3]
    if init_end > 4 * 1024 * 1024:
        raise SegmentFormatError("init segment larger than 4 MiB")
    f.seek(0)
    init = f.read(init_end)
    timescale = _timescale(init[first[3]:])
    fragments: list[FragmentIndex] = []
    valid_end = init_end
    pending: tuple[int, bytes] | None = None
    for kind, start, header, box_size in boxes:
        if kind == b"moof":
            if box_size > 16 * 1024 * 1024:
                break
            f.seek(start)
            pending = (start, f.read(box_size))
        elif kind == b"mdat" and pending is not None:
            fragment = _parse_moof(pending[1], pending[0])
            mdat_end = start + box_size
            if fragment is None or fragment.data_offset < start + header or (
                    fragment.data_offset + sum(fragment.sizes) > mdat_end) or (
                    fragment.audio is not None and (
                        fragment.audio.data_offset < start + header
                        or fragment.audio.data_offset + sum(fragment.audio.sizes) > mdat_end)):
                break
            fragments.append(dataclasses.replace(fragment, offset=pending[0], end=mdat_end))
            valid_end = mdat_end
            pending = None
        else:
            break
    return SegmentIndex(init, timescale, tuple(fragments), init_end, valid_end)


def init_track(init: bytes) -> tuple[bytes, int, int]:
    """``(avcC payload, width, height)`` from an init segment written by the segmenter."""
    found = find_box(init, [b"moov", b"trak", b"mdia", b"minf", b"stbl", b"stsd"])
    if found is None:
        raise SegmentFormatError("no stsd in the init segment")
    entry = found[0] + 8  # version/flags, entry_count
    for kind, start, end in iter_boxes(init, entry, found[1]):
        if kind in (b"avc1", b"avc3"):
            width, height = struct.unpack_from(">HH", init, start + 24)
            for child, cstart, cend in iter_boxes(init, start + 78, end):
                if child == b"avcC":
                    return init[cstart:cend], width, height
    raise SegmentFormatError("no avc1/avcC sample entry in the init segment")


def init_audio(init: bytes) -> bytes | None:
    """The AudioSpecificConfig of the init segment's AAC track (``mp4a``/``esds``), None when
    it has no sound."""
    moov = find_box(init, [b"moov"])
    if moov is None:
        return None
    for kind, start, end in iter_boxes(init, moov[0], moov[1]):
        if kind != b"trak":
            continue
        stsd = find_box(init, [b"mdia", b"minf", b"stbl", b"stsd"], start, end)
        if stsd is None:
            continue
        for entry, estart, eend in iter_boxes(init, stsd[0] + 8, stsd[1]):
            if entry != b"mp4a":
                continue
            esds = find_box(init, [b"esds"], estart + 28, eend)
            if esds is not None:
                return _decoder_specific_info(init[esds[0] + 4 : esds[1]])
    return None


def _decoder_specific_info(es: bytes) -> bytes | None:
    """The DecoderSpecificInfo (tag 5) inside an ES_Descriptor (ISO/IEC 14496-1 7.2.6)."""
    pos = 0
    while pos + 2 <= len(es):
        tag = es[pos]
        pos += 1
        size = 0
        for _ in range(4):
            byte = es[pos]
            pos += 1
            size = (size << 7) | (byte & 0x7F)
            if not byte & 0x80:
                break
        if tag == 0x05:
            return bytes(es[pos : pos + size])
        if tag == 0x03:
            flags = es[pos + 2]
            pos += 3 + (2 if flags & 0x80 else 0) + (2 if flags & 0x20 else 0)
            if flags & 0x40:
                pos += 1 + es[pos]
        elif tag == 0x04:
            pos += 13  # objectType, streamType, bufferSizeDB, maxBitrate, avgBitrate
        else:
            pos += size
    return None
