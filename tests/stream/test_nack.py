"""The NACK responder, alone: what it finds, what it sends, what it refuses."""

from __future__ import annotations

import time

from aiortc.rtp import RtpPacket, unwrap_rtx

from ruseon_appliance.stream.history import PacketizedFrame
from ruseon_appliance.stream.nack import NackResponder
from ruseon_appliance.stream.pacing import BUDGET_BURST_S, SendBudget
from ruseon_appliance.stream.rtp_header import RtpHeaderTemplate
from tests.stream.conftest import big_frame, recorded_frames

SSRC, RTX_SSRC = 1111, 2222


def responder_with(frame: PacketizedFrame, seq: int = 65_530) -> NackResponder:
    """A responder that sent ``frame`` as ``seq ..`` in two service calls (across the wrap)."""
    nack = NackResponder(history_s=1.5)
    now = time.monotonic()
    nack.note(seq, frame, 0, 10, 5000, now)
    nack.note((seq + 10) & 0xFFFF, frame, 10, len(frame.payloads) - 10, 5000, now)
    return nack


def budget(tokens: float) -> SendBudget:
    """A full budget of ``tokens`` (a refill cannot add to it)."""
    b = SendBudget(lambda: 0.0)
    b.override = tokens / BUDGET_BURST_S
    b.fill(time.monotonic())
    return b


def test_finds_packets_across_runs_and_the_sequence_wrap() -> None:
    frame = big_frame()
    nack = responder_with(frame)
    for k in (0, 5, 9, 10, 11, len(frame.payloads) - 1):
        found = nack.find((65_530 + k) & 0xFFFF)
        assert found is not None and found[1] == k and found[0].frame is frame
    assert nack.find((65_530 + len(frame.payloads)) & 0xFFFF) is None
    assert nack.find(65_529) is None


def test_consecutive_slices_of_a_frame_merge_into_one_run() -> None:
    frame = big_frame()
    nack = NackResponder(history_s=1.5)
    now = time.monotonic()
    for offset in range(0, len(frame.payloads), 7):
        count = min(7, len(frame.payloads) - offset)
        nack.note(100 + offset, frame, offset, count, 1, now)
    assert len(nack._runs) == 1 and nack._runs[0].count == len(frame.payloads)


def test_rtx_retransmission_carries_the_original_sequence_number() -> None:
    frame = big_frame()
    nack = responder_with(frame)
    nack.rtx_ssrc, nack.rtx_payload_type = RTX_SSRC, 103
    header = RtpHeaderTemplate(102, SSRC)
    sent: list[bytes] = []
    lost = (65_530 + len(frame.payloads) - 1) & 0xFFFF  # the frame's last packet: marker set
    b = budget(1e6)
    assert nack.respond(lost, header, b, time.monotonic(), lambda d: sent.append(d) or True)
    rtx = RtpPacket.parse(sent[0])
    assert (rtx.payload_type, rtx.ssrc, rtx.timestamp, rtx.marker) == (103, RTX_SSRC, 5000, 1)
    original = unwrap_rtx(rtx, payload_type=102, ssrc=SSRC)
    assert original.sequence_number == lost and original.payload == frame.payloads[-1]
    assert b.tokens == 1e6 - len(frame.payloads[-1]) - 2
    assert (nack.nacked, nack.retransmitted) == (1, 1)
    # The next RTX packet takes the next RTX sequence number.
    assert nack.respond(65_530, header, b, time.monotonic(), lambda d: sent.append(d) or True)
    second = RtpPacket.parse(sent[1])
    assert second.sequence_number == (rtx.sequence_number + 1) & 0xFFFF and second.marker == 0


def test_without_rtx_the_packet_is_resent_as_it_was() -> None:
    frame = big_frame()
    nack = responder_with(frame)
    sent: list[bytes] = []
    assert nack.respond(65_535, RtpHeaderTemplate(102, SSRC), budget(1e6), time.monotonic(),
                        lambda d: sent.append(d) or True)
    packet = RtpPacket.parse(sent[0])
    assert (packet.payload_type, packet.ssrc, packet.sequence_number) == (102, SSRC, 65_535)
    assert packet.payload == frame.payloads[5]


def test_refusals_are_counted_and_send_nothing() -> None:
    frame = big_frame()
    nack = responder_with(frame)
    header = RtpHeaderTemplate(102, SSRC)
    sent: list[bytes] = []

    def send(data: bytes) -> bool:
        sent.append(data)
        return True

    assert not nack.respond(1234, header, budget(1e6), time.monotonic(), send)  # never sent
    assert not nack.respond(65_530, header, budget(10), time.monotonic(), send)  # no budget
    assert not nack.respond(65_530, header, budget(1e6), time.monotonic(), None)  # no route
    assert not nack.respond(65_530, header, budget(1e6), time.monotonic(), lambda d: False)
    assert sent == []
    assert (nack.nacked, nack.nack_unavailable, nack.nack_over_budget, nack.retransmitted) == (
        4, 1, 1, 0)


def test_history_older_than_its_window_is_forgotten() -> None:
    frames = recorded_frames()[:3]
    nack = NackResponder(history_s=1.5)
    now = time.monotonic()
    old = frames[0]
    old.created = now - 10  # packetized long ago
    nack.note(1, old, 0, len(old.payloads), 0, now)
    seq = 1 + len(old.payloads)
    nack.note(seq, frames[1], 0, len(frames[1].payloads), 3000, now)
    assert nack.find(1) is None  # the old frame's run went when a new one was noted
    assert nack.find(seq) is not None
    nack.clear()
    assert nack.find(seq) is None
