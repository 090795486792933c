"""Real aiortc client peers against one engine over real UDP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from aiortc.sdp import SessionDescription

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.engine import Engine, aiortc_internals
from tests.engine.conftest import (
    RecordingDecoder,
    Viewer,
    connect_viewer,
    wait_for,
    webrtc_config,
)

SPS, PPS, IDR = 7, 8, 5


def answer_fingerprint(answer: str) -> str:
    match = re.search(r"^a=fingerprint:(sha-256 \S+)", answer, re.M)
    assert match, answer
    return match.group(1)


async def test_ten_viewers_at_once_share_one_port_and_certificate(engine: Engine) -> None:
    viewers = await asyncio.gather(*(connect_viewer(engine) for _ in range(10)))
    try:
        await wait_for(lambda: all(v.frames >= 5 for v in viewers), timeout=40)

        # One host candidate per advertised address (here one), all on the mux port.
        for v in viewers:
            media = SessionDescription.parse(v.answer).media
            candidates = [c for m in media for c in m.ice_candidates]
            assert [(c.ip, c.port, c.type) for c in candidates] == [
                ("127.0.0.1", engine.udp_port, "host")]

        # Every pair the clients nominated points at the single server port.
        for v in viewers:
            (conn,) = aiortc_internals.ice_connection_of(v.pc)
            pairs = aiortc_internals.nominated_addresses(conn)
            assert pairs and all(remote == ("127.0.0.1", engine.udp_port) for _, remote in pairs)

        # Same certificate for everyone: the engine's.
        assert {answer_fingerprint(v.answer) for v in viewers} == {engine.fingerprint}

        # Each client's decoder was first fed a keyframe carrying SPS and PPS.
        assert len(RecordingDecoder.instances) == 10
        for decoder in RecordingDecoder.instances:
            first = decoder.first_nal_types or []
            assert SPS in first and PPS in first and IDR in first, first
            assert decoder.decoded >= 5

        stats = engine.stats()
        assert stats["sessions_connected"] == 10
        assert stats["mux"]["routes"] == 10
        assert stats["mux"]["sessions"] == 10
        for session in engine.sessions.values():
            s = session.stats()
            assert s["packets_sent"] > 0 and s["bytes_sent"] > 0 and s["frames_sent"] >= 5
    finally:
        await asyncio.gather(*(v.close() for v in viewers))


async def test_delete_releases_routes_and_ring_cursor(
        engine: Engine, feed: CapturePipeline) -> None:
    readers_before = feed.ring.stats()["readers"]
    v = await connect_viewer(engine)
    await wait_for(lambda: v.frames >= 3)
    session = engine.sessions[v.session_id]
    assert engine.mux.routes_for(session.ufrag)
    assert feed.ring.stats()["readers"] == readers_before + 1
    ended: list[str] = []
    engine.add_listener(lambda event, s: ended.append(f"{event}:{s.end_reason}"))

    assert await engine.close(v.session_id)
    assert v.session_id not in engine.sessions
    assert not engine.mux.is_live(session.ufrag)
    assert engine.mux.route_count == 0
    assert feed.ring.stats()["readers"] == readers_before
    assert ended == ["session-ended:delete"]
    assert not await engine.close(v.session_id)
    await v.close()


async def test_vanished_viewer_is_reaped_by_consent_others_unaffected(engine: Engine) -> None:
    previous = aiortc_internals.set_consent_timing(0.3, 3)
    try:
        stay = await connect_viewer(engine)
        gone = await connect_viewer(engine)
        await wait_for(lambda: stay.frames >= 3 and gone.frames >= 3)
        gone_session = engine.sessions[gone.session_id]
        # The client's sockets close without DTLS close_notify or anything else being sent.
        (conn,) = aiortc_internals.ice_connection_of(gone.pc)
        aiortc_internals.close_sockets_silently(conn)

        await wait_for(lambda: gone.session_id not in engine.sessions, timeout=20)
        assert gone_session.end_reason == "consent-expired"
        assert engine.mux.routes_for(gone_session.ufrag) == set()
        assert not engine.mux.is_live(gone_session.ufrag)

        frames = stay.frames
        await wait_for(lambda: stay.frames >= frames + 10)
        assert engine.sessions[stay.session_id].state == "connected"
        assert engine.stats()["sessions_ended"] == {"consent-expired": 1}
        await stay.close()
        await gone.close()
    finally:
        aiortc_internals.set_consent_timing(*previous)


async def test_peer_closing_ends_session(engine: Engine) -> None:
    v = await connect_viewer(engine)
    await wait_for(lambda: v.frames >= 3)
    session = engine.sessions[v.session_id]
    await v.close()
    await wait_for(lambda: v.session_id not in engine.sessions)
    assert session.end_reason in ("peer-closed", "consent-expired")
    assert engine.mux.route_count == 0


async def test_session_that_never_connects_is_reaped(feed: CapturePipeline, tmp_path: Path) -> None:
    engine = Engine(webrtc_config(connect_timeout_s=0.5), tmp_path / "state", feed)
    await engine.start()
    try:
        from tests.engine.conftest import make_offer

        pc, offer = await make_offer()
        session, _answer = await engine.offer(offer)  # the answer is never applied
        await wait_for(lambda: session.id not in engine.sessions, timeout=10)
        assert session.end_reason == "connect-timeout"
        assert engine.mux.stats()["sessions"] == 0
        await pc.close()
    finally:
        await engine.stop()


async def test_five_simultaneous_plis_force_exactly_one_idr(engine: Engine,
                                                             feed: CapturePipeline) -> None:
    viewers = await asyncio.gather(*(connect_viewer(engine) for _ in range(5)))
    try:
        await wait_for(lambda: all(v.frames >= 3 for v in viewers))
        await asyncio.sleep(0.7)  # past the coalescing window of any join-time request
        forced_before = feed.stats()["keyframes_forced"]
        plis_before = engine.stats()["keyframe_requests"].get("pli/fir", 0)

        async def pli(v: Viewer) -> None:
            ssrc = int(re.search(r"^a=ssrc:(\d+)", v.answer, re.M).group(1))  # type: ignore[union-attr]
            receiver = v.pc.getTransceivers()[0].receiver
            await aiortc_internals.send_pli(receiver, ssrc)

        await asyncio.gather(*(pli(v) for v in viewers))
        await wait_for(
            lambda: engine.stats()["keyframe_requests"].get("pli/fir", 0) - plis_before == 5)
        await asyncio.sleep(0.2)
        assert feed.stats()["keyframes_forced"] - forced_before == 1
        assert sum(s.keyframes_forced for s in engine.sessions.values()) >= 1
    finally:
        await asyncio.gather(*(v.close() for v in viewers))


async def test_audio_first_bundle_offer_is_answered_on_one_transport(engine: Engine) -> None:
    v = await connect_viewer(engine, audio_first=True)
    try:
        await wait_for(lambda: v.frames >= 3)
        media = SessionDescription.parse(v.answer).media
        assert [m.kind for m in media] == ["audio", "video"]
        assert all(m.port == engine.udp_port for m in media)
        assert media[1].direction == "sendonly"
    finally:
        await v.close()


async def test_fingerprint_survives_restart(feed: CapturePipeline, tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = Engine(webrtc_config(), state, feed)
    await first.start()
    fingerprint = first.fingerprint
    await first.stop()
    second = Engine(webrtc_config(), state, feed)
    await second.start()
    try:
        assert second.fingerprint == fingerprint
        v = await connect_viewer(second)
        await wait_for(lambda: v.frames >= 3)
        assert answer_fingerprint(v.answer) == fingerprint
        await v.close()
    finally:
        await second.stop()


async def test_shutdown_closes_sessions_then_socket(feed: CapturePipeline, tmp_path: Path) -> None:
    engine = Engine(webrtc_config(), tmp_path / "state", feed)
    await engine.start()
    viewers = [await connect_viewer(engine) for _ in range(2)]
    await wait_for(lambda: all(v.frames >= 2 for v in viewers))
    sessions = list(engine.sessions.values())
    await engine.stop()
    assert not engine.sessions
    assert all(s.end_reason == "shutdown" for s in sessions)
    assert engine.mux.families == []
    for v in viewers:
        await v.close()
