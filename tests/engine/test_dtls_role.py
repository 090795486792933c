"""The engine's DTLS role: the server (``a=setup:passive``) wherever the viewer's offer leaves the
choice (``actpass``: browsers and aiortc), so it is connected on the viewer's second flight instead
of waiting for the viewer's last one; an offer that fixes its role (``active``, ``passive``) gets
the opposite one. Every case: a real aiortc viewer over real UDP connects and decodes every frame
the camera made, without a decode error, on both send paths. And DTLS starts as soon as ICE
completes (not at aioice's next check tick).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.engine import Engine, aiortc_internals
from tests.engine.conftest import wait_for, webrtc_config
from tests.engine.test_aiortc_internals import endless_connect_pacing, stop_tidying
from tests.engine.test_fanout import CameraLog, DecodeErrors, StampedViewer, decode_errors, gaps

__all__ = ["decode_errors"]  # the fixture, used by name


@pytest.mark.parametrize(("send_path", "offered", "answered", "engine_role"), [
    ("fanout", "actpass", "passive", "server"),
    ("aiortc", "actpass", "passive", "server"),
    ("fanout", "active", "passive", "server"),
    ("fanout", "passive", "active", "client"),
])
async def test_engine_takes_the_dtls_role_the_offer_leaves_and_every_frame_decodes(
        feed: CapturePipeline, tmp_path: Path, decode_errors: DecodeErrors, send_path: str,
        offered: str, answered: str, engine_role: str) -> None:
    engine = Engine(webrtc_config(send_path=send_path), tmp_path / "state", feed)
    await engine.start()
    camera = CameraLog(feed)
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    viewer = StampedViewer(pc)
    try:
        pc.addTransceiver("video", direction="recvonly")

        def on_track(track: Any) -> None:
            viewer.task = asyncio.ensure_future(viewer.consume(track))

        pc.on("track", on_track)
        await pc.setLocalDescription(await pc.createOffer())
        offer = pc.localDescription.sdp
        assert "a=setup:actpass" in offer
        session, answer = await engine.offer(offer.replace("a=setup:actpass",
                                                           f"a=setup:{offered}"))
        assert re.findall(r"^a=setup:(\w+)", answer, re.M) == [answered]
        # aiortc's offerer takes the role opposite to the answer's, whatever it offered.
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await wait_for(lambda: len(viewer.frames) >= 30, timeout=40)
        (dtls,) = aiortc_internals.dtls_transports_of(session.pc)
        assert dtls._role == engine_role
        assert pc.getTransceivers()[0].receiver.transport._role != engine_role
        # From the 5th picture on (the aiortc send path's first is an older keyframe).
        assert gaps(viewer, camera, start=5) == [], gaps(viewer, camera, start=5)[:5]
        assert decode_errors.count == 0
        assert session.state == "connected" and session.srtp_profile is not None
        assert session.stats()["dtls_role"] == engine_role
    finally:
        await viewer.close()
        camera.close()
        await engine.stop()


async def test_engine_starts_dtls_as_soon_as_ice_completes(
        engine: Engine, decode_errors: DecodeErrors) -> None:
    """The engine's ICE connection returns from connect() at completion, not at aioice's next
    20 ms pacing tick (``aiortc_internals.connect_promptly``, hooked before aiortc's connect task
    can start): with that tick made endless a viewer (hooked the same way) still connects and
    decodes. Unhooked, or hooked after ``setLocalDescription`` (too late: aiortc's connect task
    runs while it awaits), the engine's connect() would never return."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    viewer = StampedViewer(pc)
    with endless_connect_pacing():
        try:
            pc.addTransceiver("video", direction="recvonly")

            def on_track(track: Any) -> None:
                viewer.task = asyncio.ensure_future(viewer.consume(track))

            pc.on("track", on_track)
            await pc.setLocalDescription(await pc.createOffer())
            (client_ice,) = aiortc_internals.ice_connection_of(pc)
            aiortc_internals.connect_promptly(client_ice)
            session, answer = await engine.offer(pc.localDescription.sdp)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            await wait_for(lambda: session.state == "connected", timeout=30)
            await wait_for(lambda: len(viewer.frames) >= 10, timeout=30)
            assert decode_errors.count == 0
        finally:
            await viewer.close()
            await stop_tidying()
