"""The NACK responder: what one viewer was sent in the last few seconds, and its retransmission.

A viewer is sent the shared packetization of each frame (``stream/history.py``); the responder
notes which sequence numbers carried which packets of which frame, one entry per run of
consecutive packets (a frame, or the part of it a service call sent), so a NACK finds its packet
without a per-packet record. Retransmissions go as RTX (RFC 4588) when negotiated, within the
viewer's send budget.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ruseon_appliance.stream.history import PacketizedFrame
from ruseon_appliance.stream.pacing import SendBudget
from ruseon_appliance.stream.rtp_header import FIXED, RtpHeaderTemplate


@dataclass(eq=False, slots=True)
class SentRun:
    """Packets ``offset .. offset+count-1`` of ``frame`` went out as ``seq .. seq+count-1``."""

    seq: int
    frame: PacketizedFrame
    offset: int
    count: int
    timestamp: int


class NackResponder:
    """Answers one viewer's NACKs from what it was sent within ``history_s`` seconds."""

    def __init__(self, history_s: float) -> None:
        self.history_s = history_s
        self._runs: deque[SentRun] = deque()
        self.rtx_ssrc = 0
        self.rtx_payload_type: int | None = None  # None: RTX not negotiated
        self._rtx_seq = random.randrange(0, 32768)
        self.nacked = 0
        self.retransmitted = 0
        self.nack_unavailable = 0  # older than the history, or never sent
        self.nack_over_budget = 0

    def note(self, seq: int, frame: PacketizedFrame, offset: int, count: int, timestamp: int,
             now: float) -> None:
        """Packets ``offset ..`` of ``frame`` went out as ``seq ..`` (once per service call)."""
        runs = self._runs
        if runs:
            tail = runs[-1]
            if tail.frame is frame and tail.offset + tail.count == offset:
                tail.count += count
                return
        runs.append(SentRun(seq, frame, offset, count, timestamp))
        cutoff = now - self.history_s
        while runs and runs[0].frame.created < cutoff and len(runs) > 1:
            runs.popleft()

    def find(self, seq: int) -> tuple[SentRun, int] | None:
        """The run that carried ``seq`` and the packet's index in its frame."""
        for run in reversed(self._runs):
            delta = (seq - run.seq) & 0xFFFF
            if delta < run.count:
                return run, run.offset + delta
        return None

    def respond(self, seq: int, header: RtpHeaderTemplate | None, budget: SendBudget,
                now: float, send: Callable[[bytes], bool] | None) -> bool:
        """Send packet ``seq`` again: the plaintext packet (``header``: the stream's) to
        ``send``, which says whether it went (None: no route to the viewer now). False if it is
        gone, over budget or not sent."""
        self.nacked += 1
        found = self.find(seq)
        if found is None:
            self.nack_unavailable += 1
            return False
        if send is None or header is None:
            return False
        run, index = found
        payload = run.frame.payloads[index]
        cost = len(payload) + 2
        budget.refill(now)
        if budget.tokens < cost:
            self.nack_over_budget += 1
            return False
        marker = 0x80 if index == len(run.frame.payloads) - 1 else 0
        packet = header.header_now()
        if self.rtx_payload_type is not None:
            FIXED.pack_into(packet, 1, marker | self.rtx_payload_type, self._rtx_seq,
                            run.timestamp, self.rtx_ssrc)
            self._rtx_seq = (self._rtx_seq + 1) & 0xFFFF
            data = b"".join((packet, seq.to_bytes(2, "big"), payload))
        else:
            FIXED.pack_into(packet, 1, marker | header.payload_type, seq, run.timestamp,
                            header.ssrc)
            data = b"".join((packet, payload))
        if not send(data):
            return False
        budget.tokens -= cost
        self.retransmitted += 1
        return True

    def clear(self) -> None:
        """Forget everything (the viewer stopped)."""
        self._runs.clear()
