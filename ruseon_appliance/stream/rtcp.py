"""RTCP a sender of the camera's RTP writes and reads: sender reports (RFC 3550 6.4.1, with
SDES CNAME, 6.5.1) and the feedback a peer sends back (PLI/FIR, REMB, receiver reports)."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from aiortc.rtp import (
    RTCP_PSFB_APP,
    RTCP_PSFB_FIR,
    RTCP_PSFB_PLI,
    RtcpPacket,
    RtcpPsfbPacket,
    RtcpRrPacket,
    RtcpSrPacket,
    unpack_remb_fci,
)

NTP_EPOCH_OFFSET = 2_208_988_800  # seconds from 1900 (NTP) to 1970 (Unix)

_SR = struct.Struct("!BBHIIIIII")


def ntp_now() -> int:
    """The current wall-clock time as a 64-bit NTP timestamp."""
    return ntp_of(time.time())


def ntp_of(wall: float) -> int:
    """Unix time ``wall`` (seconds) as a 64-bit NTP timestamp."""
    t = wall + NTP_EPOCH_OFFSET
    seconds = int(t)
    return (seconds << 32) | int((t - seconds) * (1 << 32))


def sender_report_at(ntp: int, ssrc: int, rtp_timestamp: int, packets: int, octets: int,
                     cname: str) -> bytes:
    """An RTCP compound packet: sender report stamped ``ntp`` + SDES CNAME (at most 255 bytes)."""
    sr = _SR.pack(0x80, 200, 6, ssrc, ntp >> 32, ntp & 0xFFFFFFFF, rtp_timestamp & 0xFFFFFFFF,
                  packets & 0xFFFFFFFF, octets & 0xFFFFFFFF)
    name = cname.encode()[:255]
    chunk = struct.pack("!IBB", ssrc, 1, len(name)) + name + b"\x00"
    chunk += b"\x00" * (-len(chunk) % 4)
    return sr + struct.pack("!BBH", 0x81, 202, len(chunk) // 4) + chunk


def sender_report(ssrc: int, rtp_timestamp: int, packets: int, octets: int, cname: str) -> bytes:
    """An RTCP compound packet: sender report (now, in NTP) + SDES CNAME, as relays and RTSP
    clients send them (RFC 3550 6.4.1, 6.5.1)."""
    return sender_report_at(ntp_now(), ssrc, rtp_timestamp, packets, octets, cname)


@dataclass
class RtcpFeedback:
    """What a relay target or RTSP client said in one RTCP datagram about the stream ``ssrc``."""

    keyframe_requests: list[str]  # "pli" / "fir", one per request
    remb_bps: int | None = None
    fraction_lost: float | None = None
    reports: int = 0  # receiver report blocks about ssrc


def rtcp_feedback(data: bytes, ssrc: int) -> RtcpFeedback | None:
    """Parse an RTCP compound packet from a consumer's peer; None when it is not RTCP (a
    client's bytes must not crash anything)."""
    try:
        packets = RtcpPacket.parse(data)
    except Exception:
        return None
    feedback = RtcpFeedback([])
    for packet in packets:
        if isinstance(packet, RtcpPsfbPacket) and packet.fmt in (RTCP_PSFB_PLI, RTCP_PSFB_FIR):
            if packet.fmt == RTCP_PSFB_PLI and packet.media_ssrc not in (ssrc, 0):
                continue
            feedback.keyframe_requests.append("pli" if packet.fmt == RTCP_PSFB_PLI else "fir")
        elif isinstance(packet, RtcpPsfbPacket) and packet.fmt == RTCP_PSFB_APP:
            try:
                bitrate, ssrcs = unpack_remb_fci(packet.fci)
            except ValueError:
                continue
            if ssrc in ssrcs or not ssrcs:
                feedback.remb_bps = bitrate
        elif isinstance(packet, RtcpRrPacket | RtcpSrPacket):
            for report in packet.reports:
                if report.ssrc == ssrc:
                    feedback.reports += 1
                    feedback.fraction_lost = report.fraction_lost / 256
    return feedback
