"""Audio benchmark: what a camera's sound costs the board, per codec, against what it replaces.

One camera's audio is encoded once (audio/pipeline.py): libopus at 32 kbit/s (20 ms frames) for
WebRTC/RTSP and FFmpeg's AAC-LC at 64 kbit/s for HLS/recordings, 48 kHz mono. This measures the
CPU of each encode (thread CPU time per second of audio = the share of one core) on the test
tone and on noise (the worst case for an encoder), and the whole pipeline thread (tone, clock
alignment, gain, meter, both encoders) running in real time. Side by side: what the naive design
costs, a per-viewer Opus encode (aiortc's default sender encodes for every viewer), so the ratio
for N viewers is printed.

An IP camera's own AAC is passed through (``--window`` in real time, both rings read): the
pipeline thread with the camera's 16 kHz AAC frames riding along with their PCM (written to the
AAC ring unchanged, only Opus encoded) against the same sound transcoded (the AAC encode too),
with the ratio. The camera's frames and PCM are made beforehand, so the decode (on the RTSP
reader thread in the appliance, the same in both cases) is not counted.

    .venv/bin/python bench/audio.py                # 20 s of audio per case, 5 s real time
    .venv/bin/python bench/audio.py --seconds 60 --viewers 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ruseon_appliance.audio.encoders import aac_encoder, opus_encoder
from ruseon_appliance.audio.format import FRAME_SAMPLES, FRAME_US, CodedFrame, PcmChunk
from ruseon_appliance.audio.pipeline import AudioPipeline
from ruseon_appliance.audio.sources.tone import ToneSource, tone_samples


def encode_cost(make: object, signal: str, seconds: float) -> float:
    """CPU seconds per second of audio for one encoder over ``seconds`` of ``signal``."""
    encoder = make()  # type: ignore[operator]
    chunks = int(seconds * 1_000_000 / FRAME_US)
    rng = np.random.default_rng(1)
    pcm = [tone_samples(i * FRAME_US, FRAME_SAMPLES) if signal == "tone"
           else rng.integers(-8000, 8000, FRAME_SAMPLES, dtype=np.int16) for i in range(chunks)]
    start = time.thread_time()
    for i, samples in enumerate(pcm):
        encoder.encode(samples, i * FRAME_SAMPLES)
    return (time.thread_time() - start) / seconds


def thread_cpu(tid: int) -> float:
    """CPU seconds of this process's thread ``tid`` (from /proc)."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def pipeline_cost(window: float, *, read: bool = True, source: object = None
                        ) -> tuple[float, dict[str, Any]]:
    """The pipeline thread's share of a core in real time, with both rings read (``read``:
    as with a WebRTC viewer and HLS) or none (nobody watching: nothing is encoded), for
    ``source`` (default: the synthetic camera's tone)."""
    pipeline = AudioPipeline(source or ToneSource())  # type: ignore[arg-type]
    readers = [pipeline.opus_ring.reader("next"), pipeline.aac_ring.reader("next")] if read \
        else []
    await pipeline.start()
    await asyncio.sleep(1.0)
    thread = pipeline._thread
    assert thread is not None and thread.native_id is not None
    before = thread_cpu(thread.native_id)
    await asyncio.sleep(window)
    used = thread_cpu(thread.native_id) - before
    stats = pipeline.stats()
    await pipeline.stop()
    for reader in readers:
        reader.close()
    return used / window, stats


class CameraTrack:
    """An IP camera's AAC track as TrackSource hands it over: 64 ms chunks of 48 kHz PCM, each
    with the camera's 16 kHz AAC frame it was decoded from (``coded``), in real time."""

    kind = "source"

    def __init__(self, *, coded: bool, seconds: float = 30.0) -> None:
        camera = aac_encoder(sample_rate=16_000)
        pcm = tone_samples(0, int(48_000 * seconds))
        frames = [data for i in range(0, len(pcm), FRAME_SAMPLES)
                  for data, _ in camera.encode(pcm[i:i + FRAME_SAMPLES], i)]
        self.config = camera.extradata
        step = 1024 * 3
        self.chunks = [(pcm[k * step:(k + 1) * step], frames[k]) for k in range(len(frames))
                       if len(pcm[k * step:(k + 1) * step]) == step]
        self.coded = coded
        self._closed = False
        self._i = 0
        self._start = 0.0

    def open(self) -> None:
        self._start = time.monotonic()

    def read(self) -> PcmChunk | None:
        if self._closed or self._i >= len(self.chunks):
            return None
        due = self._start + self._i * 0.064
        time.sleep(max(0.0, due - time.monotonic()))
        samples, frame = self.chunks[self._i]
        self._i += 1
        coded = (CodedFrame("aac", frame, self.config, 0, 3072),) if self.coded else ()
        return PcmChunk(samples, time.time_ns() // 1000 - 64_000, coded)

    def close(self) -> None:
        self._closed = True

    def stats(self) -> dict[str, object]:
        return {}


class PumpClock:
    """Loop-thread CPU spent in a send loop's ``pump`` (wrapped on the instance)."""

    def __init__(self, loop_object: object) -> None:
        self.cpu = 0.0
        self.calls = 0
        original = loop_object.pump  # type: ignore[attr-defined]

        def pump() -> None:
            began = time.thread_time()
            original()
            self.cpu += time.thread_time() - began
            self.calls += 1

        loop_object.pump = pump  # type: ignore[attr-defined]


async def fanout_cost(viewers: int, window: float, *, audio_on: bool) -> dict[str, float]:
    """``viewers`` aiortc peers (packets counted and dropped, never decoded) on a real engine
    over loopback; the loop-thread CPU of the video and the audio send loops per packet sent,
    each counted apart."""
    import tempfile

    import aioice.ice
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    from ruseon_appliance.capture.pipeline import CapturePipeline
    from ruseon_appliance.config import CameraConfig, HostPort, WebRtcConfig
    from ruseon_appliance.engine import Engine
    from ruseon_appliance.engine.aiortc_internals import discard_received_rtp

    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]
    feed = CapturePipeline(CameraConfig(source="synthetic", width=640, height=480, framerate=30,
                                        bitrate=1_000_000, keyframe_interval=60,
                                        profile="baseline"))
    audio = AudioPipeline(ToneSource())
    await feed.start()
    await feed.wait_first_frame(10)
    await audio.start()
    with tempfile.TemporaryDirectory() as state:
        engine = Engine(WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",),
                                     max_viewers=max(16, viewers)), Path(state), feed)
        await engine.start()
        clients = []
        received = [0]
        for _ in range(viewers):
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            pc.addTransceiver("video", direction="recvonly")
            pc.addTransceiver("audio", direction="recvonly")
            await pc.setLocalDescription(await pc.createOffer())
            session, answer = await engine.offer(pc.localDescription.sdp,
                                                 audio=audio if audio_on else None)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            discard_received_rtp(pc, lambda size: received.__setitem__(0, received[0] + 1))
            clients.append((pc, session))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
                s.state == "connected" for _, s in clients):
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        fanout = engine.fanout
        assert fanout is not None
        video_clock = PumpClock(fanout)
        audio_fanout = engine.audio_fanout_for(audio) if audio_on else None
        audio_clock = PumpClock(audio_fanout) if audio_fanout is not None else None

        def sent() -> tuple[int, int]:
            video = sum(s.track.packets_sent for _, s in clients)
            sound = sum(s.audio.packets_sent for _, s in clients if s.audio is not None)
            return video, sound

        v0, a0 = sent()
        await asyncio.sleep(window)
        v1, a1 = sent()
        for pc, _ in clients:
            await pc.close()
        await engine.stop()
    await audio.stop()
    await feed.stop()
    video_packets, audio_packets = v1 - v0, a1 - a0
    return {
        "viewers": viewers,
        "video_packets": video_packets,
        "audio_packets": audio_packets,
        "video_us_per_packet": video_clock.cpu / max(1, video_packets) * 1e6,
        "audio_us_per_packet": (audio_clock.cpu / max(1, audio_packets) * 1e6
                                if audio_clock is not None else 0.0),
        "video_loop_share": video_clock.cpu / window,
        "audio_loop_share": audio_clock.cpu / window if audio_clock is not None else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="audio per encode case")
    parser.add_argument("--window", type=float, default=5.0, help="real-time pipeline window")
    parser.add_argument("--viewers", type=int, default=10, help="viewers for the ratio")
    args = parser.parse_args()
    results: dict[str, float] = {}
    for codec, make in (("opus", opus_encoder), ("aac", aac_encoder)):
        for signal in ("tone", "noise"):
            results[f"{codec}_{signal}"] = encode_cost(make, signal, args.seconds)
    pipeline_share, stats = asyncio.run(pipeline_cost(args.window))
    idle_share, _ = asyncio.run(pipeline_cost(args.window, read=False))
    with_audio = asyncio.run(fanout_cost(args.viewers, args.window, audio_on=True))
    without = asyncio.run(fanout_cost(args.viewers, args.window, audio_on=False))
    passed, passed_stats = asyncio.run(pipeline_cost(
        args.window, source=CameraTrack(coded=True, seconds=args.window + 5)))
    transcoded, _ = asyncio.run(pipeline_cost(
        args.window, source=CameraTrack(coded=False, seconds=args.window + 5)))
    assert passed_stats["aac"]["passthrough"] is True, passed_stats["aac"]
    per_camera = results["opus_tone"] + results["aac_tone"]
    naive = results["opus_tone"] * args.viewers + results["aac_tone"]
    print("audio encode cost, share of one core (CPU s per s of 48 kHz mono audio)")
    for key, value in results.items():
        print(f"  {key:12s} {value * 100:6.2f} %")
    print(f"  pipeline thread in real time (tone + both encoders): {pipeline_share * 100:.2f} %"
          f" ({stats['chunks_in']} chunks)")
    print(f"  pipeline thread with nobody reading (the tone only, no encode): "
          f"{idle_share * 100:.2f} %")
    print(f"  one encode per camera: {per_camera * 100:.2f} %; a per-viewer Opus encode for "
          f"{args.viewers} viewers: {naive * 100:.2f} % -> ratio {naive / per_camera:.1f}x")
    print(f"an IP camera's 16 kHz AAC, pipeline thread in real time (both rings read): passed "
          f"through {passed * 100:.2f} % ({passed_stats['aac']['passthrough_packets']} frames), "
          f"transcoded {transcoded * 100:.2f} % -> ratio {transcoded / max(passed, 1e-9):.1f}x")
    print(f"fan-out to {args.viewers} WebRTC viewers, loop-thread CPU per packet sent:")
    print(f"  audio on : video {with_audio['video_us_per_packet']:.1f} us/packet "
          f"({with_audio['video_packets']} packets), audio "
          f"{with_audio['audio_us_per_packet']:.1f} us/packet ({with_audio['audio_packets']} "
          f"packets); audio loop {with_audio['audio_loop_share'] * 100:.2f} % of a core")
    print(f"  audio off: video {without['video_us_per_packet']:.1f} us/packet "
          f"({without['video_packets']} packets)")
    print(json.dumps({"results": results, "pipeline": pipeline_share, "pipeline_idle": idle_share,
                      "camera_aac_passthrough": passed, "camera_aac_transcoded": transcoded,
                      "viewers": args.viewers, "fanout_audio_on": with_audio,
                      "fanout_audio_off": without}))


if __name__ == "__main__":
    main()
