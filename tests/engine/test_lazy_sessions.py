"""Lazy sessions (issue 31): the first offer of a shape is answered by aiortc and teaches the
engine that shape's answer template; later offers of the shape are answered from the template
with no aiortc object built, until the viewer's first valid STUN check, when the engine builds
the connection with the values the answer promised and checks that aiortc's own answer is the
one that was sent."""

from __future__ import annotations

import asyncio
import re
import secrets
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aioice import stun
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription

from ruseon_appliance.audio.pipeline import AudioPipeline
from ruseon_appliance.audio.sources.tone import ToneSource
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.engine import Engine, aiortc_internals
from ruseon_appliance.engine.answer_template import (
    AnswerTemplate,
    Identities,
    offer_shape,
    same_answer,
)
from tests.engine.conftest import Viewer, connect_viewer, make_offer, wait_for, webrtc_config
from tests.web.test_whep_fuzz import CHROMIUM_OFFER

pytestmark = pytest.mark.timeout(120)


def _lines(*lines: str) -> str:
    return "\r\n".join([*lines, ""])


_FINGERPRINT = ("a=fingerprint:sha-256 0F:74:31:25:CB:A2:13:EC:28:6F:6D:2C:61:FF:5D:C2:BC:B9:"
                "DB:3D:98:14:8D:1A:BB:EA:33:0C:A4:60:A8:8E")

# Chromium 12x, the device page with sound: recvonly audio and video, BUNDLEd, after gathering
# (a real port and address in m=/c=, then a=candidate lines).
CHROMIUM_AV_OFFER = _lines(
    "v=0", "o=- 7321190315186305563 2 IN IP4 127.0.0.1", "s=-", "t=0 0",
    "a=group:BUNDLE 0 1", "a=extmap-allow-mixed", "a=msid-semantic: WMS",
    "m=audio 50123 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126",
    "c=IN IP4 192.0.2.10", "a=rtcp:9 IN IP4 0.0.0.0",
    "a=candidate:1 1 udp 2122260223 192.0.2.10 50123 typ host generation 0",
    "a=ice-ufrag:Ab3d", "a=ice-pwd:QwErTyUiOpAsDfGhJkLzXcVb", "a=ice-options:trickle",
    _FINGERPRINT, "a=setup:actpass", "a=mid:0",
    "a=extmap:1 urn:ietf:params:rtp-hdrext:ssrc-audio-level",
    "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid",
    "a=recvonly", "a=rtcp-mux",
    "a=rtpmap:111 opus/48000/2", "a=rtcp-fb:111 transport-cc",
    "a=fmtp:111 minptime=10;useinbandfec=1",
    "a=rtpmap:63 red/48000/2", "a=fmtp:63 111/111",
    "a=rtpmap:9 G722/8000", "a=rtpmap:0 PCMU/8000", "a=rtpmap:8 PCMA/8000",
    "a=rtpmap:13 CN/8000", "a=rtpmap:110 telephone-event/48000",
    "a=rtpmap:126 telephone-event/8000",
    "m=video 50123 UDP/TLS/RTP/SAVPF 96 97 102 103 106 107 35 36",
    "c=IN IP4 192.0.2.10", "a=rtcp:9 IN IP4 0.0.0.0",
    "a=ice-ufrag:Ab3d", "a=ice-pwd:QwErTyUiOpAsDfGhJkLzXcVb", "a=ice-options:trickle",
    _FINGERPRINT, "a=setup:actpass", "a=mid:1",
    "a=extmap:14 urn:ietf:params:rtp-hdrext:toffset",
    "a=extmap:2 http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time",
    "a=extmap:3 http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01",
    "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid",
    "a=recvonly", "a=rtcp-mux", "a=rtcp-rsize",
    "a=rtpmap:96 VP8/90000", "a=rtcp-fb:96 goog-remb", "a=rtcp-fb:96 transport-cc",
    "a=rtcp-fb:96 ccm fir", "a=rtcp-fb:96 nack", "a=rtcp-fb:96 nack pli",
    "a=rtpmap:97 rtx/90000", "a=fmtp:97 apt=96",
    "a=rtpmap:102 H264/90000", "a=rtcp-fb:102 goog-remb", "a=rtcp-fb:102 transport-cc",
    "a=rtcp-fb:102 ccm fir", "a=rtcp-fb:102 nack", "a=rtcp-fb:102 nack pli",
    "a=fmtp:102 level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42001f",
    "a=rtpmap:103 rtx/90000", "a=fmtp:103 apt=102",
    "a=rtpmap:106 H264/90000", "a=rtcp-fb:106 goog-remb", "a=rtcp-fb:106 transport-cc",
    "a=rtcp-fb:106 ccm fir", "a=rtcp-fb:106 nack", "a=rtcp-fb:106 nack pli",
    "a=fmtp:106 level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f",
    "a=rtpmap:107 rtx/90000", "a=fmtp:107 apt=106",
    "a=rtpmap:35 H264/90000",
    "a=fmtp:35 level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=4d001f",
    "a=rtpmap:36 rtx/90000", "a=fmtp:36 apt=35",
)

# Firefox 12x, the device page with sound: the fingerprint at session level, credentials at
# media level, an a=ssrc line (its RTCP sender) in each recvonly section.
FIREFOX_AV_OFFER = _lines(
    "v=0", "o=mozilla...THIS_IS_SDPARTA-99.0 5521349165539420327 0 IN IP4 0.0.0.0",
    "s=-", "t=0 0", _FINGERPRINT, "a=group:BUNDLE 0 1", "a=ice-options:trickle",
    "a=msid-semantic:WMS *",
    "m=video 9 UDP/TLS/RTP/SAVPF 120 124 121 125 126 127 97 98 105 106",
    "c=IN IP4 0.0.0.0", "a=recvonly",
    "a=extmap:3 urn:ietf:params:rtp-hdrext:sdes:mid",
    "a=extmap:4 http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time",
    "a=extmap:5 urn:ietf:params:rtp-hdrext:toffset",
    "a=extmap:6/recvonly http://www.webrtc.org/experiments/rtp-hdrext/playout-delay",
    "a=extmap:7 http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01",
    "a=fmtp:126 profile-level-id=42e01f;level-asymmetry-allowed=1;packetization-mode=1",
    "a=fmtp:97 profile-level-id=42e01f;level-asymmetry-allowed=1",
    "a=fmtp:120 max-fs=12288;max-fr=60", "a=fmtp:124 apt=120",
    "a=fmtp:121 max-fs=12288;max-fr=60", "a=fmtp:125 apt=121", "a=fmtp:127 apt=126",
    "a=fmtp:98 apt=97",
    "a=fmtp:105 profile-level-id=42001f;level-asymmetry-allowed=1;packetization-mode=1",
    "a=fmtp:106 apt=105",
    "a=ice-pwd:8b1f0e6c7a2d4f3e9c5b6a7d8e9f0a1b", "a=ice-ufrag:5f3a9c1e",
    "a=mid:0",
    "a=rtcp-fb:120 nack", "a=rtcp-fb:120 nack pli", "a=rtcp-fb:120 ccm fir",
    "a=rtcp-fb:120 goog-remb", "a=rtcp-fb:120 transport-cc",
    "a=rtcp-fb:121 nack", "a=rtcp-fb:121 nack pli", "a=rtcp-fb:121 ccm fir",
    "a=rtcp-fb:121 goog-remb", "a=rtcp-fb:121 transport-cc",
    "a=rtcp-fb:126 nack", "a=rtcp-fb:126 nack pli", "a=rtcp-fb:126 ccm fir",
    "a=rtcp-fb:126 goog-remb", "a=rtcp-fb:126 transport-cc",
    "a=rtcp-fb:97 nack", "a=rtcp-fb:97 nack pli", "a=rtcp-fb:97 ccm fir",
    "a=rtcp-fb:97 goog-remb", "a=rtcp-fb:97 transport-cc",
    "a=rtcp-fb:105 nack", "a=rtcp-fb:105 nack pli", "a=rtcp-fb:105 ccm fir",
    "a=rtcp-fb:105 goog-remb", "a=rtcp-fb:105 transport-cc",
    "a=rtcp-mux", "a=rtcp-rsize",
    "a=rtpmap:120 VP8/90000", "a=rtpmap:124 rtx/90000", "a=rtpmap:121 VP9/90000",
    "a=rtpmap:125 rtx/90000", "a=rtpmap:126 H264/90000", "a=rtpmap:127 rtx/90000",
    "a=rtpmap:97 H264/90000", "a=rtpmap:98 rtx/90000", "a=rtpmap:105 H264/90000",
    "a=rtpmap:106 rtx/90000",
    "a=setup:actpass", "a=ssrc:2245484342 cname:{6c0f4b1e-2d3a-4b5c-8d9e-0f1a2b3c4d5e}",
    "m=audio 9 UDP/TLS/RTP/SAVPF 109 9 0 8 101",
    "c=IN IP4 0.0.0.0", "a=recvonly",
    "a=extmap:1 urn:ietf:params:rtp-hdrext:ssrc-audio-level",
    "a=extmap:2/recvonly urn:ietf:params:rtp-hdrext:csrc-audio-level",
    "a=extmap:3 urn:ietf:params:rtp-hdrext:sdes:mid",
    "a=fmtp:109 maxplaybackrate=48000;stereo=1;useinbandfec=1",
    "a=fmtp:101 0-15",
    "a=ice-pwd:8b1f0e6c7a2d4f3e9c5b6a7d8e9f0a1b", "a=ice-ufrag:5f3a9c1e",
    "a=mid:1", "a=rtcp-mux",
    "a=rtpmap:109 opus/48000/2", "a=rtpmap:9 G722/8000/1", "a=rtpmap:0 PCMU/8000",
    "a=rtpmap:8 PCMA/8000", "a=rtpmap:101 telephone-event/8000",
    "a=setup:actpass", "a=ssrc:3418402374 cname:{6c0f4b1e-2d3a-4b5c-8d9e-0f1a2b3c4d5e}",
)


def another_offerer(offer: str) -> str:
    """The same browser's offer from another page load: new ICE credentials, fingerprint,
    origin, SSRCs, cname, port and address; the same shape."""
    ufrag, pwd = secrets.token_hex(4), secrets.token_hex(16)
    fingerprint = ":".join(f"{b:02X}" for b in secrets.token_bytes(32))
    cname = secrets.token_hex(8)
    port = 40000 + secrets.randbelow(20000)

    def line(text: str) -> str:
        if text.startswith("a=ice-ufrag:"):
            return "a=ice-ufrag:" + ufrag
        if text.startswith("a=ice-pwd:"):
            return "a=ice-pwd:" + pwd
        if text.startswith("a=fingerprint:"):
            return "a=fingerprint:sha-256 " + fingerprint
        if text.startswith("o="):
            head, _sid, rest = text.split(" ", 2)
            return f"{head} {secrets.randbelow(10**18)} {rest}"
        if text.startswith("a=ssrc:"):
            return f"a=ssrc:{secrets.randbelow(2**32)} cname:{cname}"
        if text.startswith("c=IN IP4 192."):
            return "c=IN IP4 192.0.2.77"
        if text.startswith("m=") and " 9 " not in text:
            kind, _, rest = text.partition(" ")
            return f"{kind} {port} {rest.partition(' ')[2]}"
        return text

    changed = "\r\n".join(line(t) for t in offer.split("\r\n"))
    assert changed != offer
    return changed


def ice_credentials(sdp: str) -> tuple[str, str]:
    ufrag = re.search(r"^a=ice-ufrag:(\S+)", sdp, re.M)
    pwd = re.search(r"^a=ice-pwd:(\S+)", sdp, re.M)
    assert ufrag and pwd
    return ufrag.group(1), pwd.group(1)


def binding_request(answer: str, offer: str, password: str | None = None) -> bytes:
    """The offerer's ICE check for the answer's credentials (controlling, nominating)."""
    ufrag, pwd = ice_credentials(answer)
    remote_ufrag, _ = ice_credentials(offer)
    message = stun.Message(message_method=stun.Method.BINDING,
                           message_class=stun.Class.REQUEST)
    message.attributes["USERNAME"] = f"{ufrag}:{remote_ufrag}"
    message.attributes["PRIORITY"] = 1853824767
    message.attributes["ICE-CONTROLLING"] = secrets.randbits(64)
    message.attributes["USE-CANDIDATE"] = None
    message.add_message_integrity((password or pwd).encode())
    message.add_fingerprint()
    return bytes(message)


async def stun_response(sock: socket.socket, timeout: float = 10.0) -> stun.Message:
    """The next STUN message the engine sends ``sock`` (the loop keeps running meanwhile)."""
    loop = asyncio.get_running_loop()
    data, _ = await asyncio.wait_for(loop.sock_recvfrom(sock, 2048), timeout)
    return stun.parse_message(data)


@pytest.fixture
async def audio() -> AsyncIterator[AudioPipeline]:
    pipeline = AudioPipeline(ToneSource())
    await pipeline.start()
    yield pipeline
    await pipeline.stop()


@pytest.fixture
def client_socket() -> Any:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


def count_builds(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many peer connections the engine took for sessions, and how many offers aiortc
    was given (setRemoteDescription), as ``[peer connections, offers]`` (client peers only
    set answers)."""
    counts = [0, 0]
    new_peer_connection = engine._new_peer_connection

    def counted(*args: Any) -> Any:
        counts[0] += 1
        return new_peer_connection(*args)

    monkeypatch.setattr(engine, "_new_peer_connection", counted)
    original = RTCPeerConnection.setRemoteDescription

    async def set_remote(self: RTCPeerConnection, description: Any) -> None:
        counts[1] += description.type == "offer"
        await original(self, description)

    monkeypatch.setattr(RTCPeerConnection, "setRemoteDescription", set_remote)
    return counts


# --- the template -----------------------------------------------------------------------------


def test_offer_shape_leaves_out_the_offerers_own_values() -> None:
    for offer in (CHROMIUM_OFFER, CHROMIUM_AV_OFFER, FIREFOX_AV_OFFER):
        assert offer_shape(offer) == offer_shape(another_offerer(offer))
        # What the answer depends on is kept: another mid, setup, codec or direction is
        # another shape.
        for old, new in (("a=mid:0", "a=mid:v"), ("a=setup:actpass", "a=setup:active"),
                         ("a=recvonly", "a=sendrecv"), ("H264/90000", "H265/90000")):
            assert offer_shape(offer.replace(old, new)) != offer_shape(offer), old


def test_template_renders_the_learned_answer_and_refuses_ambiguous_values() -> None:
    identities = Identities.fresh(2)
    values = identities.values()
    ufrag, pwd = "ab12cd34", "0123456789abcdef01234567"
    answer = _lines(
        "v=0", "o=- 3900000000 3900000000 IN IP4 0.0.0.0", "s=-", "t=0 0",
        "a=group:BUNDLE 0", "m=video 9 UDP/TLS/RTP/SAVPF 102 103", "a=mid:0",
        f"a=msid:{values['stream']} {values['s0_track']}",
        f"a=ice-ufrag:{ufrag}", f"a=ice-pwd:{pwd}",
        f"a=ssrc-group:FID {values['s0_ssrc']} {values['s0_rtx']}",
        f"a=ssrc:{values['s0_ssrc']} cname:{identities.cname}",
        f"a=ssrc:{values['s0_rtx']} cname:{identities.cname}",
        "a=fmtp:102 packetization-mode=1;profile-level-id=42e01f;x={braces}")
    template = AnswerTemplate.learn(answer, ufrag, pwd, identities)
    assert template is not None
    assert same_answer(template.render(ufrag, pwd, identities), answer)
    other = Identities.fresh(2)
    rendered = template.render("ef56ab78", "f" * 24, other)
    assert f"a=ssrc:{other.senders[0].ssrc} cname:{other.cname}" in rendered
    assert "a=ice-ufrag:ef56ab78" in rendered and "x={braces}" in rendered
    assert not set(values.values()) & set(re.split(r"[ :\r\n]", rendered))
    # Our own value where no field may be: no template (the shape stays eager).
    leaky = answer.replace("a=mid:0", f"a=mid:{pwd}")
    assert AnswerTemplate.learn(leaky, ufrag, pwd, identities) is None


# --- browsers' offer shapes, end to end on the engine ----------------------------------------


@pytest.mark.parametrize("browser_offer", [CHROMIUM_OFFER, CHROMIUM_AV_OFFER, FIREFOX_AV_OFFER],
                         ids=["chromium-video", "chromium-av", "firefox-av"])
async def test_template_answers_are_aiortcs_answers_for_browser_offers(
        browser_offer: str, feed: CapturePipeline, audio: AudioPipeline, tmp_path: Path,
        client_socket: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(webrtc_config(), tmp_path / "state", feed)
    await engine.start()
    try:
        first, first_answer = await engine.offer(browser_offer, audio=audio)
        assert first.built and engine.stats()["lazy"]["templates"] == 1
        has_audio = "m=audio" in browser_offer
        assert ("a=rtpmap:111 opus/48000/2" in first_answer
                or "a=rtpmap:109 opus/48000/2" in first_answer) == has_audio
        counts = count_builds(engine, monkeypatch)
        offer = another_offerer(browser_offer)
        session, answer = await engine.offer(offer, audio=audio)
        assert not session.built and session.pc is None and counts == [0, 0]
        # A full answer of its own: aiortc parses it, it carries fresh credentials and ids,
        # and but for those (and the origin) it is the first viewer's answer.
        parsed = SessionDescription.parse(answer)
        assert [m.kind for m in parsed.media] == [m.kind for m in SessionDescription.parse(
            first_answer).media]
        assert ice_credentials(answer) != ice_credentials(first_answer)
        assert "{" not in answer and "}" not in answer
        strip = re.compile(r"^(a=ice-ufrag|a=ice-pwd|a=msid|a=ssrc|a=ssrc-group|o=).*$", re.M)
        assert strip.sub("", answer) == strip.sub("", first_answer)

        # The offerer's first check: the session is built, and aiortc's answer is the one sent.
        client_socket.sendto(binding_request(answer, offer), ("127.0.0.1", engine.udp_port))
        response = await stun_response(client_socket)
        assert response.message_class == stun.Class.RESPONSE
        assert counts == [1, 1] and session.built
        assert session.pc is not None and session.pc.localDescription is not None
        assert same_answer(session.pc.localDescription.sdp, answer)
        lazy = engine.stats()["lazy"]
        assert (lazy["built"], lazy["answer_mismatch"], lazy["pending"]) == (1, 0, 0)
        # What the answer promised is what the connection sends with.
        ssrcs = aiortc_internals.sender_ssrcs(session.sender)
        assert f"a=ssrc:{ssrcs[0]} " in answer and f"a=ssrc:{ssrcs[1]} " in answer
        assert (session.audio is not None) == has_audio
    finally:
        await engine.stop()


async def test_a_template_that_aiortc_contradicts_closes_its_session_and_is_dropped(
        engine: Engine, client_socket: socket.socket) -> None:
    pc, offer = await make_offer()
    await pc.close()
    await engine.offer(offer)
    key, template = next(iter(engine._templates.items()))
    assert template is not None
    # A template gone wrong (as if aiortc answered this shape otherwise than it taught).
    template._text = template._text.replace("a=rtcp-mux", "a=rtcp-mux\r\na=x-stale:1")
    session, answer = await engine.offer(offer)
    assert not session.built
    client_socket.sendto(binding_request(answer, offer), ("127.0.0.1", engine.udp_port))
    await wait_for(lambda: session.state == "closed")
    assert session.end_reason == "answer-mismatch"
    assert engine.stats()["lazy"]["answer_mismatch"] == 1
    # That shape is answered eagerly from then on.
    again, _ = await engine.offer(offer)
    assert again.built and engine._templates[key] is None


# --- pending sessions -------------------------------------------------------------------------


async def test_a_pending_session_that_never_sends_stun_costs_no_aiortc_object(
        feed: CapturePipeline, tmp_path: Path, client_socket: socket.socket,
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(webrtc_config(connect_timeout_s=1.0), tmp_path / "state", feed)
    await engine.start()
    try:
        pc, offer = await make_offer()
        await pc.close()
        first, _ = await engine.offer(offer)
        counts = count_builds(engine, monkeypatch)
        pending = [await engine.offer(offer) for _ in range(5)]
        assert counts == [0, 0]
        assert all(s.pc is None and s.sender is None and s.track is None for s, _ in pending)
        assert engine.stats()["sessions_pending"] == 6
        assert engine.mux.stats()["pending"] == 5
        # Checks that do not authenticate build nothing (and are not answered).
        session, answer = pending[0]
        client_socket.sendto(binding_request(answer, offer, password="x" * 24),
                             ("127.0.0.1", engine.udp_port))
        await wait_for(lambda: engine.mux.dropped["stun_bad_integrity"] == 1)
        # DELETE one, let the others time out: still nothing built, nothing left.
        assert await engine.close(session.id)
        assert session.end_reason == "delete"
        await wait_for(lambda: not engine.sessions, timeout=10)
        assert all(s.end_reason == "connect-timeout" for s, _ in pending[1:])
        assert first.end_reason == "connect-timeout"
        assert counts == [0, 0]
        assert (engine.mux.stats()["sessions"], engine.mux.stats()["pending"]) == (0, 0)
        assert engine.stats()["lazy"]["pending"] == 0
    finally:
        await engine.stop()


def _lossy(pc: RTCPeerConnection, decide: Callable[[bytes], list[bytes]]) -> None:
    """Pass what a client peer sends over UDP through ``decide`` (data -> what to send now)."""
    (connection,) = aiortc_internals.ice_connection_of(pc)
    for protocol in connection._protocols:
        transport = protocol.transport
        sendto = transport.sendto

        def send(data: bytes, addr: Any = None, sendto: Any = sendto) -> None:
            for out in decide(data):
                sendto(out, addr)

        transport.sendto = send


def _is_binding_request(data: bytes) -> bool:
    return len(data) >= 20 and data[0] < 4 and data[:2] == b"\x00\x01"


async def test_lazy_sessions_connect_under_loss_and_reordering(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    pc, offer = await make_offer()
    await pc.close()
    await engine.offer(offer)  # teaches the shape
    counts = count_builds(engine, monkeypatch)
    # The engine's first STUN response to each viewer is lost as well.
    answered: set[tuple[str, int]] = set()
    send_datagram = engine.mux.send_datagram

    def lossy_send(data: bytes, addr: tuple[str, int], family: int) -> None:
        if data[:2] == b"\x01\x01" and addr not in answered:
            answered.add(addr)
            return
        send_datagram(data, addr, family)

    monkeypatch.setattr(engine.mux, "send_datagram", lossy_send)

    viewers: list[Viewer] = []
    lost, held = [], []

    def drop_first_two(data: bytes) -> list[bytes]:
        if _is_binding_request(data) and len(lost) < 2:
            lost.append(data)
            return []
        return [data]

    def reorder(data: bytes) -> list[bytes]:
        # The first check waits for the second, then both go, the first twice (duplicated).
        if _is_binding_request(data) and not held:
            held.append(data)
            return []
        if _is_binding_request(data) and len(held) == 1:
            held.append(data)
            return [data, held[0], held[0]]
        return [data]

    try:
        for decide in (drop_first_two, reorder):
            pc, offer = await make_offer()
            _lossy(pc, decide)
            viewer = Viewer(pc)
            pc.on("track", lambda track, v=viewer: setattr(
                v, "task", asyncio.ensure_future(v.consume(track))))
            session, viewer.answer = await engine.offer(offer)
            viewer.session_id = session.id
            assert not session.built
            viewers.append(viewer)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=viewer.answer, type="answer"))
        await wait_for(lambda: all(v.frames >= 3 for v in viewers), timeout=40)
        assert len(lost) == 2 and len(held) == 2 and len(answered) == 2
        # One connection each, built once however many checks came.
        assert counts == [2, 2]
        lazy = engine.stats()["lazy"]
        assert (lazy["built"], lazy["answer_mismatch"], lazy["build_failed"]) == (2, 0, 0)
        assert all(engine.sessions[v.session_id].state == "connected" for v in viewers)
    finally:
        await asyncio.gather(*(v.close() for v in viewers))


async def test_checks_arriving_while_a_lazy_session_is_built_wait_for_it(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    await (await connect_viewer(engine)).close()  # teaches the shape
    counts = count_builds(engine, monkeypatch)
    pc, offer = await make_offer()
    viewer = Viewer(pc)
    pc.on("track", lambda track: setattr(
        viewer, "task", asyncio.ensure_future(viewer.consume(track))))
    session, answer = await engine.offer(offer)
    try:
        # Another offer's build holds the engine (it answers one at a time): the viewer's
        # checks keep coming meanwhile, and wait for its connection.
        async with engine._answer_lock:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            await wait_for(lambda: engine.mux.counters["pending_checks"] >= 2, timeout=10)
            assert not session.built and counts == [0, 0]
        await wait_for(lambda: viewer.frames >= 3, timeout=30)
        assert counts == [1, 1] and session.state == "connected"
    finally:
        await viewer.close()


async def test_a_lazy_session_closed_before_its_build_builds_nothing(
        engine: Engine, client_socket: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    pc, offer = await make_offer()
    await pc.close()
    await engine.offer(offer)  # teaches the shape
    counts = count_builds(engine, monkeypatch)
    session, answer = await engine.offer(offer)
    async with engine._answer_lock:  # another offer being built
        client_socket.sendto(binding_request(answer, offer), ("127.0.0.1", engine.udp_port))
        await wait_for(lambda: session.building is not None)
        assert await engine.close(session.id)
    assert session.building is None and not session.built
    await asyncio.sleep(0.2)
    assert counts == [0, 0] and session.end_reason == "delete"
    assert engine.mux.stats()["pending"] == 0 and not engine.mux.is_live(session.ufrag)


# Per-offer values (left out of the shape) broken: (old, new) in the offer.
BROKEN_VALUES = [
    ("a=ice-ufrag:5f3a9c1e", "a=ice-ufrag:"),
    ("a=ice-pwd:8b1f0e6c7a2d4f3e9c5b6a7d8e9f0a1b", "a=ice-pwd:"),
    ("a=fingerprint:sha-256 ", "a=fingerprint:sha-256"),
    ("a=fingerprint:sha-256 ", "a=fingerprint:sha 256 "),
    ("a=ssrc:2245484342 cname:", "a=ssrc:22454x4342 cname:"),
    ("a=ssrc:2245484342 cname:", "a=ssrc:2245484342 cname"),
    ("c=IN IP4 0.0.0.0", "c=IN IP9 0.0.0.0"),
    ("m=video 9 ", "m=video 9x "),
    ("m=video 9 ", "m=video \uff19 "),
]


@pytest.mark.parametrize(("old", "new"), BROKEN_VALUES)
async def test_an_offer_of_a_known_shape_with_broken_values_is_refused_with_a_reason(
        old: str, new: str, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from ruseon_appliance.engine import MalformedOffer
    from ruseon_appliance.engine.offer import check_offer

    await engine.offer(FIREFOX_AV_OFFER)
    assert engine.stats()["lazy"]["templates"] == 1
    counts = count_builds(engine, monkeypatch)
    broken = FIREFOX_AV_OFFER.replace(old, new, 1)
    # The template's shape: only a value differs.
    assert broken != FIREFOX_AV_OFFER and offer_shape(broken) == offer_shape(FIREFOX_AV_OFFER)
    with pytest.raises(MalformedOffer) as eager:
        check_offer(broken, max_bytes=65536, stream_profile_level_id="42e01f")
    with pytest.raises(MalformedOffer) as refused:
        await engine.offer(broken)
    assert refused.value.reason == eager.value.reason
    assert counts[0] == 0 and engine.stats()["lazy"]["answered"] == 0
    # The same offer, unbroken, is answered from the template.
    session, _ = await engine.offer(another_offerer(FIREFOX_AV_OFFER))
    assert not session.built and engine.stats()["lazy"]["answered"] == 1


async def test_rtcp_and_connection_lines_of_a_gathered_offer_are_per_offer(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from ruseon_appliance.engine import MalformedOffer

    await engine.offer(CHROMIUM_AV_OFFER)
    for old, new in (("a=rtcp:9 IN IP4 0.0.0.0", "a=rtcp:nine IN IP4 0.0.0.0"),
                     ("a=rtcp:9 IN IP4 0.0.0.0", "a=rtcp:9 IN IP4"),
                     ("c=IN IP4 192.0.2.10", "c=IN IP4")):
        with pytest.raises(MalformedOffer):
            await engine.offer(CHROMIUM_AV_OFFER.replace(old, new, 1))
    # Another address and port (another viewer's gathered offer): the same shape.
    session, _ = await engine.offer(another_offerer(CHROMIUM_AV_OFFER))
    assert not session.built


async def test_a_lazy_build_holds_datagrams_and_the_collector_like_an_offer(
        engine: Engine, client_socket: socket.socket) -> None:
    import gc

    pc, offer = await make_offer()
    await pc.close()
    await engine.offer(offer)  # teaches the shape
    await wait_for(lambda: not engine._burst.holding)
    session, answer = await engine.offer(offer)
    assert not engine._burst.holding  # answered from the template: nothing held
    holds = engine.stats()["offer_bursts"]["holds"]
    async with engine._answer_lock:  # the build waits behind another offer's
        client_socket.sendto(binding_request(answer, offer), ("127.0.0.1", engine.udp_port))
        await wait_for(lambda: session.building is not None)
        await asyncio.sleep(0.05)
        assert engine._burst.holding and not gc.isenabled()
        assert engine.stats()["offer_bursts"]["holds"] == holds + 1
    response = await stun_response(client_socket)  # built: the check is answered
    assert response.message_class == stun.Class.RESPONSE and session.built
    await wait_for(lambda: not engine._burst.holding and gc.isenabled())


async def test_a_burst_of_a_new_shape_builds_one_session_and_answers_the_rest_lazily(
        feed: CapturePipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first viewers after boot offer at once, before any template exists: the first offer
    # is answered by aiortc (its template learned), the ones that waited behind it for the
    # answer lock from that template; all of them connect and decode.
    engine = Engine(webrtc_config(), tmp_path / "state", feed)
    await engine.start()
    viewers: list[Viewer] = []
    try:
        made = [await make_offer() for _ in range(4)]
        counts = count_builds(engine, monkeypatch)
        answers = await asyncio.gather(*(engine.offer(offer) for _, offer in made))
        assert counts[1] == 1  # aiortc was given one offer to answer, not four
        lazy = engine.stats()["lazy"]
        assert (lazy["learned"], lazy["answered"], lazy["answered_after_learning"]) == (1, 3, 3)
        assert [s.built for s, _ in answers] == [True, False, False, False]
        for (pc, _), (_session, answer) in zip(made, answers, strict=True):
            viewer = Viewer(pc)
            viewers.append(viewer)
            pc.on("track", lambda track, v=viewer: setattr(
                v, "task", asyncio.ensure_future(v.consume(track))))
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await wait_for(lambda: all(v.frames >= 3 for v in viewers), timeout=40)
        assert engine.stats()["lazy"]["built"] == 3
    finally:
        await asyncio.gather(*(v.close() for v in viewers))
        await engine.stop()
