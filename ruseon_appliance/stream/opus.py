"""What every sender of a camera's Opus shares (WebRTC viewers, engine/audio.py; relays,
relay/rtp_relay.py): the feed it reads and the RTP timeline it stamps.

The camera encodes its sound once (audio/, CONTRACTS.md "audio"): an ``opus_ring`` of 20 ms
packets, pts in 1/48000 s on a timeline that only grows, capture time on the video's wall clock.
A sender stamps each packet with its own random origin plus the pts, keeps its RTP time moving
on should the pts ever go back (a new pipeline), and sets the marker bit on the first packet of
a talkspurt: the first one, and the first after a hole.
"""

from __future__ import annotations

import random
from typing import Protocol

from ruseon_appliance.capture.ring import RingBuffer

OPUS_CLOCK_RATE = 48_000
OPUS_PACKET_TICKS = 960  # 20 ms
# A hole in the packets' pts longer than this starts a new talkspurt (the RTP marker bit).
TALKSPURT_GAP_TICKS = OPUS_CLOCK_RATE // 10


class AudioFeed(Protocol):
    """What a sender needs of a camera's sound (``audio.AudioPipeline`` satisfies it): its ring
    of Opus packets."""

    opus_ring: RingBuffer


class OpusTimeline:
    """One sender's RTP time for the feed's packets (see the module docstring)."""

    def __init__(self) -> None:
        self.origin = random.randrange(0, 1 << 32)
        self._offset = 0
        self.last_pts: int | None = None

    def stamp(self, pts: int) -> tuple[int, bool]:
        """``(rtp_timestamp, marker)`` of the packet at ``pts``."""
        pts += self._offset
        last = self.last_pts
        if last is not None and pts <= last:
            step = last + OPUS_PACKET_TICKS - pts
            self._offset += step
            pts += step
        marker = last is None or pts - last > TALKSPURT_GAP_TICKS
        self.last_pts = pts
        return (self.origin + pts) & 0xFFFFFFFF, marker

    def next_empty(self) -> int:
        """The RTP timestamp of a packet made here, not from the feed (a probe): 20 ms on."""
        pts = (self.last_pts if self.last_pts is not None else 0) + OPUS_PACKET_TICKS
        self.last_pts = pts
        return (self.origin + pts) & 0xFFFFFFFF
