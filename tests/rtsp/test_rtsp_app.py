"""The appliance's own wiring: ``[rtsp]`` from the config file, every camera at its path, the
stats in ``/api/status`` and ``/metrics``, and the server off by default."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.cli import build_parser, config_from_args
from ruseon_appliance.config import (
    Config,
    ConfigError,
    HostPort,
    HttpConfig,
    RtspConfig,
    StateConfig,
    WebRtcConfig,
    load_config,
)
from tests.rtsp.conftest import RawClient, camera, wait_for
from tests.rtsp.test_rtsp_clients import assert_live_and_whole, decode_rtsp, frames_late
from tests.tooling import free_port
from tests.web.conftest import admin_of


def test_rtsp_config_is_off_by_default_and_read_from_toml(tmp_path: Path) -> None:
    assert Config().rtsp.enable is False
    assert Config().rtsp.listen == HostPort("0.0.0.0", 8554)
    path = tmp_path / "ruseon.toml"
    path.write_text('[rtsp]\nenable = true\nlisten = "127.0.0.1:9554"\nmax_clients = 3\n')
    config = load_config(path, env={})
    assert config.rtsp.enable and config.rtsp.listen == HostPort("127.0.0.1", 9554)
    assert config.rtsp.max_clients == 3
    flags = build_parser().parse_args(["serve", "--config", str(path), "--rtsp", "[::1]:8555"])
    from_flags = config_from_args(flags)
    assert from_flags.rtsp.enable and from_flags.rtsp.listen == HostPort("::1", 8555)
    path.write_text("[rtsp]\nmax_clients = 0\n")
    with pytest.raises(ConfigError, match=r"rtsp\.max_clients"):
        load_config(path, env={})


@pytest.mark.parametrize("send_path", ["fanout", "aiortc"])
async def test_appliance_serves_each_camera_over_rtsp(tmp_path: Path, send_path: str) -> None:
    rtsp_port, http_port = free_port(), free_port()
    front, back = camera(name="front"), camera(name="back", width=256, height=144)
    config = Config(
        cameras=(front, back),
        http=HttpConfig(listen=HostPort("127.0.0.1", http_port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",),
                            send_path=send_path),
        state=StateConfig(dir=str(tmp_path / "state")),
        rtsp=RtspConfig(enable=True, listen=HostPort("127.0.0.1", rtsp_port)),
    )
    appliance = Appliance(config)
    await appliance.start()
    try:
        assert appliance.rtsp is not None and appliance.rtsp.port == rtsp_port
        result = await asyncio.to_thread(decode_rtsp, f"rtsp://127.0.0.1:{rtsp_port}/back",
                                         "tcp", 15)
        back_camera = appliance.cameras.get("back")
        assert back_camera is not None
        assert_live_and_whole(result, 15, late=frames_late(back_camera.pipeline))
        client = await RawClient.connect(rtsp_port, "front")
        try:
            await client.play_tcp()
            await wait_for(lambda: client.frames >= 5, what="frames of the front camera")
            cams = {s.camera for s in appliance.rtsp.sessions.values()}
            assert cams == {"front"}
            async with aiohttp.ClientSession(headers=admin_of(appliance)) as http:
                base = f"http://127.0.0.1:{http_port}"
                async with http.get(f"{base}/api/status") as response:
                    status = await response.json()
                async with http.get(f"{base}/metrics") as response:
                    metrics = await response.text()
            rtsp = status["rtsp"]
            assert rtsp["playing"] == 1 and rtsp["sessions_total"] == 2
            assert rtsp["session_list"][0]["camera"] == "front"
            assert "# TYPE ruseon_rtsp_frames_sent_total counter" in metrics
            assert "ruseon_rtsp_frames_sent_total " in metrics
            assert "ruseon_rtsp_playing 1.0" in metrics
            assert 'ruseon_rtsp_requests_total{method="PLAY"} 2.0' in metrics
            assert "ruseon_rtsp_auth_failures_total 0.0" in metrics
        finally:
            await client.close()
    finally:
        await appliance.stop()


async def test_a_file_source_joins_with_the_gop_so_far_not_a_still_picture(
        tmp_path: Path) -> None:
    """A source that cannot make a keyframe on demand (a file replay): PLAY sends the GOP so
    far, as a WebRTC viewer gets it, instead of one stale keyframe and nothing until the next."""
    data = Path(__file__).resolve().parents[1] / "capture" / "data" / "cam_320x240_baseline.h264"
    rtsp_port = free_port()
    config = Config(
        cameras=(camera(source=f"file:{data}"),),
        http=HttpConfig(listen=HostPort("127.0.0.1", free_port())),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        rtsp=RtspConfig(enable=True, listen=HostPort("127.0.0.1", rtsp_port)),
    )
    appliance = Appliance(config)
    await appliance.start()
    try:
        assert appliance.rtsp is not None
        for _ in range(3):
            await asyncio.sleep(0.4)  # joins at different places in the GOP
            client = await RawClient.connect(rtsp_port)
            try:
                await client.play_tcp()
                await wait_for(lambda c=client: c.frames >= 10, what="10 frames")
                session = appliance.rtsp.sessions[client.session]
                assert client.first_nal == 7 and client.sequence_gaps == 0
                assert session.cursor is not None
                assert session.cursor.join_mode != "keyframe-then-live"
                assert session.frames_skipped == 0
            finally:
                await client.close()
    finally:
        await appliance.stop()


async def test_rtsp_is_off_unless_enabled(tmp_path: Path) -> None:
    config = Config(
        cameras=(camera(),),
        http=HttpConfig(listen=HostPort("127.0.0.1", free_port())),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
    )
    appliance = Appliance(config)
    await appliance.start()
    try:
        assert appliance.rtsp is None
    finally:
        await appliance.stop()
