"""The relay against real UDP receivers on loopback: RTP continuity, RTCP both ways, SRTP, the
server being down, and the appliance's own wiring (config, /relay/<name>.sdp read by FFmpeg)."""

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
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.h264 import AccessUnitSplitter
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.config import (
    CameraConfig,
    Config,
    HostPort,
    HttpConfig,
    RelayConfig,
    StateConfig,
    WebRtcConfig,
)
from ruseon_appliance.relay import RtpRelay
from ruseon_appliance.relay.rtp_relay import PROBE_AUD
from ruseon_appliance.stream.fanout import Fanout
from tests.relay.conftest import RtpReceiver, wait_for
from tests.tooling import free_port, require_tool
from tests.web.conftest import admin_of

DATA = Path(__file__).resolve().parents[1] / "capture" / "data"
FPS = 30
KEY = os.urandom(30)


def camera(**overrides: Any) -> CameraConfig:
    values: dict[str, Any] = dict(source="synthetic", width=320, height=240, framerate=FPS,
                                  bitrate=300_000, keyframe_interval=60)
    values.update(overrides)
    return CameraConfig(**values)


def relay_config(port: int, **overrides: Any) -> RelayConfig:
    # No RTCP unless a test opens a port for it (the default, the RTP port + 1, would send
    # sender reports to whatever holds that port on this machine).
    values: dict[str, Any] = dict(name="test", url=f"rtp://127.0.0.1:{port}",
                                  bind=HostPort("127.0.0.1", 0), rtcp_port=0)
    values.update(overrides)
    return RelayConfig(**values)


def make_relay(config: RelayConfig, feed: Any, fanout: Fanout) -> RtpRelay:
    return RtpRelay(config, feed, fanout, framerate=FPS, catch_up_max_frames=15,
                    keyframe_interval_frames=60)


@pytest.fixture
async def live_camera() -> AsyncIterator[tuple[CapturePipeline, Fanout]]:
    """A real synthetic camera and a fan-out with no viewers (as on the aiortc send path)."""
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


async def test_relay_sends_live_decodable_rtp_and_takes_keyframe_requests(
        live_camera: tuple[CapturePipeline, Fanout]) -> None:
    capture, fanout = live_camera
    receiver = RtpReceiver()
    rtcp_port = receiver.open_rtcp()
    receiver.start()
    relay = make_relay(relay_config(receiver.port, rtcp_port=rtcp_port), capture, fanout)
    await relay.start()
    try:
        await wait_for(lambda: len(receiver.stamps) >= 20, what="20 decoded, stamped pictures")
        # The stamps count up: the picture is live, not a repeated frame.
        numbers = [n for _, n in receiver.stamps]
        assert numbers == sorted(numbers) and numbers[-1] - numbers[0] >= 19
        receiver.assert_continuous()
        assert receiver.packets[0][2] == relay.ssrc
        # Sender reports go to the RTCP port, from the relay's own socket.
        await wait_for(lambda: any(p[1] == 200 for p in receiver.rtcp), what="a sender report")
        sr = next(p for p in receiver.rtcp if p[1] == 200)
        assert struct.unpack_from("!I", sr, 4)[0] == relay.ssrc
        assert receiver.rtcp_from == ("127.0.0.1", relay.local_port)

        # The server's PLI (as Janus sends it: sender SSRC 1, media SSRC ours) reaches capture.
        assert receiver.rtcp_sock is not None
        requests_before = capture.stats()["keyframe_requests"]
        pli = struct.pack("!BBHII", 0x81, 206, 2, 1, relay.ssrc)
        receiver.rtcp_sock.sendto(pli, ("127.0.0.1", relay.local_port))
        await wait_for(lambda: relay.keyframe_requests_received == 1, what="the PLI")
        assert capture.stats()["keyframe_requests"] > requests_before
        # Garbage and strangers change nothing but counters.
        receiver.rtcp_sock.sendto(b"\x81\xce\xff", ("127.0.0.1", relay.local_port))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
            stranger.bind(("127.0.0.2", 0))
            stranger.sendto(pli, ("127.0.0.1", relay.local_port))
        await wait_for(lambda: relay.errors["rtcp_malformed"] == 1 and relay.rtcp_ignored == 1,
                       what="the garbage and the stranger's packet")
        assert relay.keyframe_requests_received == 1
        sent = relay.packets_sent
        await wait_for(lambda: relay.packets_sent > sent, what="sending to go on")
        stats = relay.stats()
        assert stats["state"] == "sending" and stats["errors"]["send"] == 0
        assert fanout.stats()["consumers"] == 1
    finally:
        relay.stop()
        receiver.close()
    assert fanout.stats()["consumers"] == 0


def recorded_access_units() -> list[tuple[bytes, bool]]:
    data = (DATA / "cam_320x240_baseline.h264").read_bytes()
    return AccessUnitSplitter().split_all(data)


class RecordedFeed:
    """A ring the test writes itself: what the relay's cursor reads."""

    def __init__(self) -> None:
        self.ring = RingBuffer(4 * 1024 * 1024, 256)
        self.requests: list[str] = []

    def request_keyframe(self, reason: str = "") -> bool:
        self.requests.append(reason)
        return True


async def test_sequence_and_timestamps_stay_continuous_across_source_restarts() -> None:
    """The source restarts twice (its pts jump back to 0, as a file loop or a reconnected camera
    does); what the relay sends never jumps: Janus gives late joiners nothing after a jump."""
    units = recorded_access_units()
    assert units[0][1], "the recording starts with a keyframe"
    feed = RecordedFeed()
    fanout = Fanout(feed, lambda family: None, framerate=FPS, min_bitrate=300_000)
    receiver = RtpReceiver()
    receiver.start()
    relay = make_relay(relay_config(receiver.port), feed, fanout)
    await relay.start()
    try:
        for _restart in range(3):
            for i, (data, keyframe) in enumerate(units[:45]):
                feed.ring.write(AccessUnit(data, i * 3000, keyframe, 0))
                fanout.pump()
                await asyncio.sleep(0.002)
        await wait_for(lambda: relay.frames_sent == 135 and len(receiver.packets) ==
                       relay.packets_sent, what="every packet")
    finally:
        relay.stop()
        receiver.close()
    receiver.assert_continuous()
    timestamps = [p[1] for p in receiver.packets if p[3]]
    assert len(timestamps) == 135
    assert all(0 < (b - a) & 0xFFFFFFFF < 1 << 31 for a, b in itertools.pairwise(timestamps))
    assert receiver.decoded == 135


async def test_server_down_pauses_logs_once_and_resumes_at_a_keyframe(
        live_camera: tuple[CapturePipeline, Fanout], caplog: pytest.LogCaptureFixture) -> None:
    capture, fanout = live_camera
    port = free_port(kind=socket.SOCK_DGRAM)
    relay = make_relay(relay_config(port), capture, fanout)
    caplog.set_level(logging.INFO, logger="ruseon_appliance.relay")
    await relay.start()
    receiver: RtpReceiver | None = None
    try:
        # Nothing listens: the kernel answers with ICMP port unreachable.
        await wait_for(lambda: relay.state == "unreachable", what="the relay to notice")
        await wait_for(lambda: relay.errors["unreachable"] >= 3, what="a few probes refused")
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert relay.outages == 1 and relay.stats()["state"] == "unreachable"
        # The server comes back on the same port.
        receiver = RtpReceiver(bind_port=port)
        receiver.start()
        await wait_for(lambda: relay.state == "sending", what="the relay to resume")
        await wait_for(lambda: receiver is not None and receiver.decoded >= 10,
                       what="decoded pictures after the outage")
        # What it heard first was a probe, and one a decoder skips (an access unit delimiter):
        # a server such as Janus forwards it to its viewers.
        assert receiver.payloads[0] == PROBE_AUD and receiver.empty_payloads == 0
        assert relay.outages == 1
        assert any("accepts again" in r.getMessage() for r in caplog.records)
    finally:
        relay.stop()
        if receiver is not None:
            receiver.close()


@pytest.mark.parametrize("right_key", [True, False])
async def test_srtp(live_camera: tuple[CapturePipeline, Fanout], right_key: bool) -> None:
    capture, fanout = live_camera
    receiver = RtpReceiver(srtp_key=KEY if right_key else os.urandom(30))
    receiver.start()
    config = relay_config(receiver.port, srtp_key=base64.b64encode(KEY).decode())
    relay = make_relay(config, capture, fanout)
    await relay.start()
    try:
        if right_key:
            await wait_for(lambda: receiver.decoded >= 10, what="decoded SRTP")
            assert receiver.unprotect_failures == 0
            receiver.assert_continuous()
        else:
            await wait_for(lambda: receiver.unprotect_failures >= 30, what="refused packets")
            assert receiver.decoded == 0 and not receiver.packets
            assert relay.stats()["state"] == "sending"
    finally:
        relay.stop()
        receiver.close()


@pytest.mark.parametrize(("send_path", "srtp"), [("fanout", False), ("aiortc", True)])
async def test_appliance_serves_the_relay_sdp_status_and_metrics(tmp_path: Path,
                                                                  send_path: str,
                                                                  srtp: bool) -> None:
    """The composition root builds the relay from [[relay]] (on the engine's fan-out, or on one
    of its own on the aiortc send path); FFmpeg, a generic receiver, decodes the stream (RTP, or
    SRTP keyed by the SDP's a=crypto) from nothing but ``GET /relay/<name>.sdp``."""
    ffmpeg = require_tool("ffmpeg", "apt-get install ffmpeg")
    rtp_port = free_port(kind=socket.SOCK_DGRAM)
    http_port = free_port()
    config = Config(
        cameras=(camera(),),
        http=HttpConfig(listen=HostPort("127.0.0.1", http_port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",),
                            send_path=send_path),
        state=StateConfig(dir=str(tmp_path / "state")),
        relay=(relay_config(rtp_port, name="lan", rtcp_port=rtp_port + 1,
                            srtp_key=base64.b64encode(KEY).decode() if srtp else ""),),
    )
    appliance = Appliance(config)
    await appliance.start()
    assert appliance.engine is not None
    assert (appliance.engine.fanout is None) == (send_path == "aiortc")
    base = f"http://127.0.0.1:{http_port}"
    try:
        async with aiohttp.ClientSession(headers=admin_of(appliance)) as http:
            async with http.get(f"{base}/relay/lan.sdp") as response:
                assert response.status == 200
                assert response.content_type == "application/sdp"
                sdp = await response.text()
            async with http.get(f"{base}/relay/nope.sdp") as response:
                assert response.status == 404
            info = appliance.capture.stream_info
            assert info is not None
            assert f"profile-level-id={info.profile_level_id}" in sdp
            assert f"m=video {rtp_port} RTP/{'SAVP' if srtp else 'AVP'} 96" in sdp
            assert ("a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" in sdp) == srtp
            sdp_file = tmp_path / "lan.sdp"
            sdp_file.write_text(sdp)
            proc = await asyncio.create_subprocess_exec(
                ffmpeg, "-nostdin", "-v", "error", "-protocol_whitelist", "file,udp,rtp,srtp",
                "-i", str(sdp_file), "-frames:v", "15", "-f", "framemd5", "-",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 60)
            finally:
                if proc.returncode is None:
                    proc.kill()
            frames = [line for line in out.decode().splitlines() if not line.startswith("#")]
            assert proc.returncode == 0 and len(frames) == 15, err.decode()[-2000:]
            async with http.get(f"{base}/api/status") as response:
                status = await response.json()
            (relay,) = status["relays"]
            assert relay["name"] == "lan" and relay["packets_sent"] > 0
            # FFmpeg has gone again, so the relay may already have seen its port close.
            assert relay["state"] in ("sending", "unreachable")
            async with http.get(f"{base}/metrics") as response:
                metrics = await response.text()
            assert 'ruseon_relay_packets_sent_total{relay="lan"}' in metrics
            # prometheus-client writes labels sorted by name.
            assert 'ruseon_relay_errors_total{kind="unreachable",relay="lan"}' in metrics
    finally:
        await appliance.stop()


async def test_a_target_name_that_does_not_resolve_yet_is_retried(
        live_camera: tuple[CapturePipeline, Fanout], monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS not up at boot: the relay waits (state unresolved) instead of stopping start-up."""
    capture, fanout = live_camera
    receiver = RtpReceiver()
    receiver.start()
    relay = make_relay(relay_config(receiver.port), capture, fanout)
    real_resolve = relay._resolve
    failures = iter([OSError("Temporary failure in name resolution")] * 2)

    async def flaky_resolve() -> tuple[int, tuple[str, int]]:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return await real_resolve()

    monkeypatch.setattr(relay, "_resolve", flaky_resolve)
    monkeypatch.setattr("ruseon_appliance.relay.rtp_relay.RESOLVE_RETRY_S", 0.1)
    await relay.start()
    try:
        assert relay.stats()["state"] == "unresolved" and relay.local_port == 0
        await wait_for(lambda: receiver.decoded >= 5, what="decoding once resolved")
        assert relay.state == "sending"
    finally:
        relay.stop()
        receiver.close()


async def test_a_bind_address_the_board_does_not_have_fails_start_up_naming_the_relay(
        live_camera: tuple[CapturePipeline, Fanout]) -> None:
    capture, fanout = live_camera
    relay = make_relay(relay_config(5004, name="janus", bind=HostPort("192.0.2.1", 0)),
                       capture, fanout)
    with pytest.raises(OSError, match=r"relay janus: cannot bind relay.bind = 192\.0\.2\.1:0"):
        await relay.start()
    assert fanout.stats()["consumers"] == 0


async def test_the_sdp_of_a_relay_whose_name_does_not_resolve_yet_is_503_not_500(
        tmp_path: Path) -> None:
    http_port = free_port()
    config = Config(
        cameras=(camera(),),
        http=HttpConfig(listen=HostPort("127.0.0.1", http_port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        relay=(RelayConfig(name="far", url="rtp://janus.invalid:5004",
                           bind=HostPort("127.0.0.1", 0)),),
    )
    appliance = Appliance(config)
    await appliance.start()
    try:
        assert appliance.relays[0].state == "unresolved"
        async with (aiohttp.ClientSession(headers=admin_of(appliance)) as http,
                    http.get(f"http://127.0.0.1:{http_port}/relay/far.sdp") as response):
            body = await response.json(content_type=None)
            assert response.status == 503, body
            assert response.headers["Retry-After"] == "5"
            assert "janus.invalid" in body["detail"]
    finally:
        await appliance.stop()


async def test_a_closed_rtcp_port_does_not_stop_the_media(
        live_camera: tuple[CapturePipeline, Fanout], caplog: pytest.LogCaptureFixture) -> None:
    """A server that takes the RTP but has nothing on the configured rtcp_port (a mountpoint
    without rtcpport, a typo): the sender reports are refused, the picture must still go out."""
    capture, fanout = live_camera
    receiver = RtpReceiver()
    receiver.start()
    closed = free_port(kind=socket.SOCK_DGRAM)
    relay = make_relay(relay_config(receiver.port, rtcp_port=closed), capture, fanout)
    caplog.set_level(logging.INFO, logger="ruseon_appliance.relay")
    await relay.start()
    try:
        await wait_for(lambda: relay.errors["rtcp_unreachable"] >= 3,
                       what="sender reports refused a few times")
        mark = receiver.decoded
        await wait_for(lambda: receiver.decoded >= mark + 30, what="the picture going on")
        assert relay.state == "sending" and relay.outages == 0
        assert relay.errors["unreachable"] == 0
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "RTCP" in warnings[0], warnings
    finally:
        relay.stop()
        receiver.close()


async def test_a_dns_server_that_does_not_answer_does_not_hold_start_up(
        live_camera: tuple[CapturePipeline, Fanout], monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolver's own timeouts (5 s x attempts x servers, per relay) would hold the appliance
    (and systemd's READY) while DNS is down: start() goes on without the answer."""
    capture, fanout = live_camera
    receiver = RtpReceiver()
    receiver.start()
    relay = make_relay(relay_config(receiver.port), capture, fanout)
    real_resolve = relay._resolve
    calls = 0

    async def hanging_once() -> tuple[int, tuple[str, int]]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(3600)  # the query nobody answers
        return await real_resolve()

    monkeypatch.setattr(relay, "_resolve", hanging_once)
    monkeypatch.setattr("ruseon_appliance.relay.rtp_relay.RESOLVE_RETRY_S", 0.1)
    monkeypatch.setattr("ruseon_appliance.relay.rtp_relay.RESOLVE_TIMEOUT_S", 0.2)
    try:
        await asyncio.wait_for(relay.start(), 60)  # liveness bound, not a duration check
        assert relay.state == "unresolved"
        await wait_for(lambda: receiver.decoded >= 5, what="decoding once DNS answers")
    finally:
        relay.stop()
        receiver.close()
