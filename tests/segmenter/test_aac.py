"""The AAC track of the fMP4 segmenter (issue 30): real libx264 pictures and FFmpeg's AAC of the
synthetic camera's tone, read back by ffprobe/ffmpeg/PyAV. Sound placed by capture time plays in
sync; sound that stops or never comes never holds the video; without sound the bytes are the
video-only ones, unchanged."""

from __future__ import annotations

import asyncio
import hashlib
import io
from pathlib import Path

import av
import pytest

from ruseon_appliance.audio.encoders import aac_encoder
from ruseon_appliance.audio.sources.tone import tone_samples
from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.hls import HlsStream
from ruseon_appliance.recording import Recorder, RecorderSettings, plan_clip
from ruseon_appliance.recording.archive import segment_info, segment_name
from ruseon_appliance.recording.segment_file import init_audio, read_segment
from ruseon_appliance.segmenter import (
    Fmp4Segmenter,
    Fragment,
    open_audio,
    run_segmenter,
    usable_audio,
)
from tests.av_sync import decode_errors, measure_sync, stream_spans, streams

from .stream import Unit, encode, segment
from .test_fmp4 import cam_units

START_US = 1_700_000_000_000_000 - 300_000
# sha256 of what the segmenter and the clip writer made of tests/capture/data's camera stream
# before the audio track existed (commit 13c4982): a camera without sound must get these bytes.
VIDEO_ONLY = {
    "fragments_0.25": "aa0e80aa576eb117742a30bec8f29099463d6f3766a58c5db5432c41b28d35a7",
    "fragments_1.0": "76eacf315e3ac4a83fe36fe0e7de17cb6368a2e698f0da64c2a9f34f1e272adf",
    "clip_mp4": "9afb2627cb5c5bbd700e72b9372469cde2dec556bd5103a05634fa1d12290260",
    "clip_fmp4": "b52c4cabceb45f4c64cc0edd7c8ca3c6763a2e652dc5bd529925d4197d799426",
}


def tone_frames(start_us: int, seconds: float) -> tuple[bytes, list[tuple[bytes, int, int]]]:
    """The tone from ``start_us`` as the audio pipeline encodes it: (AudioSpecificConfig,
    [(AAC frame, pts, capture_time_us)])."""
    encoder = aac_encoder()
    out: list[tuple[bytes, int, int]] = []
    capture, pts = start_us, 7_000
    for _ in range(int(seconds * 50)):
        for data, p in encoder.encode(tone_samples(capture, 960), pts):
            out.append((data, p, capture + (p - pts) * 1_000_000 // 48_000))
        capture += 20_000
        pts += 960
    return encoder.extradata, out


def interleave(seg: Fmp4Segmenter, video: list[Unit], audio: list[tuple[bytes, int, int]],
               lag_us: int = 60_000) -> list[Fragment]:
    """Push both as they would arrive: each AAC frame ``lag_us`` after its capture time."""
    out: list[Fragment] = []
    i = 0
    for unit in video:
        while i < len(audio) and audio[i][2] + lag_us <= unit.capture_time_us:
            out += seg.push_audio(*audio[i])
            i += 1
        out += seg.push(unit.data, unit.pts, unit.keyframe, unit.capture_time_us)
    # What had been captured by the last picture's end is in when the stream stops.
    end = video[-1].capture_time_us + (video[-1].capture_time_us - video[-2].capture_time_us)
    for frame in audio[i:]:
        if frame[2] < end:
            out += seg.push_audio(*frame)
    return out + seg.flush()


def test_without_audio_the_bytes_are_the_video_only_ones(tmp_path: Path) -> None:
    got = {}
    for fmax in (0.25, 1.0):
        seg = Fmp4Segmenter(fragment_max_s=fmax, fragment_limit_s=fmax)
        fragments = segment(cam_units(), seg)
        assert seg.init_segment is not None and seg.codecs == seg.codec
        data = seg.init_segment + b"".join(f.data for f in fragments)
        got[f"fragments_{fmax}"] = hashlib.sha256(data).hexdigest()
    path = tmp_path / (segment_name(1_000_000_000_000) + ".mp4")
    path.write_bytes(data)
    recorded = segment_info(path)
    for fmt in ("mp4", "fmp4"):
        clip = plan_clip([recorded], recorded.start_us + 500_000, recorded.start_us + 2_500_000,
                         fmt)
        got[f"clip_{fmt}"] = hashlib.sha256(b"".join(clip.read())).hexdigest()
        clip.close()
    assert got == VIDEO_ONLY


def test_the_tone_is_muxed_in_sync_and_both_streams_last_as_long(tmp_path: Path) -> None:
    video = encode(90, fps=30, gop=30, start_us=START_US)
    config, audio = tone_frames(START_US - 100_000, 3.5)
    seg = Fmp4Segmenter(fragment_max_s=0.25, audio_config=config)
    fragments = interleave(seg, video, audio)
    assert seg.codecs is not None and seg.codecs.endswith(",mp4a.40.2")
    assert all(f.audio_frames > 0 for f in fragments)
    # Frames before the first picture are dropped; none after is lost or placed again.
    assert seg.audio_reanchored == 0 and seg.audio_waited_out == 0
    assert sum(f.audio_frames for f in fragments) == pytest.approx(3.0 * 48_000 / 1024, abs=2)
    out = tmp_path / "av.mp4"
    assert seg.init_segment is not None
    out.write_bytes(seg.init_segment + b"".join(f.data for f in fragments))
    assert streams(out) == [("video", "h264"), ("audio", "aac")]
    assert decode_errors(out) == ""
    spans = stream_spans(out)
    assert abs((spans["audio"][1] - spans["audio"][0]) - (spans["video"][1] - spans["video"][0])
               ) <= 1 / 30, spans
    sync = measure_sync(out)
    assert len(sync.errors_s) == 3 and all(abs(e) <= 0.002 for e in sync.errors_s), sync


def test_sound_that_stops_or_never_comes_never_holds_the_video(tmp_path: Path) -> None:
    video = encode(90, fps=30, gop=30, start_us=START_US)
    config, audio = tone_frames(START_US, 1.0)  # one second of sound, then the source stops
    plain = Fmp4Segmenter(fragment_max_s=0.25)
    expected = [(len(plain.push(u.data, u.pts, u.keyframe, u.capture_time_us)), u)
                for u in video]
    seg = Fmp4Segmenter(fragment_max_s=0.25, audio_config=config)
    fragments: list[Fragment] = []
    late = 0
    i = 0
    for ready, unit in expected:
        while i < len(audio) and audio[i][2] + 60_000 <= unit.capture_time_us:
            fragments += seg.push_audio(*audio[i])
            i += 1
        got = seg.push(unit.data, unit.pts, unit.keyframe, unit.capture_time_us)
        fragments += got
        if unit.capture_time_us > START_US + 1_800_000:
            # Long after the sound stopped: each fragment as soon as the video-only one.
            assert len(got) == ready
        late += ready - len(got)
    fragments += seg.flush()
    assert [f.audio_frames > 0 for f in fragments][:3] == [True] * 3
    assert not any(f.audio_frames for f in fragments[-4:])
    assert [f.frames for f in fragments] == [f.frames for f in segment(video, Fmp4Segmenter())]
    out = tmp_path / "stopped.mp4"
    assert seg.init_segment is not None
    out.write_bytes(seg.init_segment + b"".join(f.data for f in fragments))
    assert streams(out) == [("video", "h264"), ("audio", "aac")]
    assert decode_errors(out) == ""

    # No sound at all (a microphone that never opened): video-only fragments, none held.
    seg = Fmp4Segmenter(fragment_max_s=0.25, audio_config=config)
    fragments = segment(video, seg)
    assert [f.data for f in fragments] == [f.data for f in segment(video, Fmp4Segmenter())]
    out = tmp_path / "silent.mp4"
    assert seg.init_segment is not None
    out.write_bytes(seg.init_segment + b"".join(f.data for f in fragments))
    assert decode_errors(out) == ""
    assert stream_spans(out)["video"][1] == pytest.approx(3.0, abs=1e-3)


async def test_run_segmenter_reads_the_aac_ring_beside_the_video() -> None:
    video = encode(60, fps=30, gop=30, start_us=START_US)
    config, audio = tone_frames(START_US - 2_000_000, 4.0)
    video_ring, audio_ring = RingBuffer(4 << 20, 256), RingBuffer(1 << 20, 512)
    # Two seconds of sound are already in the AAC ring (open_audio takes them), the rest
    # arrives with the pictures.
    backlog = [a for a in audio if a[2] < START_US]
    for data, pts, capture in backlog:
        audio_ring.write(AccessUnit(data, pts, True, capture))
    seg = Fmp4Segmenter(fragment_max_s=0.25, audio_config=config)
    out: list[Fragment] = []
    reader = video_ring.reader("next")
    audio_reader, early = open_audio(seg, audio_ring)
    out += early
    task = asyncio.create_task(run_segmenter(reader, seg, out.extend, audio=audio_reader))
    rest = audio[len(backlog):]
    for unit in video:
        while rest and rest[0][2] + 60_000 <= unit.capture_time_us:
            data, pts, capture = rest.pop(0)
            audio_ring.write(AccessUnit(data, pts, True, capture))
            await asyncio.sleep(0)
        video_ring.write(AccessUnit(unit.data, unit.pts, unit.keyframe, unit.capture_time_us))
        await asyncio.sleep(0)
    end = video[-1].capture_time_us + 33_333
    for data, pts, capture in rest:
        if capture < end:
            audio_ring.write(AccessUnit(data, pts, True, capture))
    for _ in range(100):
        if not reader.lag and not audio_reader.lag:
            break
        await asyncio.sleep(0)
    reader.close()
    await asyncio.wait_for(task, 5)
    audio_reader.close()
    assert sum(f.frames for f in out) == 60
    assert all(f.audio_frames > 0 for f in out)
    # Only the sound from before the first picture was left out (the backlog); the two seconds
    # the pictures span are muxed, but for the last few frames still in flight at the close.
    assert seg.audio_dropped == len(backlog) and seg.audio_waited_out == 0
    assert 2.0 * 48_000 / 1024 - 5 <= sum(f.audio_frames for f in out) <= 2.0 * 48_000 / 1024 + 2


async def test_a_sink_failure_on_a_fragment_the_audio_released_is_raised_by_run_segmenter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """HLS raises from its sink to start over with other parts (tests/hls): that must work when
    the fragment came out because its sound arrived, not only after a picture. And a failure
    of the audio side itself never stops the pictures."""
    video = encode(30, fps=30, gop=30, start_us=START_US)
    config, audio = tone_frames(START_US, 1.5)

    class Refused(Exception):
        pass

    def refuse(fragments: list[Fragment]) -> None:
        raise Refused

    video_ring, audio_ring = RingBuffer(4 << 20, 256), RingBuffer(1 << 20, 512)
    seg = Fmp4Segmenter(fragment_max_s=0.25, audio_config=config)
    reader = video_ring.reader("next")
    audio_reader, _ = open_audio(seg, audio_ring)
    task = asyncio.create_task(run_segmenter(reader, seg, refuse, audio=audio_reader))
    audio_ring.write(AccessUnit(*audio[0][:2], True, audio[0][2]))  # the sound has begun
    for unit in video[:9]:  # one part closes when the 9th picture comes, and waits for sound
        video_ring.write(AccessUnit(unit.data, unit.pts, unit.keyframe, unit.capture_time_us))
        await asyncio.sleep(0)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done() and len(seg._held) == 1
    for data, pts, capture in audio[1:20]:
        audio_ring.write(AccessUnit(data, pts, True, capture))
    with pytest.raises(Refused):
        await asyncio.wait_for(task, 5)
    audio_reader.close()

    seg = Fmp4Segmenter(fragment_max_s=0.25, audio_config=config)

    def broken(*args: object) -> list[Fragment]:
        raise RuntimeError("an audio bug")

    monkeypatch.setattr(seg, "push_audio", broken)
    out: list[Fragment] = []
    reader = video_ring.reader("next")
    audio_reader = audio_ring.reader("next")
    task = asyncio.create_task(run_segmenter(reader, seg, out.extend, audio=audio_reader))
    await asyncio.sleep(0)
    audio_ring.write(AccessUnit(*audio[30][:2], True, audio[30][2]))
    for unit in video:
        video_ring.write(AccessUnit(unit.data, unit.pts, unit.keyframe, unit.capture_time_us))
        await asyncio.sleep(0)
    for _ in range(100):
        if not reader.lag:
            break
        await asyncio.sleep(0)
    reader.close()
    await asyncio.wait_for(task, 5)
    audio_reader.close()
    assert sum(f.frames for f in out) == 30 and not any(f.audio_frames for f in out)


def test_jittered_capture_times_of_the_pictures_do_not_move_the_sound(tmp_path: Path) -> None:
    """An RTSP or rpicam camera's capture times are arrival times: up to tens of ms late, never
    the same twice. The sound is placed by the smoothed mapping, so it is placed once and stays
    in sync with what the pictures show (their stamps are the true capture times)."""
    video = encode(150, fps=30, gop=30, start_us=START_US)
    jitter = [(i * 7919) % 40_000 for i in range(len(video))]  # 0-40 ms late, no pattern
    arrived = [Unit(u.data, u.pts, u.keyframe, u.capture_time_us + 20_000 + j)
               for u, j in zip(video, jitter, strict=True)]
    config, audio = tone_frames(START_US - 100_000, 5.5)
    # The sound's capture times are the true ones, shifted like the pictures' mean delay (a
    # source delivering its chunks as late on average as the camera its pictures).
    audio = [(d, p, c + 40_000) for d, p, c in audio]
    seg = Fmp4Segmenter(fragment_max_s=0.25, audio_config=config)
    fragments = interleave(seg, arrived, audio)
    assert seg.audio_reanchored == 0
    out = tmp_path / "jitter.mp4"
    assert seg.init_segment is not None
    out.write_bytes(seg.init_segment + b"".join(f.data for f in fragments))
    assert decode_errors(out) == ""
    sync = measure_sync(out)
    assert len(sync.errors_s) >= 4 and all(abs(e) <= 0.015 for e in sync.errors_s), sync


def test_an_av_segment_cut_short_reads_to_its_last_whole_fragment_with_its_sound(
        tmp_path: Path) -> None:
    """A power cut in the middle of a fragment of a segment with sound: the archive's reader
    keeps the whole fragments (both runs checked against their mdat), finds the AAC track's
    configuration, and what it keeps still plays with both streams."""
    video = encode(60, fps=30, gop=30, start_us=START_US)
    config, audio = tone_frames(START_US - 100_000, 2.5)
    seg = Fmp4Segmenter(fragment_max_s=1.0, audio_config=config)
    fragments = interleave(seg, video, audio)
    assert seg.init_segment is not None and len(fragments) == 2
    whole = seg.init_segment + b"".join(f.data for f in fragments)
    cut = whole[: len(whole) - fragments[-1].audio_bytes // 2]  # inside the last AAC run
    index = read_segment(io.BytesIO(cut), len(cut))
    assert init_audio(index.init) == config
    assert len(index.fragments) == 1 and index.valid_end == len(whole) - len(fragments[-1].data)
    run = index.fragments[0].audio
    assert run is not None and len(run.sizes) == fragments[0].audio_frames
    assert sum(run.sizes) == fragments[0].audio_bytes
    # The first AAC frame captured at or after the first picture, placed where it was captured.
    first_audio = next(c for _, _, c in audio if c >= START_US)
    assert run.decode_time == round((first_audio - START_US) * 48_000 / 1_000_000) < 1024
    kept = tmp_path / "kept.mp4"
    kept.write_bytes(cut[: index.valid_end])
    assert streams(kept) == [("video", "h264"), ("audio", "aac")]
    assert decode_errors(kept) == ""


def test_an_unusable_aac_configuration_costs_the_sound_not_the_pictures(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        aac_ring = RingBuffer(1 << 16, 16)
        aac_config = b"\x12"  # one byte: no AudioSpecificConfig

    with pytest.raises(ValueError):
        Fmp4Segmenter(audio_config=Broken.aac_config)
    assert usable_audio(Broken()) is None and "unusable" in caplog.text
    ring = RingBuffer(1 << 20, 64)
    assert HlsStream(ring, framerate=30, keyframe_interval=30, audio=Broken()).audio is None
    recorder = Recorder(RecorderSettings(directory=tmp_path), ring, audio=Broken())
    assert recorder.audio is None and recorder.stats()["audio"] is None


def test_a_new_audio_configuration_starts_a_new_init_segment_at_the_next_idr(
        tmp_path: Path) -> None:
    """An IP camera's own AAC replaces the encoder's (its first sound, after the stream began):
    the fragments before the next IDR keep the old configuration's frames, the IDR starts a new
    init segment with the new one, and each generation decodes under its own init."""
    video = encode(90, fps=30, gop=30, start_us=START_US)  # IDRs at 0, 1 and 2 s
    old_config, old = tone_frames(START_US - 100_000, 1.35)
    encoder = aac_encoder(sample_rate=16_000)
    new: list[tuple[bytes, int, int]] = []
    capture, pts = START_US + 1_250_000, 200_000
    for _ in range(90):
        for data, p in encoder.encode(tone_samples(capture, 960), pts):
            new.append((data, p, capture + (p - pts) * 1_000_000 // 48_000))
        capture += 20_000
        pts += 960
    new_config = encoder.extradata
    assert new_config != old_config
    seg = Fmp4Segmenter(fragment_max_s=0.25, audio_config=old_config)
    fragments: list[Fragment] = []
    i = j = 0
    for unit in video:
        while i < len(old) and old[i][2] + 60_000 <= unit.capture_time_us:
            fragments += seg.push_audio(*old[i])
            i += 1
        if i == len(old) and j == 0:
            seg.set_audio_config(new_config)  # what the runner does when the feed says so
        while i == len(old) and j < len(new) and new[j][2] + 60_000 <= unit.capture_time_us:
            fragments += seg.push_audio(*new[j])
            j += 1
        fragments += seg.push(unit.data, unit.pts, unit.keyframe, unit.capture_time_us)
    fragments += seg.flush()
    assert seg.audio_config == new_config and seg.audio_config_changes == 1
    generations = sorted({f.init_generation for f in fragments})
    assert generations == [0, 1]
    first_new = next(f for f in fragments if f.init_generation == 1)
    assert first_new.independent and first_new.start_pts == 2 * 90_000
    # Every fragment's sound is of its own generation's configuration: each decodes under it.
    for generation, rate in ((0, 48_000), (1, 16_000)):
        init = seg.init_segment_for(generation)
        assert init is not None
        part = [f for f in fragments if f.init_generation == generation]
        assert sum(f.audio_frames for f in part) > 10
        out = tmp_path / f"gen{generation}.mp4"
        out.write_bytes(init + b"".join(f.data for f in part))
        assert streams(out) == [("video", "h264"), ("audio", "aac")]
        assert decode_errors(out) == ""
        with av.open(str(out)) as container:
            stream = container.streams.audio[0]
            assert stream.codec_context.sample_rate == rate
            # Each frame lasts its 1024 samples at its own rate, the last of a fragment too.
            durations = {p.duration for p in container.demux(stream) if p.size}
            assert durations == {1024 * 48_000 // rate}, durations
    # The same configuration again changes nothing.
    seg.set_audio_config(new_config)
    assert seg.audio_config_changes == 1
