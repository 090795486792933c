"""The SPS/PPS muxer: every IDR it emits starts with the parameter sets and decodes alone."""

from __future__ import annotations

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.h264 import NAL_PPS, NAL_SPS, START_CODE_4, nal_spans
from ruseon_appliance.capture.muxer import Muxer

from .conftest import decode_alone


def unit(data: bytes, n: int = 0, keyframe: bool = False) -> AccessUnit:
    return AccessUnit(data, pts=n * 3000, keyframe=keyframe, capture_time_us=n)


def strip_parameter_sets(data: bytes) -> bytes:
    return b"".join(
        START_CODE_4 + data[s:e] for s, e in nal_spans(data) if data[s] & 0x1F not in (7, 8)
    )


def assert_idr_shape(data: bytes, muxer: Muxer) -> None:
    assert muxer.sps is not None and muxer.pps is not None
    head = START_CODE_4 + muxer.sps + START_CODE_4 + muxer.pps + START_CODE_4
    assert data.startswith(head)
    assert len(decode_alone(data)) == 1


def test_idr_gets_cached_parameter_sets(once_units: list[tuple[bytes, bool]]) -> None:
    muxer = Muxer(64 * 1024)
    out = []
    for n, (data, idr) in enumerate(once_units):
        emitted = muxer.push(unit(data, n, idr))
        assert emitted is not None
        out.append((bytes(emitted.data), emitted.keyframe, idr))
    keyframes = [o for o in out if o[1]]
    assert len(keyframes) == 3  # GOP 20 over 60 frames
    # The recording carries SPS/PPS only before the first IDR; every emitted IDR has them now.
    raw_idrs_without_sps = [d for d, idr in once_units if idr and NAL_SPS not in
                            [d[s] & 0x1F for s, _ in nal_spans(d)]]
    assert len(raw_idrs_without_sps) == 2
    for data, keyframe, idr in out:
        assert keyframe == idr
        if keyframe:
            assert_idr_shape(data, muxer)
    info = muxer.stream_info
    assert info is not None and (info.width, info.height, info.profile_idc) == (160, 120, 77)


def test_p_frames_pass_through_without_copy(cam_units: list[tuple[bytes, bool]]) -> None:
    muxer = Muxer(64 * 1024)
    muxer.push(unit(cam_units[0][0], 0, True))
    data = cam_units[1][0]
    emitted = muxer.push(unit(data, 1))
    assert emitted is not None and emitted.data is data


def test_idr_before_parameter_sets_is_held_back(cam_units: list[tuple[bytes, bool]]) -> None:
    muxer = Muxer(64 * 1024)
    bare_idr = strip_parameter_sets(cam_units[0][0])
    assert muxer.push(unit(bare_idr, 0, True)) is None
    assert muxer.push(unit(cam_units[1][0], 1)) is None  # P frame: nothing to predict from
    assert muxer.counters["idr_without_parameter_sets"] == 1
    assert muxer.counters["before_first_keyframe"] == 1
    # Parameter sets arriving alone are cached, then the next bare IDR is completed.
    idr = cam_units[0][0]
    sps_pps = b"".join(START_CODE_4 + idr[s:e] for s, e in nal_spans(idr) if idr[s] & 31 in (7, 8))
    assert muxer.push(unit(sps_pps, 2)) is None
    emitted = muxer.push(unit(bare_idr, 3, True))
    assert emitted is not None and emitted.keyframe
    assert_idr_shape(bytes(emitted.data), muxer)


def test_resolution_change_replaces_the_cache(
    cam_units: list[tuple[bytes, bool]], once_units: list[tuple[bytes, bool]]
) -> None:
    muxer = Muxer(64 * 1024)
    muxer.push(unit(cam_units[0][0], 0, True))
    assert muxer.stream_info is not None and muxer.stream_info.width == 320
    emitted = muxer.push(unit(once_units[0][0], 1, True))
    assert emitted is not None
    assert muxer.stream_info.width == 160
    assert muxer.counters["parameter_set_changes"] == 1
    frames = decode_alone(bytes(emitted.data))
    assert (frames[0].width, frames[0].height) == (160, 120)


def test_bad_units_are_counted_not_raised(cam_units: list[tuple[bytes, bool]]) -> None:
    muxer = Muxer(16 * 1024)
    assert muxer.push(unit(b"")) is None
    assert muxer.push(unit(b"no start code here")) is None
    assert muxer.push(unit(b"\x00\x00\x01\xe5garbage")) is None  # forbidden bit set
    assert muxer.counters["empty"] == 1
    assert muxer.counters["no_start_code"] == 1
    assert muxer.counters["invalid_nal"] == 1
    big = cam_units[0][0] + b"\x00\x00\x00\x01\x01" + b"\x55" * 20_000
    assert muxer.push(unit(big, 0, True)) is None
    assert muxer.counters["oversized"] == 1
    # Garbage before the first start code and between units is dropped from the output.
    dirty = b"\xffjunk" + cam_units[0][0] + b"\x00\x00\x01\x80\x01\x02"
    emitted = muxer.push(unit(dirty, 1, True))
    assert emitted is not None
    assert_idr_shape(bytes(emitted.data), muxer)
    kinds = [emitted.data[s] & 0x1F for s, _ in nal_spans(bytes(emitted.data))]
    assert kinds[:2] == [NAL_SPS, NAL_PPS] and kinds.count(NAL_SPS) == 1


def test_assembly_allocates_nothing_proportional_to_the_frame(
    cam_units: list[tuple[bytes, bool]],
) -> None:
    """The IDR rebuild copies into the preallocated buffer only (no temporary payload copies)."""
    import tracemalloc

    from ruseon_appliance.capture.ring import RingBuffer

    muxer = Muxer(1024 * 1024)
    ring = RingBuffer(4 * 1024 * 1024, 64)
    idr = cam_units[0][0]
    big_idr = idr + b"\x00\x00\x00\x01\x05" + b"\x55" * 300_000  # a second, huge IDR slice
    muxer.push(unit(big_idr, 0, True))  # warm up (first-time SPS parse, caches)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = muxer.push(unit(big_idr, 1, True))
        assert out is not None
        ring.write(out)
        transient = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert len(out.data) > 300_000
    assert transient < 16 * 1024, transient
