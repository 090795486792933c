"""A LAN time server for the booted machine's own systemd-timesyncd: SNTP (RFC 4330) server mode
on 127.0.0.1, which the guest reaches at qemu's host address (10.0.2.2) when its user-mode
network is unrestricted (only inside scripts/test's loopback-only namespace).

It answers with this host's clock as a stratum-2 server with a small root distance, which is what
timesyncd requires to set its clock (mode 4, stratum 1-15, leap not 3, origin = its transmit
time, root distance under ``RootDistanceMaxSec``). ``answering`` turns it off and on, so a test
decides when "NTP" comes back; requests while off are counted and dropped. No NTP server from
Debian's packages is used here: chrony and ntpsec conflict with the host's own time daemon, and
their package scripts would start them against the public pools.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

NTP_EPOCH_OFFSET = 2_208_988_800  # 1900-01-01 to 1970-01-01, seconds
PACKET = struct.Struct("!BBbbII4sQQQQ")  # RFC 4330 section 4, 48 bytes


def ntp_timestamp(unix_s: float) -> int:
    seconds = int(unix_s) + NTP_EPOCH_OFFSET
    fraction = int((unix_s % 1.0) * (1 << 32)) & 0xFFFFFFFF
    return (seconds << 32) | fraction


def unix_time(timestamp: int) -> float:
    return (timestamp >> 32) - NTP_EPOCH_OFFSET + (timestamp & 0xFFFFFFFF) / (1 << 32)


def answer(request: bytes, received: float, now: float) -> bytes | None:
    """The server's reply to ``request`` (None: not a client request, dropped)."""
    if len(request) < PACKET.size:
        return None
    first, _stratum, poll, _precision, _delay, _dispersion, _ref, _reft, _orig, _recv, transmit = \
        PACKET.unpack_from(request)
    version, mode = (first >> 3) & 0x7, first & 0x7
    if mode != 3 or not 1 <= version <= 4:
        return None
    # LI 0 (no warning), the client's version, mode 4 (server); stratum 2; 2^-20 s precision;
    # root delay 0 and dispersion ~4 ms (16.16 fixed point); origin = the client's transmit.
    return PACKET.pack((0 << 6) | (version << 3) | 4, 2, poll, -20, 0, 0x0000_0100, b"RUSE",
                       ntp_timestamp(now - 1), transmit, ntp_timestamp(received),
                       ntp_timestamp(now))


class SntpServer:
    """``with SntpServer() as ntp:`` serves on 127.0.0.1:``port`` (123, as NTP clients use)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 123) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.sock.settimeout(0.2)
        self.answering = True
        self.answered = 0
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sntp", daemon=True)

    def __enter__(self) -> SntpServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                request, peer = self.sock.recvfrom(512)
            except TimeoutError:
                continue
            except OSError:
                return
            received = time.time()
            reply = answer(request, received, time.time()) if self.answering else None
            if reply is None:
                self.dropped += 1
                continue
            self.sock.sendto(reply, peer)
            self.answered += 1
