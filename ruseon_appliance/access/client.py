"""The client's address: the TCP peer's, or, behind a trusted reverse proxy, the one it forwards.

Behind a proxy every client shares the proxy's address, so whatever counts per address (the
share of viewer places, failed logins) would count them all as one. A proxy named in
``http.trusted_proxies`` says whom it serves in ``Forwarded: for=`` (RFC 7239) or
``X-Forwarded-For``. Each proxy on the way appends the address it got the request from, so the
list's right end is written by the nearest proxy and its left end by whoever the client is (and
may be forged by it): the answer is the right-most address that is not a trusted proxy. Anything
that does not parse, or a hop that hides its address (``unknown``, an obfuscated ``_name``),
gives the peer's own address: counting a client as its proxy is safe, counting it as an address
it made up is not.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# RFC 9110 tchar: what a token (an unquoted Forwarded parameter name or value) consists of.
_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789"
                   "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_OBFUSCATED = frozenset("._-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class MalformedHeader(ValueError):
    """A ``Forwarded`` or ``X-Forwarded-For`` value that does not parse."""


def client_address(peer: str | None, headers: Mapping[str, str],
                   trusted_proxies: Sequence[Network]) -> str:
    """The address a request counts against: ``peer`` (the TCP peer; "" when unknown) unless
    it is inside one of ``trusted_proxies``, then the right-most address of ``Forwarded``'s
    ``for=`` (or, without any, ``X-Forwarded-For``) that is not a trusted proxy. Malformed or
    absent headers, or a hop that hides its address, give ``peer``."""
    if not peer:
        return ""
    peer_ip = parse_ip(peer)
    if peer_ip is None or not _trusted(peer_ip, trusted_proxies):
        return peer
    try:
        hops = forwarded_for(_header_values(headers, "Forwarded"))
        if not hops:
            hops = x_forwarded_for(_header_values(headers, "X-Forwarded-For"))
    except MalformedHeader:
        return peer
    for hop in reversed(hops):
        if hop is None:
            return peer
        if not _trusted(hop, trusted_proxies):
            return str(hop)
    # Every hop is a trusted proxy (a client on a proxy's own host): the first is the client.
    first = hops[0] if hops else None
    return str(first) if first is not None else peer


def parse_ip(text: str) -> Address | None:
    """An IP literal (an IPv6 zone dropped, an IPv4-mapped IPv6 address as IPv4), or None."""
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def forwarded_for(value: str) -> list[Address | None]:
    """The ``for=`` node of each element of a ``Forwarded`` value, in order: an address, or
    None for ``unknown``, an obfuscated name, or an element without ``for``. [] when no element
    has a ``for``. Raises :class:`MalformedHeader`."""
    elements = parse_forwarded(value)
    if not any("for" in element for element in elements):
        return []
    return [_node(element["for"]) if "for" in element else None for element in elements]


def parse_forwarded(value: str) -> list[dict[str, str]]:
    """A ``Forwarded`` value (RFC 7239 §4) as its elements' parameters (names lower-cased,
    quoted strings unquoted). Raises :class:`MalformedHeader`."""
    elements: list[dict[str, str]] = []
    element: dict[str, str] = {}
    i, n = 0, len(value)
    while True:
        i = _skip_space(value, i)
        if i < n and value[i] not in ",;":
            name, i = _token(value, i)
            if i >= n or value[i] != "=":
                raise MalformedHeader(f"Forwarded: {name!r} has no value")
            i += 1
            if i < n and value[i] == '"':
                pair_value, i = _quoted(value, i)
            else:
                pair_value, i = _token(value, i)
            name = name.lower()
            if name in element:
                raise MalformedHeader(f"Forwarded: {name} twice in one element")
            element[name] = pair_value
            i = _skip_space(value, i)
        if i >= n:
            elements.append(element)
            return elements
        if value[i] == ",":
            elements.append(element)
            element = {}
        elif value[i] != ";":
            raise MalformedHeader(f"Forwarded: unexpected {value[i]!r} at {i}")
        i += 1


def x_forwarded_for(value: str) -> list[Address | None]:
    """The addresses of an ``X-Forwarded-For`` value, in order (None for ``unknown``); [] when
    there is none. Bare IPv4/IPv6, ``IPv4:port`` and ``[IPv6]:port`` are understood. Raises
    :class:`MalformedHeader`."""
    if not value.strip():
        return []
    hops: list[Address | None] = []
    for entry in value.split(","):
        entry = entry.strip()
        if entry.lower() == "unknown":
            hops.append(None)
            continue
        ip = parse_ip(entry) or _host_port(entry)
        if ip is None:
            raise MalformedHeader(f"X-Forwarded-For: {entry!r} is not an address")
        hops.append(ip)
    return hops


def _node(node: str) -> Address | None:
    """RFC 7239 §6 node: ``IPv4[:port]``, ``[IPv6][:port]``, or ``unknown`` / ``_obfuscated``
    (with or without a port: None)."""
    name, colon, port = node.partition(":") if not node.startswith("[") else (node, "", "")
    if name.lower() == "unknown" or (name.startswith("_") and _obfuscated(name)):
        if colon and not _is_port(port):
            raise MalformedHeader(f"Forwarded: for={node!r} has a bad port")
        return None
    ip = _host_port(node)
    if ip is None:
        raise MalformedHeader(f"Forwarded: for={node!r} is not a node")
    return ip


def _host_port(text: str) -> Address | None:
    """The address of ``IPv4[:port]`` or ``[IPv6][:port]``, or None when it is neither."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or ":" not in host or (rest and not (rest.startswith(":")
                                                            and _is_port(rest[1:]))):
            return None
    else:
        host, colon, port = text.partition(":")
        if ":" in host or (colon and not _is_port(port)) or "." not in host:
            return None
    return parse_ip(host)


def _is_port(port: str) -> bool:
    """A node-port: 1 to 5 digits, or an obfuscated ``_name``."""
    if port.isascii() and port.isdigit() and 1 <= len(port) <= 5:
        return True
    return port.startswith("_") and _obfuscated(port)


def _obfuscated(name: str) -> bool:
    return len(name) > 1 and all(c in _OBFUSCATED for c in name[1:])


def _trusted(ip: Address, trusted_proxies: Sequence[Network]) -> bool:
    return any(ip.version == net.version and ip in net for net in trusted_proxies)


def _header_values(headers: Mapping[str, str], name: str) -> str:
    """Every field line of ``name`` joined with commas (RFC 9110 §5.3), as one value."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return ",".join(getall(name, ()))
    return headers.get(name, "")


def _skip_space(value: str, i: int) -> int:
    while i < len(value) and value[i] in " \t":
        i += 1
    return i


def _token(value: str, i: int) -> tuple[str, int]:
    start = i
    while i < len(value) and value[i] in _TCHAR:
        i += 1
    if i == start:
        raise MalformedHeader(f"Forwarded: a token expected at {i}")
    return value[start:i], i


def _quoted(value: str, i: int) -> tuple[str, int]:
    """A quoted-string starting at ``value[i] == '"'``: its content and the index after it."""
    out: list[str] = []
    i += 1
    while i < len(value):
        char = value[i]
        if char == '"':
            return "".join(out), i + 1
        if char == "\\":
            i += 1
            if i >= len(value):
                break
            char = value[i]
        elif not (char == "\t" or " " <= char <= "~" or char >= "\x80"):
            raise MalformedHeader(f"Forwarded: control character in a quoted string at {i}")
        out.append(char)
        i += 1
    raise MalformedHeader("Forwarded: unterminated quoted string")
