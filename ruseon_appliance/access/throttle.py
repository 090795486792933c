"""Brute force made impractical: failed authentications are throttled per client address.

Ten wrong credentials in a row from one address are free (a person mistyping); from then on
that address must wait before its next try, 1 s doubling with each further failure up to
:data:`MAX_WAIT_S` (429 + ``Retry-After`` in HTTP and RTSP). Only that address waits: a correct
credential from anywhere else is served at once, and requests that present no credential
(viewing, when it is open) are never held. The admin secret resets the address (the viewer
token does not: it is shared); an address quiet for :data:`FORGET_AFTER_S` is forgotten. IPv6
clients are counted by /64 (one host holds a whole prefix). The table is bounded, oldest
forgotten first. Each burst is logged once.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ruseon_appliance.access.policy import Role

log = logging.getLogger(__name__)

FREE_FAILURES = 10
BASE_WAIT_S = 1.0
MAX_WAIT_S = 300.0
FORGET_AFTER_S = 900.0
MAX_TRACKED = 4096


def address_key(address: str) -> str:
    """The unit of throttling: an IPv4 address, or an IPv6 /64 (an IPv4-mapped one as IPv4)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass(slots=True)
class _Entry:
    failures: int = 0
    blocked_until: float = 0.0
    last: float = 0.0
    logged: bool = False


class FailureThrottle:
    """Counts failed authentications per address and says how long one must wait."""

    def __init__(self, *, free_failures: int = FREE_FAILURES, base_wait_s: float = BASE_WAIT_S,
                 max_wait_s: float = MAX_WAIT_S, forget_after_s: float = FORGET_AFTER_S,
                 max_tracked: int = MAX_TRACKED,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.free_failures = free_failures
        self.base_wait_s = base_wait_s
        self.max_wait_s = max_wait_s
        self.forget_after_s = forget_after_s
        self.max_tracked = max_tracked
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        # Counters for /metrics, by protocol ("http", "rtsp").
        self.failures: dict[str, int] = {}
        self.throttled: dict[str, int] = {}

    def _entry(self, key: str, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and now - entry.last > self.forget_after_s \
                and now >= entry.blocked_until:
            del self._entries[key]
            return None
        return entry

    def retry_after(self, address: str, kind: str = "http") -> int | None:
        """Whole seconds ``address`` must still wait before presenting a credential, or None
        when it may try now. A refusal is counted (``throttled``)."""
        now = self.clock()
        entry = self._entry(address_key(address), now)
        if entry is None or now >= entry.blocked_until:
            return None
        self.throttled[kind] = self.throttled.get(kind, 0) + 1
        return max(1, math.ceil(entry.blocked_until - now))

    def failed(self, address: str, kind: str = "http") -> None:
        """Count a wrong credential from ``address``."""
        now = self.clock()
        key = address_key(address)
        self.failures[kind] = self.failures.get(kind, 0) + 1
        entry = self._entry(key, now)
        if entry is None:
            entry = self._entries[key] = _Entry()
            while len(self._entries) > self.max_tracked:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        entry.failures += 1
        entry.last = now
        over = entry.failures - self.free_failures
        if over >= 0:
            wait = min(self.max_wait_s, self.base_wait_s * 2 ** min(over, 30))
            entry.blocked_until = now + wait
            if not entry.logged:
                entry.logged = True
                log.warning(
                    "authentication: %d wrong credentials in a row from %s (%s); it now waits "
                    "%.0f s before each try, doubling", entry.failures, key, kind, wait,
                    extra={"EVENT": "auth_throttled", "CLIENT": key, "PROTOCOL": kind})

    def succeeded(self, address: str, role: Role) -> None:
        """A correct credential from ``address``: the admin secret starts its count again.
        The viewer token does not: it is shared, and its holders could otherwise reset their
        count between guesses at the admin secret (their failures only age out)."""
        if role == Role.ADMIN:
            self._entries.pop(address_key(address), None)

    def addresses_waiting(self) -> int:
        """Addresses that must wait now before their next try."""
        now = self.clock()
        return sum(1 for e in self._entries.values() if e.blocked_until > now)

    def stats(self) -> dict[str, object]:
        """Counters for ``/api/status`` and ``/metrics``."""
        return {"failures": dict(self.failures), "throttled": dict(self.throttled),
                "addresses_waiting": self.addresses_waiting()}
