"""Access control for every HTTP route: the Host allow-list, credentials, the page's login.

Middleware order (outermost first, web/app.py): :func:`host_middleware` (a foreign ``Host`` is
refused before anything else, DNS rebinding), CORS, problem details, then
:func:`access_middleware`, which looks up the matched route in ``access/policy.py`` and lets the
request through only with what it needs:

- a credential is ``Authorization: Bearer <secret>`` (scripts, WHEP players, Prometheus), the
  page's login cookie, or ``?token=`` on ``/hls/`` only (native players cannot add headers);
- a wrong credential is 401 (and counted: :mod:`ruseon_appliance.access.throttle`; an address
  past its free failures gets 429 + ``Retry-After`` before its credential is even looked at);
- an admin route without the admin secret is 401 (no credential) or 403 (a viewer's);
- a state change authenticated by the cookie must come with the page's own ``Origin``.

OPTIONS requests are never authenticated (CORS preflights carry no credentials; WHEP clients
discover the endpoint with OPTIONS).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

from ruseon_appliance.access.client import client_address
from ruseon_appliance.access.credentials import Credentials
from ruseon_appliance.access.hosts import HostAllowList
from ruseon_appliance.access.policy import Access, Role, classify
from ruseon_appliance.access.sessions import COOKIE_NAME, SESSION_LIFETIME_S
from ruseon_appliance.web.problem import Handler, Problem

REALM = "ruseon"
ROLE_KEY: web.RequestKey[Role] = web.RequestKey("ruseon_role", Role)
ADDRESS_KEY: web.RequestKey[str] = web.RequestKey("ruseon_client", str)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
WHERE_THE_SECRET_IS = ("print it on the board with `sudo ruseon admin-secret`, or use "
                       "[auth] token from its config")

Networks = Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]


def bearer_token(request: web.Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None (scheme is case-blind)."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def query_token(request: web.Request) -> str | None:
    """The ``token`` query parameter, or None. Accepted on ``/hls/`` only: query strings end up
    in logs and browser history, so nothing else takes a credential this way."""
    token = request.query.get("token", "").strip()
    return token or None


def request_role(request: web.Request) -> Role:
    """What the request's credential granted (NONE before :func:`access_middleware` ran)."""
    role = request.get(ROLE_KEY)
    return role if isinstance(role, Role) else Role.NONE


def request_address(request: web.Request) -> str:
    """The client's address as the access rules saw it (a trusted proxy's forwarded one)."""
    return str(request.get(ADDRESS_KEY) or request.remote or "")


def route_access(request: web.Request) -> Access | None:
    """The access the matched route needs; None for aiohttp's own 404/405 answers."""
    route = request.match_info.route
    resource = route.resource
    if resource is None:
        return None
    access = classify(route.method, resource.canonical)
    # Not in the table at run time (the start-up check makes this unreachable): fail closed.
    return Access.ADMIN if access is None else access


def host_middleware(allowed: HostAllowList) -> Middleware:
    """421 for a request whose ``Host`` is not one of this board's names (DNS rebinding)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if not allowed.allows(host):
            response: web.StreamResponse = Problem(
                421, f"this device does not answer to the host name {host!r} (DNS rebinding "
                     "defence); use its address or add the name to http.hosts").response()
            return response
        return await handler(request)

    return middleware


def _unauthorized(detail: str, *, invalid: bool = False) -> Problem:
    challenge = f'Bearer realm="{REALM}"' + (', error="invalid_token"' if invalid else "")
    return Problem(401, detail, headers={"WWW-Authenticate": challenge})


def _throttled(wait: int) -> Problem:
    return Problem(429, f"too many wrong credentials from this address; try again in {wait} s",
                   headers={"Retry-After": str(wait)})


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if not origin:
        return False
    parts = urlsplit(origin)
    return bool(parts.netloc) and parts.netloc.lower() == request.host.lower()


def access_middleware(credentials: Credentials, trusted_proxies: Networks = ()) -> Middleware:
    """Enforce ``access/policy.py`` on every request (see the module docstring)."""
    throttle = credentials.throttle

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        address = client_address(request.remote, request.headers, trusted_proxies)
        request[ADDRESS_KEY] = address
        access = route_access(request)
        if access is None or request.method == "OPTIONS":
            return await handler(request)
        role = Role.NONE
        by_cookie = False
        provided = bearer_token(request)
        if provided is None and request.path.startswith("/hls/"):
            provided = query_token(request)
        if provided is not None and access > Access.OPEN:
            wait = throttle.retry_after(address)
            if wait is not None:
                raise _throttled(wait)
            granted = credentials.role_of(provided)
            if granted is None:
                throttle.failed(address)
                raise _unauthorized("the Bearer token is not valid", invalid=True)
            throttle.succeeded(address, granted)
            role = granted
        elif access > Access.OPEN:
            cookie = request.cookies.get(COOKIE_NAME)
            if cookie:
                role = credentials.sessions.role(cookie)
                by_cookie = role > Role.NONE
        request[ROLE_KEY] = role
        if by_cookie and request.method not in SAFE_METHODS and not _same_origin(request):
            raise Problem(403, "a change made with the page's login must come from the page "
                               "itself (its Origin header was missing or another site's)")
        if access == Access.ADMIN and role < Role.ADMIN:
            if role == Role.NONE:
                raise _unauthorized(f"this needs the admin secret ({WHERE_THE_SECRET_IS})")
            raise Problem(403, "this needs the admin secret; the viewer token only watches")
        if access == Access.VIEW and role < Role.VIEWER and not credentials.viewing_open:
            raise _unauthorized("watching this camera needs the viewer token or the admin "
                                "secret")
        return await handler(request)

    return middleware


class SessionResource:
    """``/api/session``: the page's login (POST), who am I (GET), logout (DELETE)."""

    def __init__(self, credentials: Credentials, *, https: bool = False) -> None:
        self.credentials = credentials
        self.https = https

    def add_routes(self, app: web.Application) -> None:
        """Register ``GET``, ``POST`` and ``DELETE /api/session``."""
        app.router.add_get("/api/session", self.whoami)
        app.router.add_post("/api/session", self.login)
        app.router.add_delete("/api/session", self.logout)

    def _role(self, request: web.Request) -> Role:
        provided = bearer_token(request)
        if provided is not None:
            # As on every other route: counted and throttled, or this would be an oracle.
            address = request_address(request)
            wait = self.credentials.throttle.retry_after(address)
            if wait is not None:
                raise _throttled(wait)
            role = self.credentials.role_of(provided)
            if role is None:
                self.credentials.throttle.failed(address)
                raise _unauthorized("the Bearer token is not valid", invalid=True)
            self.credentials.throttle.succeeded(address, role)
            return role
        cookie = request.cookies.get(COOKIE_NAME)
        return self.credentials.sessions.role(cookie) if cookie else Role.NONE

    def _document(self, request: web.Request, role: Role) -> dict[str, Any]:
        return {"role": role.name.lower(), "viewing": self.credentials.viewing,
                "https": request.secure}

    async def whoami(self, request: web.Request) -> web.Response:
        """``GET /api/session``: the caller's role and whether viewing is open."""
        return web.json_response(self._document(request, self._role(request)),
                                 headers={"Cache-Control": "no-store"})

    async def login(self, request: web.Request) -> web.Response:
        """``POST /api/session`` ``{"secret": "..."}``: a login cookie for its role."""
        address = request_address(request)
        wait = self.credentials.throttle.retry_after(address)
        if wait is not None:
            raise _throttled(wait)
        try:
            body = json.loads(await request.read() or b"null")
        except (ValueError, UnicodeDecodeError):
            raise Problem(400, 'the body must be JSON: {"secret": "..."}') from None
        provided = body.get("secret") if isinstance(body, dict) else None
        if not isinstance(provided, str) or not provided.strip():
            raise Problem(400, 'the body must be JSON: {"secret": "..."}')
        role = self.credentials.role_of(provided.strip())
        if role is None:
            self.credentials.throttle.failed(address)
            raise Problem(401, "that secret is not valid")
        self.credentials.throttle.succeeded(address, role)
        response = web.json_response(self._document(request, role),
                                     headers={"Cache-Control": "no-store"})
        response.set_cookie(COOKIE_NAME, self.credentials.sessions.open(role), path="/",
                            httponly=True, samesite="Strict", secure=request.secure,
                            max_age=int(SESSION_LIFETIME_S))
        return response

    async def logout(self, request: web.Request) -> web.Response:
        """``DELETE /api/session``: end this browser's login."""
        cookie = request.cookies.get(COOKIE_NAME)
        if cookie:
            self.credentials.sessions.close(cookie)
        response = web.Response(status=204, headers={"Cache-Control": "no-store"})
        response.del_cookie(COOKIE_NAME, path="/")
        return response
