"""The offer path's shortcuts (issue 19): peer connections built ahead in idle time, each handed
to exactly one viewer, and offers parsed with their codec lists kept per shape, equal to
aiortc's own parse."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import aiortc.sdp
import pytest
from aiortc import RTCSessionDescription
from aiortc.sdp import SessionDescription
from OpenSSL import SSL

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.engine import Engine, aiortc_internals
from ruseon_appliance.engine import engine as engine_module
from ruseon_appliance.engine import prebuilt as prebuilt_module
from ruseon_appliance.engine.errors import MalformedOffer
from ruseon_appliance.engine.offer import OfferParser, check_offer, strip_remote_candidates
from ruseon_appliance.engine.prebuilt import PrebuiltPool
from tests.engine.conftest import Viewer, make_offer, wait_for, webrtc_config
from tests.web.test_whep_fuzz import CHROMIUM_OFFER


async def test_pool_hands_out_each_object_once_and_refills_when_idle() -> None:
    built: list[object] = []

    def build() -> object:
        built.append(object())
        return built[-1]

    pool: PrebuiltPool[object] = PrebuiltPool(build, capacity=4, idle_s=0.05)
    pool.start()
    await asyncio.sleep(0.2)
    assert not built  # nothing built before anything is asked for
    first = pool.take()
    await wait_for(lambda: pool.ready == 4, timeout=10)
    assert len(built) == 5
    taken = [first] + [pool.take() for _ in range(6)]  # 4 built ahead, then 2 on the spot
    assert len({id(x) for x in taken}) == 7 and len(built) == 7
    assert (pool.taken_prebuilt, pool.built_inline) == (4, 3)
    await wait_for(lambda: pool.ready == 4, timeout=10)
    again = [pool.take() for _ in range(4)]
    assert not {id(x) for x in again} & {id(x) for x in taken}
    pool.stop()
    assert pool.ready == 0
    await asyncio.sleep(0.2)
    assert pool.ready == 0  # stopped: no more building


async def test_pool_waits_while_busy() -> None:
    busy = [True]
    pool: PrebuiltPool[object] = PrebuiltPool(object, capacity=2, idle_s=0.02,
                                              busy=lambda: busy[0])
    pool.start()
    pool.take()
    await asyncio.sleep(0.3)
    assert pool.ready == 0  # offers being answered: nothing built meanwhile
    busy[0] = False
    await wait_for(lambda: pool.ready == 2, timeout=10)
    pool.stop()


async def test_prebuilt_and_inline_viewers_never_share_objects(
        feed: CapturePipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "PREBUILT_PEER_CONNECTIONS", 3)
    # Long enough that no refill slips in between the back-to-back offers, however loaded.
    monkeypatch.setattr(prebuilt_module, "REFILL_IDLE_S", 1.0)
    engine = Engine(webrtc_config(), tmp_path / "state", feed)
    await engine.start()
    viewers: list[Viewer] = []
    try:
        # The pools fill once a first viewer came (built on the spot) and things are quiet.
        pc, offer = await make_offer()
        session, _ = await engine.offer(offer)
        await engine.close(session.id)
        await pc.close()
        await wait_for(lambda: engine.stats()["prebuilt"]["ready"] == 3)
        offers = [await make_offer() for _ in range(6)]
        # Back to back: three come from the pool, the others are built on the spot (the pool
        # waits for a quiet moment before building again).
        for pc, offer in offers:
            viewer = Viewer(pc)
            pc.on("track", lambda track, v=viewer: setattr(
                v, "task", asyncio.ensure_future(v.consume(track))))
            session, viewer.answer = await engine.offer(offer)
            viewer.session_id = session.id
            viewers.append(viewer)
        for viewer in viewers:
            await viewer.pc.setRemoteDescription(
                RTCSessionDescription(sdp=viewer.answer, type="answer"))
        await wait_for(lambda: all(v.frames >= 3 for v in viewers), timeout=40)
        # Taken when each was built: on its first STUN check (lazy sessions, the same shape).
        prebuilt = engine.stats()["prebuilt"]

        sessions = [engine.sessions[v.session_id] for v in viewers]
        # Everything below the peer connection (transceiver, sender, receiver, DTLS and ICE
        # transports, aioice connection, OpenSSL connection, SRTP sessions), the track, the
        # fan-out viewer: one of each per viewer.
        owned = [[s.pc, s.track, *aiortc_internals.owned_objects(s.pc)] for s in sessions]
        assert all(len(objs) == len(owned[0]) for objs in owned)
        every = [id(o) for objs in owned for o in objs]
        assert len(every) == len(set(every)), "an object is shared between two viewers"
        assert prebuilt["taken_prebuilt"] >= 1 and prebuilt["built_inline"] >= 1, prebuilt
        # DTLS: an OpenSSL connection each, all made from the engine's one context (built at
        # start), whose session cache is off: no viewer can resume another's session.
        connections = [o for objs in owned for o in objs if isinstance(o, SSL.Connection)]
        assert len(connections) == 6 and len({id(c) for c in connections}) == 6
        assert len({id(c.get_context()) for c in connections}) == 1
        context = connections[0].get_context()
        assert context.get_session_cache_mode() == SSL.SESS_CACHE_OFF
        assert engine.stats()["dtls_contexts"] == 1
        assert len({s.ufrag for s in sessions}) == 6
        ssrcs = [aiortc_internals.sender_ssrcs(s.sender) for s in sessions]
        assert len({x for pair in ssrcs for x in pair}) == 12
        # One certificate for all, as before.
        certs = {id(c) for s in sessions
                 for c in aiortc_internals.peer_connection_certificates(s.pc)}
        assert len(certs) == 1

        # Idle again: the pool refills, and a viewer built ahead plays like the others.
        await wait_for(lambda: engine.stats()["prebuilt"]["ready"] == 3)
        before = engine.stats()["prebuilt"]["taken_prebuilt"]
        pc, offer = await make_offer()
        late = Viewer(pc)
        pc.on("track", lambda track: setattr(
            late, "task", asyncio.ensure_future(late.consume(track))))
        session, answer = await engine.offer(offer)
        viewers.append(late)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await wait_for(lambda: late.frames >= 3, timeout=40)
        assert engine.stats()["prebuilt"]["taken_prebuilt"] == before + 1
        assert not {id(o) for o in aiortc_internals.owned_objects(session.pc)} & set(every)
    finally:
        await asyncio.gather(*(v.close() for v in viewers))
        await engine.stop()
    assert engine.stats()["prebuilt"] is None


async def offers_to_parse() -> list[str]:
    """An aiortc offer, an audio-first BUNDLE one, and Chromium's (candidates stripped)."""
    texts = []
    for audio_first in (False, True):
        pc, offer = await make_offer(audio_first=audio_first)
        await pc.close()
        texts.append(offer)
    texts.append(CHROMIUM_OFFER)
    return [strip_remote_candidates(t.strip()) for t in texts]


async def test_offer_parser_equals_aiortc_parse_and_shares_nothing() -> None:
    parser = OfferParser()
    for sdp in await offers_to_parse():
        full = SessionDescription.parse(sdp)
        first, second = parser.parse(sdp), parser.parse(sdp)
        for parsed in (first, second):
            assert str(parsed) == str(full)
            for mine, theirs in zip(parsed.media, full.media, strict=True):
                assert mine.rtp.codecs == theirs.rtp.codecs
                assert mine.rtp.headerExtensions == theirs.rtp.headerExtensions
                assert (mine.ice, mine.dtls, mine.direction, mine.rtp.muxId) == (
                    theirs.ice, theirs.dtls, theirs.direction, theirs.rtp.muxId)
        # The second came from the kept codecs: fresh objects, down to feedback and fmtp.
        for a, b in zip(first.media, second.media, strict=True):
            for ca, cb in zip(a.rtp.codecs, b.rtp.codecs, strict=True):
                assert ca is not cb and ca.parameters is not cb.parameters
                assert ca.rtcpFeedback is not cb.rtcpFeedback
                assert not {id(f) for f in ca.rtcpFeedback} & {id(f) for f in cb.rtcpFeedback}
            assert a.rtp.headerExtensions, "the offers have header extensions"
            assert not {id(x) for x in a.rtp.headerExtensions} & {
                id(x) for x in b.rtp.headerExtensions}
    assert (parser.misses, parser.hits) == (3, 3)
    # Another client's offer: other port, credentials, fingerprint, ids; the same codecs.
    (other, *_) = await offers_to_parse()
    assert str(parser.parse(other)) == str(SessionDescription.parse(other))
    assert (parser.misses, parser.hits) == (3, 4)


async def test_offer_parser_keeps_refusing_what_aiortc_refuses() -> None:
    parser = OfferParser()
    (sdp, *_) = await offers_to_parse()
    check_offer(sdp, max_bytes=65536, stream_profile_level_id="42e01f", parse=parser.parse)
    # Same codec lines (a kept shape), broken elsewhere: refused as without the parser.
    broken = sdp.replace("a=setup:actpass", "a=setup:sideways")
    for parse in (parser.parse, None):
        with pytest.raises(MalformedOffer):
            check_offer(broken, max_bytes=65536, stream_profile_level_id="42e01f", parse=parse)
    assert parser.hits == 1
    # A codec line changed: a new shape, parsed whole (and kept).
    other = sdp.replace("packetization-mode=1;profile-level-id=42001f",
                        "packetization-mode=1;profile-level-id=42001e")
    assert other != sdp
    assert str(parser.parse(other)) == str(SessionDescription.parse(other))
    assert parser.misses == 2
    # Bounded: old shapes are dropped, and still parse right.
    small = OfferParser(max_shapes=1)
    for text in (sdp, other, sdp):
        assert str(small.parse(text)) == str(SessionDescription.parse(text))
    assert (small.misses, small.hits) == (3, 0)


async def test_sendonly_peer_connection_has_no_estimator_and_its_own_objects() -> None:
    from aiortc import RTCCertificate, RTCConfiguration

    from ruseon_appliance.engine.fanout import FanoutTrack

    certificate = RTCCertificate.generateCertificate()
    built = [aiortc_internals.sendonly_peer_connection(
        RTCConfiguration(iceServers=[]), certificate, FanoutTrack()) for _ in range(2)]
    for pc, transceiver in built:
        assert transceiver.direction == "sendonly"
        assert aiortc_internals.peer_connection_certificates(pc) == [certificate]
        assert transceiver.receiver._RTCRtpReceiver__remote_bitrate_estimator is None
    (a, _), (b, _) = built
    assert not {id(o) for o in aiortc_internals.owned_objects(a)} & {
        id(o) for o in aiortc_internals.owned_objects(b)}


def test_offer_parser_guard_points() -> None:
    """aiortc 1.16 cuts lines with splitlines() and builds a media section's codecs only from
    its rtpmap, fmtp and rtcp-fb lines, its header extensions only from extmap lines: what
    OfferParser relies on."""
    assert "sdp.splitlines()" in inspect.getsource(aiortc.sdp.grouplines)
    parse = inspect.getsource(
        aiortc_internals.unhooked(SessionDescription, "parse").__func__)
    for attr in ("rtpmap", "fmtp", "rtcp-fb", "extmap"):
        assert f'attr == "{attr}"' in parse, attr
    # Three places touch the codec list: rtpmap appends, fmtp finds, rtcp-fb loops over it.
    assert parse.count("current_media.rtp.codecs") == 3
    assert parse.count("current_media.rtp.headerExtensions") == 1


def test_ssl_context_hook_points() -> None:
    """aiortc 1.16 asks the (shared) certificate for a new SSL context per DTLS connection,
    with the transport's SRTP profiles, and only wraps it in an SSL.Connection: where the
    engine hands every connection the one context it shares."""
    from aiortc import RTCCertificate
    from aiortc.rtcdtlstransport import SRTP_PROFILES, RTCDtlsTransport

    start = inspect.getsource(RTCDtlsTransport.start)
    wrapped = ("self._ssl = SSL.Connection(\n"
               "            self.__local_certificate._create_ssl_context(")
    assert wrapped in start
    assert "srtp_profiles=self._srtp_profiles" in start
    # Nothing else in the transport touches the context it was given.
    source = inspect.getsource(RTCDtlsTransport)
    assert source.count("_create_ssl_context(") == 1 and "get_context" not in source
    certificate = RTCCertificate.generateCertificate()
    create = aiortc_internals.ssl_context_factory(certificate)
    profiles = list(SRTP_PROFILES)
    first, second = create(profiles), create(profiles)
    assert isinstance(first, SSL.Context) and first is not second
    built = aiortc_internals.share_ssl_contexts(certificate)
    shared = certificate._create_ssl_context(srtp_profiles=profiles[:1])
    assert certificate._create_ssl_context(srtp_profiles=list(profiles[:1])) is shared
    assert shared.get_session_cache_mode() == SSL.SESS_CACHE_OFF and built() == 1
    other = certificate._create_ssl_context(srtp_profiles=profiles)
    assert isinstance(other, SSL.Context) and other is not shared and built() == 2
    # Closing one connection does not cut the shared context's verify callback.
    connection = SSL.Connection(shared)
    aiortc_internals._release_verify_callback(connection)
    assert shared._verify_helper is not None and shared._verify_helper.callback is not None
