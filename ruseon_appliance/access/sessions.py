"""Login sessions of the device page: a random id in an HttpOnly, SameSite=Strict cookie.

The id is the session (256 random bits, kept only in memory here: a restart logs everyone out,
which for a camera on a LAN is the safe side). A session expires :data:`SESSION_LIFETIME_S`
after login; rotating the admin secret ends every admin session at once.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ruseon_appliance.access.policy import Role

COOKIE_NAME = "ruseon_session"
SESSION_LIFETIME_S = 7 * 24 * 3600.0
MAX_SESSIONS = 1024


@dataclass(frozen=True, slots=True)
class LoginSession:
    """One logged-in browser."""

    role: Role
    created: float  # time.monotonic()


class SessionStore:
    """Sessions by id, bounded (the oldest logs out first)."""

    def __init__(self, *, lifetime_s: float = SESSION_LIFETIME_S, max_sessions: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime_s = lifetime_s
        self.max_sessions = max_sessions
        self.clock = clock
        self._sessions: OrderedDict[str, LoginSession] = OrderedDict()

    def open(self, role: Role) -> str:
        """A new session for ``role``; returns its id (the cookie's value)."""
        session_id = secrets.token_urlsafe(32)
        self._sessions[session_id] = LoginSession(role, self.clock())
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return session_id

    def role(self, session_id: str) -> Role:
        """The role of a live session, or NONE (unknown, expired or ended)."""
        if not session_id or len(session_id) > 128:
            return Role.NONE
        session = self._sessions.get(session_id)
        if session is None:
            return Role.NONE
        if self.clock() - session.created > self.lifetime_s:
            del self._sessions[session_id]
            return Role.NONE
        return session.role

    def close(self, session_id: str) -> None:
        """Log one session out."""
        self._sessions.pop(session_id, None)

    def end_role(self, role: Role) -> int:
        """End every session of ``role`` (the admin secret was rotated); how many ended."""
        ended = [k for k, s in self._sessions.items() if s.role == role]
        for key in ended:
            del self._sessions[key]
        return len(ended)

    def count(self) -> dict[str, int]:
        """Live sessions by role name."""
        counts: dict[str, int] = {}
        for session in self._sessions.values():
            counts[session.role.name.lower()] = counts.get(session.role.name.lower(), 0) + 1
        return counts


def same_secret(provided: str, expected: str) -> bool:
    """Compare in constant time, so timing does not reveal a prefix."""
    if not expected:
        return False
    return hmac.compare_digest(provided.encode("utf-8", "surrogateescape"), expected.encode())
