"""What this image was built from: ``/etc/ruseon/build-info``.

image/layer/apply.sh writes it on both image targets (TOML): the project's version and commit,
whether the build had uncommitted changes, the lock file (``requirements.lock``, kept whole at
``/usr/lib/ruseon/requirements.lock``) with its sha256 and the versions it pinned. A checkout
run with ``make run`` has no such file. ``/api/status`` shows it to admin only.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

BUILD_INFO = Path("/etc/ruseon/build-info")


def read_build_info(path: Path | None = None) -> dict[str, Any] | None:
    """The build info as data; None where there is none (not an image), and ``{"error": why}``
    when the file is there but cannot be read, so a broken one is seen, not hidden."""
    path = path or BUILD_INFO
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"error": f"{path}: {exc.strerror or exc}"}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return {"error": f"{path}: {exc}"}
