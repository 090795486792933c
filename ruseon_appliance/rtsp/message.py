"""RTSP 1.0 messages (RFC 2326) as NVRs and players send them: requests in, responses out, and
the ``Transport`` header.

Parsing is strict where it matters (a request line ``METHOD URL RTSP/1.0``, sizes bounded,
``CSeq`` present) and lenient elsewhere (header names in any case, unknown headers ignored).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The request line and headers together, and a request body (GET_PARAMETER, SET_PARAMETER).
MAX_HEAD_BYTES = 8192
MAX_BODY_BYTES = 4096
MAX_HEADERS = 64

_METHOD = re.compile(r"^[A-Z_]{1,32}$")
_TOKEN_VALUE = re.compile(r"^[\x20-\x7e\t]*$")

REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Request Entity Too Large",
    451: "Parameter Not Understood",
    454: "Session Not Found",
    455: "Method Not Valid in This State",
    459: "Aggregate Operation Not Allowed",
    461: "Unsupported Transport",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "RTSP Version Not Supported",
    551: "Option not supported",
}


class BadRequest(Exception):
    """A request that cannot be parsed: answered with ``status`` and the connection closed."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(slots=True)
class RtspRequest:
    """One parsed request; header names are lower-cased."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes = b""

    @property
    def cseq(self) -> str:
        """The request's ``CSeq`` (every response echoes it)."""
        return self.headers.get("cseq", "")

    def header(self, name: str) -> str:
        """A header's value, ``""`` when absent."""
        return self.headers.get(name.lower(), "")


def parse_head(head: bytes) -> RtspRequest:
    """Parse a request line and headers (ending with the blank line); raise :class:`BadRequest`."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the request is not UTF-8 text") from None
    lines = text.split("\r\n")
    while lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise BadRequest("empty request")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _METHOD.match(parts[0]) or not parts[1]:
        raise BadRequest("the request line is not 'METHOD URL RTSP/1.0'")
    method, url, version = parts
    if not version.startswith("RTSP/"):
        raise BadRequest("the request line is not 'METHOD URL RTSP/1.0'")
    if version != "RTSP/1.0":
        raise BadRequest(f"{version} is not supported (RTSP/1.0 only)", 505)
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(f"more than {MAX_HEADERS} headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        name = name.strip().lower()
        if not sep or not name or " " in name or not _TOKEN_VALUE.match(value):
            raise BadRequest("a header line is not 'Name: value'")
        value = value.strip()
        # Repeated headers (rare in RTSP) are joined as HTTP does.
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    request = RtspRequest(method, url, headers)
    if not request.cseq.strip().isdigit():
        raise BadRequest("CSeq is missing or not a number")
    return request


def content_length(request: RtspRequest) -> int:
    """The body's length (0 without ``Content-Length``); raise :class:`BadRequest` when it is
    not a number or larger than :data:`MAX_BODY_BYTES`."""
    value = request.header("content-length")
    if not value:
        return 0
    if not value.isdigit():
        raise BadRequest("Content-Length is not a number")
    if len(value) > 9:  # (int() refuses thousands of digits with ValueError)
        raise BadRequest(f"a body larger than {MAX_BODY_BYTES} bytes", 413)
    length = int(value)
    if length > MAX_BODY_BYTES:
        raise BadRequest(f"a body larger than {MAX_BODY_BYTES} bytes", 413)
    return length


@dataclass(slots=True)
class RtspResponse:
    """A response; ``headers`` in order (a name may repeat, e.g. ``WWW-Authenticate``)."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    reason: str = ""
    # Close the connection once this response is written (bad requests).
    close: bool = False

    def encode(self, cseq: str) -> bytes:
        """The response as bytes, ``CSeq`` first."""
        lines = [f"RTSP/1.0 {self.status} {REASONS.get(self.status, 'Error')}"]
        if cseq:
            lines.append(f"CSeq: {cseq}")
        lines.append("Server: RUSEON")
        lines += [f"{name}: {value}" for name, value in self.headers]
        body = self.body
        if not body and self.reason and self.status >= 400:
            body = (self.reason + "\r\n").encode()
            lines.append("Content-Type: text/plain")
        if body:
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass(frozen=True, slots=True)
class TransportSpec:
    """One transport the client proposed in ``Transport`` (RFC 2326 12.39)."""

    profile: str  # "RTP/AVP" (UDP) or "RTP/AVP/TCP"
    unicast: bool
    interleaved: tuple[int, int] | None
    client_port: tuple[int, int] | None
    destination: str
    mode: str

    @property
    def tcp(self) -> bool:
        """Interleaved on the RTSP connection."""
        return self.profile.upper() == "RTP/AVP/TCP"


def _pair(text: str) -> tuple[int, int] | None:
    first, sep, second = text.partition("-")
    if not first.isdigit() or (sep and not second.isdigit()):
        return None
    if len(first) > 5 or len(second) > 5:  # no port or channel is longer (int() refuses
        return None                        # thousands of digits with ValueError)
    a = int(first)
    b = int(second) if sep else a + 1
    return (a, b)


def parse_transport(value: str) -> list[TransportSpec]:
    """The proposals of a ``Transport`` header, in the client's order of preference."""
    specs: list[TransportSpec] = []
    for proposal in value.split(","):
        params = [p.strip() for p in proposal.split(";") if p.strip()]
        if not params:
            continue
        profile = params[0].upper()
        if profile == "RTP/AVP/UDP":
            profile = "RTP/AVP"
        unicast = True
        interleaved = client_port = None
        destination = mode = ""
        for param in params[1:]:
            key, _, val = param.partition("=")
            key = key.strip().lower()
            val = val.strip().strip('"')
            if key == "multicast":
                unicast = False
            elif key == "interleaved":
                interleaved = _pair(val) or (-1, -1)
            elif key == "client_port":
                client_port = _pair(val) or (-1, -1)
            elif key == "destination":
                destination = val
            elif key == "mode":
                mode = val.upper()
        specs.append(TransportSpec(profile, unicast, interleaved, client_port, destination,
                                   mode))
    return specs
