"""One logging setup for the whole appliance: levels plus key=value context.

Context travels as upper-case ``extra`` keys, the names journald will index
(``log.info("viewer joined", extra={"EVENT": "session_start", "SESSION_ID": sid})``). On a
terminal they print as ``key=value`` after the message; under systemd the journal handler
(see :mod:`ruseon_appliance.systemd_integration`) sends them as structured fields.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from typing import Any

# Attributes every LogRecord has; anything else upper-case came from ``extra``.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({})))


def context_fields(record: logging.LogRecord) -> dict[str, Any]:
    """Return the structured fields a record carries (its upper-case ``extra`` keys)."""
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _RECORD_ATTRS and key.isupper()
    }


class KeyValueFormatter(logging.Formatter):
    """``time level logger: message key=value …``, values quoted when they contain spaces."""

    def __init__(self, with_time: bool = True) -> None:
        fmt = "%(asctime)s %(levelname)-7s %(name)s: %(message)s" if with_time else (
            "%(levelname)s %(name)s: %(message)s"
        )
        super().__init__(fmt)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = context_fields(record)
        if fields:
            text += " " + " ".join(
                f"{key.lower()}={_quote(value)}" for key, value in sorted(fields.items())
            )
        return text


def _quote(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "='):
        return '"' + text.replace('"', '\\"') + '"'
    return text


class RateLimit:
    """Says yes at most once per ``interval_s``: for a warning that a failing peer or a broken
    input could otherwise repeat on every packet or retry and flood the journal.

    ``if self._failure_log.ready(): log.warning(...)``; the first call is always ready. The
    counting of what was not logged stays with the caller (its counters say how many).
    """

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last = -math.inf

    def ready(self) -> bool:
        """True (and the interval restarts) when ``interval_s`` has passed since the last True."""
        now = self._clock()
        if now - self._last >= self.interval_s:
            self._last = now
            return True
        return False


def setup_logging(level: str = "info", handler: logging.Handler | None = None) -> None:
    """Configure the root logger once: one handler, the given level, quiet third parties."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(KeyValueFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiortc/aioice log every STUN transaction at INFO; keep them to warnings unless debugging.
    third_party = logging.DEBUG if level.lower() == "debug" else logging.WARNING
    for name in ("aioice", "aiortc", "aiohttp.access", "libav"):
        logging.getLogger(name).setLevel(third_party)
