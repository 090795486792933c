"""Is a datagram a plausible STUN message, DTLS record or SRTP/SRTCP packet? (RFC 7983)

The first byte says what a datagram on a WebRTC port claims to be: 0-3 STUN, 20-63 DTLS,
128-191 RTP/RTCP; everything else (including nothing at all) is not ours. This module checks
that the rest of the datagram agrees with the claim — header lengths consistent with the
datagram's size, a version and content type that exist, room for the authentication tag — so
that what the mux hands to aioice/aiortc is something their parsers were written for. It
checks shape only: whether a packet is *authentic* is decided by STUN MESSAGE-INTEGRITY (the
mux), DTLS record protection (OpenSSL) and SRTP authentication (libsrtp).

Every function returns ``None`` for a plausible datagram or the drop reason (a key of
:data:`SHAPE_DROP_REASONS`).
"""

from __future__ import annotations

import struct

from aioice import stun

STUN_HEADER = 20
DTLS_HEADER = 13  # DTLSPlaintext: type, version, epoch, sequence number, length
# DTLSPlaintext versions: DTLS 1.0 and DTLS 1.2 (1.3 keeps 1.2's in its plaintext records).
DTLS_VERSIONS = (0xFEFF, 0xFEFD)
# change_cipher_spec, alert, handshake, application_data, heartbeat, tls12_cid.
DTLS_CONTENT_TYPES = range(20, 26)
ALERT = 21
# No renegotiation: epoch 0 (handshake in clear) and 1 (after the first ChangeCipherSpec).
DTLS_MAX_EPOCH = 1
DTLS_MAX_RECORD = 2**14 + 2048
# The shortest authentication tag of the SRTP profiles aiortc negotiates
# (AES_CM_128_HMAC_SHA1_80: 10 bytes; the AEAD GCM profiles: 16).
SRTP_MIN_TAG = 10
RTP_HEADER = 12
RTCP_HEADER = 8
SRTCP_INDEX = 4
# DTLS 1.3 unified header (RFC 9147 section 4): 0b001CSLEE.
_UNIFIED_CID, _UNIFIED_SEQ16, _UNIFIED_LENGTH = 0x10, 0x08, 0x04
# Record number encryption samples 16 bytes of ciphertext (RFC 9147 section 4.2.3).
DTLS13_MIN_CIPHERTEXT = 16

_STUN_COOKIE = struct.pack("!I", stun.COOKIE)

SHAPE_DROP_REASONS = (
    "empty",  # a zero-length datagram
    "too_short",  # one byte, or shorter than its class's smallest header
    "garbage",  # first byte in none of RFC 7983's ranges
    "stun_truncated",  # STUN length field does not match the datagram / no magic cookie
    "dtls_truncated",  # a record header or record does not fit the datagram
    "dtls_bad_content_type",  # a record type outside 20-25
    "dtls_bad_version",  # not DTLS 1.0/1.2
    "dtls_bad_epoch",  # an epoch no handshake of ours reaches
    "dtls_plaintext_alert",  # an alert in clear (epoch 0): unauthenticated, see check_dtls
    "dtls_bad_header",  # a DTLS 1.3 header with a connection ID (never negotiated)
    "rtp_truncated",  # RTP header, CSRCs, extension and tag do not fit
    "rtcp_truncated",  # RTCP header, SRTCP index and tag do not fit
)


def classify(data: bytes) -> str:
    """``"stun"``, ``"dtls"``, ``"rtp"`` or ``""`` (not ours) by the first byte (RFC 7983)."""
    if not data:
        return ""
    first = data[0]
    if first < 4:
        return "stun"
    if 20 <= first <= 63:
        return "dtls"
    if 128 <= first <= 191:
        return "rtp"
    return ""


def check_shape(data: bytes) -> str | None:
    """The drop reason for a datagram that is not a plausible STUN/DTLS/SRTP(C) packet."""
    if not data:
        return "empty"
    if len(data) < 2:
        return "too_short"
    kind = classify(data)
    if kind == "stun":
        return check_stun(data)
    if kind == "dtls":
        return check_dtls(data)
    if kind == "rtp":
        return check_srtp(data)
    return "garbage"


def check_stun(data: bytes) -> str | None:
    """A STUN header: room for it, the magic cookie, a length that is the rest exactly."""
    if len(data) < STUN_HEADER:
        return "too_short" if len(data) < 8 or data[4:8] == _STUN_COOKIE else "garbage"
    if data[4:8] != _STUN_COOKIE:
        return "garbage"
    length = struct.unpack_from("!H", data, 2)[0]
    if len(data) != STUN_HEADER + length or length % 4:
        return "stun_truncated"
    return None


def check_dtls(data: bytes) -> str | None:
    """Every record in the datagram: a known type and version, a reachable epoch, and a
    length that fits; the records fill the datagram exactly."""
    pos, size = 0, len(data)
    while pos < size:
        first = data[pos]
        if 32 <= first <= 63:
            reason, pos = _dtls13_record(data, pos)
            if reason is not None:
                return reason
            continue
        if first not in DTLS_CONTENT_TYPES:
            return "dtls_bad_content_type"
        if pos + DTLS_HEADER > size:
            return "dtls_truncated" if pos else "too_short"
        version, epoch = struct.unpack_from("!HH", data, pos + 1)
        if version not in DTLS_VERSIONS:
            return "dtls_bad_version"
        if epoch > DTLS_MAX_EPOCH:
            return "dtls_bad_epoch"
        if first == ALERT and epoch == 0:
            # Anyone can forge an alert in clear, and during the handshake OpenSSL acts on it
            # (even a warning close_notify failed a joining viewer's session); after it,
            # OpenSSL ignores them anyway. The cost: a peer's genuine handshake failure is
            # noticed by the pending timeout instead of at once.
            return "dtls_plaintext_alert"
        length = struct.unpack_from("!H", data, pos + 11)[0]
        if length == 0 or length > DTLS_MAX_RECORD or pos + DTLS_HEADER + length > size:
            return "dtls_truncated"
        pos += DTLS_HEADER + length
    return None


def _dtls13_record(data: bytes, pos: int) -> tuple[str | None, int]:
    first = data[pos]
    if first & _UNIFIED_CID:
        return "dtls_bad_header", pos
    header = 1 + (2 if first & _UNIFIED_SEQ16 else 1)
    if first & _UNIFIED_LENGTH:
        if pos + header + 2 > len(data):
            return "dtls_truncated", pos
        length = struct.unpack_from("!H", data, pos + header)[0]
        header += 2
    else:
        length = len(data) - pos - header  # the record runs to the end of the datagram
    if length < DTLS13_MIN_CIPHERTEXT or pos + header + length > len(data):
        return "dtls_truncated", pos
    return None, pos + header + length


def is_rtcp(data: bytes) -> bool:
    """RTCP rather than RTP (aiortc's own test: packet type 192-208 in the second byte)."""
    return len(data) >= 2 and 192 <= data[1] <= 208


def check_srtp(data: bytes) -> str | None:
    """SRTP: header, CSRCs and extension fit, with room for the tag. SRTCP: the first
    packet's length fits, with room for the SRTCP index and the tag."""
    size = len(data)
    if is_rtcp(data):
        if size < RTCP_HEADER + SRTCP_INDEX + SRTP_MIN_TAG:
            return "rtcp_truncated"
        words = struct.unpack_from("!H", data, 2)[0]
        if (words + 1) * 4 > size - SRTCP_INDEX - SRTP_MIN_TAG:
            return "rtcp_truncated"
        return None
    header = RTP_HEADER + 4 * (data[0] & 0x0F)
    if data[0] & 0x10:  # header extension: 4-byte header, then `length` words
        if size < header + 4:
            return "rtp_truncated"
        header += 4 + 4 * struct.unpack_from("!H", data, header + 2)[0]
    if size < header + SRTP_MIN_TAG:
        return "rtp_truncated"
    return None
