"""The per-device admin secret: generated on first start, kept 0600 in the state directory.

No two boards share a default credential (ETSI EN 303 645 provision 5.1-1): when the config sets
no ``[auth] token``, the first start makes 128 random bits (URL-safe text, 22 characters) and
keeps them in ``<state.dir>/admin-secret``. ``ruseon admin-secret`` prints it (``--rotate`` makes
a new one); the running service notices the file changing within seconds and ends every admin
session that was opened with the old one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

FILE_NAME = "admin-secret"
SECRET_BYTES = 16  # 128 bits
# A secret read from a file must be at least this long (a hand-written one-letter token would
# make brute force practical, throttling or not).
MIN_LENGTH = 16


def new_secret() -> str:
    """128 random bits as URL-safe text (fits a URL's password field and a header unquoted)."""
    return secrets.token_urlsafe(SECRET_BYTES)


def secret_path(state_dir: str | Path) -> Path:
    """Where the generated admin secret lives."""
    return Path(state_dir) / FILE_NAME


def write_secret(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` atomically, 0600 from the start (never readable by others,
    not even for a moment), owned like its directory (``ruseon admin-secret`` runs as root for a
    service that runs as the ``ruseon`` user)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (value + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    if os.geteuid() == 0:
        owner = path.parent.stat()
        with contextlib.suppress(OSError):
            os.chown(tmp, owner.st_uid, owner.st_gid)
    os.replace(tmp, path)


def read_secret(path: Path) -> str:
    """The secret kept at ``path`` (stripped); raises OSError or ValueError (too short)."""
    value = path.read_text(encoding="utf-8").strip()
    if len(value) < MIN_LENGTH:
        raise ValueError(f"{path} holds {len(value)} characters; an admin secret needs "
                         f"at least {MIN_LENGTH}")
    return value


def ensure_secret(path: Path) -> tuple[str, bool]:
    """The secret at ``path``, made first when there is none: (value, whether it was made now).

    A file that exists but cannot be used (empty, too short) is replaced, not trusted."""
    try:
        return read_secret(path), False
    except FileNotFoundError:
        pass
    except ValueError:
        pass
    value = new_secret()
    write_secret(path, value)
    return value, True


def file_signature(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file is rewritten (inode, size, mtime), None when it is gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
