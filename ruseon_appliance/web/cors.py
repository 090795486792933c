"""CORS: the device page's own origin is always allowed, plus the configured extra origins.

A request carrying an ``Origin`` that is not allowed is refused with 403 rather than merely left
without CORS headers: a browser would block reading the answer anyway, but a WHEP POST would
already have created a session, and the API should not act on requests from foreign pages.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web
from aiohttp.typedefs import Middleware

from ruseon_appliance.web.problem import Handler, Problem

ALLOWED_METHODS = "GET, HEAD, POST, PATCH, DELETE, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type, If-Match"
# Headers a cross-origin WHEP client must be able to read from our answers.
EXPOSED_HEADERS = (
    "Location, ETag, Link, Accept-Post, Accept-Patch, Allow, Retry-After, WWW-Authenticate"
)
PREFLIGHT_MAX_AGE_S = "600"


def own_origin(request: web.Request) -> str:
    """The origin the device page was served from, as a browser would spell it."""
    return f"{request.scheme}://{request.host}".lower()


def cors_middleware(extra_origins: Iterable[str]) -> Middleware:
    """CORS headers on every answer (errors included, so a page can read a 401), and preflights.

    ``extra_origins`` may contain ``*`` to allow any origin.
    """
    allowed = {origin.rstrip("/").lower() for origin in extra_origins}
    allow_any = "*" in allowed

    def is_allowed(request: web.Request, origin: str) -> bool:
        origin = origin.lower()
        return allow_any or origin == own_origin(request) or origin in allowed

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None:
            return await handler(request)
        if not is_allowed(request, origin):
            response: web.StreamResponse = Problem(
                403, f"origin {origin!r} is not allowed; add it to http.cors_origins"
            ).response()
            return response
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            # Preflight: answered here, before authentication and before routing to handlers.
            response = web.Response(status=204)
            response.headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
            response.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
            response.headers["Access-Control-Max-Age"] = PREFLIGHT_MAX_AGE_S
            if request.path == "/whep":
                response.headers["Accept-Post"] = "application/sdp"
        else:
            response = await handler(request)
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
        response.headers.add("Vary", "Origin")
        return response

    return middleware
