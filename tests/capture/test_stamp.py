"""The stamp survives libx264 at low bitrates and reads back from PyAV-decoded frames."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest

from ruseon_appliance.capture.sources.synthetic import MovingPicture
from ruseon_appliance.capture.stamp import draw_stamp, read_stamp


def roundtrip(frames: list[av.VideoFrame], bitrate: int) -> list[av.VideoFrame]:
    first = frames[0]
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = first.width, first.height, "yuv420p"
    enc.time_base = Fraction(1, 30)
    enc.bit_rate = bitrate
    enc.options = {"preset": "ultrafast", "tune": "zerolatency", "threads": "1"}
    dec = av.CodecContext.create("h264", "r")
    out: list[av.VideoFrame] = []
    for i, frame in enumerate(frames):
        frame.pts = i
        for packet in enc.encode(frame):
            out.extend(dec.decode(packet))
    for packet in enc.encode(None):
        out.extend(dec.decode(packet))
    out.extend(dec.decode(None))
    return out


@pytest.mark.parametrize(("width", "height", "bitrate"), [(320, 240, 150_000), (640, 360, 300_000)])
def test_stamp_survives_encode_and_decode(width: int, height: int, bitrate: int) -> None:
    pattern = MovingPicture(width, height)
    base = 1_764_000_000_123_456
    sent = [(base + i * 33_333, 4_000_000_000 + i) for i in range(20)]
    decoded = roundtrip([pattern.render(n, t) for t, n in sent], bitrate)
    assert [read_stamp(f) for f in decoded] == [(t, n & 0xFFFFFFFF) for t, n in sent]


def test_stamp_on_720p_frame_and_full_64_bit_range() -> None:
    luma = np.full((720, 1280), 128, np.uint8)
    draw_stamp(luma, 2**64 - 1, 2**32 - 1)
    assert read_stamp(luma) == (2**64 - 1, 2**32 - 1)
    frame = av.VideoFrame.from_ndarray(np.concatenate([luma, np.full((360, 1280), 128, np.uint8)]),
                                       format="yuv420p")
    decoded = roundtrip([frame], 1_000_000)
    assert read_stamp(decoded[0]) == (2**64 - 1, 2**32 - 1)


def test_draw_into_rgb_and_video_frame() -> None:
    rgb = np.zeros((240, 320, 3), np.uint8)
    draw_stamp(rgb, 123_456_789, 42)
    assert read_stamp(rgb) == (123_456_789, 42)
    frame = av.VideoFrame(320, 240, "yuv420p")
    for plane in frame.planes:
        np.frombuffer(memoryview(plane), np.uint8)[:] = 128
    draw_stamp(frame, 987_654_321, 7)
    assert read_stamp(frame) == (987_654_321, 7)
    # Through a format conversion too (the HIL harness may decode to rgb24).
    assert read_stamp(frame.reformat(format="rgb24")) == (987_654_321, 7)


def test_no_stamp_reads_as_none() -> None:
    assert read_stamp(np.full((240, 320), 16, np.uint8)) is None
    assert read_stamp(np.full((240, 320), 235, np.uint8)) is None
    noise = np.random.default_rng(5).integers(0, 255, (240, 320), dtype=np.uint8)
    assert read_stamp(noise) is None
    assert read_stamp(np.zeros((40, 60), np.uint8)) is None  # too small to hold one


def test_corrupted_stamp_is_rejected() -> None:
    luma = np.full((240, 320), 128, np.uint8)
    draw_stamp(luma, 1_000_000, 5)
    luma[8:16, 8:16] = 255 - luma[12, 12]  # flip the first bit
    assert read_stamp(luma) is None
