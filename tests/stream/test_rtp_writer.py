"""The per-packet loop: real SRTP, real UDP on loopback, what a receiver reads back."""

from __future__ import annotations

import errno
import socket
from typing import Any

from aiortc.rtp import RtpPacket

from ruseon_appliance.stream.gso import GSO_MAX_BYTES, DropCounters, GsoSender
from ruseon_appliance.stream.rtp_header import RtpHeaderTemplate
from ruseon_appliance.stream.rtp_writer import SrtpPacketWriter
from ruseon_appliance.stream.srtp import SrtpPacketBuffer, srtp_handle
from tests.stream.conftest import Loopback, SrtpPair, big_frame, recorded_frames

SSRC = 0x0BAD_CAFE


def writer_for(pair: SrtpPair, gso: GsoSender | None = None) -> SrtpPacketWriter:
    return SrtpPacketWriter(RtpHeaderTemplate(102, SSRC), srtp_handle(pair.tx),
                            batch=SrtpPacketBuffer(GSO_MAX_BYTES + 4096),
                            single=SrtpPacketBuffer(), gso=gso or GsoSender(),
                            drops=DropCounters())


def received(pair: SrtpPair, loopback: Loopback, count: int) -> list[RtpPacket]:
    return [RtpPacket.parse(pair.rx.unprotect(d)) for d in loopback.receive(count)]


def test_a_frame_arrives_whole_in_order_in_gso_batches(srtp_pair: SrtpPair,
                                                       loopback: Loopback) -> None:
    frame = big_frame()
    assert len(frame.payloads) > 40 and len(frame.ends) == 1  # one run of equal fragments
    gso = GsoSender()
    writer = writer_for(srtp_pair, gso)
    first = writer.seq
    index, tokens, octets = writer.send_frame(frame, 123_456, 0, 1e9, loopback.tx, loopback.addr)
    assert (index, octets, tokens) == (len(frame.payloads), frame.size, 1e9 - frame.size)
    packets = received(srtp_pair, loopback, len(frame.payloads))
    assert loopback.nothing_more()
    assert [p.sequence_number for p in packets] == [
        (first + k) & 0xFFFF for k in range(len(frame.payloads))]
    assert [p.payload for p in packets] == frame.payloads
    assert [p.marker for p in packets] == [0] * (len(packets) - 1) + [1]
    assert {(p.payload_type, p.timestamp, p.ssrc) for p in packets} == {(102, 123_456, SSRC)}
    assert gso.gso_sends >= 1 and gso.datagram_sends == 0  # batched: not one send per packet
    assert writer.seq == (first + len(frame.payloads)) & 0xFFFF
    assert writer.drops == DropCounters()


def test_the_budget_stops_the_loop_packet_exact_and_it_resumes(srtp_pair: SrtpPair,
                                                               loopback: Loopback) -> None:
    frame = big_frame()
    writer = writer_for(srtp_pair)
    first = writer.seq
    allowed = sum(len(p) for p in frame.payloads[:5]) + 1
    index, tokens, octets = writer.send_frame(frame, 9, 0, allowed, loopback.tx, loopback.addr)
    assert (index, tokens, octets) == (5, 1, allowed - 1)
    head = received(srtp_pair, loopback, 5)
    assert loopback.nothing_more()
    index, _tokens, _octets = writer.send_frame(frame, 9, 5, 1e9, loopback.tx, loopback.addr)
    assert index == len(frame.payloads)
    tail = received(srtp_pair, loopback, len(frame.payloads) - 5)
    packets = head + tail
    assert [p.sequence_number for p in packets] == [
        (first + k) & 0xFFFF for k in range(len(frame.payloads))]
    assert [p.payload for p in packets] == frame.payloads


def test_a_recorded_stream_frame_by_frame(srtp_pair: SrtpPair, loopback: Loopback) -> None:
    """Mixed packet sizes (STAP-A, single NAL units, FU-A runs): every frame arrives as cut."""
    writer = writer_for(srtp_pair)
    seq = writer.seq
    for n, frame in enumerate(recorded_frames()[:20]):
        index, _tokens, _octets = writer.send_frame(frame, n * 3000, 0, 1e9, loopback.tx,
                                                    loopback.addr)
        assert index == len(frame.payloads)
        packets = received(srtp_pair, loopback, len(frame.payloads))
        assert [p.payload for p in packets] == frame.payloads
        assert [p.sequence_number for p in packets] == [
            (seq + k) & 0xFFFF for k in range(len(packets))]
        assert packets[-1].marker and {p.timestamp for p in packets} == {n * 3000}
        seq = (seq + len(packets)) & 0xFFFF
    assert loopback.nothing_more()


class RefusingSocket(socket.socket):
    """A UDP socket whose kernel "does not segment": sendmsg with UDP_SEGMENT fails EINVAL."""

    def sendmsg(self, *args: Any, **kwargs: Any) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")


def test_gso_refused_once_then_datagram_by_datagram(srtp_pair: SrtpPair,
                                                    loopback: Loopback) -> None:
    refusing = RefusingSocket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        gso = GsoSender()
        writer = writer_for(srtp_pair, gso)
        frame = big_frame()
        for _ in range(2):
            writer.send_frame(frame, 1, 0, 1e9, refusing, loopback.addr)
            packets = received(srtp_pair, loopback, len(frame.payloads))
            assert [p.payload for p in packets] == frame.payloads  # the refused batch resent
        assert not gso.enabled and gso.refused is not None and "EINVAL" in gso.refused
        assert gso.gso_sends == 0 and gso.datagram_sends == 2 * len(frame.payloads)
        assert writer.drops == DropCounters()
    finally:
        refusing.close()


def test_padding_packet_takes_a_sequence_number(srtp_pair: SrtpPair,
                                                loopback: Loopback) -> None:
    writer = writer_for(srtp_pair)
    first = writer.seq
    writer.send_padding(loopback.tx, loopback.addr, 777)
    (data,) = loopback.receive(1)
    plain = srtp_pair.rx.unprotect(data)
    assert plain[0] & 0x20  # P bit
    packet = RtpPacket.parse(plain)
    assert (packet.sequence_number, packet.timestamp, packet.payload) == (first, 777, b"")
    assert packet.padding_size == 4
    assert writer.seq == (first + 1) & 0xFFFF
