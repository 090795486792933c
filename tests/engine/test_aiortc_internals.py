"""Fails loudly when an aiortc/aioice upgrade changes what engine/aiortc_internals.py relies on."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import types
from collections.abc import Iterator
from typing import Any

import aioice.ice
import aiortc
from aioice import Connection
from aiortc import RTCCertificate, RTCPeerConnection, RTCRtpReceiver, RTCRtpSender

from ruseon_appliance.config import SRTP_PROFILE_NAMES
from ruseon_appliance.engine import aiortc_internals


def test_versions_are_the_ones_the_module_was_written_for() -> None:
    assert aiortc_internals.installed_versions() == (
        aiortc_internals.AIORTC_VERSION, aiortc_internals.AIOICE_VERSION), (
        "aiortc/aioice changed: re-check every item in engine/aiortc_internals.py, then bump")


def test_certificate_hook_scoped_to_the_engine() -> None:
    aiortc_internals.install_certificate_hook()
    assert "generateCertificate()" in inspect.getsource(RTCPeerConnection.__init__)
    mine = RTCCertificate.generateCertificate()
    with aiortc_internals.shared_certificate(mine):
        inside = RTCPeerConnection()
    outside = RTCPeerConnection()
    assert aiortc_internals.peer_connection_certificates(inside) == [mine]
    assert aiortc_internals.peer_connection_certificates(outside) != [mine]


async def test_aioice_connection_private_state() -> None:
    conn = Connection(ice_controlling=False)
    for name in ("_local_username", "_local_password", "_protocols", "_local_candidates",
                 "_local_candidates_start", "_local_candidates_end", "_nominated",
                 "_query_consent_task", "_closing"):
        assert hasattr(conn, name), name
    aiortc_internals.set_local_credentials(conn, "abcdEFGH", "a" * 24)
    assert (conn.local_username, conn.local_password) == ("abcdEFGH", "a" * 24)
    # gather_candidates must be a no-op once candidates are installed.
    aiortc_internals.install_local_candidates(conn, [], [])
    await conn.gather_candidates()
    assert conn._protocols == [] and conn.local_candidates == []
    source = inspect.getsource(Connection.query_consent)
    assert "self._query_consent_task = None" in source and "CONSENT_INTERVAL" in source
    assert isinstance(aioice.ice.CONSENT_INTERVAL, int | float)
    assert isinstance(aioice.ice.CONSENT_FAILURES, int)
    assert "await protocol.close()" in inspect.getsource(Connection.close)
    assert "receiver.protocol_lost" in inspect.getsource(aioice.ice.StunProtocol.connection_lost)


def test_rtp_sender_private_state() -> None:
    assert "self._send_keyframe()" in inspect.getsource(RTCRtpSender._handle_rtcp_packet)
    assert "await self._retransmit(seq)" in inspect.getsource(RTCRtpSender._handle_rtcp_packet)
    init = inspect.getsource(RTCRtpSender.__init__)
    for name in ("self.__packet_count", "self.__octet_count", "self.__rtt"):
        assert name in init, name
    assert hasattr(RTCRtpReceiver, "_send_rtcp_pli")


def test_codec_registry_assumptions() -> None:
    from aiortc import rtcpeerconnection
    from aiortc.codecs import CODECS

    assert isinstance(CODECS["video"], list)
    # First compatible local codec wins, and its parameters are copied into the answer.
    # Read aiortc's own function, not the engine's hook (installed once any engine has started).
    source = inspect.getsource(
        aiortc_internals.unhooked(rtcpeerconnection, "find_common_codecs"))
    assert "break" in source and "codec = copy.deepcopy(codec)" in source
    assert "codec.parameters == pref.parameters" in inspect.getsource(
        rtcpeerconnection.filter_preferred_codecs)
    assert aiortc.__version__


def test_lean_offer_hook_points() -> None:
    """The names the lean offer path hooks are still looked up where it expects."""
    from aiortc import rtcpeerconnection, rtcrtpreceiver

    set_remote = inspect.getsource(RTCPeerConnection.setRemoteDescription)
    set_local = inspect.getsource(RTCPeerConnection.setLocalDescription)
    assert "sdp.SessionDescription.parse(sessionDescription.sdp)" in set_remote
    assert "sdp.SessionDescription.parse(sessionDescription.sdp)" in set_local
    assert "find_common_codecs(CODECS[media.kind]" in set_remote
    assert "return wrap_session_description(description)" in inspect.getsource(
        RTCPeerConnection.createAnswer)
    # Re-applying the transport description to the answer object must be idempotent.
    add = inspect.getsource(rtcpeerconnection.add_transport_description)
    assert "media.ice_candidates = " in add and "media.ice = " in add
    receiver_init = inspect.getsource(rtcrtpreceiver.RTCRtpReceiver.__init__)
    assert "RemoteBitrateEstimator()" in receiver_init
    assert "self.__remote_bitrate_estimator is not None" in inspect.getsource(
        rtcrtpreceiver.RTCRtpReceiver._handle_rtp_packet)


async def test_lean_find_common_codecs_matches_aiortc() -> None:
    """Same negotiated codecs as aiortc's deepcopy version, for a browser-like offer."""
    from aiortc import RTCConfiguration, RTCPeerConnection
    from aiortc.codecs import CODECS
    from aiortc.sdp import SessionDescription

    from ruseon_appliance.engine.codec_registry import CodecRegistry

    aiortc_internals.install_lean_offer_hooks()
    registry = CodecRegistry()
    registry.install()
    local = registry.local_codecs("42e01f")
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    remote = SessionDescription.parse(pc.localDescription.sdp).media[0].rtp.codecs
    await pc.close()
    original = aiortc_internals._original["find_common_codecs"]
    expected = [c for c in original(CODECS["video"], remote)
                if c.mimeType.lower() == "video/h264"
                and c.parameters == local[0].parameters]
    lean = aiortc_internals.lean_find_common_codecs(local, remote)
    assert expected and [c for c in lean if c.mimeType.lower() == "video/h264"] == expected
    rtx = [c for c in lean if c.mimeType.lower() == "video/rtx"]
    assert rtx and all(c.parameters["apt"] in {e.payloadType for e in expected} for c in rtx)


def test_fanout_internals() -> None:
    """What the fan-out send path reads and replaces."""
    from aiortc.rtcdtlstransport import RTCDtlsTransport

    connect = inspect.getsource(RTCPeerConnection._RTCPeerConnection__connect)  # type: ignore[attr-defined]
    assert "await transceiver.sender.send(self.__localRtp(transceiver))" in connect
    assert "if self.__started:" in inspect.getsource(RTCRtpSender.stop)
    init = inspect.getsource(RTCRtpSender.__init__)
    assert "self._ssrc = " in init and "self._rtx_ssrc = " in init
    dtls = inspect.getsource(RTCDtlsTransport)
    assert "self._tx_srtp = Session(tx_policy)" in dtls
    assert "tx_policy.allow_repeat_tx = True" in dtls
    assert "self._rtp_router.register_sender(sender, ssrc=sender._ssrc)" in dtls
    assert "await recipient._handle_rtcp_packet(packet)" in dtls


def test_reference_cycle_break_points() -> None:
    """What :func:`aiortc_internals.break_reference_cycles` clears must still exist (and the
    cycles it cuts still be made the way it assumes)."""
    from aiortc.rtcdtlstransport import RTCDtlsTransport, RtpRouter
    from aiortc.rtcicetransport import RTCIceGatherer, RTCIceTransport
    from OpenSSL import SSL

    router = RtpRouter()
    for name in ("receivers", "senders", "mid_table", "ssrc_table", "payload_type_table"):
        assert hasattr(router, name), name
    pc_source = inspect.getsource(RTCPeerConnection)
    assert 'dtlsTransport.on("statechange", self.__updateConnectionState)' in pc_source
    assert 'iceTransport.on("statechange", self.__updateConnectionState)' in pc_source
    assert 'iceGatherer.on("statechange", self.__updateIceGatheringState)' in pc_source
    for emitter in (RTCPeerConnection, RTCDtlsTransport, RTCIceTransport, RTCIceGatherer):
        assert hasattr(emitter, "remove_all_listeners"), emitter
    assert "self._rtp_router = RtpRouter()" in inspect.getsource(RTCDtlsTransport.__init__)
    sender_init = inspect.getsource(RTCRtpSender.__init__)
    assert "self.__rtp_task" in sender_init and "self.__rtcp_task" in sender_init
    assert "self.__rtcp_task" in inspect.getsource(RTCRtpReceiver.__init__)
    conn = Connection(ice_controlling=False)
    for name in ("_check_list", "_nominated", "_early_checks", "_protocols"):
        assert hasattr(conn, name), name
    assert "self._protocols.clear()" in inspect.getsource(Connection.close)
    assert "self.protocol = protocol" in inspect.getsource(aioice.ice.CandidatePair.__init__)
    assert "self._verify_helper = _VerifyHelper(callback)" in inspect.getsource(
        SSL.Context.set_verify)
    assert "self.callback = _ffi.callback" in inspect.getsource(SSL._VerifyHelper.__init__)


async def test_dtls_receive_guard_points() -> None:
    """The guard wraps ``_recv_next`` per transport: aiortc's loop must still call it through
    ``self`` (so the instance attribute wins), close on any exception, and read ``data[0]``
    (why the mux drops empty datagrams); the guard's own checks read ``_ssl`` and ``state``."""
    from aiortc import RTCDtlsTransport

    run = inspect.getsource(RTCDtlsTransport._RTCDtlsTransport__run)  # type: ignore[attr-defined]
    assert "await self._recv_next()" in run and "except Exception" in run
    assert "self._set_state(State.CLOSED)" in run
    handshake = inspect.getsource(RTCDtlsTransport._do_handshake)
    assert "await self._recv_next()" in handshake
    recv_next = inspect.getsource(RTCDtlsTransport._recv_next)
    assert "first_byte = data[0]" in recv_next and "raise ConnectionError" in recv_next
    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="sendonly")
    (dtls,) = aiortc_internals.dtls_transports_of(pc)
    assert hasattr(dtls, "_ssl") and dtls.state == "new"
    aiortc_internals.guard_dtls_receive(pc, lambda exc: None)
    assert "_recv_next" in dtls.__dict__
    aiortc_internals.break_reference_cycles(pc)
    assert "_recv_next" not in dtls.__dict__
    await pc.close()


def test_srtp_profile_list_is_read_from_the_transport() -> None:
    """``offer_srtp_profiles`` sets ``RTCDtlsTransport._srtp_profiles``: aiortc must still take
    the offered list from there and look the negotiated profile up in it."""
    from aiortc import rtcdtlstransport

    cls = rtcdtlstransport.RTCDtlsTransport
    assert "self._srtp_profiles = SRTP_PROFILES" in inspect.getsource(cls.__init__)
    assert "srtp_profiles=self._srtp_profiles" in inspect.getsource(cls.start)
    setup = inspect.getsource(cls._setup_srtp)
    assert "self._ssl.get_selected_srtp_profile()" in setup
    assert "for srtp_profile in self._srtp_profiles" in setup
    assert "set_tlsext_use_srtp" in inspect.getsource(RTCCertificate._create_ssl_context)
    assert set(aiortc_internals.available_srtp_profiles()) <= set(SRTP_PROFILE_NAMES)
    assert "SRTP_AES128_CM_SHA1_80" in aiortc_internals.available_srtp_profiles()
    # aiortc's own order is what "auto" keeps on CPUs with AES instructions.
    assert [p.openssl_profile.decode() for p in rtcdtlstransport.SRTP_PROFILES] == list(
        SRTP_PROFILE_NAMES)


async def test_dtls_server_answer_points() -> None:
    """``answer_as_dtls_server`` sets ``RTCDtlsTransport._role`` to "server" after an actpass
    offer: ``createAnswer`` must still write that role as ``a=setup:passive``, ``start`` act on
    it, and aiortc must still answer an actpass offer with active by itself (else the hook is
    moot); an offer of active or passive is left to aiortc (answered passive / active)."""
    from aiortc import RTCDtlsTransport, RTCSessionDescription

    assert 'if self._role == "server":' in inspect.getsource(RTCDtlsTransport.start)
    answer_source = inspect.getsource(RTCPeerConnection.createAnswer)
    assert 'media.dtls.role = dtlsTransport._role' in answer_source

    offerer = RTCPeerConnection()
    offerer.addTransceiver("video", direction="recvonly")
    await offerer.setLocalDescription(await offerer.createOffer())
    actpass = offerer.localDescription.sdp
    assert "a=setup:actpass" in actpass
    try:
        for setup, hooked, switched, answered, role in [
                ("actpass", False, 0, "active", "client"),
                ("actpass", True, 1, "passive", "server"),
                ("active", True, 0, "passive", "server"),
                ("passive", True, 0, "active", "client")]:
            pc = RTCPeerConnection()
            pc.addTransceiver("video", direction="sendonly")
            await pc.setRemoteDescription(RTCSessionDescription(
                sdp=actpass.replace("a=setup:actpass", f"a=setup:{setup}"), type="offer"))
            assert (aiortc_internals.answer_as_dtls_server(pc) if hooked else 0) == switched
            await pc.setLocalDescription(await pc.createAnswer())
            assert f"a=setup:{answered}" in pc.localDescription.sdp, (setup, hooked)
            (dtls,) = aiortc_internals.dtls_transports_of(pc)
            # What start() will act on (the answer's role is never "auto").
            assert dtls._role == role, (setup, hooked)
            await pc.close()
    finally:
        await offerer.close()


@contextlib.contextmanager
def endless_connect_pacing() -> Iterator[None]:
    """aioice's connect() pacing tick (its ``asyncio.sleep(0.02)``) lasts an hour meanwhile, so
    a connect() that waits for its next tick never returns (other sleeps are untouched)."""
    real_sleep = asyncio.sleep

    async def endless_pacing(delay: float, *args: Any) -> Any:
        if delay == 0.02:  # only connect()'s pacing tick
            await real_sleep(3600)
        return await real_sleep(delay, *args)

    proxy = types.SimpleNamespace(**{k: getattr(asyncio, k) for k in dir(asyncio)
                                     if not k.startswith("__")})
    proxy.sleep = endless_pacing
    original = aioice.ice.asyncio
    aioice.ice.asyncio = proxy  # type: ignore[assignment]
    try:
        yield
    finally:
        aioice.ice.asyncio = original  # type: ignore[assignment]


async def stop_tidying() -> None:
    """Cancel aioice's own connect()s that connect_promptly left running (and wait for them)."""
    tidying = list(aiortc_internals._tidying)
    for task in tidying:
        task.cancel()
    if tidying:
        await asyncio.wait(tidying)
    await asyncio.sleep(0)  # their done callbacks


async def test_prompt_connect_points() -> None:
    """``connect_promptly`` relies on aioice's connect() pacing its checks in a 20 ms loop that
    ends only at the next tick after completion, and on completion going through
    ``self._check_list_maybe_complete()`` (so the per-connection hook sees it). With the pacing
    sleep made endless, two connections still connect through the hook (without it they would
    hang), exchange data, and close with no consent task left running."""
    connect_source = inspect.getsource(Connection.connect)
    assert "self._check_periodic()" in connect_source
    assert "await asyncio.sleep(0.02)" in connect_source
    assert "self._check_list_state.get()" in connect_source
    assert "self._query_consent_task = asyncio.create_task" in connect_source
    assert "self._check_list_maybe_complete()" in inspect.getsource(Connection.check_complete)
    assert "self._closing = True" in inspect.getsource(Connection.close)

    controlling = Connection(ice_controlling=True, use_ipv6=False)
    controlled = Connection(ice_controlling=False, use_ipv6=False)
    with endless_connect_pacing():
        for conn in (controlling, controlled):
            await conn.gather_candidates()
            aiortc_internals.connect_promptly(conn)
        for local, remote in ((controlling, controlled), (controlled, controlling)):
            local.remote_username, local.remote_password = (remote.local_username,
                                                            remote.local_password)
            for candidate in remote.local_candidates:
                await local.add_remote_candidate(candidate)
        try:
            async with asyncio.timeout(30):
                await asyncio.gather(controlling.connect(), controlled.connect())
            assert len(aiortc_internals._tidying) >= 2  # aioice's own connect()s still sleep
            await controlling.send(b"hello")
            async with asyncio.timeout(30):
                assert await controlled.recv() == b"hello"
        finally:
            await controlling.close()
            await controlled.close()
            await stop_tidying()
    assert not aiortc_internals._tidying
    for conn in (controlling, controlled):
        consent = conn._query_consent_task
        assert consent is None or consent.done()
