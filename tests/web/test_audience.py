"""``/api/status`` ``viewers.by_transport``: everyone watching, counted by how (WebRTC, HLS, RTSP,
relays), in what a viewer may see (counts only: no address, session id or relay target), so
the page's "Viewers" can say it in every mode."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import aiohttp

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    RelayConfig,
    RtspConfig,
    StateConfig,
    WebRtcConfig,
)
from tests.rtsp.conftest import RawClient, camera, wait_for
from tests.tooling import free_port
from tests.web.conftest import Viewer, admin_of
from tests.web.test_whep import SDP


async def test_status_counts_webrtc_hls_rtsp_and_relay_viewers_for_anyone(tmp_path: Path) -> None:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the relay's media server
    sink.bind(("127.0.0.1", 0))
    http_port, rtsp_port = free_port(), free_port()
    relay_url = f"rtp://127.0.0.1:{sink.getsockname()[1]}"
    config = Config(
        cameras=(camera(name="front"),),
        http=HttpConfig(listen=HostPort("127.0.0.1", http_port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        hls=HlsConfig(part_duration_s=0.5, window_s=6.0),
        rtsp=RtspConfig(enable=True, listen=HostPort("127.0.0.1", rtsp_port)),
        relay=(RelayConfig(name="janus", url=relay_url),),
    )
    appliance = Appliance(config)
    await appliance.start()
    base = f"http://127.0.0.1:{http_port}"
    viewer = Viewer()
    rtsp: RawClient | None = None
    try:
        async with aiohttp.ClientSession() as http:
            async def stranger() -> dict[str, Any]:
                async with http.get(base + "/api/status") as response:
                    assert response.status == 200
                    document: dict[str, Any] = await response.json()
                    return document

            # Nobody but the relay (sending as soon as the camera has frames).
            await wait_for(lambda: appliance_relay_sending(appliance))
            alone = await stranger()
            assert alone["viewers"] == {"count": 0, "by_transport": {
                "webrtc": 0, "hls": 0, "rtsp": 0, "relays": 1}}, alone["viewers"]

            async with http.post(base + "/whep", data=await viewer.offer(),
                                 headers=SDP) as response:
                assert response.status == 201, await response.text()
                session_id = response.headers["Location"].rsplit("/", 1)[1]
            async with http.get(base + "/hls/index.m3u8",
                                headers={"User-Agent": "an HLS player"}) as response:
                assert response.status == 200
            rtsp = await RawClient.connect(rtsp_port, "front")
            await rtsp.play_tcp()
            await wait_for(lambda: rtsp is not None and rtsp.frames > 0)

            everyone = await stranger()
            assert everyone["viewers"] == {"count": 1, "by_transport": {
                "webrtc": 1, "hls": 1, "rtsp": 1, "relays": 1}}, everyone["viewers"]
            text = repr(everyone)
            assert session_id not in text and relay_url not in text and "rtsp" not in everyone
            assert "relays" not in everyone
            # The admin reads the same counts beside the details.
            async with http.get(base + "/api/status", headers=admin_of(appliance)) as response:
                admin = await response.json()
            assert admin["viewers"]["by_transport"] == everyone["viewers"]["by_transport"]
            assert admin["rtsp"]["playing"] == 1 and admin["relays"][0]["state"] == "sending"

            # The RTSP client leaves: it no longer counts.
            await rtsp.close()
            rtsp = None

            async def rtsp_gone() -> bool:
                return (await stranger())["viewers"]["by_transport"]["rtsp"] == 0
            await wait_until(rtsp_gone)
    finally:
        if rtsp is not None:
            await rtsp.close()
        await viewer.close()
        await appliance.stop()
        sink.close()


def appliance_relay_sending(appliance: Appliance) -> bool:
    return all(relay.state == "sending" for relay in appliance.relays)


async def wait_until(condition: Any, timeout: float = 30.0) -> None:
    """Await ``condition()`` until it is true; the timeout only bounds a broken run."""
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.1)
