"""H.264 access units in, CMAF fragmented MP4 out, without re-encoding.

A hand-written box writer rather than PyAV's mov muxer: it decides exactly which access units go
into which fragment (an LL-HLS part is a fragment of about 0.25 s; recording uses about 1 s), it
starts a new init segment the moment SPS/PPS change, its box builders also write the progressive
MP4 of a clip (recording/clip.py), and it is somewhat cheaper: bench/recording.py measured about
12 µs per access unit at 720p30 2 Mbit/s and 31-33 µs at 1080p30 8 Mbit/s (half of it finding the
NAL units), against 17-19 and 51-67 µs for PyAV's muxer fed the same units.

Samples are AVCC (4-byte length-prefixed NAL units). SPS, PPS and access-unit delimiters are left
out of the samples because the ``avcC`` box in the init segment carries the parameter sets.
"""

from __future__ import annotations

import collections
import itertools
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..capture.h264 import (
    NAL_AUD,
    NAL_IDR,
    NAL_PPS,
    NAL_SPS,
    BitstreamError,
    StreamInfo,
    nal_spans,
    parse_sps,
    unescape_rbsp,
)
from ..stream.aac import parse_aac_config as parse_aac_config
from .boxes import box, full_box
from .ring_media import NO_SEQ, RingMedia, Sample, Spans, avcc

if TYPE_CHECKING:
    from ..capture.ring import RingBuffer

TRACK_ID = 1
# trun sample_flags (ISO/IEC 14496-12 8.8.3.1): a sync sample depends on nothing; any other
# depends on others and is not a sync sample.
SYNC_SAMPLE_FLAGS = 0x02000000
NON_SYNC_SAMPLE_FLAGS = 0x01010000
_DROP_FROM_SAMPLES = frozenset({NAL_SPS, NAL_PPS, NAL_AUD})
_LEN = struct.Struct(">I")
_SAMPLE = struct.Struct(">III")
_AUDIO_SAMPLE = struct.Struct(">II")
# A gap between two access units longer than this is not a frame duration (camera restart,
# clock jump): the earlier frame gets the previous duration instead.
_MAX_SAMPLE_S = 10.0

# The AAC track (issue 30): track 2 of the same file, in the audio's own clock.
AUDIO_TRACK_ID = 2
AUDIO_TIMESCALE = 48_000
AAC_FRAME_SAMPLES = 1024
# A closed fragment waits for the audio of its span (the AAC encoder's frame and look-ahead
# make audio arrive ~45-65 ms after its capture time) until the audio reaches its end, or the
# video is this far past its end, or the audio is this far behind it (a source that stopped:
# the fragment goes out at once without it). Audio that comes later still goes out, in the
# next fragment, at its own place on the timeline.
AUDIO_WAIT_US = 200_000
AUDIO_STALE_US = 500_000
# Audio whose place by its pts and by its capture time differ by more than one AAC frame is
# placed again by its capture time (the video's clock and the capture clock drifted apart).
AUDIO_REANCHOR_TICKS = AAC_FRAME_SAMPLES
# The video's capture times are often arrival times (RTSP, rpicam: jittered by the network and
# the encoder), so the capture-to-pts mapping the audio is placed by is smoothed over about
# 50 pictures; a step of more than a second (a new timeline) starts it again.
VIDEO_CLOCK_SMOOTHING = 0.02
VIDEO_CLOCK_STEP_US = 1_000_000
# At most this many AAC frames wait for video (about 43 s): a camera without pictures yet must
# not let its sound pile up.
MAX_AUDIO_QUEUE = 2048


@dataclass(frozen=True, slots=True)
class Fragment:
    """One CMAF chunk: a moof+mdat pair holding one or more access units."""

    data: bytes  # moof + mdat, ready to write/serve (b"" when ``media`` holds it)
    sequence: int  # mfhd sequence number (monotonic per segmenter)
    start_pts: int  # decode time of the first sample, timescale ticks (== tfdt)
    duration: int  # sum of sample durations, timescale ticks
    independent: bool  # first sample is an IDR (a segment may start here)
    frames: int  # samples in it
    capture_time_us: int  # wall-clock µs of the first sample
    init_generation: int  # which init segment it belongs to
    audio_frames: int = 0  # AAC frames in its second track run (0: video only)
    audio_bytes: int = 0
    # A segmenter with a ring (Fmp4Segmenter(ring=...)): the bytes by reference to the ring's
    # pictures, put together on demand (RingMedia.resolve).
    media: RingMedia | None = None

    @property
    def size(self) -> int:
        """Bytes of moof + mdat (held, or by reference)."""
        return self.media.size if self.media is not None else len(self.data)

    def content(self) -> bytes | None:
        """moof + mdat, or None when the ring lost a picture of a referenced fragment."""
        return self.media.resolve() if self.media is not None else self.data


@dataclass(slots=True)
class _Sample:
    data: bytes  # AVCC (b"" for a sample by reference: ``ref``)
    pts: int  # timescale ticks
    keyframe: bool
    capture_time_us: int
    parameter_sets: tuple[bytes, bytes] | None  # (sps, pps) carried by this IDR
    size: int  # of the AVCC sample
    ref: tuple[int, Spans] | None = None  # the ring seq and the kept NAL units' spans


@dataclass(slots=True)
class _AudioFrame:
    data: bytes
    pts: int  # 1/48000, the audio pipeline's timeline
    capture_time_us: int


@dataclass(slots=True)
class _Held:
    """A closed video fragment waiting for the audio of its span."""

    sequence: int
    table: list[tuple[int, int, int]]
    payload: list[_Sample]
    start_pts: int
    duration: int
    independent: bool
    frames: int
    capture_time_us: int
    end_us: int
    init_generation: int


def _ue(bits: str, pos: int) -> tuple[int, int]:
    zeros = 0
    while bits[pos] == "0":
        zeros += 1
        pos += 1
    value = int(bits[pos : pos + zeros + 1], 2) - 1
    return value, pos + zeros + 1


def _avcc_high_extension(sps: bytes) -> bytes:
    """The chroma/bit-depth tail avcC needs for High profiles (ISO/IEC 14496-15 5.3.3.1)."""
    chroma, luma8, chroma8 = 1, 0, 0
    try:
        bits = "".join(f"{b:08b}" for b in unescape_rbsp(sps[4:], 16))
        _, pos = _ue(bits, 0)  # seq_parameter_set_id
        chroma, pos = _ue(bits, pos)
        if chroma == 3:
            pos += 1
        luma8, pos = _ue(bits, pos)
        chroma8, pos = _ue(bits, pos)
    except (IndexError, ValueError):
        pass
    return bytes([0xFC | (chroma & 3), 0xF8 | (luma8 & 7), 0xF8 | (chroma8 & 7), 0])


def avc_decoder_configuration(sps: bytes, pps: bytes) -> bytes:
    """The ``avcC`` box payload built from one SPS and one PPS NAL unit (headers included)."""
    out = bytes([1, sps[1], sps[2], sps[3], 0xFF, 0xE1]) + _LEN.pack(len(sps))[2:] + sps
    out += bytes([1]) + _LEN.pack(len(pps))[2:] + pps
    if sps[1] in (100, 110, 122, 144):
        out += _avcc_high_extension(sps)
    return out


def init_segment(sps: bytes, pps: bytes, info: StreamInfo, timescale: int = 90_000,
                 audio_config: bytes | None = None) -> bytes:
    """ftyp + moov for one H.264 track (and an AAC one when ``audio_config``, the
    AudioSpecificConfig, is given) with empty sample tables and an mvex (fragmented file)."""
    ftyp = box(b"ftyp", b"iso6", struct.pack(">I", 0), b"iso6", b"cmfc", b"isom", b"avc1", b"mp41")
    return ftyp + movie_box(
        [avc_decoder_configuration(sps, pps)], info.width, info.height, timescale,
        duration=0, sample_tables=None,
        audio=AudioTrackBox(audio_config) if audio_config is not None else None)


@dataclass(frozen=True, slots=True)
class AudioTrackBox:
    """What :func:`movie_box` needs for the AAC track: the AudioSpecificConfig and, for a
    progressive file, its duration (1/48000), sample tables and the silence before its first
    sample (an empty edit, so it starts where the video does at the same capture time)."""

    config: bytes
    duration: int = 0
    sample_tables: bytes | None = None
    delay_us: int = 0


def esds_box(config: bytes, bitrate: int = 0) -> bytes:
    """``esds`` (ISO/IEC 14496-1 ES_Descriptor) for AAC with this AudioSpecificConfig."""
    def descriptor(tag: int, *payload: bytes) -> bytes:
        body = b"".join(payload)
        if len(body) > 0x7F:
            raise ValueError("descriptor too long")
        return bytes([tag, len(body)]) + body

    decoder_config = descriptor(
        0x04, bytes([0x40, 0x15]),  # MPEG-4 audio; audio stream, upstream 0, reserved 1
        struct.pack(">I", 0)[1:],  # bufferSizeDB
        struct.pack(">II", bitrate, bitrate), descriptor(0x05, config))
    es = descriptor(0x03, struct.pack(">HB", 0, 0), decoder_config, descriptor(0x06, b"\x02"))
    return full_box(b"esds", 0, 0, es)


def mp4a_entry(config: bytes) -> bytes:
    """An audio sample entry ``mp4a`` around the ``esds`` of an AudioSpecificConfig."""
    info = parse_aac_config(config)
    rate = info.sample_rate if info.sample_rate < 0x10000 else 0
    return box(
        b"mp4a",
        bytes(6), struct.pack(">H", 1),  # reserved, data_reference_index
        bytes(8),  # reserved (version, revision, vendor)
        struct.pack(">HHHHI", info.channels, 16, 0, 0, rate << 16),
        esds_box(config),
    )


def _audio_trak(audio: AudioTrackBox, movie_ts: int) -> bytes:
    delay = audio.delay_us * movie_ts // 1_000_000
    movie_duration = audio.duration * movie_ts // AUDIO_TIMESCALE
    tkhd = full_box(b"tkhd", 1, 3, struct.pack(">QQIIQ", 0, 0, AUDIO_TRACK_ID, 0,
                                               delay + movie_duration),
                    bytes(8), struct.pack(">hhHH", 0, 1, 0x0100, 0), _matrix(),
                    struct.pack(">II", 0, 0))
    mdhd = full_box(b"mdhd", 1, 0, struct.pack(">QQIQ", 0, 0, AUDIO_TIMESCALE, audio.duration),
                    struct.pack(">HH", 0x55C4, 0))
    hdlr = full_box(b"hdlr", 0, 0, struct.pack(">I4s", 0, b"soun"), bytes(12),
                    b"SoundHandler\x00")
    stsd = full_box(b"stsd", 0, 0, struct.pack(">I", 1), mp4a_entry(audio.config))
    tables = audio.sample_tables
    if tables is None:
        tables = (full_box(b"stts", 0, 0, bytes(4)) + full_box(b"stsc", 0, 0, bytes(4))
                  + full_box(b"stsz", 0, 0, bytes(8)) + full_box(b"stco", 0, 0, bytes(4)))
    minf = box(
        b"minf",
        full_box(b"smhd", 0, 0, bytes(4)),
        box(b"dinf", full_box(b"dref", 0, 0, struct.pack(">I", 1), full_box(b"url ", 0, 1))),
        box(b"stbl", stsd, tables),
    )
    children = [tkhd]
    if delay > 0:
        # An empty edit (the silence before the first sample), then the samples from time 0.
        children.append(box(b"edts", full_box(
            b"elst", 0, 0, struct.pack(">I", 2), struct.pack(">IiI", delay, -1, 0x00010000),
            struct.pack(">IiI", movie_duration, 0, 0x00010000))))
    children.append(box(b"mdia", mdhd, hdlr, minf))
    return box(b"trak", *children)


def _matrix() -> bytes:
    return struct.pack(">9I", 0x00010000, 0, 0, 0, 0x00010000, 0, 0, 0, 0x40000000)


def avc1_entry(avcc: bytes, width: int, height: int) -> bytes:
    """A visual sample entry ``avc1`` around an avcC payload."""
    return box(
        b"avc1",
        bytes(6), struct.pack(">H", 1),  # reserved, data_reference_index
        bytes(16),  # pre_defined, reserved, pre_defined[3]
        struct.pack(">HHIIIH", width, height, 0x00480000, 0x00480000, 0, 1),
        bytes(32),  # compressorname
        struct.pack(">Hh", 0x0018, -1),
        box(b"avcC", avcc),
    )


def movie_box(avccs: list[bytes], width: int, height: int, timescale: int, *, duration: int,
              sample_tables: bytes | None, audio: AudioTrackBox | None = None) -> bytes:
    """moov for one video track, and an AAC track after it when ``audio`` is given.

    ``sample_tables`` None makes a fragmented file's moov (empty tables + mvex); otherwise it is
    the stts/stss/stsc/stsz/stco boxes of a progressive file. ``duration`` is in ``timescale``.
    Without ``audio`` the bytes are exactly those of a video-only file before audio existed.
    """
    movie_ts = 1000
    movie_duration = duration * movie_ts // timescale
    whole_duration = movie_duration
    if audio is not None:
        whole_duration = max(movie_duration, (audio.delay_us * movie_ts // 1_000_000
                                              + audio.duration * movie_ts // AUDIO_TIMESCALE))
    next_track = (AUDIO_TRACK_ID if audio is not None else TRACK_ID) + 1
    mvhd = full_box(b"mvhd", 1, 0, struct.pack(">QQIQ", 0, 0, movie_ts, whole_duration),
                    struct.pack(">IH", 0x00010000, 0x0100), bytes(10), _matrix(), bytes(24),
                    struct.pack(">I", next_track))
    tkhd = full_box(b"tkhd", 1, 3, struct.pack(">QQIIQ", 0, 0, TRACK_ID, 0, movie_duration),
                    bytes(8), struct.pack(">hhHH", 0, 0, 0, 0), _matrix(),
                    struct.pack(">II", width << 16, height << 16))
    mdhd = full_box(b"mdhd", 1, 0, struct.pack(">QQIQ", 0, 0, timescale, duration),
                    struct.pack(">HH", 0x55C4, 0))  # language "und"
    hdlr = full_box(b"hdlr", 0, 0, struct.pack(">I4s", 0, b"vide"), bytes(12),
                    b"VideoHandler\x00")
    stsd = full_box(b"stsd", 0, 0, struct.pack(">I", len(avccs)),
                    *(avc1_entry(a, width, height) for a in avccs))
    fragmented = sample_tables is None
    if sample_tables is None:
        sample_tables = (full_box(b"stts", 0, 0, bytes(4)) + full_box(b"stsc", 0, 0, bytes(4))
                         + full_box(b"stsz", 0, 0, bytes(8)) + full_box(b"stco", 0, 0, bytes(4)))
    minf = box(
        b"minf",
        full_box(b"vmhd", 0, 1, bytes(8)),
        box(b"dinf", full_box(b"dref", 0, 0, struct.pack(">I", 1), full_box(b"url ", 0, 1))),
        box(b"stbl", stsd, sample_tables),
    )
    trak = box(b"trak", tkhd, box(b"mdia", mdhd, hdlr, minf))
    children = [mvhd, trak]
    if audio is not None:
        children.append(_audio_trak(audio, movie_ts))
    if fragmented:
        trex = full_box(b"trex", 0, 0, struct.pack(">IIIII", TRACK_ID, 1, 0, 0, 0))
        if audio is not None:
            trex += full_box(b"trex", 0, 0, struct.pack(">IIIII", AUDIO_TRACK_ID, 1, 0, 0,
                                                        SYNC_SAMPLE_FLAGS))
        children.append(box(b"mvex", trex))
    return box(b"moov", *children)


def moof_box(sequence: int, base_decode_time: int, samples: list[tuple[int, int, int]]) -> bytes:
    """moof for one track run whose data follows in the next mdat: ``samples`` are
    (duration, size, flags). The run's data offset points just past the mdat header."""
    n = len(samples)
    table = b"".join(_SAMPLE.pack(d, s, f) for d, s, f in samples)
    # moof = 8 + mfhd 16 + traf(8 + tfhd 16 + tfdt 20 + trun 20 + 12n)
    moof_size = 8 + 16 + 8 + 16 + 20 + 20 + 12 * n
    return box(
        b"moof",
        full_box(b"mfhd", 0, 0, struct.pack(">I", sequence)),
        box(
            b"traf",
            full_box(b"tfhd", 0, 0x020000, struct.pack(">I", TRACK_ID)),  # default-base-is-moof
            full_box(b"tfdt", 1, 0, struct.pack(">Q", base_decode_time)),
            # data-offset, sample-duration, sample-size, sample-flags present
            full_box(b"trun", 0, 0x000701, struct.pack(">Ii", n, moof_size + 8), table),
        ),
    )


def av_moof_box(sequence: int, base_decode_time: int, samples: list[tuple[int, int, int]],
                audio_decode_time: int, audio: list[tuple[int, int]]) -> bytes:
    """moof for a video run and an AAC run (``audio``: (duration, size), decode time in
    1/48000) whose data follow in the next mdat, the video's first. Empty ``audio``: the
    video-only moof of :func:`moof_box`."""
    if not audio:
        return moof_box(sequence, base_decode_time, samples)
    n, m = len(samples), len(audio)
    # moof = 8 + mfhd 16 + video traf (8 + 16 + 20 + 20 + 12n) + audio traf (8 + 20 + 20 + 20 + 8m)
    moof_size = 8 + 16 + (64 + 12 * n) + (68 + 8 * m)
    video_bytes = sum(size for _, size, _ in samples)
    return box(
        b"moof",
        full_box(b"mfhd", 0, 0, struct.pack(">I", sequence)),
        box(
            b"traf",
            full_box(b"tfhd", 0, 0x020000, struct.pack(">I", TRACK_ID)),
            full_box(b"tfdt", 1, 0, struct.pack(">Q", base_decode_time)),
            full_box(b"trun", 0, 0x000701, struct.pack(">Ii", n, moof_size + 8),
                     b"".join(_SAMPLE.pack(d, s, f) for d, s, f in samples)),
        ),
        box(
            b"traf",
            # default-base-is-moof, default-sample-flags (every AAC frame is a sync sample)
            full_box(b"tfhd", 0, 0x020020, struct.pack(">II", AUDIO_TRACK_ID, SYNC_SAMPLE_FLAGS)),
            full_box(b"tfdt", 1, 0, struct.pack(">Q", audio_decode_time)),
            full_box(b"trun", 0, 0x000301, struct.pack(">Ii", m, moof_size + 8 + video_bytes),
                     b"".join(_AUDIO_SAMPLE.pack(d, s) for d, s in audio)),
        ),
    )


def _frame_ticks(audio_config: bytes | None) -> int:
    """An AAC frame's duration in 1/48000 s for ``audio_config`` (1024 samples at its rate)."""
    if audio_config is None:
        return AAC_FRAME_SAMPLES
    rate = parse_aac_config(audio_config).sample_rate
    return max(1, AAC_FRAME_SAMPLES * AUDIO_TIMESCALE // rate) if rate else AAC_FRAME_SAMPLES


class Fmp4Segmenter:
    """H.264 Annex B access units in, CMAF fMP4 out. No re-encoding.

    ``fragment_max_s``: an open fragment is closed once it holds this much media (LL-HLS parts
    ~0.25 s; recording may use ~1 s). ``fragment_limit_s``: what no fragment of more than one
    sample may exceed (LL-HLS's PART-TARGET). A fragment is always closed before an IDR, so
    every IDR starts a new, independent fragment. A sample's duration is known when the next
    access unit arrives, so :meth:`push` returns the fragments that became complete (usually []
    or one), delayed by at most one frame.

    ``audio_config`` (an AAC AudioSpecificConfig) adds an AAC track: :meth:`push_audio` takes
    the camera's AAC frames, and each fragment carries, in a second track run, the frames
    captured before its end (from its start, for the first one), placed on the video's
    timeline by capture time. A closed fragment then waits for that audio (see
    ``AUDIO_WAIT_US``); audio that stopped never holds it. Without ``audio_config`` the output
    is byte for byte the video-only one.

    ``ring`` (the ring the access units are read from; :meth:`push` then takes each one's
    ``seq``): fragments keep their pictures by reference (:attr:`Fragment.media`,
    :mod:`.ring_media`) instead of copying them, for a consumer that holds fragments while the
    ring still has their frames (the live HLS window). Their bytes are the same. The segmenter
    pins the ring (a sample whose frame the writer is about to overwrite is copied out first);
    :meth:`close` unpins it.
    """

    def __init__(self, *, fragment_max_s: float = 0.25, fragment_limit_s: float | None = None,
                 timescale: int = 90_000, audio_config: bytes | None = None,
                 ring: RingBuffer | None = None) -> None:
        if fragment_max_s <= 0:
            raise ValueError("fragment_max_s must be positive")
        if audio_config is not None:
            parse_aac_config(audio_config)  # ValueError now, not with the first IDR
        self.audio_config = audio_config
        self.ring = ring
        if ring is not None:
            ring.pin(self)
        # One AAC frame's length on the audio track's 48 kHz timescale (1024 samples at the
        # configuration's rate: 3072 ticks for an IP camera's 16 kHz AAC passed through).
        self._audio_frame_ticks = _frame_ticks(audio_config)
        self.timescale = timescale
        self._max_ticks = max(1, round(fragment_max_s * timescale))
        # A sample that would take the open fragment past this starts the next one instead
        # (LL-HLS: no part may outlast PART-TARGET, even when the camera skipped frames and a
        # sample lasts several frame times). Only a single sample longer than this (a camera
        # stalled for longer than a part) still makes a longer fragment.
        self._limit_ticks = (max(self._max_ticks, int(fragment_limit_s * timescale))
                             if fragment_limit_s is not None else None)
        self.split_for_limit = 0
        # Fragments of a single sample longer than the limit (the camera stalled for longer
        # than a part): the one case a fragment outlasts fragment_limit_s.
        self.over_limit = 0
        self._default_duration = timescale // 30
        self._max_sample_ticks = int(_MAX_SAMPLE_S * timescale)
        self._sequence = 0
        self._generation = 0
        self._init: bytes | None = None
        self._inits: dict[int, bytes] = {}
        self._codec: str | None = None
        self._info: StreamInfo | None = None
        self._params: tuple[bytes, bytes] | None = None
        self._pending: _Sample | None = None
        self._last_duration = self._default_duration
        self._open: list[_Sample] = []
        self._open_durations: list[int] = []
        self._open_ticks = 0
        self._open_generation = 0
        self._ready: list[Fragment] = []
        self._need_idr = True
        self.dropped_before_idr = 0
        self.bad_units = 0
        # The audio track (only with audio_config).
        self._audio: collections.deque[_AudioFrame] = collections.deque()
        self._audio_newest_us: int | None = None  # capture time of the newest frame pushed
        self._audio_offset: int | None = None  # decode time (1/48000) = pts + offset
        self._audio_end: int | None = None  # where the last frame muxed ends (1/48000)
        self._held: list[_Held] = []
        self._video_now_us: int | None = None  # capture time of the newest video pushed
        self._video_clock_us: float | None = None  # smoothed capture time minus pts (µs)
        self._video_clock_n = 0
        # A new AudioSpecificConfig (set_audio_config): its frames wait here for the next IDR,
        # which starts a new init segment with it.
        self._audio_config_next: bytes | None = None
        self._audio_next: collections.deque[_AudioFrame] = collections.deque()
        self.audio_config_changes = 0
        self.audio_frames = 0  # muxed
        self.audio_dropped = 0  # before the video started, overlapping, or queue overflow
        self.audio_reanchored = 0
        self.audio_waited_out = 0  # fragments sent without waiting longer for late audio

    # -- public ---------------------------------------------------------------------------

    @property
    def init_segment(self) -> bytes | None:
        """ftyp+moov built from the cached SPS/PPS (None until the first IDR with SPS/PPS)."""
        return self._init

    @property
    def init_generation(self) -> int:
        """+1 whenever SPS/PPS change (a new init segment)."""
        return self._generation

    def init_segment_for(self, generation: int) -> bytes | None:
        """The init segment of ``generation`` (the current one and the one before it are kept):
        the fragment closed just before an SPS change still belongs to the previous one."""
        return self._inits.get(generation)

    @property
    def codec(self) -> str | None:
        """RFC 6381 codec string from the SPS (``avc1.42e01f``), None before the first IDR."""
        return self._codec

    @property
    def codecs(self) -> str | None:
        """Every track's codec, as HLS ``CODECS`` lists them (``avc1.42e01f,mp4a.40.2``)."""
        if self._codec is None or self.audio_config is None:
            return self._codec
        return f"{self._codec},{parse_aac_config(self.audio_config).codec}"

    @property
    def stream_info(self) -> StreamInfo | None:
        """What the current SPS says (size, profile), None before the first IDR."""
        return self._info

    def push(self, data: bytes | memoryview, pts: int, keyframe: bool,
             capture_time_us: int, seq: int | None = None) -> list[Fragment]:
        """Add one access unit (Annex B, pts in 1/90000); return fragments that became complete.

        ``data`` is copied before this returns, so a ring view may be passed directly. ``seq``:
        its sequence number in the segmenter's ``ring`` (required with one, ignored without).
        """
        sample = self._convert(data, pts, keyframe, capture_time_us, seq)
        if sample is None:
            return self._take_ready()
        previous = self._pending
        self._pending = sample
        if self.audio_config is not None:
            self._video_now_us = capture_time_us
            lead = capture_time_us - sample.pts * 1_000_000 / self.timescale
            clock = self._video_clock_us
            if clock is None or abs(lead - clock) > VIDEO_CLOCK_STEP_US:
                self._video_clock_us, self._video_clock_n = lead, 1
            else:
                # The mean of the first ones (the first part's sound is placed by it), then
                # a moving average.
                self._video_clock_n += 1
                weight = max(VIDEO_CLOCK_SMOOTHING, 1 / self._video_clock_n)
                self._video_clock_us = clock + weight * (lead - clock)
        if previous is not None:
            delta = sample.pts - previous.pts
            if not 0 < delta <= self._max_sample_ticks:
                delta = self._last_duration
            self._append(previous, delta, next_is_idr=sample.keyframe)
        if self._held:
            self._release()
        return self._take_ready()

    def push_audio(self, data: bytes | memoryview, pts: int,
                   capture_time_us: int) -> list[Fragment]:
        """Add one AAC frame (raw, pts in 1/48000, capture time on the video's clock); return
        the fragments that were waiting for it. Ignored without ``audio_config``.

        Frames must come in order; ``data`` is copied before this returns.
        """
        if self.audio_config is None or not len(data):
            return self._take_ready()
        if self._audio_config_next is not None:  # the new configuration's: kept for its IDR
            self._audio_next.append(_AudioFrame(bytes(data), pts, capture_time_us))
            if len(self._audio_next) > MAX_AUDIO_QUEUE:
                self._audio_next.popleft()
                self.audio_dropped += 1
            return self._take_ready()
        newest = self._audio_newest_us
        if newest is not None and capture_time_us < newest:
            self.audio_dropped += 1  # out of order (never from the pipeline): not muxable
            return self._take_ready()
        self._audio.append(_AudioFrame(bytes(data), pts, capture_time_us))
        self._audio_newest_us = capture_time_us
        if len(self._audio) > MAX_AUDIO_QUEUE:
            self._audio.popleft()
            self.audio_dropped += 1
        if self._held:
            self._release()
        return self._take_ready()

    def set_audio_config(self, config: bytes) -> None:
        """The AAC frames pushed from now on have AudioSpecificConfig ``config`` (an IP camera's
        own, once it connects): they are muxed from the next IDR on, which starts a new init
        segment (``init_generation`` + 1) with it; until then the fragments carry the frames of
        the old one that are left. ValueError for a configuration that cannot be muxed (the
        old one stays). Ignored without ``audio_config``, or when it is the current one."""
        if self.audio_config is None or config == self.audio_config:
            self._audio_config_next = None
            self._audio_next.clear()
            return
        if config == self._audio_config_next:
            return
        parse_aac_config(config)
        if self._init is None:  # no init segment yet: it is made with the new one
            self.audio_config = config
            self._audio_frame_ticks = _frame_ticks(config)
            self._audio.clear()
            self._audio_newest_us = None
            self.audio_config_changes += 1
            return
        self._audio_config_next = config
        self._audio_next.clear()

    def _switch_audio_config(self, params: tuple[bytes, bytes] | None) -> None:
        """At an IDR (the open fragment is closed) with parameter sets ``params``: the
        fragments of the old configuration go out with the frames they have, and the new one's
        frames are muxed from here, under a new init segment."""
        config, self._audio_config_next = self._audio_config_next, None
        assert config is not None and params is not None
        self._release(force=True)
        self.audio_dropped += len(self._audio)
        self._audio, self._audio_next = self._audio_next, collections.deque()
        self._audio_newest_us = self._audio[-1].capture_time_us if self._audio else None
        self._audio_offset = None
        self._audio_end = None
        self.audio_config = config
        self._audio_frame_ticks = _frame_ticks(config)
        self.audio_config_changes += 1
        self._set_init(params)

    def flush(self) -> list[Fragment]:
        """Close the open fragment (the last sample lasts as long as the one before it); a
        fragment waiting for audio goes out with what has come of it."""
        if self._pending is not None:
            self._append(self._pending, self._last_duration, next_is_idr=True)
            self._pending = None
        if self._held:
            self._release(force=True)
        return self._take_ready()

    def reset(self) -> None:
        """Forget timing after a gap (camera restart, ring overrun); wait for the next IDR.

        What was buffered is not lost: it is closed into a fragment that the next
        :meth:`push` or :meth:`flush` returns.
        """
        buffered = self.flush()  # (not extend(flush()): flush replaces the list)
        self._ready.extend(buffered)
        self._last_duration = self._default_duration
        self._need_idr = True
        # The video's timeline may start again anywhere: the audio is placed anew.
        self._audio_offset = None
        self._audio_end = None
        self._video_clock_us = None

    # -- internals ------------------------------------------------------------------------

    def close(self) -> None:
        """Unpin the ring (a segmenter that is replaced or stopped)."""
        if self.ring is not None:
            self.ring.unpin(self)

    @property
    def seq(self) -> int:
        """The oldest ring frame a sample still refers to (:class:`RingPin`)."""
        for sample in self._samples():
            if sample.ref is not None:
                return sample.ref[0]
        return NO_SEQ

    def before_lap(self, oldest: int) -> None:
        """The ring's writer is about to overwrite the frames before ``oldest``: the samples
        that refer to them are copied out now (:class:`RingPin`)."""
        assert self.ring is not None
        for sample in self._samples():
            ref = sample.ref
            if ref is None:
                continue
            if ref[0] >= oldest:
                return
            data = avcc(self.ring, *ref)
            if data is not None:  # (never None: the frame is intact during the call)
                sample.data, sample.ref = data, None

    def _samples(self) -> Iterator[_Sample]:
        """Every sample held, oldest first."""
        for held in self._held:
            yield from held.payload
        yield from self._open
        if self._pending is not None:
            yield self._pending

    def _take_ready(self) -> list[Fragment]:
        ready = self._ready
        if ready:
            self._ready = []
        return ready

    def _convert(self, data: bytes | memoryview, pts: int, keyframe: bool,
                 capture_time_us: int, seq: int | None) -> _Sample | None:
        by_reference = self.ring is not None
        if by_reference and seq is None:
            raise ValueError("a segmenter with a ring needs each access unit's seq")
        raw = bytes(data)
        spans = nal_spans(raw)
        if not spans:
            self.bad_units += 1
            return None
        view = memoryview(raw)
        parts: list[bytes | memoryview] = []
        kept: list[tuple[int, int]] = []
        size = 0
        sps = pps = None
        has_idr = False
        for start, end in spans:
            kind = raw[start] & 0x1F
            if kind in _DROP_FROM_SAMPLES:
                if kind == NAL_SPS:
                    sps = raw[start:end]
                elif kind == NAL_PPS and pps is None:
                    pps = raw[start:end]
                continue
            if kind == NAL_IDR:
                has_idr = True
            size += 4 + end - start
            if by_reference:
                kept.append((start, end))
            else:
                parts.append(_LEN.pack(end - start))
                parts.append(view[start:end])
        if not size:
            self.bad_units += 1
            return None
        keyframe = keyframe or has_idr
        params = (sps, pps) if sps is not None and pps is not None else None
        if self._need_idr:
            if not keyframe or (params is None and self._params is None):
                self.dropped_before_idr += 1
                return None
            self._need_idr = False
        if params is not None and self._init is None and not self._set_init(params):
            self._need_idr = True
            self.bad_units += 1
            return None
        pts = max(0, pts)
        if self.timescale != 90_000:
            pts = pts * self.timescale // 90_000
        if by_reference:
            assert seq is not None
            return _Sample(b"", pts, keyframe, capture_time_us, params, size, (seq, tuple(kept)))
        return _Sample(b"".join(parts), pts, keyframe, capture_time_us, params, size)

    def _set_init(self, params: tuple[bytes, bytes]) -> bool:
        sps, pps = params
        try:
            info = parse_sps(sps)
        except BitstreamError:
            return False
        self._init = init_segment(sps, pps, info, self.timescale, self.audio_config)
        self._codec = f"avc1.{info.profile_level_id}"
        self._info = info
        if self._params is not None:
            self._generation += 1
        self._params = params
        self._inits[self._generation] = self._init
        self._inits.pop(self._generation - 2, None)
        return True

    def _append(self, sample: _Sample, duration: int, *, next_is_idr: bool) -> None:
        if sample.keyframe and self._open:
            self._close()
        elif (self._open and self._limit_ticks is not None
              and self._open_ticks + duration > self._limit_ticks):
            self.split_for_limit += 1
            self._close()
        if sample.keyframe and self._audio_config_next is not None:
            self._switch_audio_config(sample.parameter_sets or self._params)
        elif sample.parameter_sets is not None and sample.parameter_sets != self._params:
            # Changed parameter sets take effect with this IDR, which starts a fragment, so every
            # fragment belongs to exactly one init segment.
            self._set_init(sample.parameter_sets)
        if not self._open:
            self._open_generation = self._generation
        self._open.append(sample)
        self._open_durations.append(duration)
        self._open_ticks += duration
        self._last_duration = duration
        if next_is_idr or self._open_ticks >= self._max_ticks:
            self._close()

    def _close(self) -> None:
        samples = self._open
        if not samples:
            return
        self._sequence += 1
        if self._limit_ticks is not None and self._open_ticks > self._limit_ticks:
            self.over_limit += 1
        durations = self._open_durations
        table = [(d, s.size, SYNC_SAMPLE_FLAGS if s.keyframe else NON_SYNC_SAMPLE_FLAGS)
                 for s, d in zip(samples, durations, strict=True)]
        first = samples[0]
        if self.audio_config is not None:
            self._held.append(_Held(
                self._sequence, table, samples, first.pts, self._open_ticks,
                first.keyframe, len(samples), first.capture_time_us,
                first.capture_time_us + self._open_ticks * 1_000_000 // self.timescale,
                self._open_generation))
        else:
            data, media = self._payload(moof_box(self._sequence, first.pts, table), samples, [])
            self._ready.append(Fragment(
                data=data,
                media=media,
                sequence=self._sequence,
                start_pts=first.pts,
                duration=self._open_ticks,
                independent=first.keyframe,
                frames=len(samples),
                capture_time_us=first.capture_time_us,
                init_generation=self._open_generation,
            ))
        self._open = []
        self._open_durations = []
        self._open_ticks = 0

    def _payload(self, moof: bytes, samples: list[_Sample], audio: list[bytes]
                 ) -> tuple[bytes, RingMedia | None]:
        """moof + mdat of ``samples`` then ``audio``: as bytes, or by reference to the ring
        (``(b"", media)``) for a segmenter with one."""
        size = sum(s.size for s in samples) + sum(len(a) for a in audio)
        head = moof + struct.pack(">I4s", 8 + size, b"mdat")
        if self.ring is None or all(s.ref is None for s in samples):
            return b"".join([head, *(s.data for s in samples), *audio]), None
        entries: list[Sample] = [s.data if s.ref is None else s.ref for s in samples]
        return b"", RingMedia(self.ring, head, entries, b"".join(audio))

    # -- the audio track --------------------------------------------------------------------

    def _audio_ready(self, held: _Held) -> bool:
        newest = self._audio_newest_us
        if newest is None or newest >= held.end_us:
            return True  # no audio at all, or all of its span is here (frames come in order)
        if newest < held.end_us - AUDIO_STALE_US:
            return True  # the audio stopped (or never caught up): video goes on without it
        if self._video_now_us is not None and self._video_now_us >= held.end_us + AUDIO_WAIT_US:
            self.audio_waited_out += 1
            return True
        return False

    def _release(self, *, force: bool = False) -> None:
        while self._held and (force or self._audio_ready(self._held[0])):
            self._ready.append(self._with_audio(self._held.pop(0)))

    def _with_audio(self, held: _Held) -> Fragment:
        """The held fragment's moof+mdat with the AAC frames captured before its end."""
        queue = self._audio
        frames: list[_AudioFrame] = []
        while queue and queue[0].capture_time_us < held.end_us:
            frame = queue.popleft()
            if self._audio_offset is None and frame.capture_time_us < held.capture_time_us:
                self.audio_dropped += 1  # before the video (re)started
                continue
            frames.append(frame)
        audio: list[tuple[int, int]] = []
        decode_time = offset = 0
        if frames:
            # Where the first frame belongs by capture time, on the video's timeline (by its
            # smoothed mapping; this fragment's first picture's before there is one).
            clock = self._video_clock_us
            if clock is None:
                clock = held.capture_time_us - held.start_pts * 1_000_000 / self.timescale
            expected = round((frames[0].capture_time_us - clock) * AUDIO_TIMESCALE / 1_000_000)
            anchored = self._audio_offset
            if anchored is None or abs(frames[0].pts + anchored - expected) > (
                    AUDIO_REANCHOR_TICKS):
                if anchored is not None:
                    self.audio_reanchored += 1
                anchored = self._audio_offset = expected - frames[0].pts
            offset = anchored
            end = self._audio_end
            if end is None:  # the first since a (re)start: nothing before the pictures
                end = held.start_pts * AUDIO_TIMESCALE // self.timescale
            # Never overlap what was already sent (after placing the audio again, earlier).
            kept = [f for f in frames if f.pts + offset >= end]
            self.audio_dropped += len(frames) - len(kept)
            frames = kept
        if frames:
            decode_time = frames[0].pts + offset
            max_ticks = int(_MAX_SAMPLE_S * AUDIO_TIMESCALE)
            for frame, after in itertools.pairwise(frames):
                delta = after.pts - frame.pts
                audio.append((delta if 0 < delta <= max_ticks else self._audio_frame_ticks,
                              len(frame.data)))
            audio.append((self._audio_frame_ticks, len(frames[-1].data)))
            self._audio_end = decode_time + sum(d for d, _ in audio)
            self.audio_frames += len(frames)
        audio_bytes = sum(len(f.data) for f in frames)
        moof = av_moof_box(held.sequence, held.start_pts, held.table, decode_time, audio)
        data, media = self._payload(moof, held.payload, [f.data for f in frames])
        return Fragment(
            data=data,
            media=media,
            sequence=held.sequence,
            start_pts=held.start_pts,
            duration=held.duration,
            independent=held.independent,
            frames=held.frames,
            capture_time_us=held.capture_time_us,
            init_generation=held.init_generation,
            audio_frames=len(frames),
            audio_bytes=audio_bytes,
        )
