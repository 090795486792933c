"""An IP camera's own AAC through the whole appliance (issue 30): a real RTSP camera
(GStreamer's gst-rtsp-server, AAC-LC 16 kHz mono beside its H.264, on loopback) is one
``rtsp://`` camera of a running appliance. Its sound reaches

- HLS and the archive *passed through*: every AAC frame muxed is one the camera sent, byte for
  byte and in order (a second client, FFmpeg's, receives the same shared media as the witness),
  under an init segment with the camera's own AudioSpecificConfig; FFmpeg decodes both tracks
  without a word;
- an RTSP client (FFmpeg, recording the stream as an NVR does) passed through as well;
- a WebRTC viewer (a real aiortc peer over real UDP, through ``POST /whep/<camera>``)
  *transcoded* to Opus, which it decodes to the camera's 440 Hz sine.
"""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path
from typing import Any

import aiohttp
import aioice.ice
import av
import numpy as np
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    CameraConfig,
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    RecordingConfig,
    RtspConfig,
    StateConfig,
    WebRtcConfig,
)
from tests.audio.test_ip_camera_track import camera_packets, dominant_hz, is_run_of
from tests.audio.whep_peer import WhepPeer
from tests.av_sync import decode_errors, streams
from tests.capture.test_rtsp import FPS, HEIGHT, WIDTH, RtspServer, record, require_rtsp_server
from tests.engine.conftest import wait_for
from tests.hls.test_audio import get
from tests.rtsp.test_rtsp_audio import run_tool
from tests.tooling import free_port

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
CAMERA_CONFIG = bytes.fromhex("1408")  # AAC-LC, 16 kHz, mono (what avenc_aac says first)


@pytest.fixture(autouse=True)
def loopback_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client peer gathers one host candidate, 127.0.0.1."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


def audio_packets(path: Path) -> tuple[list[bytes], bytes]:
    """The AAC frames of an MP4 file, in order, and its AudioSpecificConfig."""
    frames, config, _ = audio_track(path)
    return frames, config


def audio_track(path: Path) -> tuple[list[bytes], bytes, set[int]]:
    """The AAC frames of an MP4 file, its AudioSpecificConfig, and the frames' durations (in
    the track's timescale, 1/48000 s)."""
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        config = bytes(stream.codec_context.extradata or b"")
        packets = [p for p in container.demux(stream) if p.size]
        return [bytes(p) for p in packets], config, {int(p.duration or 0) for p in packets}


async def hls_after_the_switch(http: aiohttp.ClientSession, base: str, count: int,
                               tmp_path: Path) -> tuple[bytes, list[str]]:
    """The newest init segment and ``count`` complete segments under it, once that init has
    the camera's own configuration (the first one may have the encoder's, from before the
    camera's first sound)."""
    for _ in range(120):
        text = (await get(http, f"{base}/hls/gate/index.m3u8")).decode()
        lines = text.splitlines()
        maps = [i for i, line in enumerate(lines) if line.startswith("#EXT-X-MAP:")]
        names = [line for line in lines[maps[-1]:] if line.startswith("seg-")] if maps else []
        if len(names) >= count:
            match = re.search(r'URI="([^"]+)"', lines[maps[-1]])
            assert match
            init = await get(http, f"{base}/hls/gate/{match.group(1)}")
            probe = tmp_path / "init.mp4"
            probe.write_bytes(init)
            if audio_packets(probe)[1][:2] == CAMERA_CONFIG:
                return init, names[-count:]
        await asyncio.sleep(0.5)
    raise AssertionError("no HLS segments under an init with the camera's configuration")


async def whep_sound(base: str) -> list[Any]:
    """Three seconds of what a WebRTC viewer of the camera decodes from its audio track."""
    peer = WhepPeer()
    try:
        await peer.connect(base, "gate")
        await wait_for(lambda: sum(len(s) for s in peer.sound) >= 48_000 * 3, timeout=60)
    finally:
        await peer.close()
    return peer.sound


async def test_an_ip_cameras_aac_is_passed_through_to_hls_and_the_archive(
        tmp_path: Path) -> None:
    require_rtsp_server()
    recording = record(tmp_path / "stamped.h264", WIDTH, HEIGHT)
    server = RtspServer(recording, free_port(), "aac")
    server.start()
    url = f"rtsp://127.0.0.1:{server.port}/cam"
    sent: list[bytes] = []
    stop = threading.Event()
    witness = threading.Thread(target=camera_packets, args=(url, stop, sent), daemon=True)
    witness.start()
    port, rtsp_port = free_port(), free_port()
    config = Config(
        cameras=(CameraConfig(name="gate", source=url, framerate=FPS, width=WIDTH,
                              height=HEIGHT),),
        http=HttpConfig(listen=HostPort("127.0.0.1", port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        hls=HlsConfig(part_duration_s=0.5, window_s=12.0),
        recording=RecordingConfig(continuous=True, segment_s=2.0,
                                  dir=str(tmp_path / "archive")),
        rtsp=RtspConfig(enable=True, listen=HostPort("127.0.0.1", rtsp_port)),
    )
    base = f"http://127.0.0.1:{port}"
    app = Appliance(config)
    try:
        await app.start()
        camera = app.cameras.resolve("gate")
        assert camera is not None and camera.audio is not None and camera.recorder is not None
        async with aiohttp.ClientSession() as http:
            init, names = await hls_after_the_switch(http, base, 3, tmp_path)
            media = tmp_path / "hls.mp4"
            media.write_bytes(init + b"".join([await get(http, f"{base}/hls/gate/{n}")
                                               for n in names]))
            sound = await whep_sound(base)
        # RTSP (an NVR's view): FFmpeg records the sound track as it comes, the camera's frames.
        relayed = tmp_path / "rtsp.mp4"
        code, _, err = await run_tool(
            "ffmpeg", "-nostdin", "-loglevel", "error", "-rtsp_transport", "tcp", "-i",
            f"rtsp://127.0.0.1:{rtsp_port}/gate", "-t", "4", "-map", "0:a", "-c", "copy",
            str(relayed), timeout=60)
        assert code == 0, err
        frames, asc = audio_packets(relayed)
        assert asc[:2] == CAMERA_CONFIG and len(frames) > 30
        assert is_run_of(frames, sent), (len(frames), len(sent))
        assert decode_errors(relayed) == ""
        # HLS: H.264 and the camera's own AAC, decoded without an error.
        assert streams(media) == [("video", "h264"), ("audio", "aac")]
        assert decode_errors(media) == ""
        frames, asc, durations = audio_track(media)
        assert asc[:2] == CAMERA_CONFIG and len(frames) > 40
        assert durations == {3072}, durations  # 1024 samples at 16 kHz, every one
        assert is_run_of(frames, sent), (len(frames), len(sent))
        # WebRTC: Opus encoded once from the camera's sound, its 440 Hz sine.
        pcm = np.concatenate(sound).astype(np.float64) / 32768.0
        assert abs(dominant_hz(pcm[-48_000:]) - 440) < 5
        level = 20 * np.log10(np.sqrt(np.mean(pcm[-48_000:] ** 2)))
        assert -12 < level < -7, level
        audio = camera.audio.stats()
        assert audio["aac"]["passthrough"] is True and audio["aac"]["passthrough_packets"] > 0
        assert audio["opus"]["passthrough"] is False and audio["opus"]["packets"] > 0
        # The archive: a segment closed after the switch holds the camera's frames too.
        recorder = camera.recorder

        def passed_through() -> list[Path]:
            return [s.path for s in recorder.archive.segments
                    if audio_packets(s.path)[1][:2] == CAMERA_CONFIG]
        await wait_for(lambda: bool(passed_through()), timeout=30, interval=0.5)
        path = passed_through()[0]
        assert decode_errors(path) == ""
        frames, asc = audio_packets(path)
        assert len(frames) > 10
        assert is_run_of(frames, sent), (len(frames), len(sent))
    finally:
        stop.set()
        await app.stop()
        server.kill()
        await asyncio.to_thread(witness.join, 15)
