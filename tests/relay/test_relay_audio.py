"""The relay's audio (``audio_port``): the camera's Opus (the real pipeline and encoder on the
synthetic camera's test tone) as RTP to a plain UDP socket on loopback, beside the video;
decoded back with PyAV's Opus decoder; sender reports checked against the packets' capture
times; the ring read only while the audio goes out."""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import os
import socket
import struct
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import pylibsrtp
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.audio.pipeline import AudioPipeline
from ruseon_appliance.audio.sources.tone import ToneSource
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.config import Config, HostPort, HttpConfig, StateConfig, WebRtcConfig
from ruseon_appliance.relay import RtpRelay
from ruseon_appliance.stream.fanout import Fanout
from ruseon_appliance.stream.reports import MAPPING_WINDOW
from ruseon_appliance.stream.rtcp import NTP_EPOCH_OFFSET
from tests.relay.conftest import RtpReceiver, assert_the_tone, wait_for
from tests.relay.test_rtp_relay import FPS, camera, relay_config
from tests.tooling import free_port, require_tool
from tests.web.conftest import admin_of

pytestmark = pytest.mark.timeout(120)

KEY = os.urandom(30)
@dataclass
class OpusReceiver:
    """A plain UDP socket on 127.0.0.1 taking the relay's audio RTP (and, optionally, its
    sender reports on a second one); undoes SRTP/SRTCP with the key when given."""

    srtp_key: bytes | None = None
    bind_port: int = 0
    packets: list[tuple[int, int, int, bool, bytes]] = field(default_factory=list)
    reports: list[tuple[int, int, int]] = field(default_factory=list)  # ssrc, ntp, rtp
    unprotect_failures: int = 0
    sock: socket.socket = field(init=False)
    rtcp_sock: socket.socket = field(init=False)
    _srtp: Any = None

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", self.bind_port))
        self.sock.setblocking(False)
        self.rtcp_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rtcp_sock.bind(("127.0.0.1", 0))
        self.rtcp_sock.setblocking(False)
        if self.srtp_key is not None:
            self._srtp = pylibsrtp.Session(pylibsrtp.Policy(
                key=self.srtp_key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND))

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def rtcp_port(self) -> int:
        return int(self.rtcp_sock.getsockname()[1])

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.sock.fileno(), self._on_rtp)
        loop.add_reader(self.rtcp_sock.fileno(), self._on_rtcp)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in (self.sock, self.rtcp_sock):
            loop.remove_reader(sock.fileno())
            sock.close()

    def _read(self, sock: socket.socket, rtcp: bool) -> list[bytes]:
        out = []
        while True:
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                return out
            if self._srtp is not None:
                try:
                    data = (self._srtp.unprotect_rtcp(data) if rtcp
                            else self._srtp.unprotect(data))
                except pylibsrtp.Error:
                    self.unprotect_failures += 1
                    continue
            out.append(data)

    def _on_rtp(self) -> None:
        for data in self._read(self.sock, rtcp=False):
            first, second, seq, ts, ssrc = struct.unpack_from("!BBHII", data)
            payload = data[12:]
            if first & 0x20:
                payload = payload[:len(payload) - payload[-1]]
            self.packets.append((seq, ts, ssrc, bool(second & 0x80), payload))

    def _on_rtcp(self) -> None:
        for data in self._read(self.rtcp_sock, rtcp=True):
            if len(data) >= 20 and data[1] == 200:
                ssrc, ntp_hi, ntp_lo, rtp = struct.unpack_from("!IIII", data, 4)
                self.reports.append((ssrc, (ntp_hi << 32) | ntp_lo, rtp))

    def decode(self) -> list[Any]:
        """Every packet's payload through PyAV's Opus decoder: mono int16 frames."""
        codec = av.CodecContext.create("libopus", "r")
        codec.sample_rate, codec.layout = 48_000, "mono"
        out = []
        for *_, payload in self.packets:
            if not payload:
                continue
            for frame in codec.decode(av.Packet(payload)):
                samples = frame.to_ndarray().reshape(-1)
                if samples.dtype != np.int16:  # fltp from libopus
                    samples = (samples * 32767).astype(np.int16)
                out.append(samples)
        return out


def ntp_wall_s(ntp: int) -> float:
    return (ntp >> 32) - NTP_EPOCH_OFFSET + (ntp & 0xFFFFFFFF) / (1 << 32)


def mapping_errors_us(reports: list[tuple[int, int, int]], ssrc: int, rate: int,
                      captured: list[tuple[int, int]], interval: int) -> list[int]:
    """For each sender report of ``ssrc``: where its NTP/RTP mapping puts the packet it was
    placed on (the last sent before it: among the two whose RTP time is at most two packet
    ``interval`` s before the report's, the nearer), against when that packet was captured.

    A capture stamp is never early, only late (a thread descheduled before it stamped: 24.5 ms
    seen with two test shards on 2 cores), so a packet was captured between its RTP time on the
    least late line of the stamps sent up to it (the last MAPPING_WINDOW, as a sender sees
    them) and its own stamp: the error is how far outside that the report puts it (0 inside;
    on an idle machine the two ends are the same microseconds)."""
    spans: list[tuple[int, int, int]] = []  # (RTP timestamp, least late, its own stamp)
    unwrapped = 0
    offsets: list[float] = []
    for i, (ts, cap) in enumerate(captured):
        if i:
            unwrapped += ((ts - captured[i - 1][0] + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
        offsets.append(cap - unwrapped * 1e6 / rate)
        earliest = round(unwrapped * 1e6 / rate + min(offsets[-MAPPING_WINDOW:]))
        spans.append((ts, min(earliest, cap), cap))
    errors = []
    for sr_ssrc, ntp, sr_rtp in reports:
        if sr_ssrc != ssrc:
            continue
        each = []
        for ts, earliest, cap in spans:
            behind = ((sr_rtp - ts + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
            if 0 <= behind < 2 * interval:
                mapped = round((ntp_wall_s(ntp) - behind / rate) * 1e6)
                each.append(mapped - cap if mapped > cap else min(0, mapped - earliest))
        if each:
            errors.append(min(each, key=abs))
    return errors


@pytest.fixture
async def sound() -> AsyncIterator[AudioPipeline]:
    """The synthetic camera's test tone through the real pipeline and Opus encoder."""
    pipeline = AudioPipeline(ToneSource())
    await pipeline.start()
    yield pipeline
    await pipeline.stop()


@pytest.fixture
async def live() -> AsyncIterator[tuple[CapturePipeline, Fanout]]:
    capture = CapturePipeline(camera())
    await capture.start()
    fanout = Fanout(capture, lambda family: None, framerate=FPS, min_bitrate=300_000)
    fanout.start()
    assert await capture.wait_first_frame(20)
    try:
        yield capture, fanout
    finally:
        await fanout.stop()
        await capture.stop()


def audio_relay(config: Any, capture: CapturePipeline, fanout: Fanout,
                sound: AudioPipeline | None) -> RtpRelay:
    return RtpRelay(config, capture, fanout, framerate=FPS, catch_up_max_frames=15,
                    keyframe_interval_frames=60, audio=sound, camera="cam")


async def record_ring(sound: AudioPipeline, into: list[tuple[bytes, int]]) -> None:
    """The test's own reader on the Opus ring: each packet's bytes and capture time, in order."""
    reader = sound.opus_ring.reader("next")
    try:
        while True:
            await sound.opus_ring.wait()
            while (view := reader.poll()) is not None:
                into.append((bytes(view.data), view.capture_time_us))
    finally:
        reader.close()


def capture_times(sent: list[bytes], ring: list[tuple[bytes, int]]) -> list[int]:
    """The capture times of ``sent`` payloads: where the whole run of them is in the ring's
    packets (the tone repeats each second, so one packet's bytes alone may recur)."""
    payloads = [data for data, _ in ring]
    for start in range(len(ring) - len(sent) + 1):
        if payloads[start:start + len(sent)] == sent:
            return [capture for _, capture in ring[start:start + len(sent)]]
    raise AssertionError("the packets sent are not a run of the ring's packets")


@pytest.mark.parametrize("srtp", [False, True], ids=["rtp", "srtp"])
async def test_audio_rtp_beside_the_video_continuous_decodable_and_on_the_capture_clock(
        live: tuple[CapturePipeline, Fanout], sound: AudioPipeline, srtp: bool) -> None:
    capture, fanout = live
    key = KEY if srtp else None
    video = RtpReceiver(srtp_key=key)
    video_rtcp = video.open_rtcp()
    audio = OpusReceiver(srtp_key=key)
    video.start()
    audio.start()
    config = relay_config(video.port, rtcp_port=video_rtcp, audio_port=audio.port,
                          audio_rtcp_port=audio.rtcp_port,
                          srtp_key=base64.b64encode(KEY).decode() if srtp else "")
    relay = audio_relay(config, capture, fanout, sound)
    captured: list[tuple[bytes, int]] = []
    recorder = asyncio.create_task(record_ring(sound, captured))
    await relay.start()
    try:
        assert sound.opus_ring.reader_count == 2  # the relay's and the test's
        await wait_for(lambda: len(audio.packets) >= 150 and len(video.stamped_at) >= 60
                       and sum(r[0] == relay.ssrc for r in video.rtcp_reports()) >= 2
                       and len(audio.reports) >= 2, timeout=60,
                       what="3 s of sound, pictures and both streams' sender reports")
    finally:
        relay.stop()
        recorder.cancel()
        await asyncio.gather(recorder, return_exceptions=True)
        video.close()
        audio.close()
    assert sound.opus_ring.reader_count == 0
    assert audio.unprotect_failures == 0 and video.unprotect_failures == 0
    assert relay.audio is not None
    ssrcs = {p[2] for p in audio.packets}
    assert ssrcs == {relay.audio.ssrc} and relay.audio.ssrc != relay.ssrc
    assert {p[2] for p in video.packets} == {relay.ssrc}
    for a, b in itertools.pairwise(audio.packets):
        assert (b[0] - a[0]) & 0xFFFF == 1, f"sequence gap {a[0]} -> {b[0]}"
        assert (b[1] - a[1]) & 0xFFFFFFFF == 960, f"timestamp step {a[1]} -> {b[1]}"
    assert audio.packets[0][3], "the first packet starts a talkspurt (marker)"
    assert not any(p[3] for p in audio.packets[1:])
    sent_captured = capture_times([p[4] for p in audio.packets], captured)
    video.assert_continuous()
    assert_the_tone(audio.decode())
    stats = relay.stats()
    assert stats["audio"]["packets_sent"] == len(audio.packets)
    assert stats["packets_sent"] == len(video.packets)  # the video's own count
    # Each stream's sender report maps RTP time to the capture clock: where it puts the packet
    # sent last before it is where that packet was captured (measured within ~10 µs; placed by
    # the send time instead, as before, the audio's were 1-34 ms off, the video's 0.6-1.5 ms).
    audio_errors = mapping_errors_us(audio.reports, relay.audio.ssrc, 48_000,
                                     [(p[1], cap) for p, cap in zip(audio.packets,
                                                                    sent_captured, strict=True)],
                                     960)
    video_errors = mapping_errors_us(video.rtcp_reports(), relay.ssrc, 90_000,
                                     video.stamped_at, 90_000 // FPS)
    assert audio_errors and video_errors
    assert max(map(abs, audio_errors)) < 500, audio_errors
    assert max(map(abs, video_errors)) < 500, video_errors


async def test_audio_port_0_sends_no_audio_and_leaves_the_ring_unread(
        live: tuple[CapturePipeline, Fanout], sound: AudioPipeline) -> None:
    capture, fanout = live
    video = RtpReceiver()
    video.start()
    relay = audio_relay(relay_config(video.port), capture, fanout, sound)
    await relay.start()
    try:
        await wait_for(lambda: video.decoded >= 20, what="pictures")
        assert relay.audio is None and relay.stats()["audio"]["state"] == "off"
        assert sound.opus_ring.reader_count == 0
        await wait_for(lambda: sound.stats()["opus"]["encoding"] is False, what="Opus off")
        assert sound.stats()["opus"]["packets"] == 0
    finally:
        relay.stop()
        video.close()


async def test_a_camera_without_sound_warns_once_and_sends_video(
        live: tuple[CapturePipeline, Fanout], caplog: pytest.LogCaptureFixture) -> None:
    capture, fanout = live
    video = RtpReceiver()
    video.start()
    closed = free_port(kind=socket.SOCK_DGRAM)
    relay = audio_relay(relay_config(video.port, name="janus", audio_port=closed), capture,
                        fanout, None)
    caplog.set_level(logging.INFO, logger="ruseon_appliance.relay")
    await relay.start()
    try:
        await wait_for(lambda: video.decoded >= 20, what="pictures")
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert warnings == ["relay janus: camera cam has no sound: relay janus sends video only"]
        assert relay.stats()["audio"]["state"] == "no sound" and relay.state == "sending"
    finally:
        relay.stop()
        video.close()


async def test_a_refused_audio_port_pauses_the_audio_alone_and_it_comes_back(
        live: tuple[CapturePipeline, Fanout], sound: AudioPipeline,
        caplog: pytest.LogCaptureFixture) -> None:
    """A mountpoint without audio (nothing on audio_port): the kernel's ICMP port unreachable
    pauses the audio (the ring let go, Opus no longer encoded), the picture goes on; once
    something listens there, the audio resumes."""
    capture, fanout = live
    video = RtpReceiver()
    video.start()
    port = free_port(kind=socket.SOCK_DGRAM)
    relay = audio_relay(relay_config(video.port, audio_port=port, audio_rtcp_port=0),
                        capture, fanout, sound)
    caplog.set_level(logging.INFO, logger="ruseon_appliance.relay")
    await relay.start()
    audio: OpusReceiver | None = None
    try:
        assert relay.audio is not None
        await wait_for(lambda: relay.audio is not None and relay.audio.state == "unreachable",
                       what="the audio to notice")
        assert sound.opus_ring.reader_count == 0
        await wait_for(lambda: relay.audio is not None
                       and relay.audio.errors["unreachable"] >= 3, what="probes refused")
        mark = video.decoded
        await wait_for(lambda: video.decoded >= mark + 30, what="the picture going on")
        assert relay.state == "sending" and relay.outages == 0
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "audio port" in warnings[0], warnings
        audio = OpusReceiver(bind_port=port)
        audio.start()
        await wait_for(lambda: len((audio is not None and audio.packets) or ()) >= 50,
                       what="the audio after the outage")
        assert relay.audio.state == "sending" and sound.opus_ring.reader_count == 1
        assert relay.audio.outages == 1
        # What resumed it: a probe, an Opus DTX packet (a TOC byte, no frame: a decoder conceals
        # it; never an empty payload, which ends FFmpeg's decoder behind Janus), then the sound
        # from the next packet on, starting a talkspurt.
        probe, first = audio.packets[0], audio.packets[1]
        assert probe[4] == bytes([31 << 3]) and not probe[3]
        assert first[3] and len(first[4]) > 1, "the marker after the pause"
        assert 0 < (first[1] - probe[1]) & 0xFFFFFFFF < 1 << 31
        for a, b in itertools.pairwise(audio.packets):
            assert (b[0] - a[0]) & 0xFFFF == 1
        video.assert_continuous()
    finally:
        relay.stop()
        video.close()
        if audio is not None:
            audio.close()
    assert sound.opus_ring.reader_count == 0


async def test_the_appliance_relays_its_tone_ffmpeg_reads_both_from_the_sdp(
        tmp_path: Path) -> None:
    """[[relay]] audio_port on the synthetic camera (whose sound is the tone): status and
    metrics count the audio apart; ``GET /relay/<name>.sdp`` has an m=audio that FFmpeg, a
    generic receiver, decodes from nothing else (at the tone's level)."""
    ffmpeg = require_tool("ffmpeg", "apt-get install ffmpeg")
    rtp_port, audio_port = free_port(kind=socket.SOCK_DGRAM), free_port(kind=socket.SOCK_DGRAM)
    http_port = free_port()
    config = Config(
        cameras=(camera(),),
        http=HttpConfig(listen=HostPort("127.0.0.1", http_port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        relay=(relay_config(rtp_port, name="lan", audio_port=audio_port, audio_rtcp_port=0),),
    )
    appliance = Appliance(config)
    await appliance.start()
    base = f"http://127.0.0.1:{http_port}"
    try:
        (relay,) = appliance.relays
        assert relay.audio is not None
        async with aiohttp.ClientSession(headers=admin_of(appliance)) as http:
            async with http.get(f"{base}/relay/lan.sdp") as response:
                assert response.status == 200
                sdp = await response.text()
            assert f"m=audio {audio_port} RTP/AVP 111\r\na=rtpmap:111 opus/48000/2" in sdp
            assert f"a=ssrc:{relay.audio.ssrc} cname:{relay.cname}" in sdp
            sdp_file = tmp_path / "lan.sdp"
            sdp_file.write_text(sdp)
            proc = await asyncio.create_subprocess_exec(
                ffmpeg, "-nostdin", "-v", "error", "-protocol_whitelist", "file,udp,rtp",
                "-i", str(sdp_file), "-map", "0:a", "-t", "3", "-ac", "1", "-ar", "48000",
                "-f", "s16le", "-", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 60)
            finally:
                if proc.returncode is None:
                    proc.kill()
            assert proc.returncode == 0, err.decode()[-2000:]
            samples = np.frombuffer(out, dtype=np.int16)
            assert len(samples) >= 48_000, len(samples)
            assert_the_tone([samples[i:i + 960] for i in range(0, len(samples) - 959, 960)])
            async with http.get(f"{base}/api/status") as response:
                status = await response.json()
            (stats,) = status["relays"]
            # (FFmpeg started after the relay: the first packets were refused, and paused it.)
            assert stats["audio"]["packets_sent"] >= len(samples) // 960
            assert stats["packets_sent"] > 0
            async with http.get(f"{base}/metrics") as response:
                metrics = await response.text()
            assert 'ruseon_relay_audio_packets_sent_total{relay="lan"}' in metrics
            assert 'ruseon_relay_audio_bytes_sent_total{relay="lan"}' in metrics
    finally:
        await appliance.stop()
