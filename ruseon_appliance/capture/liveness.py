"""When a camera counts as down: the one rule that /healthz, the cameras' problem lines and the
stall events (Home Assistant's sensor, webhooks) share."""

from __future__ import annotations

# A camera is down when its newest frame is older than this many frame intervals, and never
# sooner than STALL_MIN_S (a 1 fps camera still counts as alive).
STALL_FRAME_INTERVALS = 10
STALL_MIN_S = 2.0


def stale_after_s(framerate: int) -> float:
    """Seconds without a frame after which a camera counts as down."""
    return max(STALL_MIN_S, STALL_FRAME_INTERVALS / max(1, framerate))
