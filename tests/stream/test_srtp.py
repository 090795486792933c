"""SRTP in place (stream/srtp.py): fails loudly when a pylibsrtp upgrade changes its binding."""

from __future__ import annotations

from ruseon_appliance.stream import srtp


def test_pylibsrtp_in_place_protection() -> None:
    """The fan-out protects in place through pylibsrtp's binding; same bytes as protect()."""
    import os

    import pylibsrtp

    assert pylibsrtp.__version__ == srtp.PYLIBSRTP_VERSION
    key = os.urandom(30)

    def session() -> pylibsrtp.Session:
        policy = pylibsrtp.Policy(key=key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
        return pylibsrtp.Session(policy)

    packet = bytes([0x80, 102, 0, 1, 0, 0, 0, 5, 0, 0, 0, 7]) + os.urandom(1000)
    expected = session().protect(packet)
    buffer = srtp.SrtpPacketBuffer()
    buffer.view[:len(packet)] = packet
    buffer.length[0] = len(packet)
    sender = session()  # must outlive the handle: the handle is only a pointer into it
    rc = srtp.srtp_protect_in_place(
        srtp.srtp_handle(sender), buffer.cdata, buffer.length)
    assert rc == srtp.SRTP_OK
    assert bytes(buffer.view[:buffer.length[0]]) == expected
