"""The credentials this device accepts, and what each grants.

- The **admin secret**: ``[auth] token`` (or ``token_file``) when the config sets one, otherwise
  the per-device secret generated on first start (:mod:`.secret`). It grants everything.
- The **viewer token** (``[auth] viewer_token`` or ``viewer_token_file``): viewing only, to be
  shared without giving admin. It matters when ``[auth] viewing = "credential"``; by default
  viewing is open on the LAN and needs nothing.
- A **login session** (the page's cookie) carries the role of the secret it was opened with.

A file-backed secret is watched: when it changes (``ruseon admin-secret --rotate``), the new one
counts from then on and every admin session opened with the old one ends.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ruseon_appliance.access import secret as secret_file
from ruseon_appliance.access.policy import Role
from ruseon_appliance.access.sessions import SessionStore, same_secret
from ruseon_appliance.access.throttle import FailureThrottle

if TYPE_CHECKING:
    from ruseon_appliance.config import AuthConfig

log = logging.getLogger(__name__)

# How often a file-backed secret is looked at for a change (a stat() in a thread).
WATCH_INTERVAL_S = 2.0


@dataclass(slots=True)
class AdminSecret:
    """The admin secret and where it comes from."""

    value: str
    origin: str  # "auth.token", "auth.token_file", or the generated file's path
    path: Path | None = None  # the file it is read from (watched), None for a literal token
    generated: bool = False  # made by this start


def load_admin_secret(auth: AuthConfig, state_dir: str | Path) -> AdminSecret:
    """The admin secret for this configuration, generating the per-device one if needed."""
    if auth.token:
        return AdminSecret(auth.token, "auth.token")
    if auth.token_file:
        return AdminSecret(auth.resolve_token(), "auth.token_file", Path(auth.token_file))
    path = secret_file.secret_path(state_dir)
    value, generated = secret_file.ensure_secret(path)
    return AdminSecret(value, str(path), path, generated)


class Credentials:
    """Decides what a presented secret grants; holds the login sessions and the throttle."""

    def __init__(self, admin: AdminSecret, *, viewer_token: str = "", viewing_open: bool = True,
                 viewer_token_path: Path | None = None,
                 sessions: SessionStore | None = None,
                 throttle: FailureThrottle | None = None) -> None:
        self.admin = admin
        self.viewer_token = viewer_token
        self.viewer_token_path = viewer_token_path
        self.viewing_open = viewing_open
        self.sessions = sessions or SessionStore()
        self.throttle = throttle or FailureThrottle()
        self.rotations = 0
        self._signatures = {
            p: secret_file.file_signature(p) for p in self._watched() if p is not None}

    @classmethod
    def from_config(cls, auth: AuthConfig, state_dir: str | Path) -> Credentials:
        """Credentials for ``auth``; generates the admin secret on a first start."""
        admin = load_admin_secret(auth, state_dir)
        if admin.generated:
            log.warning(
                "admin: generated this device's admin secret in %s (0600); print it with "
                "`sudo ruseon admin-secret`. The page's Settings, Record and Delete ask for it",
                admin.origin, extra={"EVENT": "admin_secret_generated", "PATH": admin.origin})
        return cls(admin, viewer_token=auth.resolve_viewer_token(),
                   viewing_open=auth.viewing == "open",
                   viewer_token_path=Path(auth.viewer_token_file) if auth.viewer_token_file
                   else None)

    @property
    def viewing(self) -> str:
        """``open`` or ``credential`` (as configured)."""
        return "open" if self.viewing_open else "credential"

    def role_of(self, provided: str) -> Role | None:
        """What ``provided`` grants: ADMIN, VIEWER, or None for a wrong secret."""
        if same_secret(provided, self.admin.value):
            return Role.ADMIN
        if self.viewer_token and same_secret(provided, self.viewer_token):
            return Role.VIEWER
        return None

    def passwords(self) -> list[tuple[str, Role]]:
        """Every accepted secret with its role (RTSP Digest tries each)."""
        out = [(self.admin.value, Role.ADMIN)]
        if self.viewer_token:
            out.append((self.viewer_token, Role.VIEWER))
        return out

    def _watched(self) -> tuple[Path | None, Path | None]:
        return (self.admin.path, self.viewer_token_path)

    def _reload_changed(self) -> list[str]:
        """Re-read the secrets whose files changed (runs in a thread); what changed."""
        changed: list[str] = []
        for path in self._watched():
            if path is None:
                continue
            signature = secret_file.file_signature(path)
            if signature is None or signature == self._signatures.get(path):
                continue
            try:
                if path == self.admin.path:
                    value = secret_file.read_secret(path)
                else:
                    value = path.read_text(encoding="utf-8").strip()
            except (OSError, ValueError) as exc:
                log.warning("admin: %s changed but cannot be used (%s); keeping the old secret",
                            path, exc)
                self._signatures[path] = signature
                continue
            self._signatures[path] = signature
            if path == self.admin.path and value != self.admin.value:
                self.admin.value = value
                changed.append("admin")
            elif path == self.viewer_token_path and value != self.viewer_token:
                self.viewer_token = value
                changed.append("viewer")
        return changed

    async def check_files(self) -> list[str]:
        """Pick up rotated secrets; ends the sessions of a rotated role."""
        changed = await asyncio.to_thread(self._reload_changed)
        for what in changed:
            role = Role.ADMIN if what == "admin" else Role.VIEWER
            ended = self.sessions.end_role(role)
            self.rotations += 1
            log.warning("admin: the %s secret changed; %d login session(s) with the old one "
                        "ended", what, ended, extra={"EVENT": "secret_rotated", "ROLE": what})
        return changed

    async def watch(self, interval_s: float = WATCH_INTERVAL_S) -> None:
        """Run :meth:`check_files` every ``interval_s`` (a task of the composition root)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.check_files()
            except Exception:
                log.exception("admin: checking the secret files failed")

    def stats(self) -> dict[str, object]:
        """For ``/api/status`` (admin) and ``/metrics``."""
        return {"viewing": self.viewing, "admin_secret": self.admin.origin,
                "viewer_token": bool(self.viewer_token), "sessions": self.sessions.count(),
                "rotations": self.rotations, **self.throttle.stats()}
