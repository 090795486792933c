"""RTSP authentication with the appliance's secrets: Basic (RFC 7617) and Digest (RFC 2617, MD5).

NVRs and players take credentials as ``rtsp://USER:PASSWORD@host:8554/cam``; the user name is
anything and the password is the viewer token or the admin secret (access/credentials.py;
which methods need which is access/policy.py's ``RTSP_METHODS``). Both schemes are offered in
the 401 (Digest first: FFmpeg, VLC/live555 and GStreamer pick it when offered, so the secret
never crosses the LAN in the clear; Basic is for clients that only know Basic).

Digest nonces are stateless: the time they were made and an HMAC of it and of the client's IP
address with a key made at start-up, valid for :data:`NONCE_LIFETIME_S` (a player re-uses its
nonce for the keep-alives of a whole session); an older one gets ``stale=true``, and clients
retry with the new nonce without asking their user. Binding the nonce to the address stops a
replay from elsewhere on the LAN: without ``qop`` (GStreamer, older players) a Digest response
is the same each time for the same request, so whoever captured one exchange could otherwise
replay it for the nonce's lifetime; from another address it is now refused (replaying from the
client's own address would need its TCP connection). Every comparison is constant-time.

The challenge offers ``qop="auth"``. A client that uses it (FFmpeg) counts its requests in
``nc``; the highest count seen per nonce is kept (a bounded LRU of :data:`NONCE_TABLE_SIZE`
nonces), and a request whose count is not higher (a replay, even from the client's own
address) is answered 401 ``stale=true`` with a fresh nonce, which an honest client takes
without asking its user. A nonce pushed out of the table raises a horizon: nonces made at or
before it and not in the table are stale too, so eviction never re-opens a replay. Clients
without ``qop`` (GStreamer's, live555's) are still let in (RFC 2617 allows it); for them a
replay from the client's own address within the nonce's hour is not detected.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

REALM = "RUSEON"
NONCE_LIFETIME_S = 3600
# Nonces whose highest nc is remembered (an entry is ~100 bytes: ~400 KB at most).
NONCE_TABLE_SIZE = 4096

_PARAM = re.compile(r'([A-Za-z0-9_-]+)\s*=\s*("((?:[^"\\]|\\.)*)"|[^,\s]*)')

Verdict = Literal["ok", "missing", "wrong", "stale"]


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


class RtspAuth:
    """Checks ``Authorization`` headers against the accepted passwords (see the module
    docstring). ``passwords`` is asked on every check, so a rotated secret counts at once."""

    def __init__(self, passwords: str | Callable[[], list[str]], *, realm: str = REALM) -> None:
        self.passwords: Callable[[], list[str]] = (
            (lambda: [passwords]) if isinstance(passwords, str) else passwords)
        self.realm = realm
        self._key = secrets.token_bytes(32)
        self._nc: OrderedDict[str, int] = OrderedDict()  # nonce -> highest nc used
        self._horizon = -1  # nonces made at or before this time (s) and not in _nc are stale
        self.replays = 0  # qop requests refused for an nc not higher than before

    def _mac(self, stamp: str, peer: str) -> str:
        return hmac.new(self._key, f"{stamp}|{peer}".encode(), hashlib.sha256).hexdigest()[:24]

    def nonce(self, peer: str = "", now: float | None = None) -> str:
        """A fresh nonce for the client at IP ``peer``: its time and an HMAC of both."""
        stamp = f"{int(time.time() if now is None else now):x}"
        return f"{stamp}{self._mac(stamp, peer)}"

    def _nonce_age(self, nonce: str, peer: str) -> float | None:
        """Seconds since ``nonce`` was made here for ``peer``, None if it was not."""
        stamp, mac = nonce[:-24], nonce[-24:]
        if not stamp or len(stamp) > 16:
            return None
        expected = self._mac(stamp, peer)
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            return None
        try:
            return time.time() - int(stamp, 16)
        except ValueError:
            return None

    def challenges(self, peer: str = "", *, stale: bool = False) -> list[tuple[str, str]]:
        """The ``WWW-Authenticate`` headers of a 401 to the client at ``peer``: Digest, then
        Basic."""
        digest = (f'Digest realm="{self.realm}", nonce="{self.nonce(peer)}", algorithm=MD5, '
                  f'qop="auth"')
        if stale:
            digest += ", stale=true"
        return [("WWW-Authenticate", digest),
                ("WWW-Authenticate", f'Basic realm="{self.realm}"')]

    def check(self, method: str, url: str, authorization: str, peer: str = "") -> Verdict:
        """Whether ``authorization`` (the header's value) carries the token for this request
        from the client at IP ``peer``."""
        scheme, _, rest = authorization.strip().partition(" ")
        scheme = scheme.lower()
        if not authorization.strip():
            return "missing"
        if scheme == "basic":
            try:
                decoded = base64.b64decode(rest.strip(), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return "wrong"
            _, sep, password = decoded.partition(":")
            ok = False
            for expected in self.passwords():
                ok |= bool(sep) and hmac.compare_digest(password.encode(), expected.encode())
            return "ok" if ok else "wrong"
        if scheme == "digest":
            return self._check_digest(method, url, rest, peer)
        return "wrong"

    def _check_digest(self, method: str, url: str, rest: str, peer: str) -> Verdict:
        params = {m.group(1).lower(): (m.group(3) if m.group(3) is not None else m.group(2))
                  for m in _PARAM.finditer(rest)}
        username, nonce = params.get("username"), params.get("nonce", "")
        uri, response = params.get("uri"), params.get("response", "")
        if username is None or uri is None or not nonce or not response:
            return "wrong"
        if params.get("realm") != self.realm:
            return "wrong"
        if params.get("algorithm", "MD5").upper() != "MD5":
            return "wrong"
        # The digest covers the URI the client names; it must be this request's.
        if uri != url and uri != _path_of(url):
            return "wrong"
        ha2 = _md5(f"{method}:{uri}")
        qop = params.get("qop", "")
        if qop and qop.lower() != "auth":
            return "wrong"
        matched = False
        for password in self.passwords():
            ha1 = _md5(f"{username}:{self.realm}:{password}")
            if qop:
                nc, cnonce = params.get("nc", ""), params.get("cnonce", "")
                expected = _md5(f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")
            else:
                expected = _md5(f"{ha1}:{nonce}:{ha2}")
            matched |= hmac.compare_digest(response.lower().encode(), expected.encode())
        if not matched:
            return "wrong"
        age = self._nonce_age(nonce, peer)
        if age is None:
            return "wrong"
        if not -60 <= age <= NONCE_LIFETIME_S:
            return "stale"
        if qop:
            return self._count(nonce, params.get("nc", ""))
        return "ok"

    def _count(self, nonce: str, nc_text: str) -> Verdict:
        """Admit a ``qop=auth`` request only if its ``nc`` is higher than any before with
        this nonce (see the module docstring)."""
        try:
            nc = int(nc_text, 16) if 0 < len(nc_text) <= 8 else -1
        except ValueError:
            nc = -1
        if nc < 1:
            return "wrong"
        last = self._nc.get(nonce)
        if last is None and int(nonce[:-24], 16) <= self._horizon:
            self.replays += 1
            return "stale"  # made before the table's horizon and not in it: may have been used
        if last is not None and nc <= last:
            self.replays += 1
            return "stale"
        self._nc[nonce] = nc
        self._nc.move_to_end(nonce)
        while len(self._nc) > NONCE_TABLE_SIZE:
            evicted, _ = self._nc.popitem(last=False)
            self._horizon = max(self._horizon, int(evicted[:-24], 16))
        return "ok"


def _path_of(url: str) -> str:
    """``/cam/trackID=0`` of ``rtsp://host:8554/cam/trackID=0`` (some clients digest that)."""
    _, sep, rest = url.partition("://")
    if not sep:
        return url
    slash = rest.find("/")
    return rest[slash:] if slash >= 0 else "/"
