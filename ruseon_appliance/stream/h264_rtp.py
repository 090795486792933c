"""H.264 RTP payloads (RFC 6184, packetization-mode 1) cut for batched sending.

The same payload types and limits as aiortc's ``H264Encoder`` (single NAL unit, STAP-A for runs
of small NAL units, FU-A above :data:`PACKET_MAX` bytes), with one difference that matters for
the send path: the FU-A fragments of a NAL unit are all the same size except the last, which
may be shorter. aiortc balances its fragments differently (the first few one byte longer than
the rest), which defeats UDP generic segmentation offload: ``UDP_SEGMENT`` sends one buffer as
datagrams of one size, only the last allowed to be shorter. Cut this way, every fragment run
of a frame goes to one viewer in one ``sendmsg`` call (SRTP adds the same tag to each packet,
so equal plaintexts stay equal when protected).
"""

from __future__ import annotations

import struct

PACKET_MAX = 1300  # payload bytes, as aiortc (room for headers, extensions, SRTP in 1500)
NAL_TYPE_FU_A = 28
NAL_TYPE_STAP_A = 24
STAP_A_MAX_NALS = 9  # as aiortc
_LENGTH = struct.Struct("!H")


def split_annexb(buf: bytes) -> list[bytes]:
    """The NAL units of an Annex B buffer (3- or 4-byte start codes), headers included."""
    nals: list[bytes] = []
    find = buf.find
    i = find(b"\x00\x00\x01")
    while i != -1:
        start = i + 3
        i = find(b"\x00\x00\x01", start)
        end = len(buf) if i == -1 else (i - 1 if buf[i - 1] == 0 else i)  # 4-byte code: 00
        if end > start:
            nals.append(buf[start:end])
    return nals


def fragment_fu_a(nal: bytes, max_payload: int = PACKET_MAX) -> list[bytes]:
    """FU-A payloads of ``nal``: as few fragments as fit ``max_payload``, all of one size but
    the last (which carries the remainder)."""
    body = len(nal) - 1
    room = max_payload - 2
    count = -(-body // room)
    size = -(-body // count)  # equal cut; the last fragment is at most this long
    indicator = (nal[0] & 0xE0) | NAL_TYPE_FU_A
    nal_type = nal[0] & 0x1F
    middle = bytes((indicator, nal_type))
    out: list[bytes] = []
    offset = 1
    end = len(nal)
    while offset < end:
        stop = offset + size
        if offset == 1:
            head = bytes((indicator, nal_type | 0x80))
        elif stop >= end:
            head = bytes((indicator, nal_type | 0x40))
        else:
            head = middle
        out.append(head + nal[offset:stop])
        offset = stop
    return out


def packetize(annexb: bytes, max_payload: int = PACKET_MAX) -> list[bytes]:
    """RTP payloads of one Annex B access unit: small NAL units aggregated in STAP-A (a lone
    one sent as is), large ones cut by :func:`fragment_fu_a`."""
    payloads: list[bytes] = []
    nals = split_annexb(annexb)
    i = 0
    n = len(nals)
    while i < n:
        nal = nals[i]
        if len(nal) > max_payload:
            payloads.extend(fragment_fu_a(nal, max_payload))
            i += 1
            continue
        # Aggregate the run of small NAL units that fits one STAP-A.
        room = max_payload - 1
        j = i
        while j < n and j - i < STAP_A_MAX_NALS and len(nals[j]) + 2 <= room:
            room -= len(nals[j]) + 2
            j += 1
        if j - i <= 1:
            payloads.append(nal)
            i += 1
            continue
        header = NAL_TYPE_STAP_A
        parts = [b""]
        for k in range(i, j):
            unit = nals[k]
            header |= unit[0] & 0x80  # F: set if any unit has it
            if unit[0] & 0x60 > header & 0x60:  # NRI: the largest of the units
                header = header & 0x9F | unit[0] & 0x60
            parts.append(_LENGTH.pack(len(unit)))
            parts.append(unit)
        parts[0] = bytes((header,))
        payloads.append(b"".join(parts))
        i = j
    return payloads


def equal_runs(payloads: list[bytes]) -> list[int]:
    """Where each batch of ``payloads`` ends: a batch is a run of equal-sized payloads, the last
    of which may be shorter (what one ``UDP_SEGMENT`` send can carry). ``ends[k]`` is the index
    one past batch ``k``."""
    ends: list[int] = []
    n = len(payloads)
    i = 0
    while i < n:
        size = len(payloads[i])
        j = i + 1
        while j < n and len(payloads[j]) == size:
            j += 1
        if j < n and len(payloads[j]) < size:
            j += 1  # the shorter tail of the run rides along
        ends.append(j)
        i = j
    return ends
