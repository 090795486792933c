"""WS-Security UsernameToken (OASIS UsernameToken Profile 1.0) as ONVIF cameras check it.

``PasswordDigest`` is Base64(SHA-1(nonce + created + password)) with the nonce's raw bytes;
``PasswordText`` is the password itself (the client's choice; over plain HTTP it is as good
as Basic).

``Created`` must be within :data:`CLOCK_SKEW_S` of this device's clock while that clock is
synchronized (NTP). Home Assistant does *not* correct its ``Created`` by the device's
``GetSystemDateAndTime`` (its ``ONVIFCamera`` runs with ``adjust_time`` off; it only warns
"this could lead to authentication issues" when the clocks differ by 5 s or more, and sets the
camera's clock only when it says ``DateTimeType = Manual``, which this device never does), so
a Pi that booted without a network time source, hours or days off, would refuse Home
Assistant for as long as it stays unsynchronized. There ``Created`` is not judged. Either
way a nonce seen before (kept for twice the window, at most :data:`MAX_NONCES`) is a replay
and refused; and no ONVIF operation here changes anything, so a replayed request could only
read again what it read.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ruseon_appliance.access.policy import Role
from ruseon_appliance.access.sessions import same_secret
from ruseon_appliance.onvif.soap import NAMESPACES, SoapFault, text_of

CLOCK_SKEW_S = 300.0
MAX_NONCES = 4096
PASSWORD_DIGEST = ("http://docs.oasis-open.org/wss/2004/01/"
                   "oasis-200401-wss-username-token-profile-1.0#PasswordDigest")
PASSWORD_TEXT = ("http://docs.oasis-open.org/wss/2004/01/"
                 "oasis-200401-wss-username-token-profile-1.0#PasswordText")


@dataclass(frozen=True, slots=True)
class Account:
    """A user name and password the ONVIF device accepts, with what it grants."""

    username: str
    password: str
    role: Role


def parse_created(text: str) -> float:
    """``wsu:Created`` (xsd:dateTime, UTC ``Z`` or an offset) as a POSIX time."""
    when = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


class UsernameTokenVerifier:
    """Checks a request's ``wsse:Security`` header against the accounts it is given."""

    def __init__(self, accounts: Callable[[], Sequence[Account]], *,
                 clock: Callable[[], float] = time.time,
                 synchronized: Callable[[], bool] = lambda: True,
                 skew_s: float = CLOCK_SKEW_S) -> None:
        self.accounts = accounts
        self.clock = clock
        self.synchronized = synchronized
        self.skew_s = skew_s
        self._nonces: OrderedDict[bytes, float] = OrderedDict()

    def role_of(self, header: object) -> tuple[Role | None, str]:
        """``(role, user)`` of the request's UsernameToken: ``(None, "")`` when it carries
        none; :class:`SoapFault` ``NotAuthorized`` when it carries a wrong one."""
        from xml.etree.ElementTree import Element
        if not isinstance(header, Element):
            return None, ""
        token = header.find("wsse:Security/wsse:UsernameToken", NAMESPACES)
        if token is None:
            return None, ""
        username = text_of(token, "wsse:Username")
        password_el = token.find("wsse:Password", NAMESPACES)
        if password_el is None:
            raise _refused("the UsernameToken has no Password")
        password = (password_el.text or "").strip()
        kind = password_el.get("Type", PASSWORD_TEXT)
        accounts = [a for a in self.accounts() if a.username == username]
        if kind == PASSWORD_TEXT:
            for account in accounts:
                if same_secret(password, account.password):
                    return account.role, username
            raise _refused("wrong user name or password")
        if kind != PASSWORD_DIGEST:
            raise _refused("unknown password type")
        created = text_of(token, "wsu:Created")
        try:
            nonce = base64.b64decode(text_of(token, "wsse:Nonce"), validate=True)
            created_at = parse_created(created)
        except (binascii.Error, ValueError):
            raise _refused("the UsernameToken's Nonce or Created cannot be read") from None
        now = self.clock()
        if not nonce or (abs(now - created_at) > self.skew_s and self.synchronized()):
            raise _refused("the UsernameToken's Created is too far from this device's clock "
                           "(ask GetSystemDateAndTime and write Created in its time)")
        for account in accounts:
            digest = base64.b64encode(hashlib.sha1(
                nonce + created.encode() + account.password.encode()).digest()).decode()
            if same_secret(password, digest):
                self._forget_old(now)
                if nonce in self._nonces:
                    raise _refused("the UsernameToken's nonce was already used")
                self._nonces[nonce] = now
                while len(self._nonces) > MAX_NONCES:
                    self._nonces.popitem(last=False)
                return account.role, username
        raise _refused("wrong user name or password")

    def _forget_old(self, now: float) -> None:
        while self._nonces:
            nonce, seen = next(iter(self._nonces.items()))
            if now - seen <= 2 * self.skew_s:
                break
            del self._nonces[nonce]


def _refused(reason: str) -> SoapFault:
    return SoapFault("NotAuthorized", reason)
