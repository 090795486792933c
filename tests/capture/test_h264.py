"""NAL scanning, SPS parsing and access-unit splitting against real libx264 output."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest

from ruseon_appliance.capture.h264 import (
    NAL_IDR,
    NAL_PPS,
    NAL_SLICE,
    NAL_SPS,
    AccessUnitSplitter,
    BitstreamError,
    nal_spans,
    parse_sps,
)
from ruseon_appliance.capture.sources.synthetic import X264_PROFILE_TOOLS

from .conftest import CAM_STREAM, ONCE_STREAM


def _first_sps(data: bytes) -> bytes:
    for s, e in nal_spans(data):
        if data[s] & 0x1F == NAL_SPS:
            return data[s:e]
    raise AssertionError("no SPS")


def test_nal_spans_handles_3_and_4_byte_start_codes_and_garbage() -> None:
    data = b"junk\x00\x00\x00\x01\x67\xaa\xbb\x00\x00\x01\x68\xcc\x00\x00\x00\x01\x65\x01\x02\x00"
    spans = nal_spans(data)
    assert [data[s:e] for s, e in spans] == [b"\x67\xaa\xbb", b"\x68\xcc", b"\x65\x01\x02"]


def test_nal_spans_skips_empty_units() -> None:
    assert nal_spans(b"\x00\x00\x01\x00\x00\x01\x41\x01") == [(6, 8)]
    assert nal_spans(b"") == []
    assert nal_spans(b"\x00\x00\x00\x00") == []


@pytest.mark.parametrize(
    ("profile", "idc", "size"),
    [("baseline", 66, (320, 240)), ("main", 77, (176, 144)), ("high", 100, (200, 120))],
)
def test_parse_sps_from_libx264(profile: str, idc: int, size: tuple[int, int]) -> None:
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height = size
    ctx.pix_fmt = "yuv420p"
    ctx.time_base = Fraction(1, 30)
    ctx.options = {"preset": "ultrafast", "tune": "zerolatency", "profile": profile,
                   "x264-params": X264_PROFILE_TOOLS[profile].rstrip(":")}
    frame = av.VideoFrame.from_ndarray(
        np.zeros((size[1] * 3 // 2, size[0]), np.uint8), format="yuv420p"
    )
    frame.pts = 0
    data = b"".join(bytes(p) for p in ctx.encode(frame))
    info = parse_sps(_first_sps(data))
    assert info.profile_idc == idc
    # 200 = 12.5 macroblocks wide: frame cropping must be applied.
    assert (info.width, info.height) == size
    assert info.profile_level_id == f"{idc:02x}{info.constraint_flags:02x}{info.level_idc:02x}"
    assert info.may_have_bframes is False  # zerolatency: no reordering, VUI says so


def test_parse_sps_reports_possible_bframes() -> None:
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = 64, 64, "yuv420p"
    ctx.time_base = Fraction(1, 30)
    ctx.max_b_frames = 2
    ctx.options = {"preset": "ultrafast", "profile": "main", "bf": "2"}
    data = b""
    for i in range(8):
        frame = av.VideoFrame.from_ndarray(np.zeros((96, 64), np.uint8), format="yuv420p")
        frame.pts = i
        data += b"".join(bytes(p) for p in ctx.encode(frame))
    data += b"".join(bytes(p) for p in ctx.encode(None))
    assert parse_sps(_first_sps(data)).may_have_bframes is True


def test_parse_sps_rejects_truncated_and_foreign_units() -> None:
    sps = _first_sps(CAM_STREAM.read_bytes())
    with pytest.raises(BitstreamError):
        parse_sps(sps[:5])
    with pytest.raises(BitstreamError):
        parse_sps(b"\x68\xce\x3c\x80")


def test_splitter_finds_every_picture(cam_units: list[tuple[bytes, bool]]) -> None:
    assert len(cam_units) == 90
    assert [i for i, (_, idr) in enumerate(cam_units) if idr] == [0, 30, 60]
    for data, idr in cam_units:
        kinds = [data[s] & 0x1F for s, _ in nal_spans(data)]
        assert (NAL_IDR in kinds) == idr
        assert NAL_SLICE in kinds or NAL_IDR in kinds
        if idr:
            assert kinds[:2] == [NAL_SPS, NAL_PPS]


def test_splitter_is_independent_of_chunking() -> None:
    stream = ONCE_STREAM.read_bytes()
    whole = AccessUnitSplitter().split_all(stream)
    rng = np.random.default_rng(3)
    splitter = AccessUnitSplitter()
    pieces: list[tuple[bytes, bool]] = []
    pos = 0
    while pos < len(stream):
        n = int(rng.integers(1, 700))
        pieces.extend(splitter.feed(stream[pos : pos + n]))
        pos += n
    last = splitter.flush()
    assert last is not None
    pieces.append(last)
    assert pieces == whole
    assert len(whole) == 60
    assert b"".join(d for d, _ in whole) == stream


def test_splitter_discards_leading_garbage() -> None:
    stream = CAM_STREAM.read_bytes()
    splitter = AccessUnitSplitter()
    units = splitter.split_all(b"\xff" * 1000 + stream)
    assert splitter.discarded_bytes == 1000
    assert len(units) == 90
