"""The fan-out's own H.264 packetizer: what aiortc would send, cut for UDP GSO."""

from __future__ import annotations

from pathlib import Path

from aiortc.codecs.h264 import H264Encoder, h264_depayload

from ruseon_appliance.capture.h264 import AccessUnitSplitter
from ruseon_appliance.stream.h264_rtp import PACKET_MAX, equal_runs, fragment_fu_a, packetize

DATA = Path(__file__).resolve().parent.parent / "capture" / "data" / "cam_320x240_baseline.h264"


def depacketize(payloads: list[bytes]) -> bytes:
    """Annex B from RTP payloads, as aiortc's receiver rebuilds it."""
    return b"".join(h264_depayload(p) for p in payloads)


def test_fu_a_fragments_are_equal_but_the_last() -> None:
    for size in (PACKET_MAX + 1, 2 * PACKET_MAX, 5000, 5001, 39_999, 120_000):
        nal = bytes([0x65]) + bytes(range(256)) * (size // 256) + b"\x07" * (size % 256)
        nal = nal[:size]
        fragments = fragment_fu_a(nal)
        sizes = [len(f) for f in fragments]
        assert all(s <= PACKET_MAX for s in sizes)
        assert len(set(sizes[:-1])) <= 1 and sizes[-1] <= sizes[0]
        # As few fragments as aiortc makes (no extra packets for equal sizes).
        assert len(fragments) == len(H264Encoder._packetize_fu_a(nal))
        assert fragments[0][1] & 0x80 and fragments[-1][1] & 0x40
        assert all(f[0] & 0x1F == 28 and f[1] & 0x1F == 5 for f in fragments)
        assert b"".join(f[2:] for f in fragments) == nal[1:]


def test_recorded_stream_round_trips_and_batches() -> None:
    units = AccessUnitSplitter().split_all(DATA.read_bytes())
    assert len(units) > 30
    for data, _keyframe in units:
        ours = packetize(data)
        theirs = H264Encoder._packetize(H264Encoder._split_bitstream(data))
        # Same packet types and count as aiortc, same NAL units after depacketization.
        assert [p[0] & 0x1F for p in ours] == [p[0] & 0x1F for p in theirs]
        assert depacketize(ours) == depacketize(theirs)
        ends = equal_runs(ours)
        assert ends[-1] == len(ours) and ends == sorted(set(ends))
        start = 0
        for end in ends:
            batch = [len(p) for p in ours[start:end]]
            assert len(set(batch[:-1])) <= 1 and batch[-1] <= batch[0]
            start = end
        # Each fragmented NAL unit lies within one batch: one send per viewer.
        first = 0
        for i, p in enumerate(ours):
            if p[0] & 0x1F == 28 and p[1] & 0x80:
                first = i
            if p[0] & 0x1F == 28 and p[1] & 0x40:
                assert not [e for e in ends if first < e <= i], (first, i, ends)


def test_equal_runs() -> None:
    sizes = [30, 1000, 1000, 1000, 400, 1000, 1000, 50, 50, 60]
    assert equal_runs([b"x" * s for s in sizes]) == [1, 5, 8, 9, 10]
    assert equal_runs([]) == []
