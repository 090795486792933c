"""A network camera's frame times on this machine's clock: the camera's own spacing, our time.

An IP camera stamps each frame (the RTP timestamp FFmpeg hands over as ``packet.pts``), but its
clock is not ours and its frames reach us late by a varying amount: the network, FFmpeg's
buffering and, under load, the reader thread waiting for a core. Timing frames by arrival (what
the RTSP source did) passes that wobble on: two frames of a 15 fps stream read 5 ms apart get
times 5 ms apart, and the HLS muxer and an NVR see a frame rate that stutters ("non monotonically
increasing dts" from FFmpeg once two land in one frame's slot).

:class:`CameraClock` maps camera time to arrival time by the *least-late line*: ``offset`` is the
smallest ``arrival - camera`` seen, so a frame's time is ``camera + offset``, the moment it would
have arrived had it been as prompt as the promptest frame. Late frames keep their camera spacing.

- A frame earlier than the line lowers it, by at most half the camera's step per frame, so the
  frames after FFmpeg's start-up burst (read at once, the first the latest) close up gently
  instead of landing on one instant.
- The line is the least lateness over the last ``WINDOW_S`` of camera time, and rises towards
  it by at most ``RISE`` (2 ms per camera second): a camera whose clock runs slower than ours is
  followed, jitter and stalls shorter than the window do not move it at all.
- A camera time that goes backwards (a camera that restarts its clock, B-frames) or a frame off
  the line by more than ``RESYNC_S`` (a jump in the camera's clock) sets the line anew; after
  ``GIVE_UP_AFTER`` such resets in one connection the camera's times are not used any more and
  frames are timed by arrival, as before.
- A frame without a camera time is timed by arrival.

The caller keeps times strictly increasing (``RtspSource._emit``); a new connection gets a new
clock (the camera's timestamps restart with it).
"""

from __future__ import annotations

from collections import deque

# The line is the least lateness of the last WINDOW_S of camera time: it rises only when that
# frame leaves the window (a camera slower than us; load lasting longer than the window).
WINDOW_S = 10.0
# How fast the line may rise: seconds per camera second (a camera's crystal is off by well under
# 0.1 %; 0.2 % follows any of them while a stall of 5 s moves the line by 10 ms at most).
RISE = 0.002
# A frame off the line by more than this is a jump in the camera's clock, not lateness.
RESYNC_S = 1.0
# Resets in one connection after which the camera's times are not trusted (they go backwards
# with B-frames, or the camera's clock is broken).
GIVE_UP_AFTER = 10


class CameraClock:
    """Maps (camera seconds, arrival seconds) to a frame time on the arrival clock."""

    __slots__ = ("_last_camera", "_offset", "_window", "by_arrival", "resyncs")

    def __init__(self) -> None:
        self._offset: float | None = None
        self._last_camera = 0.0
        # The window's candidates for the least lateness: (camera s, lateness), lateness
        # increasing from the front (the front is the window's least).
        self._window: deque[tuple[float, float]] = deque()
        self.resyncs = 0
        # The camera's times were given up on (GIVE_UP_AFTER resets): arrival from then on.
        self.by_arrival = False

    def time(self, camera_s: float | None, arrival_s: float) -> float:
        """The frame's time on the arrival clock; not yet made strictly increasing."""
        if camera_s is None or self.by_arrival:
            return arrival_s
        lateness = arrival_s - camera_s
        window = self._window
        offset = self._offset
        if offset is not None:
            step = camera_s - self._last_camera
            if step <= 0 or abs(lateness - offset) > RESYNC_S:
                self.resyncs += 1
                if self.resyncs >= GIVE_UP_AFTER:
                    self.by_arrival = True
                    return arrival_s
                offset = None
                window.clear()
        while window and window[-1][1] >= lateness:
            window.pop()
        window.append((camera_s, lateness))
        while window[0][0] < camera_s - WINDOW_S:
            window.popleft()
        least = window[0][1]
        if offset is None:
            offset = least
        elif least < offset:
            # A prompter frame: lower the line, closing no gap by more than half a step.
            offset = max(least, offset - step / 2)
        else:
            offset = min(least, offset + RISE * step)
        self._offset = offset
        self._last_camera = camera_s
        return camera_s + offset
