"""SRTP in place: libsrtp called through pylibsrtp's own cffi binding on a reused buffer.

pylibsrtp 1.0's ``Session.protect`` copies the packet in, allocates an ``int *`` and copies the
result out on every call. The fan-out, the relay and anything else that sends SRTP per packet
protect in place in one reused buffer instead, calling libsrtp with the session's ``srtp_t``
(``_srtp[0]``, a private attribute of pylibsrtp: ``tests/stream/test_srtp.py`` fails loudly when
an upgrade changes it). Which session to use (aiortc's DTLS-keyed one, or a relay's own keyed
from config) is the caller's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pylibsrtp import _binding as _srtp_binding

PYLIBSRTP_VERSION = "1.0.0"
SRTP_OK: int = _srtp_binding.lib.srtp_err_status_ok
srtp_protect_in_place: Callable[[Any, Any, Any], int] = _srtp_binding.lib.srtp_protect


class SrtpPacketBuffer:
    """A packet buffer libsrtp protects in place: write the RTP packet into :attr:`view`, set
    ``length[0]``, call ``srtp_protect_in_place(handle, cdata, length)``, send
    ``view[:length[0]]``. The header stays in clear, so only what changes is rewritten."""

    def __init__(self, size: int = 2048) -> None:
        self.cdata: Any = _srtp_binding.ffi.new("char[]", size)
        self.view = memoryview(_srtp_binding.ffi.buffer(self.cdata))
        self.length: Any = _srtp_binding.ffi.new("int *")


def srtp_handle(session: Any) -> Any:
    """The ``srtp_t`` of a ``pylibsrtp.Session`` (for :func:`srtp_protect_in_place`)."""
    return session._srtp[0]
