"""The RTSP server (RFC 2326, RTSP 1.0 as NVRs and players speak it).

One path per camera: ``rtsp://HOST:8554/<camera>``; ``/`` and ``/stream`` are the first camera;
``/<camera>/sub`` a camera's sub-stream (a source of its own, named so by ``app.py``).
Methods: OPTIONS, DESCRIBE, SETUP (``RTP/AVP/TCP;interleaved`` or ``RTP/AVP;unicast;
client_port``), PLAY, PAUSE, TEARDOWN, GET_PARAMETER / SET_PARAMETER (keep-alives). No option
tag is supported: a request with ``Require:`` is answered 551 with ``Unsupported:``.

Tracks: ``trackID=0`` the picture (H.264); for a camera with sound (``RtspSource.audio``)
``trackID=1``, AAC (rtsp/audio.py). A session is one camera: its first SETUP (of either track)
makes it, a SETUP with its ``Session`` adds the other track (before PLAY), each track with a
transport of its own; PLAY, PAUSE and TEARDOWN act on both.

Sessions (``Session: id;timeout=60``): a TCP-interleaved session lives as long as its
connection; a UDP session as long as its client shows signs of life (a request naming it, or
any datagram from it, e.g. its receiver reports) within the timeout, and is reaped otherwise.
OPTIONS needs no credentials, so it keeps a session alive only when it has them. A UDP session
may be taken over by another connection of the same client address, within that connection's
:data:`MAX_SESSIONS_PER_CONNECTION`.

Limits: request heads of :data:`~message.MAX_HEAD_BYTES`, bodies of
:data:`~message.MAX_BODY_BYTES`, ``max_clients`` connections and sessions (more: 503); a request
that cannot be parsed is answered 400 and its connection closed. Authentication (when the
appliance has a token) is in :mod:`.auth`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from ruseon_appliance.access.policy import Access, rtsp_access
from ruseon_appliance.access.throttle import FailureThrottle
from ruseon_appliance.config import RtspConfig
from ruseon_appliance.listening import bind_every_host
from ruseon_appliance.relay.sdp import parameter_sets
from ruseon_appliance.rtsp.audio import RtspAudio, RtspAudioFeed, RtspAudioTrack
from ruseon_appliance.rtsp.auth import RtspAuth
from ruseon_appliance.rtsp.message import (
    MAX_HEAD_BYTES,
    BadRequest,
    RtspRequest,
    RtspResponse,
    TransportSpec,
    content_length,
    parse_head,
    parse_transport,
)
from ruseon_appliance.rtsp.sdp import AUDIO_TRACK_CONTROL, TRACK_CONTROL, describe_sdp
from ruseon_appliance.rtsp.session import TCP_BUFFER_LIMIT, RtspFeed, RtspSession
from ruseon_appliance.stream.fanout import Fanout
from ruseon_appliance.tasks import cancel_and_wait

if TYPE_CHECKING:
    from ruseon_appliance.access.credentials import Credentials

logger = logging.getLogger(__name__)

SESSION_TIMEOUT_S = 60.0
# A request that has begun must be complete within this (slow senders hold a slot otherwise).
REQUEST_TIMEOUT_S = 10.0
# How often idle UDP sessions are looked for.
REAP_INTERVAL_S = 5.0
# The kernel's send buffer per connection (Linux doubles it): with the user-space limit of
# session.TCP_BUFFER_LIMIT it bounds what a slow client costs and how soon it is skipped to the
# next keyframe. 256 KiB is ~250 ms of an 8 Mbit/s stream, and no limit on a LAN's throughput.
SOCKET_SEND_BUFFER = 256 * 1024
# Sessions one connection may hold (one per camera is what clients do).
MAX_SESSIONS_PER_CONNECTION = 8

PUBLIC = "OPTIONS, DESCRIBE, SETUP, PLAY, PAUSE, TEARDOWN, GET_PARAMETER, SET_PARAMETER"
_KNOWN = frozenset(PUBLIC.replace(",", " ").split())
_NOT_ALLOWED = frozenset({"ANNOUNCE", "RECORD", "REDIRECT"})


# What /metrics exports of stats(): (key, "counter" or "gauge", help). Counters get "_total".
METRICS = (
    ("clients", "gauge", "RTSP connections open."),
    ("sessions", "gauge", "RTSP sessions set up."),
    ("playing", "gauge", "RTSP sessions playing."),
    ("bytes_sent", "counter", "Bytes of RTP (with interleaved framing) sent to RTSP clients."),
    ("packets_sent", "counter", "RTP packets sent to RTSP clients."),
    ("frames_sent", "counter", "Frames sent to RTSP clients."),
    ("frames_skipped", "counter",
     "Frames RTSP clients did not get (joining, or too slow: skipped to a keyframe)."),
    ("keyframe_skips", "counter", "Times an RTSP client fell behind and skipped to a keyframe."),
    ("keyframe_requests_received", "counter", "PLI/FIR received from RTSP clients."),
    ("send_errors", "counter", "RTP packets to RTSP clients that could not be sent."),
    ("sessions_total", "counter", "RTSP sessions set up since start."),
    ("sessions_reaped", "counter", "UDP sessions closed for showing no sign of life."),
    ("auth_failures", "counter", "RTSP requests with wrong credentials."),
    ("auth_challenges", "counter", "RTSP requests without credentials (answered 401)."),
    ("auth_throttled", "counter",
     "RTSP requests refused (429) while their address waits after wrong credentials."),
    ("auth_replays", "counter",
     "RTSP Digest requests refused for re-using a request count (nc) of their nonce."),
    ("bad_requests", "counter", "RTSP requests that could not be parsed (400, closed)."),
    ("rejected_full", "counter", "RTSP connections or sessions refused at max_clients (503)."),
    ("audio_sessions", "gauge", "RTSP sessions with the sound's track set up."),
    ("audio_frames_sent", "counter", "AAC frames sent to RTSP clients."),
    ("audio_bytes_sent", "counter",
     "Bytes of the sound's RTP (with interleaved framing) sent to RTSP clients."),
    ("audio_frames_dropped", "counter",
     "AAC frames RTSP clients did not get (their connection was full, or lapped)."),
)


@dataclass(frozen=True, slots=True)
class RtspSource:
    """One camera as the server offers it (built in ``app.py``; the name is its URL path)."""

    name: str
    feed: RtspFeed
    fanout: Fanout
    framerate: int
    catch_up_max_frames: int
    keyframe_interval_frames: int
    # A source that cannot make a keyframe on demand: the GOP so far (up to this many bytes)
    # goes out at PLAY, as for a WebRTC viewer, instead of a still picture until the next IDR.
    catch_up_max_bytes: int = 0
    # The camera's sound (``Camera.audio``): offered as a second track (AAC, rtsp/audio.py).
    audio: RtspAudio | None = None


def _plain_ip(host: str) -> str:
    """``127.0.0.1`` for ``::ffff:127.0.0.1`` (a dual-stack socket's IPv4 peer); an IPv6 zone
    (``fe80::1%eth0``) is left out: the address is the client's identity (nonces, sessions),
    the zone travels apart as a scope id (:func:`_scope_id`), needed to send to it."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


class _TooManySessions(Exception):
    """A connection at MAX_SESSIONS_PER_CONNECTION named another session to take over."""


def _scope_id(address: Any) -> int:
    """The scope id of a socket address (an IPv6 link-local one's interface), else 0."""
    if isinstance(address, tuple) and len(address) == 4:
        return int(address[3])
    return 0


@dataclass(eq=False)
class _Connection:
    writer: asyncio.StreamWriter
    peer: tuple[str, int]
    local: tuple[str, int]
    # IPv6 link-local addresses mean nothing without their interface: UDP to the client and
    # the UDP sockets' own address need these.
    peer_scope: int = 0
    local_scope: int = 0
    full: bool = False
    sessions: list[RtspSession] = field(default_factory=list)

    def playing(self) -> bool:
        return any(s.state == "playing" for s in self.sessions)


class RtspServer:
    """Serves every camera over RTSP (see the module docstring). Built and owned by ``app.py``."""

    def __init__(
        self,
        config: RtspConfig,
        sources: Sequence[RtspSource],
        *,
        token: str = "",
        credentials: Credentials | None = None,
        buffer_limit: int = TCP_BUFFER_LIMIT,
        socket_send_buffer: int = SOCKET_SEND_BUFFER,
        session_timeout_s: float = SESSION_TIMEOUT_S,
        default: str = "",
        absent: Mapping[str, str] | None = None,
        extra_passwords: Callable[[], list[str]] | None = None,
    ) -> None:
        if not sources:
            raise ValueError("an RTSP server needs at least one camera")
        self.config = config
        self.sources = {source.name: source for source in sources}
        # What rtsp://HOST:PORT/ and /stream play: the default camera (the first by default).
        self.default = self.sources.get(default) or sources[0]
        # Paths that name a stream there is not (a camera's /sub without one): why, for a 404.
        self.absent = dict(absent or {})
        # Credentials: the appliance's (viewing open or not, the shared throttle), or a bare
        # token that every request but OPTIONS needs (tests, embedding).
        self.auth: RtspAuth | None = None
        self.auth_required = False
        self.throttle = credentials.throttle if credentials is not None else FailureThrottle()
        if credentials is not None:
            creds = credentials
            # More passwords that play (view): [onvif] password, so the stream URI an NVR got
            # over ONVIF plays with the account it adopted the camera with.
            extra = extra_passwords or (lambda: [])
            self.auth = RtspAuth(lambda: [password for password, _ in creds.passwords()]
                                 + extra())
            self.auth_required = not creds.viewing_open
        elif token:
            self.auth = RtspAuth(token)
            self.auth_required = True
        self.auth_throttled = 0
        self.buffer_limit = buffer_limit
        # Bytes a connection may have waiting to be sent: its RTP stays under buffer_limit
        # plus one frame or a join burst; answers beyond that are a client that sends requests
        # and never reads (cut off, or it would fill the memory).
        self.backlog_limit = 4 * buffer_limit + max(s.catch_up_max_bytes for s in sources)
        self.socket_send_buffer = socket_send_buffer
        self.session_timeout_s = session_timeout_s
        self.sessions: dict[str, RtspSession] = {}
        self._connections: set[_Connection] = set()
        # One per address family listened on (rtsp.listen [::] is both).
        self._servers: list[asyncio.Server] = []
        self._reaper: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._sdp_id = secrets.randbelow(1 << 31)
        # Per camera with sound (its main and sub-stream share it), made at its first audio
        # SETUP.
        self._audio_feeds: dict[int, RtspAudioFeed] = {}
        self._ended_audio = {"audio_frames_sent": 0, "audio_bytes_sent": 0,
                             "audio_frames_dropped": 0}
        # counters (of sessions that ended; live sessions are added in stats())
        self._ended = {"frames_sent": 0, "packets_sent": 0, "bytes_sent": 0,
                       "frames_skipped": 0, "keyframe_skips": 0, "keyframe_requests_received": 0,
                       "send_errors": 0}
        self.connections_total = 0
        self.sessions_total = 0
        self.sessions_reaped = 0
        self.auth_failures = 0
        self.auth_challenges = 0
        self.auth_accepted: dict[str, int] = {}  # requests let in, by scheme
        self.bad_requests = 0
        self.rejected_full = 0
        self.requests: dict[str, int] = {}
        self.joins: dict[str, int] = {}  # PLAYs by how the client joined (ViewerCursor modes)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on ``config.listen``; raises ``OSError`` naming the setting when it cannot."""
        listen = self.config.listen

        async def bind(host: str, port: int) -> int:
            server = await asyncio.start_server(
                self._connection, host, port, limit=MAX_HEAD_BYTES, reuse_address=True)
            self._servers.append(server)
            return int(server.sockets[0].getsockname()[1])

        try:
            await bind_every_host(listen, "rtsp.listen", bind)
        except OSError as exc:
            for server in self._servers:
                server.close()
            self._servers.clear()
            raise OSError(exc.errno, f"cannot listen on rtsp.listen = {listen}: "
                                     f"{exc.strerror}") from exc
        self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())
        logger.info("rtsp: listening on %s (cameras: %s)", listen, ", ".join(self.sources))

    async def stop(self) -> None:
        """Close every session and connection, stop listening."""
        await cancel_and_wait(self._reaper)
        self._reaper = None
        for session in list(self.sessions.values()):
            session.close("server stopping")
        for feed in self._audio_feeds.values():
            await feed.stop()
        for server in self._servers:
            server.close()
        for conn in list(self._connections):
            conn.writer.transport.abort()  # their handlers end on the closed connection
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=2.0)
        for task in list(self._handlers):
            await cancel_and_wait(task)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()

    @property
    def port(self) -> int:
        """The TCP port listened on (0 before start)."""
        if not self._servers or not self._servers[0].sockets:
            return 0
        return int(self._servers[0].sockets[0].getsockname()[1])

    # -- connections -----------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.socket_send_buffer)
        peer = writer.get_extra_info("peername") or ("", 0)
        local = writer.get_extra_info("sockname") or ("", 0)
        conn = _Connection(writer, (_plain_ip(str(peer[0])), int(peer[1])),
                           (_plain_ip(str(local[0])), int(local[1])),
                           peer_scope=_scope_id(peer), local_scope=_scope_id(local))
        conn.full = len(self._connections) >= self.config.max_clients
        self.connections_total += 1
        if len(self._connections) >= 2 * self.config.max_clients + 16:
            # A flood of connections: beyond the ones answered 503, not even a response.
            self.rejected_full += 1
            writer.transport.abort()
            if task is not None:
                self._handlers.discard(task)
            return
        self._connections.add(conn)
        try:
            await self._read_loop(conn, reader)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except Exception:  # nothing a client sends may take the server down
            logger.exception("rtsp: connection from %s failed", conn.peer[0])
        finally:
            self._connections.discard(conn)
            for session in list(conn.sessions):
                # UDP sessions may outlive their connection (RFC 2326); their timeout ends them.
                if session.transport_kind != "udp" or session.state == "closed":
                    session.close("connection closed")
            writer.transport.abort()
            if task is not None:
                self._handlers.discard(task)

    async def _read_loop(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        writer = conn.writer
        while True:
            # Playing: no idle limit (a TCP session lasts as long as its connection), but the
            # wait is looked at again every timeout: a UDP session reaped meanwhile (a client
            # gone without closing) must not leave its connection holding a slot for ever.
            # Refused for being full: the first request comes at once or the connection goes.
            idle = REQUEST_TIMEOUT_S if conn.full else self.session_timeout_s
            try:
                async with asyncio.timeout(idle):
                    first = await reader.readexactly(1)
            except TimeoutError:
                if not conn.full and conn.playing():
                    continue
                raise
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                if first == b"$":
                    head = await reader.readexactly(3)
                    data = await reader.readexactly(int.from_bytes(head[1:3], "big"))
                    self._interleaved(conn, head[0], data)
                    continue
                try:
                    head_bytes = first + await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    await self._reject(
                        conn, BadRequest(f"request head over {MAX_HEAD_BYTES} bytes"), "")
                    return
                cseq = ""
                try:
                    request = parse_head(head_bytes)
                    cseq = request.cseq
                    request.body = await reader.readexactly(content_length(request))
                except BadRequest as exc:
                    await self._reject(conn, exc, cseq)
                    return
            response, after = self._handle(conn, request)
            if not writer.transport.is_closing():
                writer.write(response.encode(request.cseq))
            if after is not None:
                after()
            if writer.transport.get_write_buffer_size() > self.backlog_limit:
                self.bad_requests += 1
                logger.info("rtsp: closing %s: it does not read what it is sent",
                            conn.peer[0])
                return
            if response.close:
                await self._close_after_write(writer)
                return

    async def _reject(self, conn: _Connection, exc: BadRequest, cseq: str) -> None:
        """Answer a request that cannot be parsed, then close its connection."""
        self.bad_requests += 1
        logger.debug("rtsp: bad request from %s: %s", conn.peer[0], exc.reason)
        conn.writer.write(RtspResponse(exc.status, reason=exc.reason).encode(cseq))
        await self._close_after_write(conn.writer)

    @staticmethod
    async def _close_after_write(writer: asyncio.StreamWriter) -> None:
        writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await writer.wait_closed()

    def _interleaved(self, conn: _Connection, channel: int, data: bytes) -> None:
        """Data the client sends on a channel: RTCP on a track's second channel."""
        for session in conn.sessions:
            audio = session.audio
            if (audio is not None and audio.transport_kind == "tcp"
                    and channel == audio.channels[1]):
                audio.handle_rtcp(data)
                return
            if (session.video_set_up and session.transport_kind == "tcp"
                    and channel == session.channels[1]):
                session.handle_rtcp(data)
                return

    # -- requests --------------------------------------------------------------------------------

    def _handle(self, conn: _Connection,
                request: RtspRequest) -> tuple[RtspResponse, Callable[[], None] | None]:
        method = request.method
        key = method if method in _KNOWN else "other"
        self.requests[key] = self.requests.get(key, 0) + 1
        if conn.full:
            self.rejected_full += 1
            return RtspResponse(503, [("Retry-After", "5")],
                                reason=f"at most {self.config.max_clients} RTSP clients",
                                close=True), None
        required = request.header("require").strip()
        if required:
            # RFC 2326 12.32: this server implements no option tag; say which were refused.
            return RtspResponse(551, [("Unsupported", required[:256])],
                                reason="no RTSP extension is supported"), None
        if method == "OPTIONS":
            # Needs no credentials (clients ask before authenticating), so it keeps a session
            # alive (some clients' keep-alive instead of GET_PARAMETER) only when it has them:
            # a stranger who learnt a session id must not hold a session open.
            if self.auth is None or not self.auth_required or self.auth.check(
                    method, request.url, request.header("authorization"), conn.peer[0]) == "ok":
                try:
                    session = self._session_of(
                        conn, request.header("session").split(";", 1)[0].strip())
                except _TooManySessions:
                    session = None
                if session is not None:
                    session.last_activity = time.monotonic()
            return RtspResponse(200, [("Public", PUBLIC)]), None
        if method in _NOT_ALLOWED:
            return RtspResponse(405, [("Allow", PUBLIC)],
                                reason="this server only plays"), None
        if method not in _KNOWN:
            return RtspResponse(501, [("Public", PUBLIC)],
                                reason=f"{method} is not supported"), None
        # Every method served past this point is VIEW (access/policy.py RTSP_METHODS; the
        # ADMIN ones are refused above: this server only plays).
        if self.auth is not None and self.auth_required and rtsp_access(method) > Access.OPEN:
            authorization = request.header("authorization")
            wait = self.throttle.retry_after(conn.peer[0], "rtsp") if authorization else None
            if wait is not None:
                self.auth_throttled += 1
                return RtspResponse(429, [("Retry-After", str(wait))],
                                    reason="too many wrong credentials from this address"), None
            verdict = self.auth.check(method, request.url, authorization, conn.peer[0])
            if verdict == "ok":
                # No reset here: the viewer token, which is shared, would otherwise let its
                # holders reset their count between guesses at the admin secret.
                scheme = authorization.split(" ", 1)[0].lower()
                self.auth_accepted[scheme] = self.auth_accepted.get(scheme, 0) + 1
            else:
                if verdict == "missing":
                    self.auth_challenges += 1
                elif verdict == "wrong":
                    self.auth_failures += 1
                    self.throttle.failed(conn.peer[0], "rtsp")
                return RtspResponse(401, self.auth.challenges(conn.peer[0],
                                                              stale=verdict == "stale"),
                                    reason="credentials required: any user name, the viewer "
                                           "token or the admin secret as password"), None
        if method == "DESCRIBE":
            return self._describe(conn, request), None
        if method == "SETUP":
            return self._setup(conn, request), None
        if method == "SET_PARAMETER" and request.body.strip():
            return RtspResponse(451, reason="no parameter can be set"), None
        session_id = request.header("session").split(";", 1)[0].strip()
        if method in ("GET_PARAMETER", "SET_PARAMETER") and not session_id:
            return RtspResponse(200), None
        try:
            session = self._session_of(conn, session_id)
        except _TooManySessions:
            return RtspResponse(455, reason="too many sessions on this connection"), None
        if session is None:
            return RtspResponse(454, reason="no such session"), None
        session.last_activity = time.monotonic()
        headers = [("Session", self._session_header(session))]
        if method == "PLAY":
            return self._play(session, request, headers)
        if method == "PAUSE":
            session.pause()
        elif method == "TEARDOWN":
            session.close("teardown")
            headers = []
        return RtspResponse(200, headers), None

    def _source_of(self, url: str, *, track: bool) -> tuple[RtspSource | None, str]:
        """The camera a request URL names, and the URL of its presentation (Content-Base)."""
        source, base, _ = self._track_of(url, track=track)
        return source, base

    def _track_of(self, url: str, *, track: bool) -> tuple[RtspSource | None, str, str]:
        """The camera a request URL names, the URL of its presentation (Content-Base), and
        (``track``) which of its tracks: "video" (``trackID=0``, or none named), "audio"
        (``trackID=1``)."""
        try:
            parts = urlsplit(url)
        except ValueError:
            return None, "", ""
        if parts.scheme.lower() not in ("rtsp", ""):
            return None, "", ""
        path = unquote(parts.path).strip("/")
        kind = "video"
        base = url.split("?", 1)[0]
        if track:
            head, _, tail = path.rpartition("/")
            for control, name in ((TRACK_CONTROL, "video"), (AUDIO_TRACK_CONTROL, "audio")):
                if tail == control:
                    path, kind = head, name
                    if base.rstrip("/").endswith("/" + control):
                        base = base.rstrip("/")[: -len(control)]
                    break
        source = self.sources.get(path)
        if source is None and path in ("", "stream"):
            source = self.default
        return source, base.rstrip("/") + "/", kind

    def _not_here(self, url: str) -> RtspResponse:
        """404 for a URL that names no source: why, where the path is a stream there is not."""
        try:
            path = unquote(urlsplit(url).path).strip("/")
        except ValueError:
            path = ""
        for known, why in self.absent.items():
            if path == known or path.startswith(known + "/"):
                return RtspResponse(404, reason=why)
        return RtspResponse(404, reason="no camera at this path; cameras: "
                                        + ", ".join(self.sources))

    def _describe(self, conn: _Connection, request: RtspRequest) -> RtspResponse:
        source, base = self._source_of(request.url, track=False)
        if source is None:
            return self._not_here(request.url)
        info = source.feed.stream_info
        sets = parameter_sets(source.feed.ring)
        if info is None or sets is None:
            return RtspResponse(503, [("Retry-After", "1")],
                                reason="no keyframe from the camera yet")
        body = describe_sdp(camera=source.name, host=conn.local[0], session_id=self._sdp_id,
                            profile_level_id=info.profile_level_id, sps=sets[0], pps=sets[1],
                            framerate=source.framerate,
                            aac_config=source.audio.aac_config if source.audio else None)
        return RtspResponse(200, [("Content-Base", base), ("Content-Type", "application/sdp")],
                            body.encode())

    def _setup(self, conn: _Connection, request: RtspRequest) -> RtspResponse:
        source, _, track = self._track_of(request.url, track=True)
        if source is None:
            return self._not_here(request.url)
        if track == "audio" and source.audio is None:
            return RtspResponse(404, reason=f"camera {source.name!r} has no sound")
        session_id = request.header("session").split(";", 1)[0].strip()
        session: RtspSession | None = None
        if session_id:
            # The second track of a session (aggregate control, RFC 2326 C.1.1).
            try:
                session = self._session_of(conn, session_id)
            except _TooManySessions:
                return RtspResponse(455, reason="too many sessions on this connection")
            if session is None:
                return RtspResponse(454, reason="no such session")
            if session.camera != source.name:
                return RtspResponse(459, reason="a session carries the tracks of one camera: "
                                                "SETUP another camera without Session")
            if ((track == "video" and session.video_set_up)
                    or (track == "audio" and session.audio is not None)):
                return RtspResponse(459, reason=f"the {track} track of this session is set "
                                                "up already")
            if session.state == "playing":
                return RtspResponse(455, reason="a track cannot be added while playing")
            session.last_activity = time.monotonic()
        else:
            if len(self.sessions) >= self.config.max_clients:
                self.rejected_full += 1
                return RtspResponse(503, [("Retry-After", "5")],
                                    reason=f"at most {self.config.max_clients} RTSP sessions")
            if len(conn.sessions) >= MAX_SESSIONS_PER_CONNECTION:
                return RtspResponse(455, reason="too many sessions on this connection")
        specs = parse_transport(request.header("transport"))
        spec, refusal = self._choose_transport(conn, specs)
        if spec is None:
            return refusal
        new = session is None
        if session is None:
            session = RtspSession(
                secrets.token_hex(8), source.name, source.feed, source.fanout,
                framerate=source.framerate, catch_up_max_frames=source.catch_up_max_frames,
                keyframe_interval_frames=source.keyframe_interval_frames, peer=conn.peer,
                peer_scope=conn.peer_scope,
                buffer_limit=self.buffer_limit, catch_up_max_bytes=source.catch_up_max_bytes)
        target: RtspSession | RtspAudioTrack = session
        if track == "audio":
            assert source.audio is not None
            feed = self._audio_feeds.get(id(source.audio))
            if feed is None:
                feed = self._audio_feeds[id(source.audio)] = RtspAudioFeed(source.audio)
            target = RtspAudioTrack(feed, peer=conn.peer, cname=session.cname,
                                    peer_scope=conn.peer_scope, buffer_limit=self.buffer_limit)
        if spec.tcp:
            channels = spec.interleaved or self._free_channels(conn)
            assert channels is not None
            target.use_tcp(conn.writer.transport, channels)
            transport = f"RTP/AVP/TCP;unicast;interleaved={channels[0]}-{channels[1]}"
        else:
            assert spec.client_port is not None
            try:
                server_ports = target.use_udp(conn.local[0], spec.client_port,
                                              scope_id=conn.local_scope)
            except OSError as exc:
                logger.warning("rtsp: no UDP ports for %s: %s", conn.peer[0], exc)
                return RtspResponse(503, [("Retry-After", "1")], reason="no free UDP ports")
            transport = (f"RTP/AVP;unicast;client_port={spec.client_port[0]}-"
                         f"{spec.client_port[1]};server_port={server_ports[0]}-"
                         f"{server_ports[1]}")
        transport += f";ssrc={target.ssrc:08X}"
        if isinstance(target, RtspAudioTrack):
            session.add_audio(target)
        if new:
            session.on_close = self._session_closed
            self.sessions[session.id] = session
            conn.sessions.append(session)
            self.sessions_total += 1
        return RtspResponse(200, [("Transport", transport),
                                  ("Session", self._session_header(session))])

    def _choose_transport(self, conn: _Connection, specs: list[TransportSpec]
                          ) -> tuple[TransportSpec | None, RtspResponse]:
        """The first proposal this server can honour, or the refusal to answer."""
        refusal = RtspResponse(461, reason="supported: RTP/AVP/TCP;unicast;interleaved=a-b or "
                                           "RTP/AVP;unicast;client_port=a-b")
        for spec in specs:
            if spec.profile not in ("RTP/AVP", "RTP/AVP/TCP") or not spec.unicast:
                continue
            if spec.mode and spec.mode not in ("PLAY", '"PLAY"'):
                continue
            if spec.tcp:
                channels = spec.interleaved
                if channels is None:
                    if self._free_channels(conn) is None:
                        continue
                    return spec, refusal
                if not (0 <= channels[0] <= 255 and 0 <= channels[1] <= 255
                        and channels[0] != channels[1]):
                    continue
                if any(s.channels_in_use() & set(channels) for s in conn.sessions):
                    continue
                return spec, refusal
            if spec.destination and _plain_ip(spec.destination) != conn.peer[0]:
                # Never send a stream to an address the client names: that would make the
                # appliance a traffic cannon aimed at a third party.
                refusal = RtspResponse(403, reason="UDP delivery goes only to the RTSP "
                                                   "client's own address (destination= refused)")
                continue
            ports = spec.client_port
            if ports is None or not (0 < ports[0] <= 65535 and 0 < ports[1] <= 65535):
                continue
            return spec, refusal
        return None, refusal

    @staticmethod
    def _free_channels(conn: _Connection) -> tuple[int, int] | None:
        used = {c for s in conn.sessions for c in s.channels_in_use()}
        for first in range(0, 254, 2):
            if first not in used and first + 1 not in used:
                return first, first + 1
        return None

    def _session_of(self, conn: _Connection, session_id: str) -> RtspSession | None:
        session = self.sessions.get(session_id)
        if session is None or session.state == "closed":
            return None
        if session in conn.sessions:
            return session
        # A UDP session may be resumed from another connection of the same client, within
        # that connection's own limit of sessions.
        if session.transport_kind == "udp" and session.peer[0] == conn.peer[0]:
            if len(conn.sessions) >= MAX_SESSIONS_PER_CONNECTION:
                raise _TooManySessions
            conn.sessions.append(session)
            return session
        return None

    def _session_header(self, session: RtspSession) -> str:
        return f"{session.id};timeout={int(self.session_timeout_s)}"

    def _play(self, session: RtspSession, request: RtspRequest, headers: list[tuple[str, str]]
              ) -> tuple[RtspResponse, Callable[[], None] | None]:
        if session.state == "playing":
            return RtspResponse(200, headers), None
        _, base = self._source_of(request.url, track=True)
        infos = []
        start_us: int | None = None
        if session.video_set_up:
            seq, rtptime = session.prepare_play()
            mode = session.cursor.join_mode if session.cursor is not None else ""
            self.joins[mode] = self.joins.get(mode, 0) + 1
            if session.audio is not None:
                # Both tracks' RTP times of one capture instant: the first picture's (a join
                # waiting for a fresh IDR: the newest picture's, before the first it sends).
                start_us = session.start_capture_us()
                if rtptime is None and start_us is not None:
                    rtptime = session.video_rtptime_at(start_us)
            info = f"url={base}{TRACK_CONTROL};seq={seq}"
            if rtptime is not None:
                info += f";rtptime={rtptime}"
            infos.append(info)
        if session.audio is not None:
            seq, rtptime = session.audio.prepare_play(start_us)
            info = f"url={base}{AUDIO_TRACK_CONTROL};seq={seq}"
            if rtptime is not None:
                info += f";rtptime={rtptime}"
            infos.append(info)
        headers += [("Range", "npt=0.000-"), ("RTP-Info", ",".join(infos))]
        return RtspResponse(200, headers), session.play

    def _session_closed(self, session: RtspSession, why: str) -> None:
        self.sessions.pop(session.id, None)
        for key in self._ended:
            self._ended[key] += getattr(session, key)
        if session.audio is not None:
            for key, value in self._audio_totals([session]).items():
                self._ended_audio[key] += value
        logger.info("rtsp: session of %s on %s ended (%s): %d frames, %d skipped",
                    session.peer[0], session.camera, why, session.frames_sent,
                    session.frames_skipped)

    # -- idle UDP sessions -----------------------------------------------------------------------

    async def _reap_loop(self) -> None:
        interval = min(REAP_INTERVAL_S, self.session_timeout_s / 4)
        while True:
            await asyncio.sleep(interval)
            self.reap(time.monotonic())

    def reap(self, now: float) -> None:
        """Close sessions not heard from within the timeout (UDP, or never played)."""
        live = {id(s) for c in self._connections for s in c.sessions if s.transport_kind == "tcp"}
        for session in list(self.sessions.values()):
            if id(session) in live:
                continue  # a TCP session ends with its connection
            if now - session.last_activity > self.session_timeout_s:
                self.sessions_reaped += 1
                session.close("timeout")
                for conn in self._connections:
                    if session in conn.sessions:
                        conn.sessions.remove(session)

    # -- stats -----------------------------------------------------------------------------------

    @staticmethod
    def _audio_totals(sessions: Sequence[RtspSession]) -> dict[str, int]:
        tracks = [s.audio for s in sessions if s.audio is not None]
        return {"audio_frames_sent": sum(t.frames_sent for t in tracks),
                "audio_bytes_sent": sum(t.bytes_sent for t in tracks),
                "audio_frames_dropped": sum(t.frames_dropped for t in tracks)}

    def stats(self) -> dict[str, Any]:
        """Figures for ``/api/status`` (and, the numbers, ``/metrics``)."""
        live = [s for s in self.sessions.values()]
        totals = dict(self._ended)
        for session in live:
            for key in totals:
                totals[key] += getattr(session, key)
        return {
            "listen": str(self.config.listen),
            "port": self.port,
            "clients": len(self._connections),
            "sessions": len(live),
            "playing": sum(s.state == "playing" for s in live),
            "by_transport": {"tcp": sum(s.transport_kind == "tcp" for s in live),
                             "udp": sum(s.transport_kind == "udp" for s in live)},
            **totals,
            "audio_sessions": sum(s.audio is not None for s in live),
            **{key: value + self._ended_audio[key]
               for key, value in self._audio_totals(live).items()},
            "connections_total": self.connections_total,
            "sessions_total": self.sessions_total,
            "sessions_reaped": self.sessions_reaped,
            "auth_failures": self.auth_failures,
            "auth_throttled": self.auth_throttled,
            "auth_challenges": self.auth_challenges,
            "auth_replays": self.auth.replays if self.auth is not None else 0,
            "auth_accepted": dict(self.auth_accepted),
            "bad_requests": self.bad_requests,
            "rejected_full": self.rejected_full,
            "requests": dict(self.requests),
            "joins": dict(self.joins),
            "session_list": [s.stats() for s in live],
        }
