"""Bearer-token authentication for WHEP and the API (off when no token is configured)."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from ruseon_appliance.web.problem import Handler, Problem

REALM = "ruseon"


def bearer_token(request: web.Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None (scheme is case-blind)."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def query_token(request: web.Request) -> str | None:
    """The ``token`` query parameter, or None. Accepted only where ``auth_middleware`` is told
    to (HLS for native players, which cannot send a header): query strings end up in logs and
    browser history, so nothing else takes a token this way."""
    token = request.query.get("token", "").strip()
    return token or None


def token_matches(provided: str, expected: str) -> bool:
    """Compare in constant time, so response timing does not reveal a prefix of the token."""
    return hmac.compare_digest(provided.encode("utf-8", "surrogateescape"), expected.encode())


def auth_middleware(
    token: str,
    protected: Callable[[web.Request], bool],
    token_in_query: Callable[[web.Request], bool] | None = None,
) -> Middleware:
    """Require ``Authorization: Bearer <token>`` on requests ``protected`` selects.

    Where ``token_in_query`` says so, a ``?token=`` query parameter is accepted instead of the
    header (a header, when present, is what counts).

    CORS preflights and other OPTIONS requests are never authenticated: browsers send preflights
    without credentials, and WHEP clients use OPTIONS to discover what the endpoint accepts.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token and request.method != "OPTIONS" and protected(request):
            provided = bearer_token(request)
            if provided is None and token_in_query is not None and token_in_query(request):
                provided = query_token(request)
            if provided is None:
                raise Problem(
                    401,
                    "this device requires a Bearer token",
                    headers={"WWW-Authenticate": f'Bearer realm="{REALM}"'},
                )
            if not token_matches(provided, token):
                raise Problem(
                    401,
                    "the Bearer token is not valid",
                    headers={"WWW-Authenticate": f'Bearer realm="{REALM}", error="invalid_token"'},
                )
        return await handler(request)

    return middleware
