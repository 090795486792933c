"""One SSRC's RTP header, made once: the fixed 12 bytes and the negotiated header extensions.

Per packet a sender then writes only what changes (marker, sequence number, timestamp) with one
``pack_into`` of :attr:`RtpHeaderTemplate.struct`; the abs-send-time extension, when negotiated,
is stamped once per frame (:meth:`RtpHeaderTemplate.extensions_now`).
"""

from __future__ import annotations

import struct

from ruseon_appliance.stream.rtcp import ntp_now

MID_URI = "urn:ietf:params:rtp-hdrext:sdes:mid"
ABS_SEND_TIME_URI = "http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"

# Byte 1 (marker|PT), sequence number, timestamp, SSRC: what a packet rewrites of a header.
FIXED = struct.Struct("!BHII")


class RtpHeaderTemplate:
    """The header of every packet of one stream (``payload_type``, ``ssrc``), with the MID and
    abs-send-time extensions if negotiated (RFC 8285, one-byte form when the ids allow it)."""

    def __init__(self, payload_type: int, ssrc: int, *, mid: str = "",
                 extensions: list[tuple[str, int]] | None = None) -> None:
        self.payload_type = payload_type
        self.ssrc = ssrc
        # Where the abs-send-time value sits in the header (-1: not negotiated).
        self.abs_offset = -1
        values: list[tuple[int, bytes]] = []
        for uri, ext_id in extensions or []:
            if uri == MID_URI and mid:
                values.append((ext_id, mid.encode()))
            elif uri == ABS_SEND_TIME_URI:
                values.append((ext_id, b""))  # 3 bytes, written per frame
        header = bytearray(struct.pack("!BBHII", 0x80, payload_type, 0, 0, ssrc))
        if values:
            header[0] |= 0x10
            one_byte = all(0 < i <= 14 and len(v) <= 16 for i, v in values)
            body = bytearray()
            for ext_id, value in values:
                length = len(value) or 3
                body += bytes([(ext_id << 4) | (length - 1)] if one_byte else [ext_id, length])
                if not value:
                    self.abs_offset = 16 + len(body)
                    value = b"\x00\x00\x00"
                body += value
            body += b"\x00" * (-len(body) % 4)
            header += struct.pack("!HH", 0xBEDE if one_byte else 0x1000, len(body) // 4) + body
        self.header = header
        # The first byte (V=2, X) and the extension block, as the per-packet pack takes them.
        self.b0 = header[0]
        self.ext = bytes(header[12:])
        # The whole header in one pack_into: first byte, M|PT, seq, timestamp, SSRC, extensions.
        self.struct = struct.Struct(f"!BBHII{len(self.ext)}s")

    def extensions_now(self) -> bytes:
        """The extension block with abs-send-time (24 bits of NTP time, 6.18 fixed point) set to
        now: taken once per frame."""
        ext = self.ext
        if self.abs_offset >= 0:
            at = self.abs_offset - 12
            ext = ext[:at] + ((ntp_now() >> 14) & 0xFFFFFF).to_bytes(3, "big") + ext[at + 3:]
        return ext

    def header_now(self) -> bytearray:
        """A copy of the whole header with abs-send-time set to now (for a one-off packet)."""
        header = bytearray(self.header)
        if self.abs_offset >= 0:
            at = self.abs_offset
            header[at:at + 3] = ((ntp_now() >> 14) & 0xFFFFFF).to_bytes(3, "big")
        return header
