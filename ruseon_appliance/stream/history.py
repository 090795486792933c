"""Each ring frame packetized once, kept a little while: every sender of the camera's RTP (WebRTC
viewers, RTSP sessions, relays) sends the same payload objects, and a viewer's retransmissions
come from them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ruseon_appliance.capture.ring import FrameView
from ruseon_appliance.stream.h264_rtp import equal_runs, packetize

# Packets a viewer can have re-sent: at least one second of video (a whole 1080p keyframe).
HISTORY_S = 1.5


@dataclass(eq=False, slots=True)
class PacketizedFrame:
    """One ring frame's RTP payloads, shared by every viewer."""

    seq: int
    payloads: list[bytes]
    created: float
    keyframe: bool
    size: int
    # Index one past each batch of equal-sized payloads (see ``h264_rtp.equal_runs``).
    ends: list[int]


class PacketHistory:
    """Frames packetized once, by ring sequence number, kept for :data:`HISTORY_S` (viewers
    that were sent a frame keep a reference to it for their retransmissions)."""

    def __init__(self, history_s: float = HISTORY_S) -> None:
        self.history_s = history_s
        self._frames: dict[int, PacketizedFrame] = {}
        self.frames_packetized = 0
        self.packets_packetized = 0
        # Stream byte rate, smoothed: the viewers' send budget is a multiple of it.
        self.byte_rate = 0.0
        self._rate_stamp: float | None = None

    def frame(self, view: FrameView) -> PacketizedFrame:
        """The shared packetization of ``view`` (made on first request)."""
        frame = self._frames.get(view.seq)
        if frame is None:
            payloads = packetize(bytes(view.data))
            now = time.monotonic()
            frame = PacketizedFrame(view.seq, payloads, now, view.keyframe,
                                    sum(len(p) for p in payloads), equal_runs(payloads))
            self._frames[view.seq] = frame
            self.frames_packetized += 1
            self.packets_packetized += len(payloads)
            self._measure(frame.size, now)
        return frame

    def _measure(self, size: int, now: float) -> None:
        if self._rate_stamp is None:
            self._rate_stamp = now
            return
        dt = max(1e-3, now - self._rate_stamp)
        self._rate_stamp = now
        alpha = min(1.0, dt / 2.0)  # ~2 s smoothing
        self.byte_rate += alpha * (size / dt - self.byte_rate)

    def prune(self, now: float) -> None:
        """Forget frames older than the history (oldest first; dicts keep insertion order)."""
        cutoff = now - self.history_s
        frames = self._frames
        while frames:
            seq = next(iter(frames))
            if frames[seq].created >= cutoff:
                return
            del frames[seq]

    def __len__(self) -> int:
        return len(self._frames)
