"""The WHEP endpoint (draft-ietf-wish-whep-04, which follows WHIP, RFC 9725, for the HTTP side).

``POST /whep`` with an SDP offer creates a viewer session and answers 201 with the SDP answer and
``Location: /whep/sessions/<id>``; ``DELETE`` on that URL ends the session at once; ``PATCH``
takes ``application/trickle-ice-sdpfrag``. Trickled candidates are accepted (204) and ignored on
purpose: the engine strips remote candidates from offers too, because the browser (ICE
controlling) always sends the first check and the single-port mux learns its address from that
check's verified STUN request. ICE restarts are offered only when the engine implements them;
otherwise they are answered 422 as the draft requires of a server that supports trickle but not
restarts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ruseon_appliance.engine.engine import StreamNotReady
from ruseon_appliance.engine.errors import (
    MalformedOffer,
    OfferError,
    OfferTooLarge,
    TooManyFromAddress,
    TooManyViewers,
    UnknownSession,
    UnsupportedOffer,
)
from ruseon_appliance.web.access import request_address
from ruseon_appliance.web.metrics import WebMetrics
from ruseon_appliance.web.problem import Problem

if TYPE_CHECKING:
    from ruseon_appliance.engine.engine import Engine

log = logging.getLogger(__name__)

SDP = "application/sdp"
SDPFRAG = "application/trickle-ice-sdpfrag"
SESSION_PREFIX = "/whep/sessions/"
ENDPOINT_METHODS = "OPTIONS, POST"
SESSION_METHODS = "OPTIONS, PATCH, DELETE"


def _main_only(stream: str) -> None:
    """Without cameras' routes: only the main stream (the engine's default feed)."""
    if stream != "main":
        raise Problem(404, f"there is no stream {stream!r} here; the stream is main")


def ice_server_link(url: str) -> str:
    """A ``Link`` header value announcing one configured STUN/TURN server (RFC 9725 §4.6)."""
    return f'<{url}>; rel="ice-server"'


def sdp_ice_ufrag(sdp: str) -> str | None:
    """The first ``a=ice-ufrag`` value in an SDP offer or fragment, if any."""
    for line in sdp.splitlines():
        if line.startswith("a=ice-ufrag:"):
            return line[len("a=ice-ufrag:") :].strip()
    return None


def entity_tag_matches(if_match: str, etag: str) -> bool:
    """RFC 9110 §13.1.1 ``If-Match`` (strong comparison): ``*`` or one of the listed tags."""
    tags = [tag.strip() for tag in if_match.split(",")]
    return "*" in tags or (bool(etag) and etag in tags)


@dataclass(slots=True)
class _SessionRecord:
    """What the web layer remembers per session: the viewer's ICE ufrag, to tell a trickle
    PATCH (same ufrag) from an ICE restart (new ufrag)."""

    remote_ufrag: str | None
    created: float = field(default_factory=time.monotonic)


class WhepResource:
    """Request handlers for ``/whep`` and ``/whep/sessions/{id}``."""

    def __init__(
        self,
        engine: Engine,
        *,
        ice_servers: tuple[str, ...],
        max_body_bytes: int,
        metrics: WebMetrics,
    ) -> None:
        self.engine = engine
        self.ice_servers = ice_servers
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        # Why a camera (by its pipeline; None: the default) has no video, for a 503's detail
        # (web/cameras.py sets it); "" or None when it does not say.
        self.camera_problem: Callable[[Any], str | None] = lambda feed: None
        # The default camera's pipeline of a stream name (``/whep?stream=sub``; web/cameras.py
        # sets it); raises a 404 Problem for a stream there is not. None: the engine's default.
        self.choose_feed: Callable[[str], Any] = _main_only
        # The sound of a camera (by its pipeline; None: the default), the engine's audio feed,
        # or None without (web/cameras.py sets it).
        self.audio_of: Callable[[Any], Any] = lambda feed: None
        self._records: dict[str, _SessionRecord] = {}
        # An engine that implements ICE restarts exposes
        # ``async restart_ice(session_id, sdpfrag) -> str`` returning the answer fragment.
        self._restart_ice: Callable[[str, str], Awaitable[str]] | None = getattr(
            engine, "restart_ice", None
        )

    @property
    def supports_ice_restart(self) -> bool:
        """True when the engine can restart ICE on a live session."""
        return self._restart_ice is not None

    def add_routes(self, app: web.Application) -> None:
        """Register the endpoint and session routes."""
        app.router.add_route("OPTIONS", "/whep", self.options_endpoint)
        app.router.add_route("POST", "/whep", self.post_offer)
        app.router.add_route("*", "/whep", self.endpoint_not_allowed)
        app.router.add_route("OPTIONS", "/whep/sessions/{id}", self.options_session)
        app.router.add_route("PATCH", "/whep/sessions/{id}", self.patch_session)
        app.router.add_route("DELETE", "/whep/sessions/{id}", self.delete_session)
        app.router.add_route("*", "/whep/sessions/{id}", self.session_not_allowed)

    # -- the endpoint --------------------------------------------------------------------------

    async def options_endpoint(self, request: web.Request) -> web.Response:
        """What the endpoint accepts (also reached by CORS-less OPTIONS discovery)."""
        return web.Response(
            status=204, headers={"Allow": ENDPOINT_METHODS, "Accept-Post": SDP}
        )

    async def endpoint_not_allowed(self, request: web.Request) -> web.Response:
        """GET, HEAD, PUT, PATCH and DELETE on the endpoint: 405 with ``Allow``."""
        raise Problem(
            405,
            f"{request.method} is not allowed on /whep; POST an SDP offer",
            headers={"Allow": ENDPOINT_METHODS, "Accept-Post": SDP},
        )

    async def post_offer(self, request: web.Request) -> web.Response:
        """Create a viewer session of the default camera (``?stream=sub``: its sub-stream) from
        an SDP offer; 201 + answer."""
        feed = self.choose_feed(request.query.get("stream", "main"))
        return await self.answer_offer(request, feed=feed)

    async def answer_offer(self, request: web.Request, feed: Any = None) -> web.Response:
        """Create a viewer session of ``feed`` (a camera's pipeline; None: the engine's
        default) from the request's SDP offer; 201 with the answer."""
        if request.content_type != SDP:
            raise Problem(
                415,
                f"the offer must be sent as {SDP}, not {request.content_type or 'no type'}",
                headers={"Accept-Post": SDP},
            )
        sdp = await self._read_text(request, "offer")
        self._forget_ended_sessions()
        began = time.perf_counter()
        # The client's address as the access rules saw it: behind a trusted proxy the one it
        # forwards (access/client.py), so a proxy's clients each have their own share.
        remote = request_address(request)
        try:
            session, answer = await self.engine.offer(sdp, feed=feed, remote=remote,
                                                      audio=self.audio_of(feed))
        except OfferError as exc:
            self.metrics.offers_refused[type(exc).__name__] += 1
            problem = self._offer_problem(exc)
            why = self.camera_problem(feed) if isinstance(exc, StreamNotReady) else None
            if why:  # the page shows this line: "no camera detected (probed: ...)"
                problem = Problem(503, f"{exc.reason}: {why}", headers=problem.headers)
            raise problem from None
        self.metrics.answer_seconds.observe(time.perf_counter() - began)
        self.metrics.offers_answered += 1
        self._records[session.id] = _SessionRecord(sdp_ice_ufrag(sdp))
        location = SESSION_PREFIX + session.id
        headers: dict[str, Any] = {"Location": location, "Accept-Patch": SDPFRAG}
        if session.etag:
            headers["ETag"] = session.etag
        response = web.Response(status=201, text=answer, content_type=SDP, headers=headers)
        for url in self.ice_servers:
            response.headers.add("Link", ice_server_link(url))
        fields = {"EVENT": "whep_session", "SESSION_ID": session.id, "REMOTE_ADDR": remote}
        if remote != request.remote:
            fields["PROXY_ADDR"] = request.remote or ""  # the trusted proxy it came through
        log.info("viewer session created", extra=fields)
        return response

    @staticmethod
    def _offer_problem(exc: OfferError) -> Problem:
        if isinstance(exc, MalformedOffer):
            return Problem(400, exc.reason)
        if isinstance(exc, UnsupportedOffer):
            # 422: the offer is well-formed SDP, but nothing in it is something we can send.
            return Problem(422, exc.reason)
        if isinstance(exc, TooManyFromAddress):
            return Problem(
                429, exc.reason, headers={"Retry-After": retry_after_seconds(exc.retry_after)}
            )
        if isinstance(exc, TooManyViewers):
            return Problem(
                503, exc.reason, headers={"Retry-After": retry_after_seconds(exc.retry_after)}
            )
        if isinstance(exc, OfferTooLarge):
            return Problem(413, exc.reason)
        if isinstance(exc, UnknownSession):
            return Problem(404, exc.reason)
        return Problem(400, exc.reason)

    # -- a session -----------------------------------------------------------------------------

    async def options_session(self, request: web.Request) -> web.Response:
        """What a session URL accepts."""
        return web.Response(
            status=204, headers={"Allow": SESSION_METHODS, "Accept-Patch": SDPFRAG}
        )

    async def session_not_allowed(self, request: web.Request) -> web.Response:
        """GET, HEAD, POST and PUT on a session URL: 405 with ``Allow``."""
        raise Problem(
            405,
            f"{request.method} is not allowed on a WHEP session URL",
            headers={"Allow": SESSION_METHODS},
        )

    def _session(self, request: web.Request) -> Any:
        session_id = request.match_info["id"]
        session = self.engine.sessions.get(session_id)
        if session is None:
            self._records.pop(session_id, None)
            raise Problem(404, "no such WHEP session (it ended or never existed)")
        return session

    async def delete_session(self, request: web.Request) -> web.Response:
        """End the session at once; 200."""
        session_id = request.match_info["id"]
        self._records.pop(session_id, None)
        if not await self.engine.close(session_id, "delete"):
            raise Problem(404, "no such WHEP session (it ended or never existed)")
        return web.Response(status=200)

    async def patch_session(self, request: web.Request) -> web.Response:
        """Trickle ICE (204, candidates ignored by design) or ICE restart (200 or 422)."""
        session = self._session(request)
        if request.content_type != SDPFRAG:
            raise Problem(
                415,
                f"PATCH takes {SDPFRAG}, not {request.content_type or 'no type'}",
                headers={"Accept-Patch": SDPFRAG},
            )
        if_match = request.headers.get("If-Match")
        if if_match is not None and not entity_tag_matches(if_match, session.etag):
            raise Problem(412, "If-Match does not match this session's ETag")
        fragment = await self._read_text(request, "SDP fragment")
        record = self._records.get(session.id)
        ufrag = sdp_ice_ufrag(fragment)
        restart = ufrag is not None and record is not None and ufrag != record.remote_ufrag
        if not restart:
            return web.Response(status=204)
        if self._restart_ice is None:
            # aiortc 1.16 cannot restart ICE on a live connection; the draft asks a server that
            # takes trickle but not restarts for 422 (and Accept-Patch still lists what it takes).
            raise Problem(
                422,
                "ICE restart is not supported by this device: the fragment carries new ICE "
                "credentials (ice-ufrag), and only trickled candidates for the current ones are "
                "accepted. To recover the stream, DELETE this session and POST a new offer.",
                headers={"Accept-Patch": SDPFRAG},
            )
        if if_match is None:
            raise Problem(428, 'an ICE restart needs "If-Match: *"')
        try:
            answer_fragment = await self._restart_ice(session.id, fragment)
        except OfferError as exc:
            raise self._offer_problem(exc) from None
        if record is not None:
            record.remote_ufrag = ufrag
        return web.Response(
            status=200, text=answer_fragment, content_type=SDPFRAG, headers={"ETag": session.etag}
        )

    # -- plumbing ------------------------------------------------------------------------------

    async def _read_text(self, request: web.Request, what: str) -> str:
        """The body as UTF-8 text, bounded by ``http.max_offer_bytes``."""
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            raise Problem(413, f"the {what} is {length} bytes; at most {self.max_body_bytes}")
        body = await request.read()  # aiohttp enforces client_max_size on chunked bodies
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Problem(
                400, f"the {what} is not UTF-8 text: {exc.reason} at byte {exc.start}"
            ) from None

    def _forget_ended_sessions(self) -> None:
        live = self.engine.sessions
        for session_id in [sid for sid in self._records if sid not in live]:
            del self._records[session_id]


def retry_after_seconds(value: float) -> str:
    """A ``Retry-After`` delta in whole seconds, at least 1."""
    return str(max(1, math.ceil(value)))
