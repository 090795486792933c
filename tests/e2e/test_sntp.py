"""tests/e2e/sntp.py, the VM test's LAN time server, against what systemd-timesyncd checks in a
reply (timesyncd-manager.c, manager_receive_response): mode 4, stratum 1-15, leap not 3, the
origin timestamp equal to the request's transmit timestamp, a small root distance; and silence
while it is not answering."""

from __future__ import annotations

import socket
import time

from tests.e2e.sntp import PACKET, SntpServer, ntp_timestamp, unix_time
from tests.tooling import free_port


def request(port: int, transmit: int, timeout: float = 2.0) -> bytes | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        # LI 0, version 4, mode 3 (client), as timesyncd sends it.
        sock.sendto(PACKET.pack((4 << 3) | 3, 0, 6, 0, 0, 0, b"\0\0\0\0", 0, 0, 0, transmit),
                    ("127.0.0.1", port))
        try:
            return sock.recv(512)
        except TimeoutError:
            return None


def test_replies_as_timesyncd_requires_and_stays_silent_while_off() -> None:
    port = free_port(socket.SOCK_DGRAM)
    with SntpServer(port=port) as server:
        sent = time.time()
        transmit = ntp_timestamp(sent)
        reply = request(port, transmit)
        assert reply is not None and len(reply) == PACKET.size
        first, stratum, poll, _, delay, dispersion, _, _, origin, received, sent_back = \
            PACKET.unpack(reply)
        assert (first >> 6, (first >> 3) & 7, first & 7) == (0, 4, 4)  # leap, version, mode
        assert 1 <= stratum <= 15 and poll == 6
        assert origin == transmit
        # Root distance (delay / 2 + dispersion, 16.16 fixed point) well under timesyncd's 5 s.
        assert (delay / 2 + dispersion) / 65536 < 0.1
        assert sent - 0.5 < unix_time(received) <= unix_time(sent_back) < time.time() + 0.5
        server.answering = False
        assert request(port, transmit, timeout=1.0) is None
        server.answering = True
        assert request(port, transmit) is not None
        # Not a client request (mode 4): dropped.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(1.0)
            sock.sendto(reply, ("127.0.0.1", port))
            try:
                sock.recv(512)
                answered_a_server = True
            except TimeoutError:
                answered_a_server = False
        assert not answered_a_server
        assert server.answered == 2 and server.dropped == 2
