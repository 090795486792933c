"""The sound's controls and figures, on a real in-process appliance with synthetic cameras
(their test tone), from the admin's side and a stranger's."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from tests.web.test_access import CREDENTIALS, full_appliance

pytestmark = pytest.mark.timeout(120)
ADMIN = CREDENTIALS["admin"]


async def wait_for_level(http: aiohttp.ClientSession, url: str, *, loud: bool) -> dict:
    """Poll until the level says sound (or silence); liveness, not a time bound."""
    for _ in range(200):
        async with http.get(url, headers=ADMIN) as response:
            assert response.status == 200
            body = await response.json()
        if (body["level_dbfs"] > -60) == loud:
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"the level never became {'sound' if loud else 'silence'}: {body}")


async def test_mute_and_gain_apply_live_and_bad_input_is_a_4xx_with_a_reason(
        tmp_path: Path) -> None:
    async with full_appliance(tmp_path, "open") as (_app, base), aiohttp.ClientSession() as http:
        url = base + "/api/camera/side/audio"
        body = await wait_for_level(http, url, loud=True)
        assert body["source"] == "tone" and body["muted"] is False and body["running"] is True
        async with http.patch(url, json={"muted": True}, headers=ADMIN) as response:
            assert response.status == 200 and (await response.json())["muted"] is True
        await wait_for_level(http, url, loud=False)
        async with http.patch(url, json={"muted": False, "gain_db": -12}, headers=ADMIN) as r:
            assert (await r.json())["gain_db"] == -12.0
        await wait_for_level(http, url, loud=True)
        # The default camera's unnamed route is the first camera's.
        async with http.get(base + "/api/camera/audio", headers=ADMIN) as response:
            assert (await response.json())["gain_db"] == 0.0
        for payload, status, words in (
                ({"gain_db": 31}, 422, "-60 to 30"), ({"gain_db": "loud"}, 422, "number"),
                ({"gain_db": True}, 422, "number"), ({"muted": "yes"}, 422, "true or false"),
                ({"volume": 1}, 422, "unknown setting volume"), ({}, 422, "expected")):
            async with http.patch(url, json=payload, headers=ADMIN) as response:
                assert response.status == status, payload
                assert words in (await response.json())["detail"], payload
        async with http.patch(url, data=b"{nope", headers={
                **ADMIN, "Content-Type": "application/json"}) as response:
            assert response.status == 400 and "JSON" in (await response.json())["detail"]
        async with http.patch(url, data=b"muted=1", headers={
                **ADMIN, "Content-Type": "text/plain"}) as response:
            assert response.status == 415
        # Nothing of the bad requests applied.
        async with http.get(url, headers=ADMIN) as response:
            assert (await response.json())["gain_db"] == -12.0
        # A stranger and a viewer can neither read nor change it.
        for who in ("none", "viewer"):
            async with http.patch(url, json={"muted": True}, headers=CREDENTIALS[who]) as r:
                assert r.status in (401, 403), who
        async with http.get(url, headers=ADMIN) as response:
            assert (await response.json())["muted"] is False


async def test_status_and_metrics_show_each_cameras_sound(tmp_path: Path) -> None:
    async with full_appliance(tmp_path, "open") as (app, base), aiohttp.ClientSession() as http:
        for name in ("front", "side"):
            await wait_for_level(http, base + f"/api/camera/{name}/audio", loud=True)
        async with http.get(base + "/api/status", headers=ADMIN) as response:
            status = await response.json()
        # No viewer and no RTSP client: no Opus is made; HLS and the continuous recording
        # read the AAC.
        for camera in status["cameras"]:
            assert camera["audio"]["opus"]["encoding"] is False, camera["audio"]
            assert camera["audio"]["aac"]["encoding"] is True, camera["audio"]
        # A reader of the Opus (what a viewer or an RTSP client opens).
        readers = [camera.audio.opus_ring.reader("next") for camera in app.cameras]
        await asyncio.sleep(0.3)  # an AAC frame is 21 ms: some are out
        async with http.get(base + "/api/status", headers=ADMIN) as response:
            status = await response.json()
        cams = {c["name"]: c for c in status["cameras"]}
        for name in ("front", "side"):
            audio = cams[name]["audio"]
            assert audio["enabled"] is True and audio["source"] == "tone"
            assert audio["opus"]["packets"] > 0 and audio["aac"]["packets"] > 0
            assert audio["opus"]["encoding"] and audio["aac"]["encoding"]
        async with http.get(base + "/metrics", headers=ADMIN) as response:
            text = await response.text()
        for name in ("front", "side"):
            for codec in ("opus", "aac"):
                match = re.search(rf'ruseon_audio_packets_total\{{camera="{name}",'
                                  rf'codec="{codec}"\}} (\S+)', text)
                assert match and float(match.group(1)) > 0, (name, codec)
        assert re.search(r'ruseon_audio_up\{camera="side"\} 1', text)
        for reader in readers:
            reader.close()


async def audio_direction(http: aiohttp.ClientSession, url: str, *, audio: bool = True) -> str:
    """POST a real aiortc recvonly offer to ``url``; the answer's audio direction ("" if the
    answer has no audio section)."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("video", direction="recvonly")
        if audio:
            pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        async with http.post(url, data=pc.localDescription.sdp,
                             headers={"Content-Type": "application/sdp"}) as response:
            assert response.status == 201, await response.text()
            answer = await response.text()
            location = response.headers["Location"]
        async with http.delete(url.split("/whep")[0] + location) as response:
            assert response.status in (200, 204)
    finally:
        await pc.close()
    if "m=audio" not in answer:
        return ""
    section = answer[answer.index("m=audio"):]
    if "\nm=" in section:
        section = section[:section.index("\nm=")]
    return next(line[2:] for line in section.splitlines()
                if line in ("a=sendonly", "a=inactive", "a=recvonly", "a=sendrecv"))


async def test_whep_answers_each_cameras_sound_on_every_stream(tmp_path: Path) -> None:
    async with full_appliance(tmp_path, "open") as (app, base), aiohttp.ClientSession() as http:
        # The default camera, a named one, and the default camera's sub-stream: the camera's
        # sound with each (a stranger may watch: viewing is open).
        for path in ("/whep", "/whep/side", "/whep/front/sub", "/whep?stream=sub"):
            assert await audio_direction(http, base + path) == "sendonly", path
        assert await audio_direction(http, base + "/whep/side", audio=False) == ""
        # A camera turned silent: its viewers' audio is answered inactive, never refused.
        side = app.cameras.get("side")
        assert side is not None and side.audio is not None
        kept, side.audio = side.audio, None
        try:
            assert await audio_direction(http, base + "/whep/side") == "inactive"
        finally:
            side.audio = kept
