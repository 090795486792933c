"""The fMP4 segmenter with real H.264: ffmpeg/ffprobe read what it writes, frame for frame."""

from __future__ import annotations

import asyncio
import itertools
import struct
from pathlib import Path

import pytest

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.h264 import AccessUnitSplitter
from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.segmenter import Fmp4Segmenter, Fragment, run_segmenter
from ruseon_appliance.segmenter.boxes import find_box, iter_boxes

from .stream import Unit, encode, ffmpeg_errors, probe_frames, probe_size, segment

CAM = Path(__file__).parents[1] / "capture" / "data" / "cam_320x240_baseline.h264"


def cam_units() -> list[Unit]:
    units = AccessUnitSplitter().split_all(CAM.read_bytes())
    return [Unit(d, i * 3000, k, 1_000_000 + i * 33_333) for i, (d, k) in enumerate(units)]


def write(path: Path, init: bytes | None, fragments: list[Fragment]) -> Path:
    assert init is not None
    path.write_bytes(init + b"".join(f.data for f in fragments))
    return path


def test_recorded_camera_stream_round_trips(tmp_path: Path) -> None:
    units = cam_units()
    seg = Fmp4Segmenter(fragment_max_s=0.25)
    fragments = segment(units, seg)
    assert seg.codec == "avc1.42c00d"
    out = write(tmp_path / "cam.mp4", seg.init_segment, fragments)
    assert ffmpeg_errors(out) == ""
    frames = probe_frames(out)
    assert len(frames) == len(units) == 90
    assert [i for i, (key, _) in enumerate(frames) if key] == [0, 30, 60]
    assert frames[1][1] == pytest.approx(3000 / 90_000, abs=1e-5)
    assert sum(f.frames for f in fragments) == 90
    # Every IDR starts a fragment; no fragment exceeds 0.25 s by more than a frame.
    starts = 0
    for f in fragments:
        assert f.independent == (starts % 30 == 0)
        assert f.frames <= 8 and f.duration == f.frames * 3000
        assert f.start_pts == starts * 3000
        assert f.capture_time_us == 1_000_000 + starts * 33_333
        starts += f.frames
    # The boxes say what the Fragment says.
    for number, f in enumerate(fragments, start=1):
        assert f.sequence == number and f.init_generation == 0
        mfhd = find_box(f.data, [b"moof", b"mfhd"])
        tfdt = find_box(f.data, [b"moof", b"traf", b"tfdt"])
        assert mfhd and tfdt
        assert struct.unpack_from(">I", f.data, mfhd[0] + 4)[0] == f.sequence
        assert struct.unpack_from(">Q", f.data, tfdt[0] + 4)[0] == f.start_pts
        assert [k for k, _, _ in iter_boxes(f.data)] == [b"moof", b"mdat"]


def test_skipped_frames_never_take_a_part_past_its_limit(tmp_path: Path) -> None:
    """A camera that skips frames (a busy board, a starved encoder) gives samples several frame
    times long. The part they fall in is closed before them rather than outgrow PART-TARGET,
    which LL-HLS forbids; only a single sample longer than the limit makes a longer part."""
    # The recorded frames, with frame slots skipped before some of them (what the encoder never
    # got): 1 to 5 slots at different places within parts, and a stall of 12.
    skips_before = {3: 5, 9: 2, 15: 3, 33: 4, 52: 1, 60: 12}
    kept, slot = [], 0
    for i, unit in enumerate(cam_units()):
        slot += skips_before.get(i, 0)
        kept.append(Unit(unit.data, slot * 3000, unit.keyframe, 1_000_000 + slot * 33_333))
        slot += 1
    limit = 0.25
    loose = segment(kept, Fmp4Segmenter(fragment_max_s=0.2167))
    assert any(f.frames > 1 and f.duration > limit * 90_000 for f in loose), (
        "the control: without a limit the skips do make over-long parts")
    seg = Fmp4Segmenter(fragment_max_s=0.2167, fragment_limit_s=limit)
    fragments = segment(kept, seg)
    assert seg.split_for_limit > 0
    for f in fragments:
        assert f.frames == 1 or f.duration <= limit * 90_000, (f.frames, f.duration)
    # ... and those (here the stall of 12 slots) are counted, and only those.
    assert seg.over_limit == sum(1 for f in fragments if f.duration > limit * 90_000) == 1
    # The timeline stays whole: each fragment starts where the one before ended.
    for before, after in itertools.pairwise(fragments):
        assert after.start_pts == before.start_pts + before.duration
    assert sum(f.frames for f in fragments) == len(kept)
    out = write(tmp_path / "skips.mp4", seg.init_segment, fragments)
    assert ffmpeg_errors(out) == ""
    assert len(probe_frames(out)) == len(kept)


def test_longer_fragments_and_high_profile(tmp_path: Path) -> None:
    units = encode(60, gop=30, profile="high")
    seg = Fmp4Segmenter(fragment_max_s=1.0)
    fragments = segment(units, seg)
    assert seg.codec is not None and seg.codec.startswith("avc1.64")
    assert [f.frames for f in fragments] == [30, 30]
    assert all(f.independent for f in fragments)
    out = write(tmp_path / "high.mp4", seg.init_segment, fragments)
    assert ffmpeg_errors(out) == ""
    assert len(probe_frames(out)) == 60


def test_nothing_before_the_first_idr() -> None:
    units = encode(20, gop=15)
    seg = Fmp4Segmenter()
    for u in units[1:15]:
        assert seg.push(u.data, u.pts, u.keyframe, u.capture_time_us) == []
    assert seg.init_segment is None and seg.codec is None
    assert seg.dropped_before_idr == 14
    assert seg.push(b"\x00\x00\x00\x01", 0, True, 0) == []  # no NAL unit at all
    assert seg.bad_units == 1
    fragments = segment(units[15:], seg)
    assert seg.init_segment is not None
    assert fragments[0].independent and sum(f.frames for f in fragments) == 5


def test_parameter_set_change_starts_a_new_init_generation(tmp_path: Path) -> None:
    small = encode(30, width=160, height=96)
    large = encode(30, width=320, height=192, first_frame=30)
    seg = Fmp4Segmenter(fragment_max_s=0.5)
    by_generation: dict[int, list[Fragment]] = {}
    inits: dict[int, bytes] = {}
    for u in small + large:
        for f in seg.push(u.data, u.pts, u.keyframe, u.capture_time_us):
            by_generation.setdefault(f.init_generation, []).append(f)
            # The fragment closed just before the change still belongs to the old init segment,
            # which init_segment_for() keeps (init_segment is already the new one then).
            init = seg.init_segment_for(f.init_generation)
            assert init is not None
            inits.setdefault(f.init_generation, init)
    for f in seg.flush():
        by_generation.setdefault(f.init_generation, []).append(f)
    assert seg.init_generation == 1 and sorted(by_generation) == [0, 1]
    assert by_generation[1][0].independent
    assert inits[0] != inits[1]
    for generation, width in ((0, 160), (1, 320)):
        out = write(tmp_path / f"g{generation}.mp4", inits[generation], by_generation[generation])
        assert ffmpeg_errors(out) == ""
        assert len(probe_frames(out)) == 30
        assert f"{width}x" in probe_size(out)
    assert seg.stream_info is not None
    assert (seg.stream_info.width, seg.stream_info.height) == (320, 192)


def test_reset_keeps_what_was_buffered_and_waits_for_an_idr() -> None:
    units = encode(40, gop=15)
    seg = Fmp4Segmenter(fragment_max_s=10)
    got: list[Fragment] = []
    for u in units[:20]:
        got += seg.push(u.data, u.pts, u.keyframe, u.capture_time_us)
    assert [f.frames for f in got] == [15]
    seg.reset()
    # Frames 20..29 are not IDRs: dropped; the buffered frames 15..19 come out with the next push.
    got += seg.push(units[20].data, units[20].pts, units[20].keyframe, 0)
    assert [f.frames for f in got] == [15, 5]
    for u in units[21:30]:
        assert seg.push(u.data, u.pts, u.keyframe, u.capture_time_us) == []
    got += segment(units[30:], seg)
    assert [f.frames for f in got] == [15, 5, 10]
    assert got[2].independent and got[2].start_pts == units[30].pts


def test_run_segmenter_reads_the_ring_and_resets_on_overrun() -> None:
    units = encode(90, gop=15)

    async def main() -> tuple[list[Fragment], int]:
        ring = RingBuffer(4 * 1024 * 1024, slots=32)
        reader = ring.reader("next")
        seg = Fmp4Segmenter(fragment_max_s=0.25)
        got: list[Fragment] = []
        task = asyncio.create_task(run_segmenter(reader, seg, got.extend))
        for u in units[:30]:
            ring.write(AccessUnit(u.data, u.pts, u.keyframe, u.capture_time_us))
            await asyncio.sleep(0)
        while reader.lag:
            await asyncio.sleep(0.01)
        # 40 frames without yielding: the 32-slot ring laps the reader.
        for u in units[30:70]:
            ring.write(AccessUnit(u.data, u.pts, u.keyframe, u.capture_time_us))
        for u in units[70:]:
            ring.write(AccessUnit(u.data, u.pts, u.keyframe, u.capture_time_us))
            await asyncio.sleep(0)
        while reader.lag:
            await asyncio.sleep(0.01)
        reader.close()
        await asyncio.wait_for(task, 10)
        return got, reader.overruns

    got, overruns = asyncio.run(main())
    assert overruns == 1
    # The first 30 frames, then from the newest keyframe after the lap (frame 60) to the end.
    pts = [f.start_pts for f in got]
    assert sum(f.frames for f in got) == 30 + 30
    jump = pts.index(units[60].pts)
    assert got[jump].independent and sum(f.frames for f in got[:jump]) == 30
    assert [f.sequence for f in got] == list(range(1, len(got) + 1))
