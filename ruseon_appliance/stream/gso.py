"""UDP generic segmentation offload: many equal-sized datagrams in one ``sendmsg``.

Linux >= 4.18 cuts one buffer into datagrams of ``UDP_SEGMENT`` bytes (the last may be
shorter). A run of protected RTP packets of one size, laid end to end, leaves in one syscall
instead of one per packet. When the kernel or the route refuses (a virtual interface without
checksum offload, an old kernel), the sender notices once and goes datagram by datagram.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
from dataclasses import dataclass

logger = logging.getLogger(__name__)

UDP_SEGMENT = 103
# The kernel's UDP_MAX_SEGMENTS (64 up to Linux 6.x) and the largest UDP payload over IPv4.
GSO_MAX_SEGMENTS = 64
GSO_MAX_BYTES = 65_000
# Errors meaning the kernel or the route will not segment for us: send datagram by datagram.
GSO_REFUSED = (errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP)


@dataclass(slots=True)
class DropCounters:
    """Where a send's losses are counted (one viewer's figures)."""

    send_dropped_full: int = 0  # the socket's buffer was full
    send_errors: int = 0  # any other error (or a packet SRTP refused to protect)


class GsoSender:
    """Sends batches of equal-sized datagrams with ``UDP_SEGMENT`` until the kernel refuses it
    once, then datagram by datagram for good. One per send loop (all its sockets)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.refused: str | None = None  # why the kernel refused, once it has
        self._cmsg: dict[int, list[tuple[int, int, bytes]]] = {}
        self.gso_sends = 0
        self.datagram_sends = 0

    def send(self, counters: DropCounters, sock: socket.socket, addr: tuple[str, int],
             view: memoryview, size: int, segment: int, count: int) -> None:
        """Send ``view[:size]``: ``count`` packets of ``segment`` bytes each, laid end to end
        (the last may be shorter), in one ``UDP_SEGMENT`` send when the kernel allows it, else
        one ``sendto`` each. Losses are counted on ``counters``, never raised."""
        if count > 1 and self.enabled:
            cmsg = self._cmsg.get(segment)
            if cmsg is None:
                cmsg = [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("H", segment))]
                self._cmsg[segment] = cmsg
            try:
                sock.sendmsg((view[:size],), cmsg, 0, addr)
                self.gso_sends += 1
                return
            except BlockingIOError:
                counters.send_dropped_full += count  # lost like on the wire: NACKs recover them
                return
            except OSError as exc:
                if exc.errno not in GSO_REFUSED:
                    counters.send_errors += count
                    return
                # Detected once: this kernel/route does not segment. Resend this batch below.
                self.enabled = False
                self.refused = f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc}"
                logger.warning("fan-out: UDP GSO refused (%s); sending datagram by datagram",
                               self.refused)
        sendto = sock.sendto
        offset = 0
        while offset < size:
            end = min(offset + segment, size)
            try:
                sendto(view[offset:end], addr)
            except BlockingIOError:
                counters.send_dropped_full += 1
            except OSError:
                counters.send_errors += 1
            offset = end
        self.datagram_sends += count
