"""Every place the engine reaches into aiortc's or aioice's private attributes, in one module.

Written for **aiortc 1.16.0** and **aioice 0.13.0**. Nothing else in the appliance touches a
private name of either library; ``tests/engine/test_aiortc_internals.py`` checks that each name
used here still exists and behaves as relied upon, so an upgrade fails loudly in CI rather than
quietly at a viewer's browser.

What is relied upon, and why:

- ``RTCPeerConnection.__init__`` calls ``RTCCertificate.generateCertificate()`` (aiortc has no
  ``certificates`` field in ``RTCConfiguration``). The classmethod is hooked once; the hook returns
  the appliance's certificate only while :func:`shared_certificate` is active, so other
  ``RTCPeerConnection`` users in the process (test clients, the naive bench answerer) keep their
  own.
- ``aioice.Connection`` binds its own sockets in ``gather_candidates``. The engine gives it
  :class:`MuxStunProtocol` objects (a ``StunProtocol`` whose transport is the shared mux socket)
  and its host candidates up front, by filling ``_protocols`` / ``_local_candidates`` and marking
  gathering done, so gathering opens no socket. Its ICE credentials come from the engine
  (``_local_username`` / ``_local_password``) so the mux can route on them.
- ``RTCRtpSender._send_keyframe`` is what aiortc calls for PLI/FIR; in pass-through it sets a
  flag nothing reads, so it is replaced per sender to forward the request to the source.
  ``RTCRtpSender._retransmit`` is wrapped to count NACKed packets; the sender's name-mangled
  packet/octet counters and RTT are read for per-session stats.
- ``aioice.ice.CONSENT_INTERVAL`` / ``CONSENT_FAILURES`` are module globals read by
  ``Connection.query_consent``; tests shorten them to see consent expiry in seconds.
- The lean offer path (:func:`lean_offer`): while an engine answers an offer, four module-level
  names are hooked so nothing is done per offer that was done before. ``SessionDescription.parse``
  returns the description the engine already parsed (the offer) or built (the answer, captured
  in ``rtcpeerconnection.wrap_session_description``) instead of parsing the text again;
  ``rtcpeerconnection.find_common_codecs`` matches against the session's two codec entries with
  shallow copies instead of every registered codec with ``deepcopy``; and the
  ``RemoteBitrateEstimator`` a video ``RTCRtpReceiver`` allocates (a 50,000-entry table, about
  1 ms) is not built for a sendonly viewer, whose receiver never receives. Outside the engine's
  offers every hook falls through to aiortc's own code.
- ``RTCDtlsTransport._recv_next`` reads one datagram from the ICE transport and handles it;
  ``RTCDtlsTransport.__run`` loops over it and closes the transport on *any* exception. A
  datagram from a routed address may be forged by anyone on the LAN, so
  :func:`guard_dtls_receive` replaces it per transport with a wrapper that counts and swallows
  what a single datagram raises (consent freshness, not a stray packet, ends a session); the
  mux already drops what is not shaped like DTLS/SRTP, so the guard is the second line.
- The fan-out send path: ``RTCRtpSender.send`` is replaced per sender so aiortc never starts its
  RTP/RTCP loops; the engine registers its own RTCP sink on the DTLS transport's router
  (``_register_rtp_sender``), encrypts with the transport's ``_tx_srtp`` session, reads the
  sender's ``_ssrc`` / ``_rtx_ssrc`` and the ICE connection's nominated pair. (It packetizes
  with its own ``stream/h264_rtp.py``, which cuts FU-A fragments to equal sizes for UDP GSO, and
  protects in place through ``stream/srtp.py``.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import aioice
import aioice.ice
import aiortc
import aiortc.rtcpeerconnection
import aiortc.rtcrtpreceiver
import aiortc.rtp
from aioice import Candidate, Connection
from aioice.ice import StunProtocol
from aiortc import RTCCertificate, RTCPeerConnection, RTCRtpSender
from aiortc.codecs import CODECS
from aiortc.rtcrtpparameters import (
    RTCRtcpFeedback,
    RTCRtpCodecParameters,
    RTCRtpSendParameters,
)
from aiortc.sdp import SessionDescription
from OpenSSL import SSL

from ruseon_appliance.engine.answer_template import Identities, SenderIdentity

AIORTC_VERSION = "1.16.0"
AIOICE_VERSION = "0.13.0"

# ---------------------------------------------------------------------------------------------
# The shared DTLS certificate

_certificate_override: ContextVar[RTCCertificate | None] = ContextVar(
    "ruseon_certificate_override", default=None
)
_original_generate: Any = None


def install_certificate_hook() -> None:
    """Hook ``RTCCertificate.generateCertificate`` once per process (idempotent)."""
    global _original_generate
    if _original_generate is not None:
        return
    _original_generate = RTCCertificate.__dict__["generateCertificate"]
    original = RTCCertificate.generateCertificate

    def generate(cls: type[RTCCertificate]) -> RTCCertificate:
        override = _certificate_override.get()
        return override if override is not None else original()

    RTCCertificate.generateCertificate = classmethod(generate)  # type: ignore[method-assign,assignment]


def certificate_hook_installed() -> bool:
    """Whether :func:`install_certificate_hook` has run in this process."""
    return _original_generate is not None


@contextlib.contextmanager
def shared_certificate(certificate: RTCCertificate) -> Iterator[None]:
    """Make ``RTCPeerConnection()`` built inside this block use ``certificate``.

    ``RTCPeerConnection.__init__`` is synchronous, so no other task can run inside the block.
    """
    install_certificate_hook()
    token = _certificate_override.set(certificate)
    try:
        yield
    finally:
        _certificate_override.reset(token)


def peer_connection_certificates(pc: RTCPeerConnection) -> list[RTCCertificate]:
    """The certificates a connection presents (for tests)."""
    return list(pc._RTCPeerConnection__certificates)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# ICE: one aioice Connection per viewer, fed by the shared UDP mux


class DatagramSink(Protocol):
    """What a :class:`MuxStunProtocol` needs from the mux: send, and forget me."""

    def send_datagram(self, data: bytes, addr: tuple[str, int], family: int) -> None: ...

    def protocol_closed(self, protocol: MuxStunProtocol) -> None: ...


class _MuxTransport:
    """The slice of ``asyncio.DatagramTransport`` aioice uses: ``sendto``, ``close``,
    ``get_extra_info``. Sends go out of the mux's socket for this family."""

    def __init__(self, sink: DatagramSink, protocol: MuxStunProtocol, family: int,
                 sockname: tuple[str, int]) -> None:
        self._sink = sink
        self._protocol: MuxStunProtocol | None = protocol
        self._family = family
        self._sockname = sockname
        self._closed = False

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        if not self._closed:
            self._sink.send_datagram(data, addr, self._family)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._sockname if name == "sockname" else default

    def is_closing(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The protocol holds this transport: let go of it, or the pair (and the connection
        # behind the protocol) waits for the cyclic garbage collector.
        protocol, self._protocol = self._protocol, None
        if protocol is None:
            return
        self._sink.protocol_closed(protocol)
        # aioice's Connection.close awaits connection_lost; report it as a real transport would,
        # on the next loop iteration.
        asyncio.get_running_loop().call_soon(protocol.connection_lost, None)


class MuxStunProtocol(StunProtocol):  # type: ignore[misc]
    """A ``StunProtocol`` for one viewer's connection on one mux socket (one address family)."""

    def __init__(self, connection: Connection, sink: DatagramSink, family: int,
                 local_candidate: Candidate, sockname: tuple[str, int]) -> None:
        super().__init__(connection)
        self.local_candidate = local_candidate
        self.family = family
        self.transport = _MuxTransport(sink, self, family, sockname)  # type: ignore[assignment]

    @property
    def connection(self) -> Connection:
        """The aioice connection this protocol delivers to."""
        conn: Connection = self.receiver
        return conn

    def datagram_received(self, data: bytes | str, addr: tuple[Any, ...]) -> None:
        # SRTP/SRTCP/DTLS (first byte >= 4) cannot be STUN: skip aioice's trial STUN parse.
        if isinstance(data, bytes) and data and data[0] > 3:
            self.receiver.data_received(data, self.local_candidate.component)
            return
        super().datagram_received(data, addr)


def ice_connection_of(pc: RTCPeerConnection) -> list[Connection]:
    """The distinct aioice connections of a peer connection's (possibly bundled) transports."""
    seen: list[Connection] = []
    for transceiver in pc.getTransceivers():
        conn = transceiver.receiver.transport.transport._connection
        if conn not in seen:
            seen.append(conn)
    if pc.sctp is not None:
        conn = pc.sctp.transport.transport._connection
        if conn not in seen:
            seen.append(conn)
    return seen


def owned_objects(pc: RTCPeerConnection) -> list[object]:
    """The objects a peer connection owns below its public surface, which must all be freed
    once it is closed and dropped: per transceiver the sender, receiver, DTLS and ICE
    transports, the aioice connection, the pyOpenSSL connection and the SRTP sessions
    (tests: a leak check holds weak references to these)."""
    owned: list[object] = []
    for transceiver in pc.getTransceivers():
        dtls = transceiver.sender.transport
        owned += [transceiver, transceiver.sender, transceiver.receiver, dtls, dtls.transport,
                  dtls.transport._connection]
        owned += [x for x in (dtls._ssl, dtls._rx_srtp, dtls._tx_srtp) if x is not None]
    return owned


def release_native_state(pc: RTCPeerConnection) -> None:
    """Drop a closed peer connection's OpenSSL connection (and with it the SSL_CTX,
    certificate and key copies, where the context was its own) and SRTP sessions now, and its
    event listeners.

    aiortc's objects reference each other in cycles, so a closed connection is only freed by
    the cyclic garbage collector, whose thresholds count Python objects and know nothing of
    the native memory these hold: under churn that memory piles up between full collections
    (measured: RSS +25 MiB over 900 join/leave cycles). Their last references are here, so
    releasing them frees the native memory at once; the Python shells follow with the next
    collection. Only call this once ``pc.close()`` has returned (its tasks are finished)."""
    for transceiver in pc.getTransceivers():
        dtls = transceiver.sender.transport
        if dtls.state not in ("closed", "failed"):
            continue
        if dtls._ssl is not None:
            _release_verify_callback(dtls._ssl)
        dtls._ssl = None
        dtls._rx_srtp = None
        dtls._tx_srtp = None
    pc.remove_all_listeners()


# Instance attributes the engine sets on a sender (its hooks), removed again on close.
_SENDER_HOOKS = ("send", "_send_keyframe", "_retransmit")
# ... and on a DTLS transport.
_DTLS_HOOKS = ("_recv_next",)
GUARD_MAX_CONSECUTIVE_ERRORS = 1000


def dtls_transports_of(pc: RTCPeerConnection) -> list[Any]:
    """The distinct ``RTCDtlsTransport`` objects of a peer connection's transceivers."""
    seen: list[Any] = []
    for transceiver in pc.getTransceivers():
        dtls = transceiver.sender.transport
        if dtls is not None and dtls not in seen:
            seen.append(dtls)
    return seen


def guard_dtls_receive(pc: RTCPeerConnection, on_error: Callable[[Exception], None]) -> None:
    """Make the DTLS receive loop survive whatever one received datagram raises.

    aiortc 1.16 ``RTCDtlsTransport.__run`` is ``while True: await self._recv_next()`` and closes
    the transport on any exception; ``_recv_next`` itself catches only the OpenSSL and libsrtp
    errors it expects (an empty datagram raised ``IndexError`` on ``data[0]`` and ended the
    session). The wrapper lets through what really means the end (``ConnectionError``: the ICE
    connection closed or the peer sent an authenticated close_notify; cancellation; anything
    once the transport is closing) and reports everything else to ``on_error`` instead; the
    loop then reads the next datagram. Call before the transport starts (after
    ``setRemoteDescription``)."""
    for dtls in dtls_transports_of(pc):
        if "_recv_next" in dtls.__dict__:
            continue
        original = dtls._recv_next
        failures = [0]

        async def recv_next(dtls: Any = dtls, original: Any = original,
                            failures: list[int] = failures) -> None:
            try:
                await original()
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception as exc:
                failures[0] += 1
                # Every call normally consumes one datagram; an error that repeats without
                # one in between would spin: that is a broken transport, let it close.
                if (dtls._ssl is None or dtls.state in ("closed", "failed")
                        or failures[0] > GUARD_MAX_CONSECUTIVE_ERRORS):
                    raise
                on_error(exc)
                await asyncio.sleep(0)
            else:
                failures[0] = 0

        dtls._recv_next = recv_next


def answer_as_dtls_server(pc: RTCPeerConnection) -> int:
    """Make the answer take the DTLS server role (``a=setup:passive``) wherever the offer left
    the choice to us (``a=setup:actpass``, what browsers send). Returns how many transports
    were switched.

    aiortc 1.16 answers ``actpass`` with ``active`` (``createAnswer`` turns a transport role of
    ``"auto"`` into ``"client"``): the answerer then sends its ClientHello only once its own ICE
    has completed, and is connected only after the browser's last flight came back, two round
    trips through the browser's processes after ICE. As the server, the browser's ClientHello
    (sent as soon as the browser's ICE is connected) is waiting when our DTLS starts, and we are
    connected (and send media) on the browser's second flight, one round trip earlier.
    ``RTCDtlsTransport._role`` is what ``createAnswer`` reads and ``start`` acts on; an offer
    of ``active`` already made it ``"server"``, one of ``passive`` made it nothing we change
    (``"auto"`` stays ``"client"`` in the answer: see the remote description's DTLS role).
    Call after ``setRemoteDescription`` and before ``createAnswer``."""
    switched = 0
    # The offer as aiortc parsed it (not parsed again: an offer's CPU is counted).
    remote = pc._RTCPeerConnection__remoteDescription()
    roles = [m.dtls.role for m in remote.media if m.dtls is not None] if remote else []
    for dtls in dtls_transports_of(pc):
        # "auto" in the offer is actpass; a remote "server" (passive) leaves ours "auto",
        # which must stay the client.
        if dtls._role == "auto" and roles and all(r == "auto" for r in roles):
            dtls._set_role("server")
            switched += 1
    return switched


# aioice's connect() tasks still tidying up after connect_promptly returned (kept referenced).
_tidying: set[asyncio.Task[None]] = set()
# Instance attributes connect_promptly sets on an aioice connection, removed again on close.
_CONNECTION_HOOKS = ("connect", "_check_list_maybe_complete")


def connect_promptly(connection: Connection) -> None:
    """Make ``connection.connect()`` return as soon as ICE has completed.

    aioice 0.13 ``Connection.connect`` paces its checks in a loop (``_check_periodic`` every
    20 ms, RFC 8445's Ta) that keeps going while more remote candidates may come, and only
    then waits for the check list's result. The engine never learns a browser's candidates
    from the offer (the browser's first check tells its address), so that loop runs until the
    check list is done, and completion (a nominated pair, found when a check arrives or
    succeeds, between two ticks) is noticed up to 20 ms late: DTLS starts that much later.
    ``_check_list_maybe_complete`` is where aioice completes the check list; hooked per
    connection, it wakes a wrapper of ``connect`` that returns at once. aioice's own
    ``connect`` goes on in the background to its next tick, where it cancels the remaining
    checks and starts consent freshness as usual. Failure and closing still come from
    ``connect`` itself (ConnectionError), and cancelling the wrapper cancels it. Call before
    ``setLocalDescription``: aiortc schedules its connect task in ``setRemoteDescription``
    already, and it runs (and calls ``connect``) while ``setLocalDescription`` awaits."""
    if "connect" in connection.__dict__:
        return
    original_connect = connection.connect
    original_complete = connection._check_list_maybe_complete
    completed = asyncio.Event()

    def check_list_maybe_complete() -> bool:
        done: bool = original_complete()
        if done:
            completed.set()
        return done

    async def connect() -> None:
        task = asyncio.ensure_future(original_connect())
        waiter = asyncio.ensure_future(completed.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            waiter.cancel()
        if task.done():
            task.result()
            return
        _tidying.add(task)
        task.add_done_callback(lambda task: _tidied(connection, task))

    connection.connect = connect
    connection._check_list_maybe_complete = check_list_maybe_complete


def _tidied(connection: Connection, task: asyncio.Task[None]) -> None:
    _tidying.discard(task)
    _forget_task_outcome(task)
    # Closed within those 20 ms: close() found no consent task to stop, and connect() may
    # just have started one, which would keep the closed connection alive for ever.
    consent = connection._query_consent_task
    if connection._closing and consent is not None and not consent.done():
        consent.cancel()


def break_reference_cycles(pc: RTCPeerConnection) -> None:
    """Cut the back-references that make a closed peer connection's objects a cycle, so they
    are freed by reference counting the moment the session lets go of them, without waiting
    for the cyclic garbage collector (whose full collections are rare under churn and whose
    pauses grow with the heap).

    The cycles (aiortc 1.16 / aioice 0.13, found with ``gc.DEBUG_SAVEALL`` on closed
    sessions): the peer connection's bound methods registered as listeners on its ICE
    gatherer, ICE and DTLS transports (pyee); the DTLS transport's RTP router holding the
    senders/receivers that hold the transport; the engine's hooks on the sender (closures
    over the session); aioice's check list and nominated pairs holding protocols whose
    ``receiver`` is the connection; finished tasks' exceptions (tracebacks hold frames whose
    locals are these objects). Only call this once ``pc.close()`` has returned."""
    pc.remove_all_listeners()
    for transceiver in pc.getTransceivers():
        sender, receiver = transceiver.sender, transceiver.receiver
        for name in _SENDER_HOOKS:
            sender.__dict__.pop(name, None)
        dtls = sender.transport
        for name in _DTLS_HOOKS:
            dtls.__dict__.pop(name, None)
        ice = dtls.transport
        connection = ice._connection
        for name in _CONNECTION_HOOKS:
            connection.__dict__.pop(name, None)
        for emitter in (dtls, ice, ice.iceGatherer):
            emitter.remove_all_listeners()
        router = dtls._rtp_router
        router.receivers.clear()
        router.senders.clear()
        router.mid_table.clear()
        router.ssrc_table.clear()
        router.payload_type_table.clear()
        for protocol in connection._protocols:
            protocol.receiver = None
        for pair in connection._check_list:
            pair.protocol = None
        connection._check_list.clear()
        connection._nominated.clear()
        connection._early_checks.clear()
        for task in (connection._query_consent_task, receiver._RTCRtpReceiver__rtcp_task,
                     sender._RTCRtpSender__rtcp_task, sender._RTCRtpSender__rtp_task):
            _forget_task_outcome(task)


def _forget_task_outcome(task: asyncio.Future[Any] | None) -> None:
    # A finished task keeps its exception, whose traceback keeps the frames (and their
    # ``self``) alive: read it so asyncio does not log it, then drop the reference.
    if task is None or not task.done() or task.cancelled():
        return
    exception = task.exception()
    if exception is not None:
        exception.__traceback__ = None


def _release_verify_callback(ssl: Any) -> None:
    # pyOpenSSL's _VerifyHelper holds its cffi callback, whose wrapper closes over the helper:
    # a cycle (with native callback memory) per DTLS context. Cut it on the helper's side.
    context = ssl.get_context()
    if getattr(context, _SHARED_CONTEXT, False):
        # A connection takes its context's helper (pyOpenSSL), here the one every connection
        # shares: nothing of its own to cut, and the shared one stays in use.
        return
    for owner in (ssl, context):
        helper = getattr(owner, "_verify_helper", None)
        if helper is not None:
            helper.callback = None


def set_local_credentials(connection: Connection, ufrag: str, password: str) -> None:
    """Replace the connection's generated ICE ufrag/password with the engine's (before the
    answer is created, so the answer carries them)."""
    aioice.ice.validate_username(ufrag)
    aioice.ice.validate_password(password)
    connection._local_username = ufrag
    connection._local_password = password


def install_local_candidates(
    connection: Connection, protocols: list[MuxStunProtocol], candidates: list[Candidate]
) -> None:
    """Give the connection its protocols and host candidates, marking gathering complete so
    ``gather_candidates`` binds nothing."""
    connection._protocols.extend(protocols)
    connection._local_candidates.extend(candidates)
    connection._local_candidates_start = True
    connection._local_candidates_end = True


def nominated_addresses(connection: Connection) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """``(local, remote)`` address of each nominated pair."""
    return [(pair.local_addr, pair.remote_addr) for pair in connection._nominated.values()]


def close_sockets_silently(connection: Connection) -> None:
    """Close a connection's sockets without telling the peer (a viewer that vanishes; tests)."""
    for protocol in connection._protocols:
        protocol.transport.close()


async def send_pli(receiver: Any, media_ssrc: int) -> None:
    """Make an ``RTCRtpReceiver`` send a Picture Loss Indication (what a browser does; tests)."""
    await receiver._send_rtcp_pli(media_ssrc)


def consent_expired(connection: Connection) -> bool:
    """Whether a connected ICE connection was closed by consent freshness (RFC 7675).

    ``query_consent`` clears ``_query_consent_task`` before closing on expiry, while ``close()``
    leaves the cancelled task in place.
    """
    return bool(connection._closing) and connection._query_consent_task is None


def set_consent_timing(interval_s: float, failures: int) -> tuple[float, int]:
    """Change aioice's consent freshness timing; returns the previous values (for tests)."""
    previous = (aioice.ice.CONSENT_INTERVAL, aioice.ice.CONSENT_FAILURES)
    aioice.ice.CONSENT_INTERVAL = interval_s  # type: ignore[assignment]
    aioice.ice.CONSENT_FAILURES = failures
    return previous


# ---------------------------------------------------------------------------------------------
# RTP sender


def forward_keyframe_requests(sender: RTCRtpSender, on_request: Callable[[], None]) -> None:
    """Route the sender's PLI/FIR handling (``_send_keyframe``) to ``on_request``."""
    sender._send_keyframe = on_request  # type: ignore[method-assign]


def count_retransmissions(sender: RTCRtpSender, on_nack: Callable[[int], None]) -> None:
    """Call ``on_nack(sequence_number)`` for every packet a NACK asks the sender to resend."""
    original = sender._retransmit

    async def retransmit(sequence_number: int) -> None:
        on_nack(sequence_number)
        await original(sequence_number)

    sender._retransmit = retransmit  # type: ignore[method-assign]


def sender_counters(sender: RTCRtpSender) -> tuple[int, int, float | None]:
    """``(packets_sent, payload_bytes_sent, rtt_seconds_or_None)`` of an RTP sender."""
    return (
        sender._RTCRtpSender__packet_count,  # type: ignore[attr-defined]
        sender._RTCRtpSender__octet_count,  # type: ignore[attr-defined]
        sender._RTCRtpSender__rtt,  # type: ignore[attr-defined]
    )


def installed_versions() -> tuple[str, str]:
    """``(aiortc.__version__, aioice.__version__)`` as installed."""
    return aiortc.__version__, aioice.__version__


# ---------------------------------------------------------------------------------------------
# The lean offer path


@dataclass(slots=True)
class _LeanOffer:
    video_codecs: list[RTCRtpCodecParameters]
    # SDP text -> the description already parsed (the offer) or built (the answer).
    parsed: dict[str, SessionDescription] = field(default_factory=dict)


_lean: ContextVar[_LeanOffer | None] = ContextVar("ruseon_lean_offer", default=None)
_original: dict[str, Any] = {}


def _lean_parse(cls: type[SessionDescription], sdp: str) -> SessionDescription:
    lean = _lean.get()
    if lean is not None:
        description = lean.parsed.pop(sdp, None)
        if description is not None:
            return description
    parsed: SessionDescription = _original["parse"](sdp)
    return parsed


def _lean_wrap(description: SessionDescription | None) -> Any:
    wrapped = _original["wrap_session_description"](description)
    lean = _lean.get()
    if lean is not None and description is not None and description.type == "answer":
        # createAnswer's description object: setLocalDescription gets it back instead of
        # parsing its text (add_transport_description assigns, so re-applying it is idempotent).
        lean.parsed[wrapped.sdp] = description
    return wrapped


def copy_codec(codec: RTCRtpCodecParameters) -> RTCRtpCodecParameters:
    """What ``deepcopy`` does, at a fraction of its cost: a codec that shares nothing with
    ``codec`` (the offer cache hands the same parsed offer to many sessions)."""
    return RTCRtpCodecParameters(
        mimeType=codec.mimeType, clockRate=codec.clockRate, channels=codec.channels,
        payloadType=codec.payloadType,
        rtcpFeedback=[RTCRtcpFeedback(type=f.type, parameter=f.parameter)
                      for f in codec.rtcpFeedback],
        parameters=dict(codec.parameters))


def lean_find_common_codecs(
    local_codecs: list[RTCRtpCodecParameters], remote_codecs: list[RTCRtpCodecParameters]
) -> list[RTCRtpCodecParameters]:
    """``rtcpeerconnection.find_common_codecs`` with shallow copies (same result)."""
    is_compatible = aiortc.rtcpeerconnection.is_codec_compatible
    dynamic = aiortc.rtp.DYNAMIC_PAYLOAD_TYPES
    common: list[RTCRtpCodecParameters] = []
    common_base: dict[int, RTCRtpCodecParameters] = {}
    for c in remote_codecs:
        if c.mimeType.lower().endswith("/rtx"):
            apt = c.parameters.get("apt")
            if (isinstance(apt, int) and apt in common_base
                    and c.clockRate == common_base[apt].clockRate):
                common.append(copy_codec(c))
            continue
        for local in local_codecs:
            if is_compatible(local, c):
                codec = copy_codec(local)
                if c.payloadType in dynamic:
                    codec.payloadType = c.payloadType
                codec.rtcpFeedback = [x for x in codec.rtcpFeedback if x in c.rtcpFeedback]
                common.append(codec)
                common_base[codec.payloadType] = codec
                break
    return common


def _lean_find_common_codecs(
    local_codecs: list[RTCRtpCodecParameters], remote_codecs: list[RTCRtpCodecParameters]
) -> list[RTCRtpCodecParameters]:
    lean = _lean.get()
    if lean is None:
        result: list[RTCRtpCodecParameters] = _original["find_common_codecs"](
            local_codecs, remote_codecs)
        return result
    if local_codecs is CODECS["video"]:
        # The session's preferences keep only these two entries afterwards anyway.
        local_codecs = lean.video_codecs
    return lean_find_common_codecs(local_codecs, remote_codecs)


def _lean_estimator(*args: Any, **kwargs: Any) -> Any:
    if _lean.get() is not None or _building_sendonly.get():
        return None  # a sendonly viewer's receiver never receives: no bandwidth estimation
    return _original["RemoteBitrateEstimator"](*args, **kwargs)


def unhooked(module: Any, name: str) -> Any:
    """``module.name`` as aiortc defines it, even after the lean offer hooks replaced it."""
    return _original.get(name, getattr(module, name))


def install_lean_offer_hooks() -> None:
    """Install the lean offer path's hooks once per process (idempotent)."""
    if _original:
        return
    _original["parse"] = SessionDescription.parse
    _original["wrap_session_description"] = aiortc.rtcpeerconnection.wrap_session_description
    _original["find_common_codecs"] = aiortc.rtcpeerconnection.find_common_codecs
    _original["RemoteBitrateEstimator"] = aiortc.rtcrtpreceiver.RemoteBitrateEstimator
    SessionDescription.parse = classmethod(_lean_parse)  # type: ignore[method-assign,assignment]
    aiortc.rtcpeerconnection.wrap_session_description = _lean_wrap
    aiortc.rtcpeerconnection.find_common_codecs = _lean_find_common_codecs
    aiortc.rtcrtpreceiver.RemoteBitrateEstimator = _lean_estimator


@contextlib.contextmanager
def lean_offer(
    offer_sdp: str, offer: SessionDescription, video_codecs: list[RTCRtpCodecParameters]
) -> Iterator[None]:
    """Answer one offer the lean way: ``offer`` is ``offer_sdp`` already parsed (aiortc gets
    it instead of parsing again), ``video_codecs`` the session's H.264 entry and its RTX."""
    install_lean_offer_hooks()
    token = _lean.set(_LeanOffer(video_codecs, {offer_sdp: offer}))
    try:
        yield
    finally:
        _lean.reset(token)


_building_sendonly: ContextVar[bool] = ContextVar("ruseon_building_sendonly", default=False)


def sendonly_peer_connection(
    configuration: aiortc.RTCConfiguration, certificate: RTCCertificate, track: Any
) -> tuple[RTCPeerConnection, aiortc.RTCRtpTransceiver]:
    """A new peer connection with one sendonly transceiver carrying ``track``, presenting
    ``certificate``, whose receiver gets no bandwidth estimator (as in :func:`lean_offer`).
    Built ahead of offers by the engine (``engine/prebuilt.py``); every call builds new
    objects (transports, ICE connection, SSRCs), nothing is shared but the certificate."""
    install_lean_offer_hooks()
    with shared_certificate(certificate):
        pc = RTCPeerConnection(configuration)
    token = _building_sendonly.set(True)
    try:
        transceiver = pc.addTransceiver(track, direction="sendonly")
    finally:
        _building_sendonly.reset(token)
    return pc, transceiver


def add_sendonly_transceiver(pc: RTCPeerConnection, track: Any) -> aiortc.RTCRtpTransceiver:
    """Add a sendonly transceiver carrying ``track`` to ``pc`` (whose receiver gets no
    bandwidth estimator, as in :func:`sendonly_peer_connection`)."""
    token = _building_sendonly.set(True)
    try:
        return pc.addTransceiver(track, direction="sendonly")
    finally:
        _building_sendonly.reset(token)


def ssl_context_factory(certificate: RTCCertificate) -> Callable[[list[Any]], Any]:
    """aiortc's own ``RTCCertificate._create_ssl_context`` for ``certificate``: a new
    ``SSL.Context`` (certificate, key, ciphers, SRTP profiles) for one DTLS connection."""
    original: Callable[..., Any] = RTCCertificate._create_ssl_context.__get__(certificate)

    def create(srtp_profiles: list[Any]) -> Any:
        return original(srtp_profiles=srtp_profiles)

    return create


# Marks an SSL.Context that every DTLS connection of the engine shares (share_ssl_contexts): it
# lives as long as the engine, so closing one connection must not cut its verify callback.
_SHARED_CONTEXT = "_ruseon_shared_by_every_connection"


def share_ssl_contexts(certificate: RTCCertificate) -> Callable[[], int]:
    """Make every DTLS transport presenting ``certificate`` share one ``SSL.Context`` per SRTP
    profile list (built on first use) instead of building its own when it starts.

    aiortc asks the (shared) certificate for a new context per connection: certificate and key
    converted and loaded again, about 0.27 ms of CPU and a context's native memory per viewer.
    aiortc only wraps the context in an ``SSL.Connection`` (``RTCDtlsTransport.start``) and
    never changes it afterwards, and OpenSSL copies a context's settings into each connection
    it makes, so one context serves them all. Its session cache is off, so a connection cannot
    resume another's session (as before: a context per connection had nothing to resume, and
    tickets were off already). Returns a function giving how many contexts were built."""
    create = ssl_context_factory(certificate)
    built: dict[tuple[bytes, ...], Any] = {}

    def create_ssl_context(srtp_profiles: list[Any]) -> Any:
        key = tuple(profile.openssl_profile for profile in srtp_profiles)
        context = built.get(key)
        if context is None:
            context = create(list(srtp_profiles))
            context.set_session_cache_mode(SSL.SESS_CACHE_OFF)
            setattr(context, _SHARED_CONTEXT, True)
            built[key] = context
        return context

    certificate._create_ssl_context = create_ssl_context  # type: ignore[method-assign]
    return lambda: len(built)


def identities_of(pc: RTCPeerConnection) -> Identities:
    """The values a peer connection's answer carries beside its ICE credentials: its CNAME
    and stream id and each transceiver's sender SSRCs and track id (``answer_template``).
    aiortc gives every sender of a connection its one stream id (the first one's is taken:
    a template learned from other ones would not render its answer, and is not kept)."""
    transceivers = pc.getTransceivers()
    return Identities(
        pc._RTCPeerConnection__cname,  # type: ignore[attr-defined]
        transceivers[0].sender._stream_id if transceivers else "",
        tuple(SenderIdentity(t.sender._ssrc, t.sender._rtx_ssrc, t.sender._track_id)
              for t in transceivers))


def impose_identities(pc: RTCPeerConnection, identities: Identities) -> None:
    """Give a new peer connection (transceivers added, no description set yet) the CNAME,
    SSRCs, stream and track ids of an answer already sent (``answer_template``).

    aiortc 1.16 draws them once: ``RTCPeerConnection.__init__`` the CNAME,
    ``RTCRtpSender.__init__`` the SSRCs, ``__createTransceiver`` the stream id (and tells the
    receiver the sender's SSRC for its RTCP), ``replaceTrack`` the track id; everything after
    (``createAnswer``, ``__localRtp``, the sender's RTCP) reads these attributes."""
    transceivers = pc.getTransceivers()
    if len(transceivers) != len(identities.senders):
        raise ValueError("identities for another number of transceivers")
    pc._RTCPeerConnection__cname = identities.cname  # type: ignore[attr-defined]
    for transceiver, identity in zip(transceivers, identities.senders, strict=True):
        sender = transceiver.sender
        sender._ssrc = identity.ssrc
        sender._rtx_ssrc = identity.rtx_ssrc
        sender._stream_id = identities.stream_id
        sender._track_id = identity.track_id
        transceiver.receiver._set_rtcp_ssrc(identity.ssrc)


def cache_fingerprints(certificate: RTCCertificate) -> None:
    """Compute the certificate's fingerprints once; aiortc asks for them several times per
    offer (``getFingerprints`` hashes the certificate with three digests each time)."""
    fingerprints = certificate.getFingerprints()
    certificate.getFingerprints = lambda: fingerprints  # type: ignore[method-assign]


# ---------------------------------------------------------------------------------------------
# The fan-out send path


class RtcpSink(Protocol):
    """What the DTLS transport's RTP router delivers RTCP to: the engine's per-viewer sender."""

    _ssrc: int

    async def _handle_rtcp_packet(self, packet: Any) -> None: ...


def sender_ssrcs(sender: RTCRtpSender) -> tuple[int, int]:
    """``(ssrc, rtx_ssrc)`` the answer's ``a=ssrc`` lines carry for this sender."""
    return sender._ssrc, sender._rtx_ssrc


def take_over_sending(
    sender: RTCRtpSender, on_start: Callable[[RTCRtpSendParameters], Awaitable[None]]
) -> None:
    """Make aiortc hand the sender's negotiated parameters to ``on_start`` when DTLS is up,
    instead of starting its own RTP and RTCP loops (``stop()`` is then a no-op)."""

    async def send(parameters: RTCRtpSendParameters) -> None:
        await on_start(parameters)

    sender.send = send  # type: ignore[method-assign]


def route_rtcp_to(sender: RTCRtpSender, sink: RtcpSink,
                  parameters: RTCRtpSendParameters) -> None:
    """Deliver RTCP about ``sink._ssrc`` (reports, NACK, PLI/FIR, REMB) to ``sink``."""
    sender.transport._register_rtp_sender(sink, parameters)


def srtp_session(sender: RTCRtpSender) -> Any:
    """The DTLS transport's outbound ``pylibsrtp.Session`` (None before DTLS completes)."""
    return sender.transport._tx_srtp


def transport_connected(sender: RTCRtpSender) -> bool:
    """Whether the sender's DTLS transport is connected (SRTP keys exist)."""
    return bool(sender.transport.state == "connected")


def nominated_pair(connection: Connection) -> tuple[Any, tuple[str, int]] | None:
    """``(protocol, remote_address)`` of component 1's nominated pair, or None."""
    pair = connection._nominated.get(1)
    if pair is None:
        return None
    return pair.protocol, pair.remote_addr


def tap_received_rtp(pc: RTCPeerConnection, on_packet: Callable[[Any], None]) -> None:
    """Call ``on_packet(RtpPacket)`` for every decrypted RTP packet a (client) peer connection
    receives, before aiortc routes it (tests: check SSRC, payload type, header extensions)."""
    for transceiver in pc.getTransceivers():
        transport = transceiver.receiver.transport
        if getattr(transport, "_ruseon_tapped", False):
            continue
        original = transport._handle_rtp_data
        ext_map = transport._rtp_header_extensions_map

        async def handle(data: bytes, arrival_time_ms: int, original: Any = original,
                         ext_map: Any = ext_map) -> None:
            on_packet(aiortc.rtp.RtpPacket.parse(data, ext_map))
            await original(data, arrival_time_ms)

        transport._handle_rtp_data = handle
        transport._ruseon_tapped = True


def discard_received_rtp(pc: RTCPeerConnection, on_packet: Callable[[int], None]) -> None:
    """Make a (client) peer connection count decrypted RTP packets (``on_packet(size)``) and
    drop them before parsing or decoding (benchmarks: many cheap viewers in one process)."""
    for transceiver in pc.getTransceivers():
        transport = transceiver.receiver.transport

        async def handle(data: bytes, arrival_time_ms: int) -> None:
            on_packet(len(data))

        transport._handle_rtp_data = handle


# ---------------------------------------------------------------------------------------------
# SRTP protection profiles offered in the DTLS handshake
#
# ``RTCDtlsTransport.__init__`` sets ``self._srtp_profiles = SRTP_PROFILES`` (the module list,
# AES-256-GCM first, only what this libsrtp build supports); ``start()`` passes it to
# ``RTCCertificate._create_ssl_context`` (``set_tlsext_use_srtp``) and ``_setup_srtp`` looks the
# negotiated OpenSSL name up in it. Replacing the attribute per transport before ``start()``
# changes what one connection offers and nothing else (test clients keep aiortc's list).


def available_srtp_profiles() -> dict[str, Any]:
    """aiortc's ``SRTPProtectionProfile`` objects this build supports, by OpenSSL name."""
    from aiortc import rtcdtlstransport

    return {p.openssl_profile.decode(): p for p in rtcdtlstransport.SRTP_PROFILES}


def offer_srtp_profiles(pc: RTCPeerConnection, profiles: list[Any]) -> None:
    """Make the connection's DTLS transports offer ``profiles`` (from
    :func:`available_srtp_profiles`), most preferred first. Call before the transports start
    (after ``setLocalDescription``, with no ``await`` in between)."""
    for dtls in dtls_transports_of(pc):
        dtls._srtp_profiles = list(profiles)


def dtls_role(pc: RTCPeerConnection) -> str | None:
    """The DTLS role (``"server"``/``"client"``) the peer connection's transport took."""
    for dtls in dtls_transports_of(pc):
        return str(dtls._role)
    return None


def selected_srtp_profile(pc: RTCPeerConnection) -> str | None:
    """The SRTP profile the DTLS handshake settled on (OpenSSL's name), None before/without."""
    for dtls in dtls_transports_of(pc):
        ssl = dtls._ssl
        if ssl is not None and dtls._tx_srtp is not None:
            name = ssl.get_selected_srtp_profile()
            if name:
                return str(name.decode())
    return None
