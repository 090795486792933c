"""How fast one viewer is sent to: its send budget (a token bucket) and the join burst's pace.

The budget is a multiple of the stream's byte rate, so a viewer that cannot take the stream
(a slow link, a stuck peer) runs out of tokens and falls behind instead of filling socket
buffers; the sender then skips it to the next keyframe. The join burst (keyframe + catch-up
frames, up to a whole GOP) leaves in slices of :data:`JOIN_PACE_BYTES` every
:data:`JOIN_PACE_S`, within that budget.

Both are consulted once per service call (a ring write or a pacing tick), not per packet: the
sender reads the tokens into a local, spends them in its packet loop and writes them back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

# Per-viewer send budget as a multiple of the stream's byte rate, and its burst in seconds of
# that budget: room for a join burst (keyframe + catch-up frames) and retransmissions.
BUDGET_FACTOR = 3.0
BUDGET_BURST_S = 1.0
# The join burst (keyframe + catch-up frames, up to a whole GOP) leaves in slices of this many
# bytes this far apart: about 50 Mbit/s to the joining viewer, so a GOP reaches it within
# ~100 ms without overrunning the socket's send buffer or a Wi-Fi link in one go.
JOIN_PACE_BYTES = 32_768
JOIN_PACE_S = 0.005
# The join burst's RTP timestamps follow that pace (see ``stream/cursor.py``): 90 kHz ticks
# per byte.
JOIN_TICKS_PER_BYTE = JOIN_PACE_S * 90_000 / JOIN_PACE_BYTES


class SendBudget:
    """A token bucket in payload bytes: :data:`BUDGET_FACTOR` times the stream's byte rate
    (``stream_rate()``), or :attr:`override` bytes/s when set, holding at most
    :data:`BUDGET_BURST_S` of it."""

    def __init__(self, stream_rate: Callable[[], float]) -> None:
        self._stream_rate = stream_rate
        self.override: float | None = None  # bytes/s; None: BUDGET_FACTOR x the stream's rate
        self.tokens = 0.0
        self._stamp = time.monotonic()

    def rate(self) -> float:
        """Bytes per second this viewer may be sent."""
        if self.override is not None:
            return self.override
        return BUDGET_FACTOR * self._stream_rate()

    def fill(self, now: float) -> None:
        """Start full (a viewer about to be sent its join burst)."""
        self._stamp = now
        self.tokens = self.rate() * BUDGET_BURST_S

    def refill(self, now: float) -> None:
        """Add what the rate gave since the last refill, up to the burst (once per service
        call: :meth:`rate` inline)."""
        override = self.override
        rate = override if override is not None else BUDGET_FACTOR * self._stream_rate()
        self.tokens = min(rate * BUDGET_BURST_S, self.tokens + (now - self._stamp) * rate)
        self._stamp = now

    def spend(self, size: int) -> bool:
        """Take ``size`` tokens if there are that many (a one-off packet: a retransmission)."""
        if self.tokens < size:
            return False
        self.tokens -= size
        return True


class JoinPacer:
    """Slices the join burst (and a keyframe refresh, sent the same way): while it lasts, each
    service call may spend at most :data:`JOIN_PACE_BYTES` of the budget, and the next slice is
    due :data:`JOIN_PACE_S` later."""

    def __init__(self) -> None:
        # Frames the burst ends with, counted in the viewer's frames sent.
        self.burst_frames = 0
        self.slices = 0  # service calls that sent part of the burst
        self._handle: asyncio.TimerHandle | None = None
        self._held = 0.0
        self._allowed = 0.0

    def start_burst(self, end_frames: int) -> None:
        """A burst runs until the viewer has been sent ``end_frames`` frames."""
        self.burst_frames = end_frames

    def bursting(self, frames_sent: int) -> bool:
        """True while frames of the burst are still to start."""
        return frames_sent < self.burst_frames

    def pacing(self, frames_sent: int, mid_frame: bool) -> bool:
        """True while the burst is going out (its last frame included, until it is whole)."""
        return frames_sent < self.burst_frames or (frames_sent == self.burst_frames and mid_frame)

    def open_slice(self, budget: SendBudget) -> None:
        """Cap what this service call may spend at one slice."""
        self._held = budget.tokens
        budget.tokens = self._allowed = min(self._held, JOIN_PACE_BYTES)

    def close_slice(self, budget: SendBudget, more: bool, wake: Callable[[], None]) -> None:
        """Give the budget back what the slice did not spend; if ``more`` is to send, call
        ``wake`` when the next slice is due."""
        self.slices += 1
        budget.tokens = self._held - (self._allowed - budget.tokens)
        if more and self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(JOIN_PACE_S, self._due, wake)

    def _due(self, wake: Callable[[], None]) -> None:
        self._handle = None
        wake()

    def cancel(self) -> None:
        """No further slices (the viewer stopped)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
