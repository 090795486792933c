"""One UDP port for every viewer's STUN, DTLS and SRTP.

aioice would bind a socket per interface per connection on a random port. Instead, the mux owns
one socket per address family on the configured port and hands each viewer's ICE connection
:class:`~.aiortc_internals.MuxStunProtocol` objects that send through it.

Routing (DESIGN.md): a datagram from a known remote address goes to the connection that address
was routed to. An unknown address may open a route only with a STUN Binding request whose
USERNAME starts with a live local ufrag *and* whose MESSAGE-INTEGRITY verifies with that
connection's password. Everything else is dropped and counted by reason; the mux never answers an
unauthenticated sender, so it cannot be used to reflect traffic.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import struct
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from aioice import Candidate, Connection, stun
from aioice.candidate import candidate_foundation, candidate_priority

from ruseon_appliance.config import HostPort
from ruseon_appliance.engine.aiortc_internals import MuxStunProtocol
from ruseon_appliance.engine.plausibility import SHAPE_DROP_REASONS, check_shape

logger = logging.getLogger(__name__)

# Sized for bursts: a 1080p keyframe is ~100-200 packets leaving at once, times every viewer.
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
# Datagrams read per readiness callback before yielding to the loop.
READ_BATCH = 64
# What viewers not connected yet send, kept while the engine holds (offer_burst.py): more than
# this many datagrams (or bytes) and the mux stops reading, the rest waiting in the socket's
# buffer (a flood of checks cannot grow the queue past them; a real check is ~100 bytes).
HELD_MAX = 4096
HELD_MAX_BYTES = 1 << 20
RECV_SIZE = 65536
# Remote addresses one connection may have routed (a client with several interfaces).
MAX_ROUTES_PER_CONNECTION = 8
# Binding requests per second from one remote address, and its burst allowance. ICE and consent
# need a few per second; anything beyond is a flood.
STUN_RATE_PER_SOURCE = 50.0
STUN_BURST_PER_SOURCE = 100.0
# Binding requests per second from unknown addresses altogether (each costs an HMAC).
STUN_RATE_UNKNOWN = 2000.0
STUN_BURST_UNKNOWN = 2000.0
_MAX_TRACKED_SOURCES = 4096
# How often rate-limit entries of sources that went quiet are dropped (each churned viewer
# leaves one behind otherwise, until the table fills).
_SOURCE_SWEEP_INTERVAL_S = 10.0

_STUN_COOKIE = struct.pack("!I", stun.COOKIE)

# Drop reasons, each its own counter (also listed so stats() always shows all of them).
DROP_REASONS = (
    "garbage",  # neither STUN, DTLS nor RTP: random bytes
    "stun_truncated",  # STUN header with a length that does not match the datagram
    "stun_malformed",  # STUN that does not parse
    "stun_not_request",  # an unsolicited STUN response/indication from an unknown address
    "stun_no_credentials",  # Binding request without USERNAME or MESSAGE-INTEGRITY
    "stun_unknown_ufrag",  # USERNAME names no live session
    "stun_bad_integrity",  # MESSAGE-INTEGRITY does not verify with that session's password
    "stun_flood",  # over the Binding request rate limit
    "dtls_unknown_source",  # DTLS from an address that has not authenticated
    "rtp_unknown_source",  # RTP/RTCP from an address that has not authenticated
    "route_limit",  # a connection already has MAX_ROUTES_PER_CONNECTION addresses
    "pending_queue_full",  # a pending session already holds PENDING_QUEUE checks
    "no_family_socket",  # should not happen: a route for a family with no protocol
    # From a routed address (spoofable on a LAN): what does not fit the route is not passed on.
    "stun_not_binding",  # a STUN request of another method
    "stun_unsolicited",  # a STUN response to no transaction of this connection
    "stun_indication",  # a STUN indication (ICE needs none)
    # Shape (plausibility.py): not a plausible STUN message / DTLS record / SRTP packet.
    *(r for r in SHAPE_DROP_REASONS if r not in ("garbage", "stun_truncated")),
)


class _TokenBucket:
    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.stamp = rate, burst, burst, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(eq=False, slots=True)
class IceEndpoint:
    """One viewer's presence on the mux: its ufrag/password, protocols and candidates."""

    ufrag: str
    password: bytes
    connection: Connection
    protocols: dict[int, MuxStunProtocol]
    candidates: list[Candidate]
    routes: set[tuple[str, int]] = field(default_factory=set)
    # Connected (ICE and DTLS): its datagrams are never held (UdpMux.pause_reading).
    established: bool = False


# Valid checks a pending session keeps while its connection is being built (a browser sends
# one per candidate pair, and retransmits each: more would only be retransmissions).
PENDING_QUEUE = 16


@dataclass(eq=False, slots=True)
class PendingEndpoint:
    """A session answered but not built (engine: a lazy session): its ufrag and password, and
    the valid checks received for it while its connection is built. ``on_check`` is called
    once, on the first one."""

    ufrag: str
    password: bytes
    on_check: Callable[[], None]
    queued: list[tuple[bytes, tuple[str, int]]] = field(default_factory=list)
    checked: bool = False


_HOST_PRIORITY = candidate_priority(1, "host")


def _normalize(addr: tuple[object, ...]) -> tuple[str, int]:
    host = str(addr[0])
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]
    return host, int(addr[1])  # type: ignore[call-overload]


def _set_buffer(sock: socket.socket, force_opt: int | None, opt: int, size: int) -> int:
    # SO_*BUFFORCE (root / CAP_NET_ADMIN) ignores net.core.[rw]mem_max, which defaults small.
    if force_opt is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, force_opt, size)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
    else:
        sock.setsockopt(socket.SOL_SOCKET, opt, size)
    return int(sock.getsockopt(socket.SOL_SOCKET, opt))


class UdpMux:
    """The single-port ICE UDP mux.

    Give it the listen address (``0.0.0.0`` / ``::`` / a literal) or already-open sockets
    (systemd socket activation). ``register`` a connection to get its protocols and host
    candidates; ``unregister`` removes it and every route to it.
    """

    def __init__(
        self,
        listen: HostPort,
        *,
        sockets: Sequence[socket.socket] = (),
        buffer_bytes: int = SOCKET_BUFFER_BYTES,
    ) -> None:
        self._listen = listen
        self._given = list(sockets)
        self._buffer_bytes = buffer_bytes
        self._sockets: dict[int, socket.socket] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # While the engine answers offers (offer_burst.py): new viewers' datagrams wait in
        # _held; connected viewers' do not (pause_reading).
        self._holding = False
        self._held: deque[tuple[bytes, tuple[str, int]]] = deque()
        self._held_bytes = 0
        self._reading_paused = False  # the readers removed: _held was full
        self._by_ufrag: dict[str, IceEndpoint] = {}
        self._pending: dict[str, PendingEndpoint] = {}
        # Advertised address -> (host, family, foundation), see _host_candidate_fields.
        self._candidate_fields: dict[str, tuple[str, int, str]] = {}
        self._routes: dict[tuple[str, int], MuxStunProtocol] = {}
        self._endpoint_of: dict[MuxStunProtocol, IceEndpoint] = {}
        self._source_buckets: dict[tuple[str, int], _TokenBucket] = {}
        self._unknown_bucket = _TokenBucket(STUN_RATE_UNKNOWN, STUN_BURST_UNKNOWN, time.monotonic())
        self._next_source_sweep = time.monotonic() + _SOURCE_SWEEP_INTERVAL_S
        self.dropped: Counter[str] = Counter({reason: 0 for reason in DROP_REASONS})
        self.counters: Counter[str] = Counter()
        self.buffer_sizes: dict[str, int] = {}
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Open (or adopt) the sockets and start reading."""
        self._loop = asyncio.get_running_loop()
        sockets = self._given or self._open_sockets()
        for sock in sockets:
            if sock.type != socket.SOCK_DGRAM:
                raise ValueError(f"UDP mux needs a datagram socket, got {sock!r}")
            sock.setblocking(False)
            fam = "ipv6" if sock.family == socket.AF_INET6 else "ipv4"
            self.buffer_sizes[f"{fam}_rcvbuf"] = _set_buffer(
                sock, getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF, self._buffer_bytes)
            self.buffer_sizes[f"{fam}_sndbuf"] = _set_buffer(
                sock, getattr(socket, "SO_SNDBUFFORCE", None), socket.SO_SNDBUF, self._buffer_bytes)
            self._sockets[sock.family] = sock
            self.port = sock.getsockname()[1]
            self._loop.add_reader(sock.fileno(), self._on_readable, sock)
        logger.info("UDP mux on port %d (%s)", self.port,
                    ", ".join(str(s.getsockname()[0]) for s in self._sockets.values()))

    def pause_reading(self) -> None:
        """Hold what can wait until :meth:`resume_reading` (the engine does this while it
        answers offers and builds sessions: offer_burst.py): what new viewers send is kept, in
        arrival order: STUN from addresses no viewer has validated (ICE checks) and anything
        from the addresses of viewers not connected yet (:meth:`mark_established`: their
        DTLS handshakes). Datagrams of connected viewers (RTCP, consent checks) are handled at
        once, and anything else from unknown addresses is dropped at once, as always. More than
        :data:`HELD_MAX` (or :data:`HELD_MAX_BYTES`) kept and the mux stops reading (the rest
        waits in the socket's buffer)."""
        if self._holding or self._loop is None:
            return
        self._holding = True

    def resume_reading(self) -> None:
        """Handle what was kept (on the next loop iteration) and read everything again."""
        if not self._holding or self._loop is None:
            return
        self._holding = False
        if self._held:
            self._loop.call_soon(self._handle_held)
        elif self._reading_paused:
            self._add_readers()

    def _handle_held(self) -> None:
        held = self._held
        while held and not self._holding:
            data, addr = held.popleft()
            self._held_bytes -= len(data)
            self._dispatch_logged(data, addr)
        if not held and not self._holding and self._reading_paused:
            self._add_readers()  # after what was kept: arrival order

    def _add_readers(self) -> None:
        self._reading_paused = False
        if self._loop is not None:
            for sock in self._sockets.values():
                self._loop.add_reader(sock.fileno(), self._on_readable, sock)

    def _open_sockets(self) -> list[socket.socket]:
        port = self._listen.port
        hosts = self._listen.bind_hosts()
        opened: list[socket.socket] = []
        for h in hosts:
            family = socket.AF_INET6 if ":" in h else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_DGRAM)
            try:
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((h, port))
            except OSError:
                sock.close()
                if len(hosts) > 1 and family == socket.AF_INET6:
                    logger.warning("IPv6 unavailable; UDP mux listens on IPv4 only")
                    continue
                for s in opened:
                    s.close()
                raise
            # With port 0 (tests), every family shares the port the first one got.
            port = sock.getsockname()[1]
            opened.append(sock)
        return opened

    def close(self) -> None:
        """Stop reading and close the sockets. Sessions must have been closed first."""
        for sock in self._sockets.values():
            if self._loop is not None:
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets.clear()
        self._reading_paused = self._holding = False
        self._held.clear()
        self._held_bytes = 0

    @property
    def families(self) -> list[int]:
        """Address families with an open socket."""
        return list(self._sockets)

    # -- registration ----------------------------------------------------------------------------

    def register(self, connection: Connection, advertise: Iterable[str]) -> IceEndpoint:
        """Create the protocols and host candidates for ``connection`` (one candidate per
        advertised address whose family has a socket, all on :attr:`port`)."""
        ufrag = connection.local_username
        if ufrag in self._by_ufrag:
            raise ValueError(f"ICE ufrag {ufrag!r} is already registered")
        pending = self._pending.get(ufrag)
        if pending is not None and pending.password != connection.local_password.encode():
            raise ValueError(f"ICE ufrag {ufrag!r} is pending with another password")
        protocols: dict[int, MuxStunProtocol] = {}
        candidates: list[Candidate] = []
        for address in advertise:
            host, family, foundation = self._host_candidate_fields(address)
            sock = self._sockets.get(family)
            if sock is None:
                continue
            # A Candidate of its own per viewer (aioice keeps it in the connection's state).
            candidate = Candidate(
                foundation=foundation,
                component=1,
                transport="udp",
                priority=_HOST_PRIORITY,
                host=host,
                port=self.port,
                type="host",
            )
            candidates.append(candidate)
            if family not in protocols:
                protocols[family] = MuxStunProtocol(
                    connection, self, family, candidate, (host, self.port))
        endpoint = IceEndpoint(ufrag, connection.local_password.encode(), connection,
                               protocols, candidates)
        self._by_ufrag[ufrag] = endpoint
        for protocol in protocols.values():
            self._endpoint_of[protocol] = endpoint
        return endpoint

    def _host_candidate_fields(self, address: str) -> tuple[str, int, str]:
        """``(host, family, foundation)`` of an advertised address, worked out once per
        address (the same for every viewer's offer)."""
        fields = self._candidate_fields.get(address)
        if fields is None:
            ip = ipaddress.ip_address(address)
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            fields = (str(ip), family, candidate_foundation("host", "udp", str(ip)))
            if len(self._candidate_fields) < 64:
                self._candidate_fields[address] = fields
        return fields

    def register_pending(self, ufrag: str, password: str, on_check: Callable[[], None]) -> None:
        """Accept checks for ``ufrag`` before its connection exists: the first Binding request
        that authenticates with ``password`` calls ``on_check()`` (once); it and every later
        valid one (up to :data:`PENDING_QUEUE`) wait until :meth:`register` is called for a
        connection with these credentials and :meth:`replay` delivers them. Nothing is ever
        answered for a pending ufrag."""
        if ufrag in self._by_ufrag or ufrag in self._pending:
            raise ValueError(f"ICE ufrag {ufrag!r} is already registered")
        self._pending[ufrag] = PendingEndpoint(ufrag, password.encode(), on_check)

    def take_pending(self, ufrag: str) -> list[tuple[bytes, tuple[str, int]]]:
        """The checks kept for a pending ufrag, which is then forgotten (call once its
        connection is registered; :meth:`replay` them)."""
        pending = self._pending.pop(ufrag, None)
        return pending.queued if pending is not None else []

    def replay(self, datagrams: list[tuple[bytes, tuple[str, int]]]) -> None:
        """Dispatch kept datagrams as if they had just arrived (their route now opens as any
        other: their integrity is checked again against the registered connection)."""
        for data, addr in datagrams:
            self._dispatch_logged(data, addr)

    def _dispatch_logged(self, data: bytes, addr: tuple[str, int]) -> None:
        """:meth:`_dispatch` a datagram that was kept (one bad datagram stops nothing)."""
        try:
            self._dispatch(data, addr)
        except Exception:
            logger.exception("UDP mux: error handling a datagram")
            self.counters["dispatch_errors"] += 1

    @property
    def pending_count(self) -> int:
        """Pending ufrags (sessions answered whose connection is not built)."""
        return len(self._pending)

    def unregister(self, ufrag: str) -> None:
        """Forget a connection: its ufrag and every route to it (idempotent)."""
        self._pending.pop(ufrag, None)
        endpoint = self._by_ufrag.pop(ufrag, None)
        if endpoint is None:
            return
        for addr in endpoint.routes:
            self._routes.pop(addr, None)
            self._source_buckets.pop(addr, None)
        endpoint.routes.clear()
        for protocol in endpoint.protocols.values():
            self._endpoint_of.pop(protocol, None)

    def mark_established(self, ufrag: str) -> None:
        """The viewer with ``ufrag`` is connected (ICE and DTLS): from now on its datagrams are
        handled at once, also while the engine holds (:meth:`pause_reading`)."""
        endpoint = self._by_ufrag.get(ufrag)
        if endpoint is not None:
            endpoint.established = True

    def routes_for(self, ufrag: str) -> set[tuple[str, int]]:
        """Remote addresses currently routed to the connection with ``ufrag``."""
        endpoint = self._by_ufrag.get(ufrag)
        return set(endpoint.routes) if endpoint else set()

    @property
    def route_count(self) -> int:
        """Remote addresses routed, over all connections."""
        return len(self._routes)

    def is_live(self, ufrag: str) -> bool:
        """Whether ``ufrag`` belongs to a registered connection or a pending one."""
        return ufrag in self._by_ufrag or ufrag in self._pending

    def socket_for(self, family: int) -> socket.socket | None:
        """The mux socket of an address family (the fan-out sends media on it directly)."""
        return self._sockets.get(family)

    # -- DatagramSink (used by MuxStunProtocol) --------------------------------------------------

    def send_datagram(self, data: bytes, addr: tuple[str, int], family: int) -> None:
        """Send ``data`` from the mux socket of ``family``; drop (and count) if the kernel
        buffer is full rather than queueing: stale media is worse than lost media."""
        sock = self._sockets.get(family)
        if sock is None:
            self.counters["send_no_socket"] += 1
            return
        try:
            sock.sendto(data, addr)
        except BlockingIOError:
            self.counters["send_dropped_full"] += 1
        except OSError:
            self.counters["send_errors"] += 1
        else:
            self.counters["datagrams_out"] += 1
            self.counters["bytes_out"] += len(data)

    def protocol_closed(self, protocol: MuxStunProtocol) -> None:
        """A connection closed this protocol: remove its routes."""
        endpoint = self._endpoint_of.pop(protocol, None)
        if endpoint is None:
            return
        for addr in [a for a in endpoint.routes if self._routes.get(a) is protocol]:
            del self._routes[addr]
            self._source_buckets.pop(addr, None)
            endpoint.routes.discard(addr)
        del endpoint.protocols[protocol.family]
        if not endpoint.protocols and self._by_ufrag.get(endpoint.ufrag) is endpoint:
            del self._by_ufrag[endpoint.ufrag]

    # -- receive path ----------------------------------------------------------------------------

    def _on_readable(self, sock: socket.socket) -> None:
        for _ in range(READ_BATCH):
            try:
                data, raw_addr = sock.recvfrom(RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # e.g. ICMP port unreachable reported on the socket: nothing to read.
                self.counters["recv_errors"] += 1
                return
            self.counters["datagrams_in"] += 1
            self.counters["bytes_in"] += len(data)
            addr = _normalize(raw_addr)
            if (self._holding or self._held) and self._waits(data, addr):
                self._hold(data, addr)
                if self._reading_paused:
                    return
                continue
            try:
                self._dispatch(data, addr)
            except Exception:  # one bad datagram must never stop the reader
                logger.exception("UDP mux: error handling a datagram")
                self.counters["dispatch_errors"] += 1

    def _waits(self, data: bytes, addr: tuple[str, int]) -> bool:
        """Whether a datagram waits for the hold to end (see :meth:`pause_reading`)."""
        protocol = self._routes.get(addr)
        if protocol is None:
            return bool(data) and data[0] < 4  # STUN: a new viewer's check; the rest drops
        endpoint = self._endpoint_of.get(protocol)
        return endpoint is None or not endpoint.established

    def _hold(self, data: bytes, addr: tuple[str, int]) -> None:
        """Keep a datagram until the hold ends; stop reading when the queue is full."""
        self._held.append((data, addr))
        self._held_bytes += len(data)
        self.counters["held"] += 1
        full = len(self._held) >= HELD_MAX or self._held_bytes >= HELD_MAX_BYTES
        if full and not self._reading_paused and self._loop is not None:
            self._reading_paused = True
            self.counters["held_full"] += 1
            for sock in self._sockets.values():
                self._loop.remove_reader(sock.fileno())

    def _dispatch(self, data: bytes, addr: tuple[str, int]) -> None:
        if not data:
            # aiortc's DTLS loop reads data[0]: one empty datagram ended a session (issue 12).
            self.dropped["empty"] += 1
            return
        if len(data) < 2:
            self.dropped["too_short"] += 1
            return
        first = data[0]
        protocol = self._routes.get(addr)
        if first < 4:
            self._dispatch_stun(data, addr, protocol)
        elif protocol is not None:
            # A routed address is only an address: anyone on the LAN can send from it. Only
            # what is shaped like DTLS or SRTP(C) reaches aiortc (whose parsers assume that).
            reason = check_shape(data)
            if reason is not None:
                self.dropped[reason] += 1
                return
            protocol.datagram_received(data, addr)
        elif 20 <= first <= 63:
            self.dropped["dtls_unknown_source"] += 1
        elif 128 <= first <= 191:
            self.dropped["rtp_unknown_source"] += 1
        else:
            self.dropped["garbage"] += 1

    def _dispatch_stun(self, data: bytes, addr: tuple[str, int],
                       protocol: MuxStunProtocol | None) -> None:
        if len(data) < 8 or data[4:8] != _STUN_COOKIE:
            self.dropped["garbage"] += 1
            return
        if len(data) < 20 or len(data) != 20 + struct.unpack_from("!H", data, 2)[0]:
            self.dropped["stun_truncated"] += 1
            return
        is_request = (struct.unpack_from("!H", data, 0)[0] & 0x0110) == 0
        if is_request and not self._take_token(addr, protocol is None):
            self.dropped["stun_flood"] += 1
            return
        try:
            message = stun.parse_message(data)
        except Exception:  # ValueError, struct.error, UnicodeDecodeError: all malformed
            self.dropped["stun_malformed"] += 1
            return
        if protocol is not None:
            # A known address asking for another session (a client reusing its port) must
            # authenticate for that session like any unknown address.
            username = message.attributes.get("USERNAME")
            if not (is_request and isinstance(username, str)
                    and username.partition(":")[0] != self._endpoint_of[protocol].ufrag):
                reason = self._check_routed_stun(message, protocol)
                if reason is not None:
                    self.dropped[reason] += 1
                    return
                protocol.datagram_received(data, addr)
                return
        if (message.message_class != stun.Class.REQUEST
                or message.message_method != stun.Method.BINDING):
            self.dropped["stun_not_request"] += 1
            return
        username = message.attributes.get("USERNAME")
        if not isinstance(username, str) or "MESSAGE-INTEGRITY" not in message.attributes:
            self.dropped["stun_no_credentials"] += 1
            return
        endpoint = self._by_ufrag.get(username.partition(":")[0])
        if endpoint is None:
            pending = self._pending.get(username.partition(":")[0])
            if pending is None:
                self.dropped["stun_unknown_ufrag"] += 1
            else:
                self._pending_check(pending, message, data, addr)
            return
        if not message.check_message_integrity(endpoint.password):
            self.dropped["stun_bad_integrity"] += 1
            return
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        target = endpoint.protocols.get(family)
        if target is None:
            self.dropped["no_family_socket"] += 1
            return
        if addr not in endpoint.routes and len(endpoint.routes) >= MAX_ROUTES_PER_CONNECTION:
            self.dropped["route_limit"] += 1
            return
        previous = self._routes.get(addr)
        if previous is not None and previous is not target:
            old = self._endpoint_of.get(previous)
            if old is not None:
                old.routes.discard(addr)
        self._routes[addr] = target
        endpoint.routes.add(addr)
        self.counters["routes_opened"] += 1
        target.datagram_received(data, addr)

    def _pending_check(self, pending: PendingEndpoint, message: stun.Message, data: bytes,
                       addr: tuple[str, int]) -> None:
        if not message.check_message_integrity(pending.password):
            self.dropped["stun_bad_integrity"] += 1
            return
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        if family not in self._sockets:
            self.dropped["no_family_socket"] += 1
            return
        if len(pending.queued) >= PENDING_QUEUE:
            self.dropped["pending_queue_full"] += 1
            return
        pending.queued.append((data, addr))
        self.counters["pending_checks"] += 1
        if not pending.checked:
            pending.checked = True
            pending.on_check()

    def _check_routed_stun(self, message: stun.Message,
                           protocol: MuxStunProtocol) -> str | None:
        """Why a STUN message from a routed address must not reach its connection, if so.

        Requests must authenticate for the route's own session, exactly as the one that opened
        the route did (aioice would answer a bad one with an error, to an address that may be
        forged); responses must answer a transaction the connection has open (aioice verifies
        their integrity itself)."""
        if message.message_class == stun.Class.REQUEST:
            if message.message_method != stun.Method.BINDING:
                return "stun_not_binding"
            if ("USERNAME" not in message.attributes
                    or "MESSAGE-INTEGRITY" not in message.attributes):
                return "stun_no_credentials"
            if not message.check_message_integrity(self._endpoint_of[protocol].password):
                return "stun_bad_integrity"
            return None
        if message.message_class == stun.Class.INDICATION:
            return "stun_indication"
        if message.transaction_id not in protocol.transactions:
            return "stun_unsolicited"
        return None

    def _take_token(self, addr: tuple[str, int], unknown: bool) -> bool:
        now = time.monotonic()
        if now >= self._next_source_sweep:
            self._sweep_sources(now)
        bucket = self._source_buckets.get(addr)
        if bucket is None:
            if len(self._source_buckets) >= _MAX_TRACKED_SOURCES:
                # Bounded memory under a spoofed-source flood; limits restart from full.
                self._source_buckets.clear()
            bucket = self._source_buckets[addr] = _TokenBucket(
                STUN_RATE_PER_SOURCE, STUN_BURST_PER_SOURCE, now)
        if not bucket.take(now):
            return False
        return not unknown or self._unknown_bucket.take(now)

    def _sweep_sources(self, now: float) -> None:
        """Forget the rate limits of sources whose bucket has refilled (quiet long enough that a
        fresh bucket would be identical)."""
        self._next_source_sweep = now + _SOURCE_SWEEP_INTERVAL_S
        buckets = self._source_buckets
        for addr in [a for a, b in buckets.items()
                     if b.tokens + (now - b.stamp) * b.rate >= b.burst]:
            del buckets[addr]

    def stats(self) -> dict[str, object]:
        """Counters: datagrams in/out, drops per reason, live ufrags and routes, buffer sizes."""
        return {
            "port": self.port,
            # Registered ufrags: connections built, and pending ones (not built yet).
            "sessions": len(self._by_ufrag) + len(self._pending),
            "pending": len(self._pending),
            "routes": len(self._routes),
            "tracked_sources": len(self._source_buckets),
            "held_now": len(self._held),
            "dropped": dict(self.dropped),
            **dict(self.counters),
            **self.buffer_sizes,
        }
