"""A real aiortc WHEP viewer that asks for picture and sound (``POST /whep/<camera>``) and keeps
what it decodes: for the audio tests through the running appliance."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription


class WhepPeer:
    """``video``: the decoded pictures' pts; ``sound``: the decoded sound's first channel,
    one int16 array per frame; ``audio_pts``: those frames' pts."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.addTransceiver("video", direction="recvonly")
        self.pc.addTransceiver("audio", direction="recvonly")
        self.video: list[int] = []
        self.sound: list[Any] = []
        self.audio_pts: list[int] = []
        self.answer = ""
        self._tasks: list[asyncio.Task[None]] = []
        self.pc.on("track", lambda track: self._tasks.append(
            asyncio.ensure_future(self._consume(track))))

    async def _consume(self, track: Any) -> None:
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            if track.kind == "video":
                self.video.append(frame.pts)
            else:
                self.audio_pts.append(frame.pts)
                self.sound.append(
                    frame.to_ndarray().reshape(-1, len(frame.layout.channels))[:, 0])

    async def connect(self, base: str, camera: str) -> None:
        """Offer to the appliance at ``base``; a 201 with Opus in its answer, applied."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with aiohttp.ClientSession() as http, http.post(
                f"{base}/whep/{camera}", data=self.pc.localDescription.sdp,
                headers={"Content-Type": "application/sdp"}) as response:
            self.answer = await response.text()
            assert response.status == 201, (response.status, self.answer)
        assert "m=audio" in self.answer and "opus/48000" in self.answer.lower()
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=self.answer, type="answer"))

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
