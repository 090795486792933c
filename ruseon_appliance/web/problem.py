"""RFC 9457 problem details: every error the web layer answers is ``application/problem+json``.

Handlers raise :class:`Problem`; :func:`problem_middleware` turns it, aiohttp's own HTTP errors
(unknown route, wrong method, oversize body) and anything unexpected into a problem response.
An unexpected exception is a bug on our side (500, logged, no details leaked); anything a client
sent is answered with a 4xx before it gets that far.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Problem(Exception):
    """An HTTP error answer: status, a one-line ``detail`` for humans and optional headers."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        headers: Mapping[str, str] | None = None,
        title: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = dict(headers or {})
        self.title = title or HTTPStatus(status).phrase

    def response(self) -> web.Response:
        """Render as an ``application/problem+json`` response."""
        return problem_response(self.status, self.detail, headers=self.headers, title=self.title)


def problem_response(
    status: int,
    detail: str,
    *,
    headers: Mapping[str, str] | None = None,
    title: str | None = None,
) -> web.Response:
    """Build an ``application/problem+json`` response (``type`` is ``about:blank``)."""
    body = {
        "type": "about:blank",
        "title": title or HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type=PROBLEM_CONTENT_TYPE,
        headers=dict(headers or {}),
    )


# aiohttp's HTTPException subclasses carry headers we must keep (Allow on 405); these are the
# ones that are safe to pass on.
_KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate", "Accept-Post", "Accept-Patch")


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn :class:`Problem`, aiohttp HTTP errors and unexpected exceptions into problem+json."""
    errors: dict[int, int] = request.app[ERROR_COUNTS]
    try:
        response = await handler(request)
    except Problem as problem:
        response = problem.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are not errors
        headers = {k: exc.headers[k] for k in _KEPT_HEADERS if k in exc.headers}
        detail = _http_exception_detail(request, exc)
        response = problem_response(exc.status, detail, headers=headers)
    except Exception:
        log.exception(
            "unexpected error answering a request",
            extra={"EVENT": "http_error", "METHOD": request.method, "PATH": request.path},
        )
        response = problem_response(500, "internal error; see the service log")
    if response.status >= 400:
        errors[response.status] = errors.get(response.status, 0) + 1
    return response


def _http_exception_detail(request: web.Request, exc: web.HTTPException) -> str:
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return f"{request.method} is not allowed on {request.path}; allowed: {exc.headers['Allow']}"
    if isinstance(exc, web.HTTPNotFound):
        return f"nothing at {request.path}"
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return f"request body is larger than {request.app[MAX_BODY_BYTES]} bytes"
    return exc.text or exc.reason


# App keys live here so that every module of the web layer can count errors without a cycle.
ERROR_COUNTS: web.AppKey[dict[int, int]] = web.AppKey("error_counts", dict)
MAX_BODY_BYTES: web.AppKey[int] = web.AppKey("max_body_bytes", int)


async def json_changes(request: web.Request, expected: str) -> dict[str, Any]:
    """A PATCH body of settings to change: a non-empty JSON object, or the Problem that says
    why not (415 not JSON, 400 unparsable, 422 not an object); ``expected`` shows its form."""
    if request.content_type not in ("application/json", "application/merge-patch+json"):
        raise Problem(415, "PATCH takes application/json: " + expected)
    try:
        changes: Any = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise Problem(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(changes, dict) or not changes:
        raise Problem(422, f"expected {expected}")
    return changes
