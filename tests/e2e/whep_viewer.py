"""A minimal WHEP viewer for the container tests: real aiortc, real decoding, loopback only."""

from __future__ import annotations

import asyncio

import aiohttp
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription


class WhepRefused(Exception):
    """The endpoint answered the offer with something other than 201."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"WHEP POST answered {status}: {body[:200]}")
        self.status = status


async def watch(
    base_url: str, *, frames: int = 5, timeout: float = 30, token: str = ""
) -> tuple[int, int, str]:
    """POST an offer to ``base_url/whep``, decode ``frames`` frames, DELETE the session.

    Returns (width, height, session path). The caller makes aioice gather 127.0.0.1 only.
    """
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    headers = {"Content-Type": "application/sdp"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        pc.addTransceiver("video", direction="recvonly")
        got_track: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        def on_track(track: object) -> None:
            if not got_track.done():
                got_track.set_result(track)

        pc.on("track", on_track)
        await pc.setLocalDescription(await pc.createOffer())
        async with aiohttp.ClientSession() as http:
            async with http.post(
                base_url + "/whep", data=pc.localDescription.sdp, headers=headers
            ) as response:
                if response.status != 201:
                    raise WhepRefused(response.status, await response.text())
                answer = await response.text()
                location = response.headers["Location"]
            await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            track = await asyncio.wait_for(got_track, timeout)
            size = (0, 0)
            for _ in range(frames):
                frame = await asyncio.wait_for(track.recv(), timeout)  # type: ignore[attr-defined]
                size = (frame.width, frame.height)
            async with http.delete(base_url + location, headers=headers) as response:
                assert response.status == 200, response.status
        return size[0], size[1], location
    finally:
        await pc.close()
