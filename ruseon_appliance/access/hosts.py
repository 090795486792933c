"""DNS rebinding defence: the ``Host`` a request names must be one of this board's names.

A web page a LAN user opens can point its own host name at the board's address (DNS
rebinding); the browser then sends the board that name in ``Host``, and treats the board as the
attacker's origin. Answering only to the board's own names stops it before any handler runs.
Allowed: any IP literal (a rebinding needs a name), ``localhost`` and ``*.localhost``, the
machine's host name and ``<hostname>.local`` (mDNS), and the names in ``http.hosts`` (a reverse
proxy's, a DNS name given to the board). A request without ``Host`` (HTTP/1.0) is not a browser's
and is let through.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable


def split_host(host: str) -> str:
    """The name or address of a ``Host`` header value, without port and brackets, lower-case."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else host
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def is_ip_literal(name: str) -> bool:
    """True for an IPv4 or IPv6 address (a zone index allowed)."""
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return True


class HostAllowList:
    """The names this board answers to (see the module docstring)."""

    def __init__(self, extra: Iterable[str] = (), *, hostname: str | None = None) -> None:
        name = (hostname if hostname is not None else socket.gethostname()).lower().rstrip(".")
        short = name.split(".", 1)[0]
        names = {"localhost", name, short, f"{short}.local", f"{name}.local"}
        names.update(split_host(h) for h in extra if h.strip())
        self.names = frozenset(n for n in names if n)

    def allows(self, host: str | None) -> bool:
        """Whether a request with this ``Host`` header may be served."""
        if host is None:
            return True
        name = split_host(host)
        if not name:
            return False
        return (name in self.names or is_ip_literal(name) or name.endswith(".localhost"))
