"""What the RTSP server's two tracks (the picture's, rtsp/session.py; the sound's,
rtsp/audio.py) share: their UDP socket pair and the clock of their sender reports."""

from __future__ import annotations

import socket
import struct
from typing import Any

from ruseon_appliance.stream.rtcp import NTP_EPOCH_OFFSET


def ntp_of_us(unix_us: int) -> int:
    """A wall-clock time (microseconds since 1970) as a 64-bit NTP timestamp."""
    seconds, micros = divmod(unix_us, 1_000_000)
    return ((seconds + NTP_EPOCH_OFFSET) << 32) | (micros * (1 << 32) // 1_000_000)


def rtp_at(anchor_ts: int, anchor_capture_us: int, unix_us: int, clock_rate: int) -> int:
    """The RTP time (32 bits) of wall-clock time ``unix_us`` on a track whose RTP time
    ``anchor_ts`` was captured at ``anchor_capture_us``: the capture clock's map, which is what
    both tracks' sender reports say."""
    return (anchor_ts + (unix_us - anchor_capture_us) * clock_rate // 1_000_000) & 0xFFFFFFFF


def open_rtp_pair(local_host: str, scope_id: int = 0
                  ) -> tuple[socket.socket, socket.socket, int]:
    """An RTP and an RTCP socket on ``local_host``, an even port and the next one (as RFC 3550
    likes; ``scope_id``: a link-local address's interface), non-blocking; returns them and the
    RTP port. Raises ``OSError``."""
    family = socket.AF_INET6 if ":" in local_host else socket.AF_INET

    def address(port: int) -> tuple[str, int] | tuple[str, int, int, int]:
        if family == socket.AF_INET6:
            return (local_host, port, 0, scope_id)
        return (local_host, port)

    for _ in range(20):
        rtp = socket.socket(family, socket.SOCK_DGRAM)
        try:
            rtp.bind(address(0))
            port = rtp.getsockname()[1]
            if port % 2 or port >= 65535:
                rtp.close()
                continue
            rtcp = socket.socket(family, socket.SOCK_DGRAM)
            try:
                rtcp.bind(address(port + 1))
            except OSError:
                rtcp.close()
                rtp.close()
                continue
        except OSError:
            rtp.close()
            raise
        break
    else:
        raise OSError("no free pair of UDP ports for RTP/RTCP")
    for sock in (rtp, rtcp):
        sock.setblocking(False)
    return rtp, rtcp, port


class RtcpSending:
    """What the picture's and the sound's tracks share to send their RTCP: interleaved on the
    RTSP connection or on the track's RTCP socket, counting reports and errors. The track
    provides the attributes below."""

    transport_kind: str
    _tcp: Any
    channels: tuple[int, int]
    _rtcp_sock: socket.socket | None
    client_ports: tuple[int, int]
    send_errors: int
    sender_reports: int

    def _client_address(self, port: int) -> Any:
        raise NotImplementedError

    def _send_report_packet(self, packet: bytes) -> None:
        """Send a sender report the track's way; count it, or the error."""
        tcp = self.transport_kind == "tcp"
        if tcp and self._tcp is None:
            return
        address = None if tcp or self._rtcp_sock is None else self._client_address(
            self.client_ports[1])
        sent = send_rtcp(packet, tcp=self._tcp if tcp else None, channel=self.channels[1],
                         sock=self._rtcp_sock, address=address)
        if sent is False:
            self.send_errors += 1
        elif sent:
            self.sender_reports += 1


def send_rtcp(packet: bytes, *, tcp: Any, channel: int, sock: socket.socket | None,
              address: Any) -> bool | None:
    """Send an RTCP packet the way the track's transport goes: interleaved on the RTSP
    connection ``tcp`` (its RTCP ``channel``) when there is one, else on the RTCP socket to
    ``address``. True when sent, False on a socket error (the caller counts it), None when
    there is nowhere to send it (a closed connection, no socket)."""
    if tcp is not None:
        if tcp.is_closing():
            return None
        tcp.write(struct.pack("!BBH", 0x24, channel, len(packet)) + packet)
        return True
    if sock is None:
        return None
    try:
        sock.sendto(packet, address)
    except OSError:
        return False
    return True
