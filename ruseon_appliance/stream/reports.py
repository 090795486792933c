"""RTCP reports for one sent stream: the sender-report generator (what was sent, NTP/RTP time
of now) and the receiver-report statistics (loss, jitter, round-trip time, REMB) the peer sends
back."""

from __future__ import annotations

import random
import time
from collections import deque

from ruseon_appliance.stream.rtcp import ntp_of, sender_report_at

# Sender report interval (randomised 0.5-1.5x, as RFC 3550 asks).
SR_INTERVAL_S = 1.0
# Sender reports remembered for matching receiver reports' LSR (round-trip time).
SR_REMEMBERED = 8
# A capture time further than this from the wall clock now (a clock step between capture and
# report) is not used to place the report's RTP timestamp: the send time is, as without one.
CAPTURE_MAPPING_MAX_S = 5.0
# The RTP-to-capture mapping is the least late of this many recent sends: a capture stamp is
# only ever late (a thread descheduled before it stamped, a packet that arrived late), never
# early, so one late stamp must not move the whole timeline.
MAPPING_WINDOW = 30


class SenderReports:
    """Counts what one SSRC sent and writes its sender reports (+ SDES CNAME).

    The sender tells it what went out once per service call (:meth:`sent`), not per packet.
    The SR maps RTP time to *capture* time (``capture_us``, on the wall clock the SR's NTP time
    is read from): every stream of a session (video, audio) then says when what it carries was
    captured, which is what a receiver lines them up by (lip sync). The mapping is the least
    late of the last :data:`MAPPING_WINDOW` sends (RTP time against capture time). Without a
    capture time for the last send (a join burst's frames), or across a wall-clock step, the
    SR's RTP time is the last one sent advanced by the time since it was sent.
    """

    def __init__(self, ssrc: int = 0, cname: str = "", *, clock_rate: int = 90_000) -> None:
        self.ssrc = ssrc
        self.cname = cname
        self.clock_rate = clock_rate
        self._last_capture_s: float | None = None
        # The last RTP timestamp unwrapped (64-bit), and capture time minus it (µs) per send.
        self._unwrapped: int | None = None
        self._anchors: deque[float] = deque(maxlen=MAPPING_WINDOW)
        self.packets_sent = 0
        self.octets_sent = 0  # payload octets, as RTCP SR counts them
        self._last_ts = 0
        self._last_send_monotonic = 0.0
        self._next = 0.0
        self._sent_at: dict[int, float] = {}  # middle 32 bits of an SR's NTP time -> when
        self.reports_sent = 0

    def sent(self, packets: int, octets: int, timestamp: int, now: float,
             capture_us: int | None = None) -> None:
        """``packets`` carrying ``octets`` of payload went out, the last stamped ``timestamp``
        (captured at ``capture_us``, wall clock, when known)."""
        self.packets_sent += packets
        self.octets_sent += octets
        if self._unwrapped is None:
            self._unwrapped = timestamp
        else:
            self._unwrapped += ((timestamp - self._last_ts + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
        self._last_ts = timestamp
        self._last_send_monotonic = now
        self._last_capture_s = None if capture_us is None else capture_us / 1e6
        if capture_us is not None:
            self._anchors.append(capture_us - self._unwrapped * 1e6 / self.clock_rate)

    def first_due(self, at: float) -> None:
        """The first report is due at ``at`` (an early one: RTT and sync from the start)."""
        self._next = at

    def due(self, now: float) -> bool:
        """True (and the next one scheduled) when a report is due; none before media."""
        if now < self._next or not self.packets_sent:
            return False
        self._next = now + SR_INTERVAL_S * (0.5 + random.random())
        return True

    def report(self, now: float) -> tuple[bytes, int]:
        """A sender report + SDES CNAME for now, and its NTP time (for :meth:`sent_report`)."""
        wall = time.time()
        ntp = ntp_of(wall)
        elapsed = now - self._last_send_monotonic
        captured = self._last_capture_s
        if captured is not None and abs(wall - captured) <= CAPTURE_MAPPING_MAX_S:
            # When the last packet sent would have been captured, were it as early as the
            # least late of the recent ones.
            assert self._unwrapped is not None and self._anchors
            ideal_us = self._unwrapped * 1e6 / self.clock_rate + min(self._anchors)
            elapsed = wall - ideal_us / 1e6
        rtp_ts = (self._last_ts + round(elapsed * self.clock_rate)) & 0xFFFFFFFF
        return sender_report_at(ntp, self.ssrc, rtp_ts, self.packets_sent, self.octets_sent,
                                self.cname), ntp

    def sent_report(self, ntp: int, now: float) -> None:
        """The report stamped ``ntp`` went out at ``now``."""
        sent_at = self._sent_at
        sent_at[(ntp >> 16) & 0xFFFFFFFF] = now
        if len(sent_at) > SR_REMEMBERED:
            del sent_at[next(iter(sent_at))]
        self.reports_sent += 1

    def sent_at(self, lsr: int) -> float | None:
        """When the report a receiver report's LSR names went out (None: not one of ours, or
        forgotten)."""
        return self._sent_at.get(lsr) if lsr else None


class ReceiverStats:
    """What the peer's receiver reports and REMB say about one stream."""

    def __init__(self, clock_rate: int = 90_000) -> None:
        self.clock_rate = clock_rate
        self.reports = 0
        self.rtt: float | None = None  # seconds, smoothed
        self.fraction_lost = 0.0
        self.packets_lost = 0
        self.jitter_ms = 0.0
        self.remb_bps: int | None = None

    def report_block(self, fraction_lost: int, packets_lost: int, jitter: int, dlsr: int,
                     sr_sent_at: float | None, now: float) -> None:
        """One report block about our SSRC (``sr_sent_at``: when the SR it answers left)."""
        self.reports += 1
        self.fraction_lost = fraction_lost / 256
        self.packets_lost = packets_lost
        self.jitter_ms = jitter * 1000 / self.clock_rate
        if sr_sent_at is not None:
            rtt = max(0.0, now - sr_sent_at - dlsr / 65536)
            self.rtt = rtt if self.rtt is None else 0.85 * self.rtt + 0.15 * rtt

    def remb(self, bitrate: int) -> None:
        """The peer's receiver-estimated maximum bitrate for our stream."""
        self.remb_bps = bitrate
