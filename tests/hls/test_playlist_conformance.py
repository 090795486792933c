"""Playlist conformance: tags, their order, TARGETDURATION against every segment, parts against
PART-TARGET, and media/discontinuity sequence continuity across the window wrapping, a camera
restart (timestamps jump, new init segment), a ring overrun (the segmenter is reset) and a camera
whose keyframes come later than the target duration.

The first tests feed the window hand-made fragments (exact control over timing); the last one
runs real H.264 through the real ring, segmenter and window.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.h264 import AccessUnitSplitter
from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.hls import HlsStream, LiveWindow, render
from ruseon_appliance.hls.playlist import init_name
from ruseon_appliance.hls.window import (
    fragment_max_for,
    layout_fits,
    part_layout,
    target_duration_for,
)
from ruseon_appliance.segmenter import Fragment
from tests.hls.m3u8 import ContinuityChecker, MediaPlaylist, Violation, parse

FPS = 30
FRAME = 90_000 // FPS
CAM_STREAM = Path(__file__).resolve().parents[1] / "capture" / "data" / "cam_320x240_baseline.h264"


class FakeCamera:
    """Fragments as the segmenter makes them: parts of up to ``part_frames`` frames, a new
    independent fragment at every IDR."""

    def __init__(self, gop: int = 60, part_frames: int = 7) -> None:
        self.gop = gop
        self.part_frames = part_frames
        self.pts = 0
        self.frame = 0
        self.capture_us = 1_764_000_000_000_000
        self.sequence = 0
        self.generation = 0

    def restart(self, *, new_generation: bool) -> None:
        """The camera restarts: timestamps start over, the next frame is an IDR."""
        self.pts = 0
        self.frame = 0
        self.capture_us += 500_000  # it was away for half a second
        if new_generation:
            self.generation += 1

    def fragments(self, count: int) -> Iterator[Fragment]:
        for _ in range(count):
            into_gop = self.frame % self.gop
            frames = min(self.part_frames, self.gop - into_gop)
            self.sequence += 1
            yield Fragment(
                data=f"part {self.sequence}".encode(), sequence=self.sequence,
                start_pts=self.pts, duration=frames * FRAME, independent=into_gop == 0,
                frames=frames, capture_time_us=self.capture_us,
                init_generation=self.generation,
            )
            self.pts += frames * FRAME
            self.frame += frames
            self.capture_us += frames * 1_000_000 // FPS


def new_window(gop: int = 60, window_s: float = 8.0) -> LiveWindow:
    return LiveWindow(target_duration=target_duration_for(gop, FPS), part_target_s=0.25,
                      window_s=window_s, run_id="0123abcd")


def feed(window: LiveWindow, camera: FakeCamera, count: int,
         checker: ContinuityChecker) -> MediaPlaylist:
    """Add ``count`` fragments, parsing and checking the playlist after each one."""
    playlist = None
    for fragment in camera.fragments(count):
        window.add_init(fragment.init_generation, b"init %d" % fragment.init_generation)
        window.add(fragment)
        playlist = parse(render(window))
        checker.add(playlist)
    assert playlist is not None
    return playlist


def test_header_parts_and_segments_follow_the_spec() -> None:
    window, camera, checker = new_window(), FakeCamera(), ContinuityChecker()
    playlist = feed(window, camera, 40, checker)
    assert playlist.version >= 6
    assert playlist.target_duration == 2
    assert playlist.part_target == 0.25
    assert float(playlist.server_control["PART-HOLD-BACK"]) >= 3 * playlist.part_target
    assert playlist.media_sequence == 0 and playlist.discontinuity_sequence == 0
    complete = [s for s in playlist.segments if s.uri is not None]
    assert len(complete) >= 3
    for segment in complete:
        # Every segment starts at an IDR here, and only its first part is independent.
        if segment.parts:
            assert segment.parts[0].independent
            assert not any(p.independent for p in segment.parts[1:])
        assert segment.duration is not None and abs(segment.duration - 2.0) < 1e-6
        assert segment.map_uri == init_name("0123abcd", 0)
        assert segment.program_date_time is not None
    # Parts are listed for the last three target durations only, and the newest segment (still
    # open) is there with its parts; the preload hint names the part after the newest.
    assert not complete[0].parts and complete[-1].parts
    newest = playlist.segments[-1]
    assert newest.uri is None and newest.parts
    assert playlist.preload_hint is not None
    assert playlist.preload_hint["URI"] == f"part-0123abcd-{window.next_part_number}.m4s"
    # Program date-time is the capture clock: consecutive segments 2 s apart.
    times = [s.program_date_time for s in complete]
    assert all(t is not None for t in times)
    gaps = {round((b - a).total_seconds(), 3) for a, b in itertools.pairwise(times)
            if a is not None and b is not None}
    assert gaps and all(abs(g - 2.0) <= 0.002 for g in gaps), gaps  # ms-rounded stamps


def test_sequence_continuity_across_window_wrap_and_camera_restarts() -> None:
    window, camera, checker = new_window(), FakeCamera(), ContinuityChecker()
    feed(window, camera, 200, checker)  # about 22 s: the 8 s window wraps many times
    wrapped = parse(render(window))
    assert wrapped.media_sequence > 5
    assert window.size < 10_000  # bounded (fake parts are a few bytes each)
    # A camera restart with the same SPS/PPS: timestamps start over.
    camera.restart(new_generation=False)
    after = feed(window, camera, 12, checker)
    restarted = [s for s in after.segments if s.discontinuity]
    assert len(restarted) == 1 and restarted[0].map_uri == init_name("0123abcd", 0)
    # Then one with new SPS/PPS: a discontinuity and a new EXT-X-MAP.
    camera.restart(new_generation=True)
    after = feed(window, camera, 12, checker)
    assert [s.dsn for s in after.segments if s.discontinuity] == [1, 2]
    assert after.segments[-1].map_uri == init_name("0123abcd", 1)
    assert window.init(1) is not None
    # Both discontinuities leave the window; the discontinuity sequence keeps their count and
    # the first generation's init segment is dropped.
    final = feed(window, camera, 100, checker)
    assert final.discontinuity_sequence == 2
    assert not any(s.discontinuity for s in final.segments)
    assert window.init(0) is None and window.inits.keys() == {1}
    assert {s.map_uri for s in final.segments} == {init_name("0123abcd", 1)}


def test_a_gop_longer_than_the_target_duration_is_split_without_an_idr() -> None:
    # The config says a 2 s GOP (TARGETDURATION 2), but the camera sends one IDR per 5 s.
    window, camera, checker = new_window(gop=60), FakeCamera(gop=150), ContinuityChecker()
    playlist = feed(window, camera, 60, checker)
    complete = [s for s in playlist.segments if s.uri is not None]
    assert window.segments_split > 0
    assert all(s.duration is not None and round(s.duration) <= 2 for s in complete)
    # A split segment starts with a part that is not independent, and says so by omission.
    assert any(s.parts and not s.parts[0].independent for s in complete)


def test_a_segment_half_a_second_over_the_target_is_split() -> None:
    # A 2.5 s GOP under a 2 s target: 10 parts of 7 frames and one of 5 would make a 2.5 s
    # segment, which Python's round() takes to 2 but RFC 8216's "nearest integer" (and Apple's
    # validator) to 3 > TARGETDURATION.
    window, camera, checker = new_window(gop=60), FakeCamera(gop=75), ContinuityChecker()
    playlist = feed(window, camera, 40, checker)
    complete = [s for s in playlist.segments if s.uri is not None]
    assert complete and all(s.duration is not None and s.duration < 2.5 - 1e-6
                            for s in complete), [s.duration for s in complete]


@pytest.mark.parametrize("fps", [10, 15, 20, 24, 25, 30, 60])
@pytest.mark.parametrize("part_s", [0.2, 0.25, 0.5])
def test_parts_fit_part_target_at_any_frame_rate(fps: int, part_s: float) -> None:
    """Every part at most PART-TARGET and, but for the exempt ones, at least 85% of it (the
    parser checks both), whatever the frame rate: parts are whole frames, so the advertised
    PART-TARGET must follow the frames, not only the configured part duration."""
    units = AccessUnitSplitter().split_all(CAM_STREAM.read_bytes())  # GOP 30
    ring = RingBuffer(1024 * 1024, 128)
    stream = HlsStream(ring, framerate=fps, keyframe_interval=30, part_target_s=part_s,
                       window_s=8.0)
    segmenter, checker = stream.segmenter, ContinuityChecker()
    for i in range(90):
        data, keyframe = units[i % len(units)]
        unit = AccessUnit(data, i * (90_000 // fps), keyframe,
                          1_764_000_000_000_000 + i * 1_000_000 // fps)
        seq = ring.write(unit)
        fragments = segmenter.push(data, unit.pts, keyframe, unit.capture_time_us, seq)
        if fragments:
            stream.add_fragments(fragments, segmenter.init_segment or b"")
            checker.add(parse(render(stream.window)))
    playlist = parse(render(stream.window))
    assert len([s for s in playlist.segments if s.uri]) >= 2
    assert playlist.part_target <= part_s  # never longer than configured


async def test_real_stream_through_ring_and_segmenter_survives_an_overrun() -> None:
    """Real H.264 (the recorded camera stream, GOP 30) through a small ring: the HLS reader is
    lapped once (the segmenter is reset), which must show as one discontinuity with the
    sequence numbers continuing."""
    units = AccessUnitSplitter().split_all(CAM_STREAM.read_bytes())
    ring = RingBuffer(2 * 1024 * 1024, 64)
    stream = HlsStream(ring, framerate=FPS, keyframe_interval=30, part_target_s=0.25,
                       window_s=6.0)
    checker = ContinuityChecker()
    pts = 0
    capture_us = 1_764_000_000_000_000

    async def play(frames: int, *, pace: bool = True) -> None:
        nonlocal pts, capture_us
        for i in range(frames):
            data, keyframe = units[i % len(units)]
            ring.write(AccessUnit(data, pts, keyframe, capture_us))
            pts += FRAME
            capture_us += 1_000_000 // FPS
            if pace:
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                if not stream.window.empty:
                    checker.add(parse(render(stream.window)))

    await stream.start()
    await stream.fresh()  # a player is watching: every frame is read as it comes
    try:
        await play(len(units) * 2)  # 6 s of video, read as it comes
        before = parse(render(stream.window))
        assert not any(s.discontinuity for s in before.segments)
        # 100 frames written while the reader sleeps: the 64-slot ring laps it.
        await play(100, pace=False)
        await play(len(units) * 2)
        after = parse(render(stream.window))
        checker.add(after)
        assert stream.window.discontinuities == 1, stream.stats()
        assert after.media_sequence >= before.media_sequence
        assert (stream.segmenter.codec or "").startswith("avc1.42")  # Baseline, from the SPS
        assert all(p.duration <= after.part_target for s in after.segments for p in s.parts)
        assert fragment_max_for(0.25, FPS) < after.part_target
    finally:
        await stream.stop()


async def test_a_segmenter_failure_is_counted_and_the_stream_goes_on() -> None:
    """An exception in the segmenter (a bitstream it chokes on) must not end HLS for good: it
    is counted, logged, and the stream starts again at the next keyframe after a discontinuity.
    """
    units = AccessUnitSplitter().split_all(CAM_STREAM.read_bytes())  # GOP 30
    ring = RingBuffer(2 * 1024 * 1024, 256)
    stream = HlsStream(ring, framerate=FPS, keyframe_interval=30, part_target_s=0.25,
                       window_s=6.0)
    push = stream.segmenter.push
    calls = 0

    def failing_once(*args: Any) -> list[Fragment]:
        nonlocal calls
        calls += 1
        if calls == 45:
            raise ValueError("a bitstream the segmenter chokes on")
        return push(*args)

    stream.segmenter.push = failing_once  # type: ignore[method-assign]
    await stream.start()
    await stream.fresh()  # a player is watching: every frame is read as it comes
    try:
        for i in range(len(units) * 4):
            data, keyframe = units[i % len(units)]
            ring.write(AccessUnit(data, i * FRAME, keyframe,
                                  1_764_000_000_000_000 + i * 1_000_000 // FPS))
            await asyncio.sleep(1 / FPS / 4)  # a quarter of real time: the restart waits 0.5 s
        for _ in range(200):
            if stream.window.parts_added > 0 and stream.stats()["segmenter_failures"] == 1 \
                    and stream.window.discontinuities == 1 and stream.window.position.msn >= 3:
                break
            await asyncio.sleep(0.02)
        assert calls > 45 and stream.stats()["segmenter_failures"] == 1, stream.stats()
        assert stream.window.discontinuities == 1, stream.stats()
        assert stream.window.position.msn >= 3, stream.stats()  # segments after the failure
        parse(render(stream.window))
    finally:
        await stream.stop()


def test_media_sequence_starts_from_the_wall_clock_so_a_restart_never_goes_back() -> None:
    """A restarted service numbers its segments above the previous run's: a player living
    through the restart never sees EXT-X-MEDIA-SEQUENCE go back, and a cache keyed on
    ?_HLS_msn= cannot hold a previous run's answer for a number the new run reuses."""
    ring = RingBuffer(64 * 1024, 8)
    started = 1_764_000_000.0
    first = HlsStream(ring, framerate=FPS, keyframe_interval=60, wall_clock=lambda: started)
    camera = FakeCamera()
    first.add_fragments(list(camera.fragments(60)), b"init")  # ~14 s of segments
    before = parse(render(first.window))
    assert before.media_sequence >= 1, before.media_sequence
    assert not any(s.discontinuity for s in before.segments)  # the first segment is no break
    newest_before = before.media_sequence + len(before.segments) - 1
    # The service restarts a second after that (a crash, an update).
    again = HlsStream(ring, framerate=FPS, keyframe_interval=60, wall_clock=lambda: started + 15)
    assert again.window.first_msn > newest_before
    again.add_fragments(list(FakeCamera().fragments(12)), b"init")
    after = parse(render(again.window))
    assert after.media_sequence > newest_before
    assert again.window.run_id != first.window.run_id


def test_every_layout_fits_the_frame_rate_it_was_made_for() -> None:
    """The stream lays parts out anew whenever the layout does not fit the measured rate: a
    layout that does not fit its own rate would be laid out again for ever."""
    misfits = [(part_s, fps) for part_s in (0.1, 0.2, 0.25, 0.33, 0.5, 1.0)
               for fps in [q / 4 for q in range(2, 241)]
               if not layout_fits(part_layout(part_s, fps), fps)]
    assert misfits == []


@pytest.mark.parametrize("real_fps", [2, 3, 4])
async def test_a_camera_slower_than_one_frame_per_part_gets_parts_of_one_frame(
        real_fps: int) -> None:
    """At 4 fps or less one frame outlasts the configured part (0.25 s): each part is one frame
    and PART-TARGET must hold it with room to spare. (It was exactly one frame long, which the
    layout check itself refused, so the segmenter started over at the same keyframe again and
    again without ever waiting, and the service's event loop stood still.)"""
    units = AccessUnitSplitter().split_all(CAM_STREAM.read_bytes())  # GOP 30
    ring = RingBuffer(2 * 1024 * 1024, 256)
    stream = HlsStream(ring, framerate=30, keyframe_interval=60, part_target_s=0.25,
                       window_s=60.0)
    await stream.start()
    await stream.fresh()  # a player is watching: every frame is read as it comes
    try:
        for i in range(len(units) * 2):
            data, keyframe = units[i % len(units)]
            ring.write(AccessUnit(data, i * (90_000 // real_fps), keyframe,
                                  1_764_000_000_000_000 + i * 1_000_000 // real_fps))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        playlist = parse(render(stream.window))  # the parser checks part durations
        assert len([s for s in playlist.segments if s.uri]) >= 2, playlist
        assert layout_fits(stream.layout, real_fps), (stream.layout, stream.framerate)
        assert stream.layout.frames == 1 and playlist.part_target >= 1 / real_fps
        assert stream.window.discontinuities == 0 and stream.stats()["segmenter_failures"] == 0
    finally:
        await stream.stop()


@pytest.mark.parametrize("real_fps", [15, 25, 60])
async def test_parts_follow_the_cameras_real_frame_rate(real_fps: int) -> None:
    """The config says 30 fps, the camera (an IP camera, say) sends ``real_fps``: parts must
    still fit PART-TARGET (at 15 fps, parts cut for 30 fps would be 4 frames, 0.267 s > 0.25),
    so the layout follows the first fragment's real rate before anything is published."""
    units = AccessUnitSplitter().split_all(CAM_STREAM.read_bytes())  # GOP 30
    ring = RingBuffer(2 * 1024 * 1024, 256)
    stream = HlsStream(ring, framerate=30, keyframe_interval=60, part_target_s=0.25,
                       window_s=8.0)
    checker = ContinuityChecker()
    await stream.start()
    await stream.fresh()  # a player is watching: every frame is read as it comes
    try:
        for i in range(len(units) * 3):
            data, keyframe = units[i % len(units)]
            ring.write(AccessUnit(data, i * (90_000 // real_fps), keyframe,
                                  1_764_000_000_000_000 + i * 1_000_000 // real_fps))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            if not stream.window.empty:
                checker.add(parse(render(stream.window)))  # the parser checks part durations
        playlist = parse(render(stream.window))
        assert len([s for s in playlist.segments if s.uri]) >= 2, playlist
        assert playlist.part_target <= 0.25
        assert layout_fits(stream.layout, real_fps), (stream.layout, stream.framerate)
        assert stream.window.discontinuities == 0 and stream.stats()["segmenter_failures"] == 0
    finally:
        await stream.stop()


async def test_parts_split_at_part_target_are_the_only_short_ones_and_are_counted() -> None:
    """A camera that skips a frame now and then (the synthetic one on a busy machine) leaves a
    sample two frame times long; a part of 6 frames (0.2 s) plus that sample would outlast
    PART-TARGET (0.25 s), so the stream closes the part at 0.2 s, under 85% of it, and counts
    it (``parts_split_at_target``). A stall longer than a part makes a one-frame part over
    PART-TARGET, also counted (``parts_over_target``). The parser accepts that many such
    parts and no more."""
    units = AccessUnitSplitter().split_all(CAM_STREAM.read_bytes())  # GOP 30
    ring = RingBuffer(2 * 1024 * 1024, 256)
    stream = HlsStream(ring, framerate=30, keyframe_interval=60, part_target_s=0.25,
                       window_s=8.0)
    await stream.start()
    await stream.fresh()  # a player is watching: every frame is read as it comes
    try:
        slot = 0
        for i in range(len(units) * 3):
            data, keyframe = units[i % len(units)]
            if i > 40 and i % 10 == 0:
                slot += 1  # the camera skipped a slot before this frame
            if i == 200:
                slot += 12  # the camera stalled for 0.4 s
            ring.write(AccessUnit(data, slot * 3000, keyframe,
                                  1_764_000_000_000_000 + slot * 33_333))
            slot += 1
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        text = render(stream.window)
        stats = stream.stats()
        splits, stalls = stats["parts_split_at_target"], stats["parts_over_target"]
        playlist = parse(text, split_parts=splits, stalled_parts=stalls)
        short = [p for s in playlist.segments if s.uri for p in s.parts[:-1]
                 if not p.independent and p.duration < 0.85 * playlist.part_target]
        assert 0 < len(short) <= splits, (short, splits)
        long = [p for s in playlist.segments for p in s.parts
                if p.duration > playlist.part_target]
        assert len(long) == stalls == 1, (long, stalls)
        with pytest.raises(Violation, match="< 85% of PART-TARGET"):
            parse(text, split_parts=len(short) - 1, stalled_parts=stalls)
        with pytest.raises(Violation, match="> PART-TARGET"):
            parse(text, split_parts=splits)
    finally:
        await stream.stop()
