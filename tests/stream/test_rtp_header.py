"""The header template: what aiortc's own parser reads back from it."""

from __future__ import annotations

from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters, RTCRtpParameters
from aiortc.rtp import HeaderExtensionsMap, RtpPacket

from ruseon_appliance.stream.rtcp import ntp_now
from ruseon_appliance.stream.rtp_header import ABS_SEND_TIME_URI, FIXED, MID_URI, RtpHeaderTemplate


def parse(header: bytes, ids: list[tuple[str, int]]) -> RtpPacket:
    extensions = HeaderExtensionsMap()
    extensions.configure(RTCRtpParameters(headerExtensions=[
        RTCRtpHeaderExtensionParameters(id=i, uri=uri) for uri, i in ids]))
    return RtpPacket.parse(header + b"\x01\x02\x03", extensions)


def test_mid_and_abs_send_time_read_back_by_aiortc() -> None:
    ids = [(MID_URI, 4), (ABS_SEND_TIME_URI, 2)]
    template = RtpHeaderTemplate(102, 0x1234_5678, mid="0", extensions=ids)
    packet = bytearray(template.struct.size)
    template.struct.pack_into(packet, 0, template.b0, 0x80 | 102, 65_535, 90_000, 0x1234_5678,
                              template.extensions_now())
    now = (ntp_now() >> 14) & 0xFFFFFF
    rtp = parse(bytes(packet), ids)
    assert (rtp.payload_type, rtp.marker, rtp.sequence_number, rtp.timestamp, rtp.ssrc) == (
        102, 1, 65_535, 90_000, 0x1234_5678)
    assert rtp.extensions.mid == "0"
    assert rtp.extensions.abs_send_time is not None
    assert (now - rtp.extensions.abs_send_time) & 0xFFFFFF < 1 << 18  # within a second
    assert rtp.payload == b"\x01\x02\x03"


def test_two_byte_form_when_an_id_does_not_fit_one_byte() -> None:
    ids = [(MID_URI, 15)]
    template = RtpHeaderTemplate(96, 7, mid="video", extensions=ids)
    assert template.header[12:14] == b"\x10\x00"  # RFC 8285 two-byte profile
    assert template.abs_offset == -1
    rtp = parse(bytes(template.header_now()), ids)
    assert rtp.extensions.mid == "video" and rtp.ssrc == 7


def test_no_extensions_is_a_plain_twelve_byte_header() -> None:
    template = RtpHeaderTemplate(96, 42, mid="0", extensions=[])
    assert len(template.header) == template.struct.size == 12 and template.ext == b""
    header = template.header_now()
    FIXED.pack_into(header, 1, 96, 9, 1000, 42)
    rtp = parse(bytes(header), [])
    assert header[0] == 0x80  # V=2, no extension bit
    assert (rtp.version, rtp.sequence_number, rtp.timestamp) == (2, 9, 1000)


def test_header_now_stamps_a_copy() -> None:
    template = RtpHeaderTemplate(96, 1, extensions=[(ABS_SEND_TIME_URI, 3)])
    before = bytes(template.header)
    stamped = template.header_now()
    assert bytes(template.header) == before  # the template itself is never written
    at = template.abs_offset
    assert before[at:at + 3] == b"\x00\x00\x00"
    rtp = parse(bytes(stamped), [(ABS_SEND_TIME_URI, 3)])
    assert rtp.extensions.abs_send_time == int.from_bytes(stamped[at:at + 3], "big")
    assert (((ntp_now() >> 14) & 0xFFFFFF) - rtp.extensions.abs_send_time) & 0xFFFFFF < 1 << 18
