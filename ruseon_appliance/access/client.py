"""The client's address as the access rules see it (a trusted reverse proxy's forwarded one)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence


def client_address(peer: str | None, headers: Mapping[str, str],
                   trusted_proxies: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]
                   ) -> str:
    """The peer's address (placeholder until forwarded headers are parsed)."""
    return peer or ""
