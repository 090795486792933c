"""The audio room: a real tone through the real encoders, decoded back with PyAV."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from fractions import Fraction
from typing import Any

import av
import numpy as np
import pytest

from ruseon_appliance.audio.choice import first_capture_device, resolve_audio
from ruseon_appliance.audio.format import (
    AUDIO_CLOCK_RATE,
    FRAME_SAMPLES,
    FRAME_US,
    CodedFrame,
    PcmChunk,
)
from ruseon_appliance.audio.pipeline import AudioPipeline, level_dbfs
from ruseon_appliance.audio.sources.base import AudioSourceUnavailable
from ruseon_appliance.audio.sources.tone import BEEP_US, ToneSource, beep_onsets_us, tone_samples
from ruseon_appliance.config import CameraConfig

pytestmark = pytest.mark.timeout(60)


class ScriptedSource:
    """A stand-in device: plays the tone from a fixed capture time, as fast as asked, with
    scripted faults. Only the hardware is stood in for; the pipeline and encoders are real."""

    kind = "scripted"

    def __init__(self, *, chunks: int, start_us: int = 10_000_000, clock_ppm: float = 0.0,
                 fail_open: int = 0, fail_after: int | None = None,
                 bad_at: tuple[int, ...] = ()) -> None:
        self.chunks, self.start_us, self.clock_ppm = chunks, start_us, clock_ppm
        self.fail_open, self.fail_after, self.bad_at = fail_open, fail_after, bad_at
        self.opens = self.sent = 0
        self.done = threading.Event()
        self._closed = threading.Event()

    def open(self) -> None:
        self.opens += 1
        if self.opens <= self.fail_open:
            raise AudioSourceUnavailable("no such device (unplugged)")
        self._closed.clear()

    def read(self) -> PcmChunk | None:
        if self._closed.is_set():
            return None
        if self.sent >= self.chunks:
            self.done.set()
            self._closed.wait(5)
            return None
        if self.fail_after is not None and self.sent == self.fail_after:
            self.fail_after = None
            raise AudioSourceUnavailable("device unplugged")
        i = self.sent
        self.sent += 1
        # The capture clock: a device whose crystal runs fast delivers more samples per second
        # of capture time; its chunks carry that many samples but are 20 ms apart in time.
        capture = self.start_us + i * FRAME_US
        if i in self.bad_at:
            return PcmChunk(np.zeros((2, 3), dtype=np.float32), capture)
        n = round(FRAME_SAMPLES * (1 + self.clock_ppm / 1e6))
        return PcmChunk(tone_samples(capture, n), capture)

    def close(self) -> None:
        self._closed.set()

    def stats(self) -> dict[str, Any]:
        return {"opens": self.opens}


async def run(source: ScriptedSource, **kw: Any) -> tuple[AudioPipeline, list[Any], list[Any]]:
    pipeline = AudioPipeline(source, retry_s=(0.05,), **kw)
    opus, aac = pipeline.opus_ring.reader("next"), pipeline.aac_ring.reader("next")
    await pipeline.start()
    await asyncio.to_thread(source.done.wait, 30)
    await asyncio.sleep(0.2)  # the last writes reach the loop
    await pipeline.stop()
    got: dict[str, list[Any]] = {"opus": [], "aac": []}
    for name, reader in (("opus", opus), ("aac", aac)):
        while (view := reader.poll()) is not None:
            got[name].append((bytes(view.data), view.pts, view.capture_time_us))
    return pipeline, got["opus"], got["aac"]


def decode(codec: str, packets: list[Any], extradata: bytes = b"") -> Any:
    ctx: Any = av.CodecContext.create(codec, "r")
    ctx.sample_rate = AUDIO_CLOCK_RATE
    ctx.layout = "mono"
    if extradata:
        ctx.extradata = extradata  # (an IP camera's AAC passed through has its own rate)
    resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_CLOCK_RATE)
    pcm = []
    for data, pts, _ in packets:
        packet = av.Packet(data)
        packet.pts = pts
        packet.time_base = Fraction(1, AUDIO_CLOCK_RATE)
        for frame in ctx.decode(packet):
            for out in resampler.resample(frame):
                pcm.append(out.to_ndarray().reshape(-1).astype(np.float64))
    return np.concatenate(pcm)


def beep_starts(pcm: Any, threshold: float = 0.15) -> list[int]:
    """Sample indices where the loud beep begins (the 1 kHz -6 dBFS burst)."""
    if pcm.dtype.kind == "i":
        pcm = pcm / 32768.0
    window = 96  # 2 ms
    env = np.sqrt(np.convolve(pcm ** 2, np.ones(window) / window, mode="same"))
    loud = env > threshold
    return [int(i) for i in np.flatnonzero(loud[1:] & ~loud[:-1]) + 1]


async def test_the_tone_comes_out_of_both_encoders_with_its_beeps_on_the_capture_clock() -> None:
    source = ScriptedSource(chunks=150, start_us=10_500_000)  # 3 s from 10.5 s
    pipeline, opus, aac = await run(source)
    assert len(opus) == 150  # one Opus packet per 20 ms chunk, none lost
    assert [p for _, p, _ in opus] == [i * FRAME_SAMPLES for i in range(150)]
    assert len(aac) in range(150 * FRAME_SAMPLES // 1024 - 2, 150 * FRAME_SAMPLES // 1024 + 1)
    assert [p for _, p, _ in aac] == [i * 1024 for i in range(len(aac))]
    # Every packet's capture time is its pts on the source's capture clock.
    for _, pts, capture in opus + aac:
        assert capture == 10_500_000 + pts * 1_000_000 // AUDIO_CLOCK_RATE
    expected = beep_onsets_us(10_500_000, 10_500_000 + 150 * FRAME_US)
    assert expected == [11_000_000, 12_000_000, 13_000_000]
    for codec, packets, extra in (("opus", opus, b""), ("aac", aac, pipeline.aac_config)):
        pcm = decode(codec, packets, extra)
        starts = [10_500_000 + i * 1_000_000 // AUDIO_CLOCK_RATE for i in beep_starts(pcm)]
        assert len(starts) == len(expected), (codec, starts)
        # Within a few ms: the codecs' own delay (Opus 2.5 ms + 2 ms window; AAC's 1024).
        for got, want in zip(starts, expected, strict=True):
            assert abs(got - want) < 30_000, (codec, got, want)
    stats = pipeline.stats()
    assert stats["opus"]["packets"] == 150 and stats["chunks_in"] == 150
    assert stats["drift_corrections"] == 0 and stats["timeline_resets"] == 0


async def test_mute_sends_silence_and_gain_scales_the_level() -> None:
    loud = ScriptedSource(chunks=50)
    pipeline, opus, _ = await run(loud, gain_db=-20.0)
    quiet_level = pipeline.stats()["level_dbfs"]
    plain, _, _ = await run(ScriptedSource(chunks=50))
    assert plain.stats()["level_dbfs"] - quiet_level == pytest.approx(20.0, abs=0.5)
    muted, opus, _ = await run(ScriptedSource(chunks=50), muted=True)
    assert len(opus) == 50  # the timeline carries on
    assert np.max(np.abs(decode("opus", opus))) < 0.01
    assert muted.stats()["level_dbfs"] == -90.0
    with pytest.raises(ValueError):
        muted.set_gain_db(99.0)


async def test_an_unplugged_device_is_retried_and_the_timeline_continues() -> None:
    source = ScriptedSource(chunks=100, fail_open=2, fail_after=40)
    pipeline, opus, _ = await run(source)
    assert source.opens == 4  # two failed opens, the first run, the re-open after the unplug
    assert pipeline.stats()["source_failures"] == 3
    assert len(opus) == 100
    pts = [p for _, p, _ in opus]
    assert pts == sorted(set(pts))
    assert pipeline.problem() is None or not pipeline.running


async def test_a_broken_chunk_is_skipped_not_fatal() -> None:
    pipeline, opus, _ = await run(ScriptedSource(chunks=60, bad_at=(10, 11, 30)))
    stats = pipeline.stats()
    assert stats["chunks_bad"] == 3
    # 57 good chunks, and the 60 ms they left as a hole made up by the clock alignment (at
    # most that much: resampled, or silence put in) so what follows stays in sync.
    made_up = stats["silence_inserted"] + stats["samples_resampled"]
    assert 0 <= made_up <= 3 * FRAME_SAMPLES
    assert len(opus) == (57 * FRAME_SAMPLES + made_up) // FRAME_SAMPLES


@pytest.mark.parametrize("ppm", [20_000, -10_000, 100], ids=["2%-fast", "1%-slow", "100ppm"])
async def test_a_device_whose_clock_drifts_is_resampled_onto_the_capture_clock(ppm: int) -> None:
    # 2 % fast: 20 ms of capture time holds 979 samples. Left alone, the sound would run 200 ms
    # behind the picture within 10 s; resampled, it stays on the capture clock, continuously
    # (no silence put in, no samples cut, no step).
    source = ScriptedSource(chunks=500, clock_ppm=ppm)
    pipeline, opus, _ = await run(source)
    stats = pipeline.stats()
    assert stats["drift_corrections"] == 0, stats
    assert stats["silence_inserted"] == 0 and stats["samples_dropped"] == 0
    if abs(ppm) >= 10_000:
        assert stats["chunks_resampled"] > 0
        assert (stats["samples_resampled"] < 0) == (ppm > 0), stats
    # The newest packet's capture time (by the sample clock) against the source's own.
    last_capture = source.start_us + (source.chunks - 1) * FRAME_US
    _, _, mapped = opus[-1]
    assert abs(mapped - last_capture) < 30_000, (mapped - last_capture)
    # Heard continuously: after the codec's start, no 20 ms of the decoded sound is silent
    # (the tone never stops), and every beep is one beep.
    pcm = decode("opus", opus)
    frames = pcm[FRAME_SAMPLES:len(pcm) // FRAME_SAMPLES * FRAME_SAMPLES].reshape(-1, FRAME_SAMPLES)
    assert np.min(np.sqrt(np.mean(frames ** 2, axis=1))) > 0.005
    starts = [source.start_us + i * 1_000_000 // AUDIO_CLOCK_RATE for i in beep_starts(pcm)]
    assert len(starts) == len(beep_onsets_us(source.start_us, last_capture))


async def test_a_device_far_off_is_still_stepped_back() -> None:
    # 10 % fast: more than resampling takes on (5 %): the rest is stepped back past the limit.
    source = ScriptedSource(chunks=300, clock_ppm=100_000)
    pipeline, opus, _ = await run(source)
    stats = pipeline.stats()
    assert stats["chunks_resampled"] > 0 and stats["drift_corrections"] >= 1
    assert stats["samples_dropped"] > 0
    last_capture = source.start_us + (source.chunks - 1) * FRAME_US
    assert abs(opus[-1][2] - last_capture) < 60_000


async def test_the_real_tone_source_is_paced_in_real_time() -> None:
    tone = ToneSource()
    tone.open()
    chunks = [tone.read() for _ in range(10)]
    tone.close()
    assert tone.read() is None
    stamps = [c.capture_time_us for c in chunks if c is not None]
    assert [b - a for a, b in itertools.pairwise(stamps)] == [FRAME_US] * 9


async def test_the_real_tone_source_is_the_reference_signal_on_whole_20_ms() -> None:
    tone = ToneSource()
    tone.open()
    chunks = [tone.read() for _ in range(3)]
    tone.close()
    for chunk in chunks:
        assert chunk is not None and chunk.capture_time_us % FRAME_US == 0
        # A slice of the precomputed second: the reference signal to within rounding.
        reference = tone_samples(chunk.capture_time_us, FRAME_SAMPLES).astype(np.int32)
        assert np.max(np.abs(chunk.samples.astype(np.int32) - reference)) <= 1


async def test_a_codec_nobody_reads_is_not_encoded_until_someone_does() -> None:
    source = ScriptedSource(chunks=250)
    pipeline = AudioPipeline(source, retry_s=(0.05,))
    opus = pipeline.opus_ring.reader("next")  # Opus is read; AAC (HLS, recordings) is not
    await pipeline.start()
    await wait_until(lambda: source.sent >= 50)
    assert pipeline.stats()["aac"] == {**pipeline.stats()["aac"], "encoding": False,
                                       "packets": 0}
    assert pipeline.aac_ring.newest_seq == -1
    aac = pipeline.aac_ring.reader("next")  # a reader comes: a fresh encoder from now on
    opus.close()  # and the last Opus reader goes
    await asyncio.to_thread(source.done.wait, 30)
    await asyncio.sleep(0.2)
    await pipeline.stop()
    stats = pipeline.stats()
    assert stats["aac"]["encoding"] is True and stats["opus"]["encoding"] is False
    got = []
    while (view := aac.poll()) is not None:
        got.append((bytes(view.data), view.pts, view.capture_time_us))
    assert 0 < stats["aac"]["packets"] == len(got)
    # It starts where the reader came, on the sample clock, contiguous from there.
    first = got[0][1]
    assert first >= 50 * FRAME_SAMPLES
    assert [p for _, p, _ in got] == [first + i * 1024 for i in range(len(got))]
    for _, pts, capture in got:
        assert capture == source.start_us + pts * 1_000_000 // AUDIO_CLOCK_RATE
    assert len(decode("aac", got, pipeline.aac_config)) > 0
    # Opus stopped with its reader and its packets so far are still counted.
    assert 50 <= stats["opus"]["packets"] < 250


async def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_beeps_start_at_whole_seconds() -> None:
    pcm = tone_samples(999_000_000 - 50_000, 9600)  # 200 ms around a whole second
    starts = beep_starts(pcm)
    assert len(starts) == 1
    assert abs(starts[0] - 2400) < 100  # 50 ms in
    assert level_dbfs(tone_samples(0, 4800)) == pytest.approx(-9.0, abs=1.5)  # beep
    assert level_dbfs(tone_samples(BEEP_US, 4800)) == pytest.approx(-33.5, abs=1.5)


def test_audio_auto_means_the_tone_the_ip_camera_track_or_a_microphone(tmp_path: Any) -> None:
    pcm = tmp_path / "pcm"
    assert resolve_audio(CameraConfig(source="synthetic")) == ("tone", "")
    assert resolve_audio(CameraConfig(source="rtsp://cam/x"))[0] == "source"
    assert resolve_audio(CameraConfig(source="picamera"), pcm_list=pcm)[0] == "none"
    pcm.write_text("00-00: bcm2835 : bcm2835 : playback 8\n"
                   "01-00: USB Audio : USB Audio : capture 1\n")
    assert first_capture_device(pcm) == "hw:1,0"
    assert resolve_audio(CameraConfig(source="picamera"), pcm_list=pcm) == ("alsa:hw:1,0", "")
    assert resolve_audio(CameraConfig(source="synthetic", audio="none"))[0] == "none"
    assert resolve_audio(CameraConfig(source="file:/x.h264"))[0] == "none"


def write_recording(path: Any, seconds: float) -> Any:
    """Recorded PCM as a USB microphone may give it: the tone, 44.1 kHz stereo WAV."""
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(44_100)
        w.writeframes(np.repeat(tone_samples(0, int(44_100 * seconds)), 2).tobytes())
    return path


class PacedRecording:
    """A recording handed over in real time, as an ALSA device's periods are (what
    ``AlsaSource``'s opener returns: a PyAV input container); its end is an unplug."""

    def __init__(self, path: Any) -> None:
        self.container = av.open(str(path))
        self.streams = self.container.streams

    def decode(self, stream: Any) -> Any:
        start = time.monotonic()
        played = 0.0
        for frame in self.container.decode(stream):
            played += frame.samples / frame.sample_rate
            time.sleep(max(0.0, start + played - time.monotonic()))
            yield frame

    def close(self) -> None:
        self.container.close()


async def test_an_alsa_device_stand_in_recorded_pcm_unplugged_and_back(tmp_path: Any) -> None:
    """The real AlsaSource and PyAV's resampler on recorded PCM (44.1 kHz stereo WAV, as a USB
    microphone may give): the opener is the one seam (no ALSA device here). The device is
    missing at first, then plays out (an unplug: the recording ends) and is opened again."""
    from ruseon_appliance.audio.sources.alsa import AlsaSource

    path = write_recording(tmp_path / "mic.wav", 1.0)
    attempts = []

    def opener(device: str) -> Any:
        attempts.append(device)
        if len(attempts) == 1:
            raise OSError(19, "No such device")
        return PacedRecording(path)

    source = AlsaSource("hw:1,0", opener=opener)
    pipeline = AudioPipeline(source, retry_s=(0.05,))
    reader = pipeline.opus_ring.reader("next")
    await pipeline.start()
    try:
        for _ in range(400):  # liveness: until it has been opened twice and played
            if source.opens >= 2 and pipeline.stats()["chunks_in"] > 10:
                break
            await asyncio.sleep(0.05)
    finally:
        await pipeline.stop()
    stats = pipeline.stats()
    assert attempts[:3] == ["hw:1,0"] * 3 and source.opens >= 2
    assert stats["source_failures"] >= 2  # missing, then the recording's end (an unplug)
    assert stats["chunks_bad"] == 0
    assert stats["samples_dropped"] == 0  # paced as a device: nothing to pull back
    packets = []
    while (view := reader.poll()) is not None:
        packets.append((bytes(view.data), view.pts, view.capture_time_us))
    # At least the first play-out's second of sound, resampled to 48 kHz mono, encoded.
    assert len(packets) >= 45
    pts = [p for _, p, _ in packets]
    assert pts == sorted(set(pts))
    assert np.max(np.abs(decode("opus", packets))) > 0.01  # sound, not silence


def test_passed_through_frames_step_by_whole_frames_whatever_the_sample_clock_wobbles() -> None:
    """An IP camera's own Opus, placed by the sample clock: where that puts a frame wobbles
    (arrival times under load: 500 ticks seen), the camera's frames do not. Less than a frame
    off, a frame continues the last exactly; a frame or more late (a hole) it goes on whole
    frames later; a frame or more early it is dropped, never sent overlapping; past a second
    (a step of the timeline) it is placed where the sample clock says."""
    pipeline = AudioPipeline(ToneSource())
    step = 960

    def frame(data: bytes) -> CodedFrame:
        return CodedFrame(codec="opus", data=data, config=b"", offset=0, duration=step)

    # Where the sample clock puts each chunk's one frame, and what goes out.
    placed = [0, 960, 1920 + 500, 2880 - 400, 3840 + 959, 4800 + 2 * step + 10,
              6720 + 1100 - 2 * step, 7680 + 3 * step, 9600 + 3 * step + 96_000]
    sent = [pipeline._pass("opus", [frame(bytes([i]))], at) for i, at in enumerate(placed)]
    out = [(data[0], pts) for chunk in sent for data, pts in chunk]
    assert out == [(0, 0), (1, 960), (2, 1920), (3, 2880), (4, 3840),
                   (5, 4800 + 2 * step),  # two frames late: a hole of two frames
                   # 6 is a frame and more early: dropped
                   (7, 10_560), (8, 9600 + 3 * step + 96_000)]  # 7: three late; 8: a step
    assert pipeline.passthrough_dropped == {"opus": 1, "aac": 0}
    assert all((b - a) % step == 0 for (_, a), (_, b) in itertools.pairwise(out[:-1]))
