"""An IP camera's own sound (``audio = "source"``): the audio track of a real RTSP camera
(GStreamer's gst-rtsp-server with an audio test source, started by the test on loopback) taken
with its video, decoded, and encoded once into Opus and AAC, with the video untouched."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import av
import numpy as np
import pytest

from ruseon_appliance.audio.choice import resolve_audio
from ruseon_appliance.audio.pipeline import AudioPipeline
from ruseon_appliance.audio.sources import audio_source_for
from ruseon_appliance.audio.sources.track import TrackSource
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.sources.rtsp import RtspSource
from ruseon_appliance.config import CameraConfig
from tests.audio.test_pipeline import decode
from tests.capture.test_rtsp import (
    FPS,
    HEIGHT,
    WIDTH,
    RtspServer,
    record,
    require_rtsp_server,
    wait_until,
)
from tests.tooling import free_port

pytestmark = pytest.mark.timeout(120)
NO_TRACK = "the camera's stream has no audio track"


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("track") / "stamped.h264", WIDTH, HEIGHT)


def camera_packets(url: str, stop: threading.Event, out: list[bytes]) -> None:
    """What the camera sends on its audio track, as a second client (FFmpeg's) receives it
    from the same shared media: the frames a passthrough must reproduce."""
    with av.open(url, options={"rtsp_transport": "tcp"}, timeout=10) as container:
        stream = container.streams.audio[0]
        for packet in container.demux(stream):
            if packet.size:
                out.append(bytes(packet))
            if stop.is_set():
                return


async def take_sound(recording: Path, audio: str, opus_packets: int = 100,
                     muted: bool = False, config_file: Path | None = None) -> dict[str, Any]:
    """Run an RTSP camera whose stream has an ``audio`` track through the video and audio
    pipelines; what came out of each, and what the camera sent (``camera``)."""
    require_rtsp_server()
    server = RtspServer(recording, free_port(), audio)
    server.start()
    url = f"rtsp://127.0.0.1:{server.port}/cam"
    sent: list[bytes] = []
    stop = threading.Event()
    witness = None
    if audio != "none":
        witness = threading.Thread(target=camera_packets, args=(url, stop, sent), daemon=True)
        witness.start()
    camera = CameraConfig(name="gate", source=url, framerate=FPS, width=WIDTH, height=HEIGHT)
    assert resolve_audio(camera)[0] == "source"  # auto: an rtsp:// camera's own track
    video = CapturePipeline(camera, source=RtspSource(camera, url, backoff_s=(0.2, 1.0)))
    track, why = audio_source_for("source", video.source)
    assert isinstance(track, TrackSource), why
    sound = AudioPipeline(track, retry_s=(0.1,), muted=muted, aac_config_file=config_file)
    opus = sound.opus_ring.reader("next")
    aac = sound.aac_ring.reader("next")
    await video.start()
    await sound.start()
    try:
        await wait_until(lambda: sound.opus_ring.newest_seq + 1 >= opus_packets
                         or (audio == "none" and sound.problem() == NO_TRACK), timeout=60)
        frames_then = video.ring.newest_seq
        # The video goes on meanwhile (liveness, not a time bound).
        await wait_until(lambda: video.ring.newest_seq >= frames_then + 5, timeout=30)
        await asyncio.sleep(0.3)
        got: dict[str, Any] = {"opus": [], "aac": []}
        for name, reader in (("opus", opus), ("aac", aac)):
            while (view := reader.poll()) is not None:
                got[name].append((bytes(view.data), view.pts, view.capture_time_us))
        newest = video.ring.frame(video.ring.newest_seq)
        stop.set()
        if witness is not None:
            await asyncio.to_thread(witness.join, 15)
        return {**got, "stats": sound.stats(), "problem": sound.problem(), "camera": sent,
                "video_frames_later": video.ring.newest_seq - frames_then,
                "video_capture_us": newest.capture_time_us if newest else 0,
                "track": track.stats(), "aac_config": sound.aac_config}
    finally:
        stop.set()
        await sound.stop()
        await video.stop()
        server.kill()


def dominant_hz(pcm: Any) -> float:
    spectrum = np.abs(np.fft.rfft(pcm[: 48_000 // 2]))
    return float(np.argmax(spectrum) * 48_000 / (2 * len(spectrum) - 2))


@pytest.mark.parametrize("codec", ["aac", "pcmu", "opus"])
async def test_an_ip_cameras_track_is_taken_with_its_video(recording: Path, codec: str,
                                                           tmp_path: Path) -> None:
    remembered = tmp_path / "aac-config"
    out = await take_sound(recording, codec, config_file=remembered)
    assert out["problem"] is None
    assert out["track"]["codec"] == {"aac": "aac", "pcmu": "pcm_mulaw", "opus": "opus"}[codec]
    assert out["track"]["decode_errors"] == 0
    # The video goes on while the sound is taken (the same connection, the same thread).
    assert out["video_frames_later"] > 0
    for name, extra in (("opus", b""), ("aac", out["aac_config"])):
        packets = out[name]
        assert len(packets) > 40, (name, len(packets))
        pcm = decode(name, packets[5:], extra)
        # The camera's 440 Hz sine at half scale (-9 dBFS RMS), through decode, resample and
        # the one encode of each codec (G.711 and the codecs cost a dB or so).
        level = 20 * np.log10(np.sqrt(np.mean(pcm[4800:] ** 2)))
        assert -12 < level < -7, (name, level)
        assert abs(dominant_hz(pcm[4800:]) - 440) < 5, name
    # Stamped on the video's clock: the newest sound is within a second of the newest picture.
    assert abs(out["opus"][-1][2] - out["video_capture_us"]) < 1_000_000
    # The camera's own codec is passed through, byte for byte, to the output of that codec
    # (AAC: HLS, recordings, RTSP; Opus: WebRTC); the other one is encoded once.
    passed = {"aac": "aac", "opus": "opus"}.get(codec)
    for name in ("opus", "aac"):
        stats = out["stats"][name]
        assert stats["passthrough"] is (name == passed), (name, stats)
        assert (stats["passthrough_packets"] > 0) is (name == passed), (name, stats)
    if passed is not None:
        frames = [data for data, _, _ in out[passed]]
        assert is_run_of(frames, out["camera"]), (len(frames), len(out["camera"]))
        pts = [p for _, p, _ in out[passed]]
        step = 1024 * 48_000 // 16_000 if passed == "aac" else 960
        assert [b - a for a, b in itertools.pairwise(pts)] == [step] * (len(pts) - 1)
    if codec == "aac":
        # The AAC ring took the camera's configuration (16 kHz mono), as its frames have, and
        # remembers it: the next start begins with it (no switch in HLS or the recordings).
        assert out["aac_config"][:2] == bytes.fromhex("1408"), out["aac_config"].hex()
        assert bytes.fromhex(remembered.read_text()) == out["aac_config"]
        again = AudioPipeline(TrackSource(), aac_config_file=remembered)
        assert again.aac_config == out["aac_config"]
        assert again.stats()["aac"]["codec"] == "aac"
    else:
        assert not remembered.exists()  # nothing to remember: the AAC is the encoder's


def test_a_remembered_aac_configuration_that_cannot_be_passed_through_is_ignored(
        tmp_path: Path) -> None:
    default = AudioPipeline(TrackSource()).aac_config
    remembered = tmp_path / "aac-config"
    for content in ("not hex", "12", "2b0a"):  # garbage, too short, HE-AAC (type 5)
        remembered.write_text(content)
        assert AudioPipeline(TrackSource(), aac_config_file=remembered).aac_config == default


def is_run_of(frames: list[bytes], sent: list[bytes]) -> bool:
    """``frames`` appear in ``sent`` one after another (a contiguous run; a steady sine makes
    some packets repeat, so every place the first one occurs is tried)."""
    n = len(frames)
    return n > 0 and any(sent[i:i + n] == frames for i in range(len(sent) - n + 1))


async def test_a_muted_ip_camera_is_encoded_in_its_own_aac_configuration(
        recording: Path) -> None:
    out = await take_sound(recording, "aac", muted=True)
    assert out["problem"] is None
    aac = out["stats"]["aac"]
    assert aac["passthrough"] is False and aac["passthrough_packets"] == 0
    assert aac["packets"] > 0
    # Still the camera's configuration (rate and channels), so a player set up for its frames
    # decodes the encode's silence: no new init segment or SDP when the microphone is muted.
    assert out["aac_config"][:2] == bytes.fromhex("1408")
    assert not any(data in out["camera"] for data, _, _ in out["aac"][5:])
    pcm = decode("aac", out["aac"], out["aac_config"])
    assert np.max(np.abs(pcm[4800:])) < 1e-3


async def test_an_ip_camera_without_sound_says_so_and_its_video_plays(recording: Path) -> None:
    out = await take_sound(recording, "none")
    assert out["problem"] == NO_TRACK
    assert out["video_frames_later"] > 0 and not out["opus"]


def test_a_track_in_a_codec_that_cannot_be_decoded_is_reported_once_and_dropped() -> None:
    track = TrackSource()
    stream = SimpleNamespace(codec_context=SimpleNamespace(
        name="no-such-codec", sample_rate=8000, extradata=b"", layout=None, channels=1))
    for _ in range(5):
        track.take(object(), stream, 0)
    assert track.stats()["packets_dropped"] == 5
    with pytest.raises(Exception, match="no-such-codec, which this FFmpeg cannot decode"):
        track.open()


def test_a_video_source_without_a_track_gets_no_audio_source() -> None:
    source, why = audio_source_for("source", object())
    assert source is None and "no audio track" in why


def test_a_tracks_chunks_are_stamped_by_the_cameras_clock_not_by_a_wobbling_arrival(
        tmp_path: Path) -> None:
    """Packets read in bunches (the reader thread waiting for a core) keep the camera's spacing:
    stamped by arrival, the pipeline's sample clock stretched and squeezed the sound."""
    clip = tmp_path / "tone.m4a"
    made = subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-f", "lavfi", "-i",
                           "sine=frequency=440:sample_rate=48000:duration=6", "-c:a", "aac",
                           str(clip)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    track = TrackSource()
    stamps, ends = [], []

    def drain() -> None:  # as the pipeline's thread does (the queue holds 64 chunks)
        while track._queue.qsize():
            chunk = track.read()
            assert chunk is not None
            stamps.append((chunk.capture_time_us, len(chunk.samples)))

    with av.open(str(clip)) as container:
        stream = container.streams.audio[0]
        for n, packet in enumerate(p for p in container.demux(stream) if p.size):
            assert packet.pts is not None and packet.time_base is not None
            end = float(packet.pts * packet.time_base) + 1024 / 48_000  # an AAC frame's end
            # 3 ms of network, and in every 50 packets a 300 ms stall that releases fifteen
            # together.
            late = 0.003
            if 20 <= n % 50 < 35:
                late += max(0.0, 0.3 - (n % 50 - 20) * 1024 / 48_000)
            track.take(packet, stream, int((1_000.0 + end + late) * 1e6))
            ends.append(end)
            if n == 0:
                track.open()
            drain()
    assert len(stamps) > 200
    # Each chunk starts where the one before ended (by its samples), to the microsecond, apart
    # from the first few that FFmpeg's decoder primes with.
    gaps = [b[0] - (a[0] + a[1] * 1_000_000 // 48_000)
            for a, b in itertools.pairwise(stamps[3:])]
    assert max(abs(g) for g in gaps) <= 1, sorted(gaps)[:3] + sorted(gaps)[-3:]
    # ... and on the arrival clock: no later than the packet came, by 3 ms at the least.
    assert track.stats()["frame_times"] == "camera" and track.stats()["clock_resyncs"] == 0
    assert stamps[-1][0] + stamps[-1][1] * 1_000_000 // 48_000 == pytest.approx(
        (1_000.0 + ends[-1] + 0.003) * 1e6, abs=2)
