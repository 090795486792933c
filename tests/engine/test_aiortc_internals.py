"""Fails loudly when an aiortc/aioice upgrade changes what engine/aiortc_internals.py relies on."""

from __future__ import annotations

import inspect

import aioice.ice
import aiortc
from aioice import Connection
from aiortc import RTCCertificate, RTCPeerConnection, RTCRtpReceiver, RTCRtpSender

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
    source = inspect.getsource(rtcpeerconnection.find_common_codecs)
    assert "break" in source and "codec = copy.deepcopy(codec)" in source
    assert "codec.parameters == pref.parameters" in inspect.getsource(
        rtcpeerconnection.filter_preferred_codecs)
    assert aiortc.__version__
