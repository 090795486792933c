"""Bad input never escapes as an exception, and every IDR the muxer emits decodes on its own.

Property-based (hypothesis): random bytes and mutated real streams go into the NAL scanner, the
SPS parser, the access-unit splitter, the muxer and the ring.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.h264 import (
    START_CODE_4,
    AccessUnitSplitter,
    BitstreamError,
    nal_spans,
    parse_sps,
)
from ruseon_appliance.capture.muxer import Muxer
from ruseon_appliance.capture.ring import RingBuffer

from .conftest import CAM_STREAM, ONCE_STREAM, decode_alone, split_file

CAM = split_file(CAM_STREAM)[:35]  # 320x240, IDRs at 0 and 30, SPS/PPS in each IDR
ONCE = split_file(ONCE_STREAM)[:25]  # 160x120, IDRs at 0 and 20, SPS/PPS only in the first
SIZES = {320: 240, 160: 120}

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(st.binary(max_size=2000))
def test_parsers_never_raise_on_random_bytes(data: bytes) -> None:
    for start, end in nal_spans(data):
        assert 0 <= start < end <= len(data)
        try:
            info = parse_sps(data[start:end])
        except BitstreamError:
            continue
        assert info.width > 0 and info.height > 0 and len(info.profile_level_id) == 6
    splitter = AccessUnitSplitter(max_au_bytes=1000)
    for i in range(0, len(data), 97):
        splitter.feed(data[i : i + 97])
    splitter.flush()


@SETTINGS
@given(st.lists(st.integers(1, 2000), min_size=1, max_size=40))
def test_splitter_result_does_not_depend_on_chunking(cuts: list[int]) -> None:
    stream = ONCE_STREAM.read_bytes()
    splitter = AccessUnitSplitter()
    units = []
    pos = 0
    for n in cuts * 20:
        if pos >= len(stream):
            break
        units += splitter.feed(stream[pos : pos + n])
        pos += n
    units += splitter.feed(stream[pos:])
    last = splitter.flush()
    if last:
        units.append(last)
    assert units == split_file(ONCE_STREAM)


def _strip_parameter_sets(data: bytes) -> bytes:
    return b"".join(START_CODE_4 + data[s:e] for s, e in nal_spans(data)
                    if data[s] & 0x1F not in (7, 8))


# One mutation per access unit: what cameras, pipes and files really get wrong.
MUTATIONS = st.sampled_from([
    "keep", "keep", "keep", "drop", "strip_parameter_sets", "leading_garbage", "trailing_junk_nal",
    "empty", "junk_unit", "truncate_p", "three_byte_start_codes", "duplicate",
])


def _mutate(units: list[tuple[bytes, bool]], ops: list[str], junk: bytes) -> list[bytes]:
    out: list[bytes] = []
    for (data, idr), op in zip(units, ops, strict=False):
        if op == "drop":
            continue
        if op == "strip_parameter_sets":
            data = _strip_parameter_sets(data)
        elif op == "leading_garbage":
            data = junk.replace(b"\x00", b"\x07") + data
        elif op == "trailing_junk_nal":
            data = data + b"\x00\x00\x01\x80" + junk  # forbidden_zero_bit set
        elif op == "empty":
            out.append(b"")
        elif op == "junk_unit":
            out.append(junk)
        elif op == "truncate_p" and not idr:
            data = data[: max(5, len(data) // 3)]
        elif op == "three_byte_start_codes":
            data = data.replace(START_CODE_4, b"\x00\x00\x01")
        elif op == "duplicate":
            out.append(data)
        out.append(data)
    return out


@SETTINGS
@given(
    st.lists(MUTATIONS, min_size=60, max_size=60),
    st.binary(min_size=1, max_size=64),
    st.booleans(),
)
def test_mutated_streams_only_ever_emit_decodable_idrs(ops: list[str], junk: bytes,
                                                       cam_first: bool) -> None:
    streams = [CAM, ONCE] if cam_first else [ONCE, CAM]  # a mid-stream resolution change too
    muxer = Muxer(64 * 1024)
    ring = RingBuffer(256 * 1024, 64)
    reader = ring.reader()
    emitted_idrs = 0
    n = 0
    for units in streams:
        for data in _mutate(units, ops[n : n + len(units)], junk):
            out = muxer.push(AccessUnit(data, n, False, n))
            n += 1
            if out is None:
                continue
            ring.write(out)
            view = reader.poll()
            assert view is not None
            if not view.keyframe:
                continue
            emitted_idrs += 1
            frame_bytes = bytes(view.data)
            assert muxer.sps is not None and muxer.pps is not None
            assert frame_bytes.startswith(START_CODE_4 + muxer.sps + START_CODE_4 + muxer.pps)
            frames = decode_alone(frame_bytes)
            assert len(frames) == 1
            assert frames[0].height == SIZES[frames[0].width]
    kept_idrs = sum(1 for (_, idr), op in zip(CAM + ONCE, ops * 2, strict=False)
                    if idr and op != "drop")
    assert emitted_idrs <= kept_idrs * 2  # duplicates at most


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 1999), st.integers(0, 255)), max_size=30))
def test_muxer_survives_byte_flips(flips: list[tuple[int, int]]) -> None:
    muxer = Muxer(32 * 1024)
    stream = bytearray(b"".join(d for d, _ in ONCE))
    for pos, value in flips:
        stream[pos % len(stream)] = value
    for n, (data, _) in enumerate(AccessUnitSplitter().split_all(bytes(stream))):
        out = muxer.push(AccessUnit(data, n, False, n))
        if out is not None and out.keyframe:
            # Whatever survived the flips, an emitted IDR still leads with the cached SPS+PPS.
            assert muxer.sps is not None and muxer.pps is not None
            assert bytes(out.data).startswith(START_CODE_4 + muxer.sps + START_CODE_4 + muxer.pps)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 5000), st.booleans()), min_size=1, max_size=120),
       st.integers(1, 6))
# Found by this test: empty frames at the offset a wrapping write starts from hid the overwritten
# 1-byte frame behind them (test_ring.py has it spelled out).
@example([(0, False)] * 14 + [(0, True), (1, False), (4096, False)], 2)
def test_ring_never_serves_overwritten_bytes(
    writes: list[tuple[int, bool]], read_every: int
) -> None:
    ring = RingBuffer(4096, 16)
    reader = ring.reader()
    expected: dict[int, bytes] = {}
    for i, (size, key) in enumerate(writes):
        payload = bytes([i % 256]) * size
        seq = ring.write(AccessUnit(payload, i, key, i))
        if size > 4096:
            assert seq is None
            continue
        assert seq is not None
        expected[seq] = payload
        if i % read_every == 0:
            while (view := reader.poll()) is not None:
                assert bytes(view.data) == expected[view.seq]
    stats = ring.stats()
    assert 0 <= stats["bytes_used"] <= 4096 and stats["frames"] <= 16
