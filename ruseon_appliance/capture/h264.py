"""H.264 Annex B bitstream handling: NAL unit scanning, SPS parsing and access-unit splitting.

Only what the capture pipeline needs: where the NAL units are (as offsets, so payloads are never
copied), which kind each one is, what the sequence parameter set says about the stream, and where
one access unit ends and the next begins in a byte stream that has no container around it.
"""

from __future__ import annotations

from dataclasses import dataclass

START_CODE = b"\x00\x00\x01"
START_CODE_4 = b"\x00\x00\x00\x01"

# nal_unit_type values (ITU-T H.264 table 7-1) the pipeline cares about.
NAL_SLICE = 1
NAL_IDR = 5
NAL_SEI = 6
NAL_SPS = 7
NAL_PPS = 8
NAL_AUD = 9
NAL_END_OF_SEQUENCE = 10
NAL_END_OF_STREAM = 11
NAL_FILLER = 12

# NAL types that, after a picture's slices, can only belong to the next access unit (7.4.1.2.3).
_AU_OPENERS = frozenset({NAL_SEI, NAL_SPS, NAL_PPS, NAL_AUD, 14, 15, 16, 17, 18})

# profile_idc values whose SPS carries chroma_format_idc and friends (7.3.2.1.1).
_HIGH_PROFILES = frozenset({100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135})


class BitstreamError(ValueError):
    """A NAL unit is too short or malformed to parse."""


def nal_type(header: int) -> int:
    """Return ``nal_unit_type`` from a NAL header byte."""
    return header & 0x1F


def nal_spans(data: bytes | bytearray) -> list[tuple[int, int]]:
    """Return ``(start, end)`` offsets of every NAL unit payload in an Annex B buffer.

    Both 3- and 4-byte start codes are accepted; ``start`` points at the NAL header byte and
    ``end`` excludes trailing zero bytes (the leading zero of a 4-byte start code or
    ``trailing_zero_8bits``). Bytes before the first start code are not part of any span; empty
    NAL units are skipped. Nothing is copied: slice the caller's buffer with the offsets.
    """
    spans: list[tuple[int, int]] = []
    find = data.find
    i = find(START_CODE)
    while i != -1:
        start = i + 3
        j = find(START_CODE, start)
        end = len(data) if j == -1 else j
        while end > start and data[end - 1] == 0:
            end -= 1
        if end > start:
            spans.append((start, end))
        i = j
    return spans


def unescape_rbsp(nal: bytes | bytearray | memoryview, limit: int | None = None) -> bytes:
    """Strip emulation-prevention bytes (``00 00 03`` -> ``00 00``) from a NAL unit's payload."""
    raw = bytes(nal if limit is None else nal[:limit])
    if b"\x00\x00\x03" not in raw:
        return raw
    out = bytearray()
    zeros = 0
    for byte in raw:
        if zeros >= 2 and byte == 3:
            zeros = 0
            continue
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


class _BitReader:
    """MSB-first bit reader with Exp-Golomb decoding over an RBSP."""

    __slots__ = ("_data", "_pos", "_size")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0
        self._size = len(data) * 8

    def u(self, bits: int) -> int:
        if self._pos + bits > self._size:
            raise BitstreamError("SPS ends early")
        value = 0
        for _ in range(bits):
            byte = self._data[self._pos >> 3]
            value = (value << 1) | ((byte >> (7 - (self._pos & 7))) & 1)
            self._pos += 1
        return value

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise BitstreamError("Exp-Golomb code longer than 32 bits")
        return (1 << zeros) - 1 + (self.u(zeros) if zeros else 0)

    def se(self) -> int:
        k = self.ue()
        return (k + 1) // 2 if k & 1 else -(k // 2)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What the sequence parameter set says about a stream.

    ``profile_level_id`` is the 6-hex-digit value for the SDP ``fmtp`` line (RFC 6184):
    profile_idc, the constraint-flag byte and level_idc. ``may_have_bframes`` is false only when
    the stream provably has no reordering (Baseline profile, or ``max_num_reorder_frames == 0``).
    """

    profile_idc: int
    constraint_flags: int
    level_idc: int
    width: int
    height: int
    profile_level_id: str
    may_have_bframes: bool

    @property
    def profile_name(self) -> str:
        """A human name for the profile (``constrained-baseline``, ``main``, ...)."""
        if self.profile_idc == 66:
            return "constrained-baseline" if self.constraint_flags & 0x40 else "baseline"
        return {77: "main", 88: "extended", 100: "high"}.get(self.profile_idc,
                                                             f"profile-{self.profile_idc}")

    @property
    def level(self) -> str:
        """Level as written in the spec (``3.1``); level 1b is reported as ``1b``."""
        if self.level_idc == 11 and self.constraint_flags & 0x10 and self.profile_idc in (66, 77):
            return "1b"
        return f"{self.level_idc // 10}.{self.level_idc % 10}"


def _skip_scaling_list(r: _BitReader, size: int) -> None:
    last = nxt = 8
    for _ in range(size):
        if nxt != 0:
            nxt = (last + r.se() + 256) % 256
        last = nxt if nxt != 0 else last


def _skip_hrd(r: _BitReader) -> None:
    cpb_cnt = r.ue() + 1
    if cpb_cnt > 32:
        raise BitstreamError("cpb_cnt out of range")
    r.u(4)
    r.u(4)
    for _ in range(cpb_cnt):
        r.ue()
        r.ue()
        r.u(1)
    r.u(20)


def _max_num_reorder_frames(r: _BitReader) -> int | None:
    """Walk ``vui_parameters()`` and return ``max_num_reorder_frames`` if present."""
    if r.u(1) and r.u(8) == 255:  # aspect_ratio_info_present_flag, aspect_ratio_idc
        r.u(32)
    if r.u(1):  # overscan_info_present_flag
        r.u(1)
    if r.u(1):  # video_signal_type_present_flag
        r.u(4)
        if r.u(1):
            r.u(24)
    if r.u(1):  # chroma_loc_info_present_flag
        r.ue()
        r.ue()
    if r.u(1):  # timing_info_present_flag
        r.u(32)
        r.u(32)
        r.u(1)
    nal_hrd = r.u(1)
    if nal_hrd:
        _skip_hrd(r)
    vcl_hrd = r.u(1)
    if vcl_hrd:
        _skip_hrd(r)
    if nal_hrd or vcl_hrd:
        r.u(1)
    r.u(1)  # pic_struct_present_flag
    if not r.u(1):  # bitstream_restriction_flag
        return None
    r.u(1)
    for _ in range(4):
        r.ue()
    return r.ue()


def parse_sps(nal: bytes | bytearray | memoryview) -> StreamInfo:
    """Parse a sequence parameter set NAL unit (header byte included).

    Raises :class:`BitstreamError` when the unit is not an SPS or is truncated/malformed.
    """
    if len(nal) < 4 or nal_type(nal[0]) != NAL_SPS:
        raise BitstreamError("not an SPS NAL unit")
    r = _BitReader(unescape_rbsp(nal[1:], limit=512))
    profile_idc = r.u(8)
    constraint_flags = r.u(8)
    level_idc = r.u(8)
    if r.ue() > 31:
        raise BitstreamError("seq_parameter_set_id out of range")
    chroma_format_idc = 1
    if profile_idc in _HIGH_PROFILES:
        chroma_format_idc = r.ue()
        if chroma_format_idc > 3:
            raise BitstreamError("chroma_format_idc out of range")
        if chroma_format_idc == 3:
            r.u(1)
        r.ue()
        r.ue()
        r.u(1)
        if r.u(1):  # seq_scaling_matrix_present_flag
            for i in range(12 if chroma_format_idc == 3 else 8):
                if r.u(1):
                    _skip_scaling_list(r, 16 if i < 6 else 64)
    r.ue()  # log2_max_frame_num_minus4
    poc_type = r.ue()
    if poc_type == 0:
        r.ue()
    elif poc_type == 1:
        r.u(1)
        r.se()
        r.se()
        cycle = r.ue()
        if cycle > 255:
            raise BitstreamError("num_ref_frames_in_pic_order_cnt_cycle out of range")
        for _ in range(cycle):
            r.se()
    elif poc_type != 2:
        raise BitstreamError("pic_order_cnt_type out of range")
    r.ue()  # max_num_ref_frames
    r.u(1)
    width_mbs = r.ue() + 1
    height_map_units = r.ue() + 1
    frame_mbs_only = r.u(1)
    if not frame_mbs_only:
        r.u(1)
    r.u(1)
    crop = (r.ue(), r.ue(), r.ue(), r.ue()) if r.u(1) else (0, 0, 0, 0)
    reorder: int | None = None
    if r.u(1):  # vui_parameters_present_flag
        try:
            reorder = _max_num_reorder_frames(r)
        except BitstreamError:
            reorder = None  # a truncated VUI leaves the size intact; just stay conservative
    sub_w, sub_h = {0: (1, 1), 1: (2, 2), 2: (2, 1), 3: (1, 1)}[chroma_format_idc]
    crop_x = 1 if chroma_format_idc == 0 else sub_w
    crop_y = (2 - frame_mbs_only) * (1 if chroma_format_idc == 0 else sub_h)
    width = width_mbs * 16 - crop_x * (crop[0] + crop[1])
    height = (2 - frame_mbs_only) * height_map_units * 16 - crop_y * (crop[2] + crop[3])
    if width <= 0 or height <= 0 or width > 16384 or height > 16384:
        raise BitstreamError(f"implausible picture size {width}x{height}")
    # Baseline has no B slices at all; otherwise trust the VUI, else assume the worst.
    may_have_bframes = False if profile_idc == 66 else (reorder is None or reorder > 0)
    return StreamInfo(
        profile_idc=profile_idc,
        constraint_flags=constraint_flags,
        level_idc=level_idc,
        width=width,
        height=height,
        profile_level_id=f"{profile_idc:02x}{constraint_flags:02x}{level_idc:02x}",
        may_have_bframes=may_have_bframes,
    )


class AccessUnitSplitter:
    """Cut an Annex B byte stream (a pipe, a file) into access units.

    A new access unit starts at an AUD/SPS/PPS/SEI, or at a slice with ``first_mb_in_slice == 0``,
    once the current unit already holds a picture's slice (7.4.1.2.3, simplified for the
    progressive, single-layer streams cameras produce). A unit is emitted as soon as the first
    NAL header of the next one arrives; :meth:`flush` emits the pending one early when the
    caller knows the writer is idle (``rpicam-vid --flush`` writes whole frames).
    """

    def __init__(self, max_au_bytes: int = 4 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._au_start = -1  # offset of the pending unit's first start code, -1 before any
        self._scan = 0
        self._has_vcl = False
        self._idr = False
        self._max = max_au_bytes
        self.discarded_bytes = 0
        self.oversized_units = 0

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[tuple[bytes, bool]]:
        """Append stream bytes; return the access units completed so far as ``(data, is_idr)``."""
        buf = self._buf
        buf += chunk
        out: list[tuple[bytes, bool]] = []
        while True:
            p = buf.find(START_CODE, self._scan)
            # Need the NAL header and one more byte (first_mb_in_slice) to decide.
            if p < 0 or p + 4 >= len(buf):
                break
            sc = p - 1 if p > 0 and buf[p - 1] == 0 else p
            kind = buf[p + 3] & 0x1F
            vcl = kind in (NAL_SLICE, NAL_IDR)
            if self._au_start < 0:
                self.discarded_bytes += sc
                self._au_start = sc
            elif self._has_vcl and (kind in _AU_OPENERS or (vcl and buf[p + 4] & 0x80)):
                out.append((bytes(buf[self._au_start : sc]), self._idr))
                self._au_start = sc
                self._has_vcl = self._idr = False
            if vcl:
                self._has_vcl = True
                self._idr = self._idr or kind == NAL_IDR
            self._scan = p + 3
        self._compact()
        return out

    def _compact(self) -> None:
        buf = self._buf
        if self._au_start > 0:
            del buf[: self._au_start]
            self._scan -= self._au_start
            self._au_start = 0
        elif self._au_start < 0 and len(buf) > 4:
            # No unit started yet: everything before the first (possibly partial, possibly
            # still undecided) start code is garbage.
            p = buf.find(START_CODE)
            drop = len(buf) - 3 if p < 0 else (p - 1 if p > 0 and buf[p - 1] == 0 else p)
            if drop > 0:
                self.discarded_bytes += drop
                del buf[:drop]
            self._scan = 0
        if len(buf) > self._max:
            # A unit larger than anything the muxer accepts: drop it and resynchronise.
            self.oversized_units += 1
            self.discarded_bytes += len(buf)
            buf.clear()
            self._au_start = -1
            self._scan = 0
            self._has_vcl = self._idr = False

    def flush(self) -> tuple[bytes, bool] | None:
        """Emit the pending access unit if it holds a picture (the writer is known to be idle)."""
        if self._au_start < 0 or not self._has_vcl:
            return None
        data = bytes(self._buf[self._au_start :])
        idr = self._idr
        self._buf.clear()
        self._au_start = -1
        self._scan = 0
        self._has_vcl = self._idr = False
        return data, idr

    def split_all(self, data: bytes | bytearray) -> list[tuple[bytes, bool]]:
        """Split a whole stream held in memory (a file) into access units."""
        units = self.feed(data)
        last = self.flush()
        if last is not None:
            units.append(last)
        return units
