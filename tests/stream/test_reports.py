"""Sender reports and receiver-report statistics, alone, read and written by aiortc's RTCP."""

from __future__ import annotations

import time

import pytest
from aiortc.rtp import (
    RTCP_PSFB_APP,
    RTCP_PSFB_PLI,
    RtcpPacket,
    RtcpPsfbPacket,
    RtcpReceiverInfo,
    RtcpRrPacket,
    RtcpSdesPacket,
    RtcpSrPacket,
    pack_remb_fci,
)

from ruseon_appliance.stream.reports import SR_INTERVAL_S, ReceiverStats, SenderReports
from ruseon_appliance.stream.rtcp import ntp_now, rtcp_feedback, sender_report

SSRC = 0x5151_5151


def test_no_report_before_media_then_one_per_interval() -> None:
    reports = SenderReports(SSRC, "cam")
    reports.first_due(10.0)
    assert not reports.due(11.0)  # nothing sent yet: nothing to report
    reports.sent(5, 6000, 90_000, 11.0)
    assert reports.due(11.0)
    assert not reports.due(11.0 + 0.49 * SR_INTERVAL_S)  # randomised 0.5-1.5 x the interval
    assert reports.due(11.0 + 1.51 * SR_INTERVAL_S)


def test_a_report_says_what_was_sent_and_where_the_rtp_clock_is_now() -> None:
    reports = SenderReports(SSRC, "ruseon-cam")
    now = time.monotonic()
    reports.sent(10, 12_000, 1000, now - 0.5)
    reports.sent(3, 3_000, 4000, now - 0.1)
    before = ntp_now()
    packet, ntp = reports.report(now)
    sr, sdes = RtcpPacket.parse(packet)
    assert isinstance(sr, RtcpSrPacket) and isinstance(sdes, RtcpSdesPacket)
    assert sr.ssrc == SSRC
    assert (sr.sender_info.packet_count, sr.sender_info.octet_count) == (13, 15_000)
    assert abs(sr.sender_info.rtp_timestamp - (4000 + 9000)) <= 1  # 100 ms of 90 kHz later
    assert sr.sender_info.ntp_timestamp == ntp and ntp >= before
    assert sdes.chunks[0].ssrc == SSRC and sdes.chunks[0].items == [(1, b"ruseon-cam")]


def rtp_at(packet: bytes, clock_rate: int) -> tuple[float, int]:
    """(wall time in s, RTP timestamp) a sender report maps to each other."""
    sr = RtcpPacket.parse(packet)[0]
    assert isinstance(sr, RtcpSrPacket)
    ntp = sr.sender_info.ntp_timestamp
    return (ntp >> 32) - 2_208_988_800 + (ntp & 0xFFFFFFFF) / (1 << 32), \
        sr.sender_info.rtp_timestamp


@pytest.mark.parametrize("clock_rate", [90_000, 48_000])
def test_a_report_maps_rtp_time_to_the_least_late_capture_time(clock_rate: int) -> None:
    reports = SenderReports(SSRC, "cam", clock_rate=clock_rate)
    step = clock_rate // 50  # 20 ms a packet
    start_us = time.time_ns() // 1000 - 2_000_000
    origin = 0xFFFF_0000  # the RTP clock wraps in the middle
    for i in range(60):
        # Every fifth capture stamp is late (a descheduled thread): 70 ms.
        late = 70_000 if i % 5 == 4 else 0
        reports.sent(1, 100, (origin + i * step) & 0xFFFFFFFF, time.monotonic(),
                     start_us + i * 20_000 + late)
    # The last one sent was late too: the mapping does not follow it.
    reports.sent(1, 100, (origin + 60 * step) & 0xFFFFFFFF, time.monotonic(),
                 start_us + 60 * 20_000 + 70_000)
    wall, rtp = rtp_at(reports.report(time.monotonic())[0], clock_rate)
    # The instant the report names, by the on-time packets: packet 0 at start_us.
    elapsed = ((rtp - origin) & 0xFFFFFFFF) / clock_rate
    assert abs(start_us / 1e6 + elapsed - wall) < 0.001


def test_without_a_capture_time_the_report_follows_the_send_time() -> None:
    reports = SenderReports(SSRC, "cam")
    now = time.monotonic()
    reports.sent(1, 100, 90_000, now - 0.5, time.time_ns() // 1000 - 400_000)
    reports.sent(1, 100, 180_000, now - 0.25)  # a join burst's frame: no capture time
    _, rtp = rtp_at(reports.report(now)[0], 90_000)
    assert abs(rtp - (180_000 + 0.25 * 90_000)) < 0.01 * 90_000


def test_round_trip_time_from_a_receiver_report_answering_our_report() -> None:
    reports = SenderReports(SSRC)
    reports.sent(1, 100, 0, time.monotonic())
    _packet, ntp = reports.report(100.0)
    reports.sent_report(ntp, 100.0)
    lsr = (ntp >> 16) & 0xFFFFFFFF
    assert reports.sent_at(lsr) == 100.0 and reports.sent_at(0) is None
    assert reports.reports_sent == 1
    stats = ReceiverStats()
    # The peer held our SR 0.25 s (DLSR, 1/65536 s) and its RR arrived at 100.4: RTT 0.15 s.
    block = RtcpReceiverInfo(ssrc=SSRC, fraction_lost=64, packets_lost=7, highest_sequence=1,
                             jitter=900, lsr=lsr, dlsr=int(0.25 * 65536))
    rr = RtcpPacket.parse(bytes(RtcpRrPacket(ssrc=1, reports=[block])))[0]
    (parsed,) = rr.reports
    stats.report_block(parsed.fraction_lost, parsed.packets_lost, parsed.jitter, parsed.dlsr,
                       reports.sent_at(parsed.lsr), 100.4)
    assert stats.rtt == pytest.approx(0.15, abs=1e-4)
    assert (stats.fraction_lost, stats.packets_lost, stats.jitter_ms) == (0.25, 7, 10.0)
    # Smoothed, not replaced; and a block answering no SR of ours leaves the RTT alone.
    stats.report_block(0, 7, 0, 0, 100.0, 101.0)
    assert stats.rtt == pytest.approx(0.85 * 0.15 + 0.15 * 1.0, abs=1e-4)
    rtt = stats.rtt
    stats.report_block(0, 7, 0, 0, None, 102.0)
    assert stats.rtt == rtt and stats.reports == 3


def test_only_the_last_few_reports_are_remembered() -> None:
    reports = SenderReports(SSRC)
    stamps = [(k + 1) << 16 for k in range(12)]
    for k, ntp in enumerate(stamps):
        reports.sent_report(ntp, float(k))
    assert reports.sent_at(1) is None  # the oldest went
    assert reports.sent_at(12) == 11.0


def test_relay_and_rtsp_feedback_parser() -> None:
    """rtcp_feedback: what a relay target or RTSP client's RTCP says about our stream."""
    report = bytes(RtcpRrPacket(ssrc=9, reports=[RtcpReceiverInfo(
        ssrc=SSRC, fraction_lost=128, packets_lost=1, highest_sequence=1, jitter=0, lsr=0,
        dlsr=0)]))
    pli = bytes(RtcpPsfbPacket(fmt=RTCP_PSFB_PLI, ssrc=9, media_ssrc=SSRC))
    other_pli = bytes(RtcpPsfbPacket(fmt=RTCP_PSFB_PLI, ssrc=9, media_ssrc=SSRC + 1))
    remb = bytes(RtcpPsfbPacket(fmt=RTCP_PSFB_APP, ssrc=9, media_ssrc=0,
                                fci=pack_remb_fci(1_500_000, [SSRC])))
    feedback = rtcp_feedback(report + pli + other_pli + remb, SSRC)
    assert feedback is not None
    assert feedback.keyframe_requests == ["pli"]  # the other stream's PLI is not ours
    assert feedback.reports == 1 and feedback.fraction_lost == 0.5
    assert feedback.remb_bps == 1_500_000
    assert rtcp_feedback(b"\x00garbage", SSRC) is None


def test_sender_report_function_as_relays_send_it() -> None:
    sr, sdes = RtcpPacket.parse(sender_report(SSRC, 1 << 33, 5, 500, "x" * 300))
    assert isinstance(sr, RtcpSrPacket) and sr.sender_info.rtp_timestamp == 0  # 32 bits
    assert isinstance(sdes, RtcpSdesPacket) and sdes.chunks[0].items == [(1, b"x" * 255)]
