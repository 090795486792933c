"""Listening on a configured ``HOST:PORT`` over TCP (the web server, RTSP): ``[::]`` is every
address of both families, on one port.

asyncio makes a ``::`` TCP socket IPv6-only, so ``listen = "[::]:8080"`` (the example the
config's error message gives) left every IPv4 client out. Each family gets its own socket
instead (the WebRTC UDP mux does the same with ``HostPort.bind_hosts``), IPv4 first; with port
0 the second is bound to the port the first got; a board without IPv6 listens on IPv4 alone.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable

from ruseon_appliance.config import HostPort

logger = logging.getLogger(__name__)

# What binding ``::`` fails with where the board has no IPv6 (module absent, or turned off).
NO_IPV6 = frozenset({errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL})


async def bind_every_host(listen: HostPort, key: str,
                          bind: Callable[[str, int], Awaitable[int]]) -> None:
    """Call ``bind(host, port)`` (which returns the port it bound) for each address
    ``listen`` stands for. ``key`` names the setting in the warning when IPv6 is missing."""
    hosts = listen.bind_hosts()
    port = listen.port
    for host in hosts:
        try:
            port = await bind(host, port)
        except OSError as exc:
            if host != "::" or len(hosts) == 1 or exc.errno not in NO_IPV6:
                raise
            logger.warning("%s = %s: this board has no IPv6 (%s); listening on IPv4 only",
                           key, listen, exc.strerror or exc)
