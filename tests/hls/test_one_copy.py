"""One copy of each access unit (issue 31): the live HLS window keeps its parts' pictures by
reference into the camera's ring, and what a client gets is byte for byte what the copying
segmenter made. A part whose pictures the ring's writer is about to reach is copied out first;
one it reached anyway is refused and dropped, never served with another frame's bytes.

Real H.264 (the recorded camera stream and libx264 pictures), the real ring, segmenter and
window; the AAC is FFmpeg's, of the synthetic camera's tone. While nobody asks for HLS the
ring is read in batches, and the first request still gets the newest parts."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.h264 import AccessUnitSplitter
from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.hls import HlsStream, LiveWindow, render
from ruseon_appliance.segmenter import Fmp4Segmenter, Fragment
from tests.hls.m3u8 import ContinuityChecker, parse
from tests.hls.test_playlist_conformance import CAM_STREAM
from tests.segmenter.stream import Unit, encode
from tests.segmenter.test_aac import VIDEO_ONLY, interleave, tone_frames
from tests.segmenter.test_fmp4 import cam_units


def by_reference(units: list[Unit], segmenter: Fmp4Segmenter, ring: RingBuffer
                 ) -> list[Fragment]:
    """Each unit written to ``ring`` and pushed with its seq, as run_segmenter does."""
    out: list[Fragment] = []
    for u in units:
        seq = ring.write(AccessUnit(u.data, u.pts, u.keyframe, u.capture_time_us))
        out.extend(segmenter.push(u.data, u.pts, u.keyframe, u.capture_time_us, seq))
    return out + segmenter.flush()


def test_fragments_by_reference_are_the_copying_segmenters_bytes() -> None:
    ring = RingBuffer(8 * 1024 * 1024, 1024)
    seg = Fmp4Segmenter(fragment_max_s=0.25, fragment_limit_s=0.25, ring=ring)
    fragments = by_reference(cam_units(), seg, ring)
    assert fragments and all(f.media is not None and f.data == b"" for f in fragments)
    contents = [f.content() for f in fragments]
    assert all(c is not None and len(c) == f.size for c, f in zip(contents, fragments, strict=True))
    assert seg.init_segment is not None
    data = seg.init_segment + b"".join(c for c in contents if c is not None)
    # The hash the copying segmenter's bytes have had since before the audio track existed.
    assert hashlib.sha256(data).hexdigest() == VIDEO_ONLY["fragments_0.25"]


def test_fragments_with_sound_by_reference_are_the_copying_segmenters_bytes() -> None:
    start = 1_700_000_000_000_000
    video = encode(60, fps=30, gop=30, start_us=start)
    config, audio = tone_frames(start - 100_000, 2.5)
    copied = interleave(Fmp4Segmenter(fragment_max_s=0.25, audio_config=config), video, audio)
    ring = RingBuffer(4 * 1024 * 1024, 256)
    seg = Fmp4Segmenter(fragment_max_s=0.25, audio_config=config, ring=ring)
    # The same order of pushes as interleave's, the pictures through the ring.
    seqs = {u.capture_time_us: ring.write(AccessUnit(u.data, u.pts, u.keyframe,
                                                     u.capture_time_us)) for u in video}
    original = seg.push
    seg.push = lambda data, pts, key, cap, seq=None: original(  # type: ignore[method-assign]
        data, pts, key, cap, seqs[cap])
    referenced = interleave(seg, video, audio)
    assert [f.audio_frames for f in referenced] == [f.audio_frames for f in copied]
    assert sum(f.audio_frames for f in copied) > 80  # ~47 a second
    assert [f.content() for f in referenced] == [f.data for f in copied]


def window_by_reference(ring: RingBuffer) -> tuple[LiveWindow, Fmp4Segmenter, Fmp4Segmenter]:
    window = LiveWindow(target_duration=1, part_target_s=0.25, window_s=4.0)
    return (window, Fmp4Segmenter(fragment_max_s=0.24, fragment_limit_s=0.25, ring=ring),
            Fmp4Segmenter(fragment_max_s=0.24, fragment_limit_s=0.25))


def test_parts_are_copied_out_of_the_ring_before_its_writer_reaches_them() -> None:
    """A ring holding ~2.5 s under a 4 s window: the older parts are copied out in time, every
    part and segment a client asks for is the copying segmenter's bytes, none is lost."""
    units = encode(300, width=320, height=240, fps=30, gop=30)
    per_frame = sum(len(u.data) for u in units) // len(units)
    ring = RingBuffer(per_frame * 75, 1024)
    window, referenced, copied = window_by_reference(ring)
    expected: dict[int, bytes] = {}
    checker = ContinuityChecker()
    for u in units:
        seq = ring.write(AccessUnit(u.data, u.pts, u.keyframe, u.capture_time_us))
        mine = referenced.push(u.data, u.pts, u.keyframe, u.capture_time_us, seq)
        theirs = copied.push(u.data, u.pts, u.keyframe, u.capture_time_us)
        assert [f.sequence for f in mine] == [f.sequence for f in theirs]
        for fragment, reference in zip(mine, theirs, strict=True):
            part = window.add(fragment)
            expected[part.number] = reference.data
        if mine:
            checker.add(parse(render(window)))
            for segment in window.segments:
                for part in segment.parts:
                    assert window.part_content(part.number) == expected[part.number]
                if segment.complete:
                    assert window.segment_content(segment.msn) == b"".join(
                        expected[p.number] for p in segment.parts)
    assert window.parts_copied_out > 0 and window.parts_lost == 0
    # The newest parts are still the ring's bytes; the window holds only what it copied out.
    newest = window.segments[-1].parts[-1]
    assert newest.media is not None and newest.data is None
    assert 0 < window.held_bytes < window.size


def feed_both(window: LiveWindow, referenced: Fmp4Segmenter, copied: Fmp4Segmenter,
              ring: RingBuffer, units: list[Unit], expected: dict[int, bytes]) -> None:
    """``units`` through the ring into both segmenters, the referenced one's parts into
    ``window``; ``expected`` gets each part's bytes as the copying segmenter made them."""
    for u in units:
        seq = ring.write(AccessUnit(u.data, u.pts, u.keyframe, u.capture_time_us))
        mine = referenced.push(u.data, u.pts, u.keyframe, u.capture_time_us, seq)
        theirs = copied.push(u.data, u.pts, u.keyframe, u.capture_time_us)
        for fragment, reference in zip(mine, theirs, strict=True):
            expected[window.add(fragment).number] = reference.data


FILLER = b"\x00\x00\x00\x01\x09\xf0" + bytes(64 * 1024)  # an AUD and padding: 64 KiB a frame


def lap(ring: RingBuffer, frames: int = 70) -> None:
    """Another writer's frames, 4.4 MiB of them: past every frame written before."""
    for i in range(frames):
        ring.write(AccessUnit(FILLER, 90_000 * 100 + i * 3000, False, 1))


def test_a_window_not_fed_while_the_ring_laps_it_loses_nothing() -> None:
    """The writer laps the ring while the window and its segmenter sit idle (a reader that fell
    behind): every part, and the sample the segmenter was holding, is copied out before its
    frame is overwritten, and is still the copying segmenter's bytes."""
    units = encode(150, width=320, height=240, fps=30, gop=30)
    ring = RingBuffer(4 * 1024 * 1024, 1024)
    window, referenced, copied = window_by_reference(ring)
    expected: dict[int, bytes] = {}
    feed_both(window, referenced, copied, ring, units[:80], expected)
    numbers = [p.number for s in window.segments for p in s.parts]
    assert numbers and window.held_bytes == 0 and referenced.seq < ring.newest_seq
    lap(ring)
    assert window.parts_copied_out == len(numbers) and window.held_bytes == window.size
    assert all(window.part_content(n) == expected[n] for n in numbers)
    feed_both(window, referenced, copied, ring, units[80:], expected)  # pending frames 70-79
    assert window.parts_lost == 0
    assert all(window.part_content(n) == expected[n]
               for s in window.segments for n in (p.number for p in s.parts))


def test_a_part_whose_frames_are_gone_is_refused_never_another_frames_bytes() -> None:
    """Without the pin (a holder that does not pin the ring), a part whose pictures were
    overwritten answers None (a 404), never the bytes that took their place."""
    units = encode(90, width=320, height=240, fps=30, gop=30)
    ring = RingBuffer(4 * 1024 * 1024, 1024)
    window, referenced, copied = window_by_reference(ring)
    expected: dict[int, bytes] = {}
    feed_both(window, referenced, copied, ring, units, expected)
    served = {n: window.part_content(n) for n in list(expected)[-3:]}  # kept for the next client
    ring.unpin(window)
    ring.unpin(referenced)
    lap(ring)
    parts = [p for s in window.segments for p in s.parts]
    assert parts and all(p.content() is None for p in parts)
    # What a client gets: nothing, or the bytes a request before the lap was given.
    assert all(window.part_content(p.number) == served.get(p.number) for p in parts)
    assert all(window.segment_content(s.msn) is None for s in window.segments)
    assert window.parts_copied_out == 0


async def test_while_nobody_asks_the_ring_is_read_in_batches_a_request_gets_the_newest() -> None:
    """No HLS request yet: the stream reads the ring about once a second, not for every frame,
    and its window still fills; the first request has the rest read before it is answered,
    and from then on every frame is read as it comes."""
    units = AccessUnitSplitter().split_all(CAM_STREAM.read_bytes())  # GOP 30, 30 fps
    ring = RingBuffer(4 * 1024 * 1024, 1024)
    stream = HlsStream(ring, framerate=30, keyframe_interval=30, part_target_s=0.25,
                       window_s=6.0)
    reads: list[int] = []
    original = ring.frame

    def counted(seq: int) -> Any:
        view = original(seq)
        if view is not None:
            reads.append(seq)
        return view

    ring.frame = counted  # type: ignore[method-assign]
    pts = 0

    async def play(frames: int) -> None:
        nonlocal pts
        for i in range(frames):
            data, keyframe = units[(pts // 3000) % len(units)]
            ring.write(AccessUnit(data, pts, keyframe, 1_764_000_000_000_000 + pts * 100 // 9))
            pts += 3000
            await asyncio.sleep(1 / 30)
            del i

    await stream.start()
    try:
        assert stream.idle
        await play(75)  # 2.5 s
        assert stream.stats()["idle"] and 1 <= stream.idle_reads <= 4, stream.idle_reads
        assert not stream.window.empty  # filled in batches
        await stream.fresh()
        assert not stream.idle
        assert reads[-1] == ring.newest_seq  # everything written was read before the answer
        before = stream.idle_reads
        await play(15)
        assert stream.idle_reads == before and reads[-1] == ring.newest_seq
    finally:
        await stream.stop()


def test_a_holder_that_fails_to_copy_out_costs_the_camera_nothing() -> None:
    """A pin whose before_lap raises is logged and dropped; the ring goes on taking frames."""
    ring = RingBuffer(64 * 1024, 16)

    class Broken:
        seq = 0
        calls = 0

        def before_lap(self, oldest: int) -> None:
            Broken.calls += 1
            raise RuntimeError("bug")

    ring.pin(Broken())
    for i in range(40):
        assert ring.write(AccessUnit(bytes(8 * 1024), i * 3000, i == 0, i)) == i
    assert Broken.calls == 1 and ring.newest_seq == 39
