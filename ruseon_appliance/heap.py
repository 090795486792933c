"""Give the C heap's free pages back to the system (glibc ``malloc_trim``), where there is one.

glibc keeps freed memory inside its arenas for reuse; a burst of allocations at start-up (a
file split into access units in a worker thread, certificate loading, imports) leaves free pages
that count in RSS until something reuses them. ``malloc_trim(0)`` releases every free page of
every arena (with ``madvise``, also from the middle of a heap). Elsewhere (musl, macOS) this is a
no-op.
"""

from __future__ import annotations

import ctypes
from typing import Any

_trim: Any = None


def _malloc_trim() -> Any:
    global _trim
    if _trim is None:
        try:
            _trim = ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on
            _trim.argtypes = [ctypes.c_size_t]
            _trim.restype = ctypes.c_int
        except (OSError, AttributeError):
            _trim = False
    return _trim


def release_free_heap() -> None:
    """``malloc_trim(0)`` if this C library has it (glibc); never raises."""
    trim = _malloc_trim()
    if trim:
        trim(0)
