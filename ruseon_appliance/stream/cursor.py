"""A reader's cursor into the ring buffer and its output timeline: how a viewer, an RTSP client or a
relay joins the stream and stays continuous (every sender of the camera's RTP uses one).

Joining without added latency: the reader starts at the newest cached keyframe so the picture
appears at once. What follows depends on how old that keyframe is:

- it is the newest frame: nothing to do;
- a few frames old (up to ``catch_up_max_frames``): those frames are sent straight behind it as a
  burst whose timestamps end at the newest frame's and are squeezed into the RTP ticks just
  before it, so the decoder catches up immediately and the jitter buffer sees no backlog;
- older, and the source cannot make a keyframe on demand (a file replay; ``rpicam-vid``
  between restarts), so a still picture would stand until the next natural IDR (up to a GOP):
  the whole GOP so far is sent the same way, as long as it is at most ``catch_up_max_bytes``
  ("catch-up-gop"). The decoder runs through it at once (a P-chain cannot be fast-forwarded, so
  nothing is dropped) and shows the live picture moving within the time it takes to decode it;
  the sender paces the burst;
- older otherwise: the keyframe is sent alone, re-stamped as "now", a fresh IDR is requested
  from the source (coalesced in capture) and the stale P-frames in between are skipped until a
  keyframe arrives. The viewer is then exactly as live as one who joined on a keyframe.

A paced burst (``burst_ticks_per_byte``, the fan-out's pacing rate) is stamped at the pace it
leaves, each frame at the moment its last byte is due to go out, rather than squeezed into a
few ticks: a 720p GOP takes tens of ms to send, and frames arriving that much later than their
timestamps say threw Chromium's receive-time estimate off, freezing the picture for 0.2-0.6 s
right after the burst in about one join in four at 720p on a loaded machine (``bench/join.py
chromium``: 17 of 60 joins squeezed, 5 of 60 with paced stamps, the rest of those being stalls
of the machine itself).

Output timestamps are continuous and strictly increasing in 1/90000 s, whatever the source does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ruseon_appliance.capture.ring import FrameView, RingBuffer, RingReader

T = TypeVar("T")


class VideoFeed(Protocol):
    """What a viewer track needs from capture (``CapturePipeline`` satisfies it)."""

    ring: RingBuffer

    def request_keyframe(self, reason: str = "") -> bool: ...


class ViewerCursor(Generic[T]):
    """One viewer's position in the ring and its output timeline (the join logic above).

    ``take`` turns a ring frame into what the consumer keeps (the aiortc path copies the bytes;
    the fan-out path looks up the frame's shared packetization). Frames ready to send wait in
    :attr:`queue` as ``(taken, out_pts, keyframe, capture_time_us)``.
    """

    def __init__(
        self,
        feed: VideoFeed,
        take: Callable[[FrameView], T],
        *,
        frame_interval: int,
        catch_up_max_frames: int,
        keyframe_interval_frames: int,
        on_keyframe_request: Callable[[str], None] | None = None,
        catch_up_max_bytes: int = 0,
        burst_ticks_per_byte: float = 0.0,
    ) -> None:
        self._feed = feed
        self._take = take
        self._catch_up_max_bytes = catch_up_max_bytes
        self.burst_ticks_per_byte = burst_ticks_per_byte
        self._frame_interval = max(1, frame_interval)
        self._catch_up_max = catch_up_max_frames
        self._gop = keyframe_interval_frames
        self.request: Callable[[str], None] = on_keyframe_request or (lambda reason: None)
        self.reader: RingReader | None = None
        self.queue: deque[tuple[T, int, bool, int]] = deque()
        self._skip_until_keyframe = False
        self._skipped_since_request = 0
        self._offset = 0
        self._last_pts: int | None = None
        self.join_mode = ""
        self.frames_skipped = 0
        self.refreshes = 0  # keyframe requests answered from the ring (refresh)

    def pull(self) -> None:
        """Join on first use, then move every frame written since into :attr:`queue`."""
        if self.reader is None:
            self.join()
        reader = self.reader
        assert reader is not None
        while True:
            view = reader.poll()
            if view is None:
                return
            self.accept(view)

    def skip_to_next_keyframe(self) -> int:
        """Drop what is queued and everything up to the next keyframe (a viewer that cannot
        keep up); returns the number of frames dropped from the queue."""
        dropped = len(self.queue)
        self.queue.clear()
        self.frames_skipped += dropped
        self._skip_until_keyframe = True
        self._skipped_since_request = 0
        return dropped

    def close(self) -> None:
        """Release the ring cursor."""
        if self.reader is not None:
            self.reader.close()
        self.queue.clear()

    # -- joining ---------------------------------------------------------------------------------

    def join(self) -> None:
        """Place the cursor as the module docstring describes and queue the first frames."""
        ring = self._feed.ring
        keyframe_seq = ring.newest_keyframe_seq
        newest = ring.newest_seq
        self.reader = ring.reader("keyframe")
        if keyframe_seq is None:
            # Nothing decodable cached (start-up, or the ring lapped the last IDR).
            self.join_mode = "wait-keyframe"
            self.request("viewer join: no cached keyframe")
            return
        behind = newest - keyframe_seq
        newest_view = ring.frame(newest)
        now_pts = newest_view.pts if newest_view is not None else 0
        if behind == 0:
            self.join_mode = "on-keyframe"
            return
        gop_burst = (behind > self._catch_up_max and self._catch_up_max_bytes > 0
                     and self._gop_bytes(ring, keyframe_seq, newest) <= self._catch_up_max_bytes)
        if behind <= self._catch_up_max or gop_burst:
            # Burst: keyframe + the frames after it, squeezed into the last `behind` ticks.
            self.join_mode = "catch-up-gop" if gop_burst else "catch-up"
            views: list[tuple[T, bool, int]] = []
            sizes: list[int] = []
            while len(views) <= behind:
                view = self.reader.poll()
                if view is None:
                    break
                views.append((self._take(view), view.keyframe, view.capture_time_us))
                sizes.append(len(view.data))
            stamps = self.burst_stamps(now_pts, sizes, self.burst_ticks_per_byte)
            for (taken, keyframe, capture_us), pts in zip(views, stamps, strict=True):
                self._emit(taken, pts, keyframe, capture_us, rebase=False)
            self._offset = 0
            return
        # Stale keyframe: send it as "now", ask for a fresh IDR, skip the stale P-frames.
        self.join_mode = "keyframe-then-live"
        view = self.reader.poll()
        assert view is not None and view.keyframe
        self._emit(self._take(view), now_pts, True, view.capture_time_us, rebase=False)
        self._offset = 0
        # Everything up to `newest` is stale; the reader resumes after it.
        while self.reader.position <= newest:
            if self.reader.poll() is None:
                break
            self.frames_skipped += 1
        self._skip_until_keyframe = True
        self._skipped_since_request = 0
        if behind > self._gop:
            self.request("viewer join: cached keyframe older than the GOP")
        else:
            self.request("viewer join mid-GOP")

    def refresh(self) -> bool:
        """Answer this viewer's keyframe request (PLI/FIR) from the ring, for a source that
        cannot make an IDR on demand: the newest cached keyframe and every frame since are
        queued again (what was queued is superseded), stamped in the ticks right after what
        this viewer already has, then the viewer carries on live, as a join burst does. The
        encoder, other viewers, the recording and HLS see nothing. A GOP larger than
        ``catch_up_max_bytes`` sends the keyframe alone and skips to the next one (a still,
        clean picture until then). False when there is nothing to send (no keyframe in the
        ring, or not joined yet: the join itself starts on a keyframe)."""
        ring = self._feed.ring
        keyframe_seq = ring.newest_keyframe_seq
        if keyframe_seq is None or self.reader is None:
            return False
        newest = ring.newest_seq
        whole = (self._catch_up_max_bytes <= 0 or self._gop_bytes(
            ring, keyframe_seq, newest) <= self._catch_up_max_bytes)
        self.reader.close()
        self.reader = ring.reader("keyframe")
        self.queue.clear()
        base = self._last_pts if self._last_pts is not None else 0
        tick = 0
        while self.reader.position <= newest:
            view = self.reader.poll()
            if view is None:
                break
            if tick and not whole:
                self.frames_skipped += 1
                continue
            tick += 1
            # Squeezed just after what was sent: the next live frame (rebased) comes after.
            self._emit(self._take(view), base + tick, view.keyframe, view.capture_time_us,
                       rebase=False)
        if not whole:
            self._skip_until_keyframe = True
            self._skipped_since_request = 0
        self.refreshes += 1
        return tick > 0

    @staticmethod
    def burst_stamps(now_pts: int, sizes: list[int], ticks_per_byte: float) -> list[int]:
        """Output timestamps for a join burst of frames of ``sizes`` bytes, the last at
        ``now_pts``: each frame ``ticks_per_byte`` per byte still to send after it earlier
        (when pacing lets it leave); at least one tick apart (with 0: the last ticks)."""
        stamps: list[int] = []
        after = sum(sizes)
        for size in sizes:
            after -= size
            stamps.append(now_pts - round(after * ticks_per_byte))
        for i in range(len(stamps) - 2, -1, -1):
            stamps[i] = min(stamps[i], stamps[i + 1] - 1)
        return stamps

    @staticmethod
    def _gop_bytes(ring: RingBuffer, first: int, last: int) -> int:
        """Bytes of frames ``first .. last`` (a huge number if one is gone)."""
        total = 0
        for seq in range(first, last + 1):
            view = ring.frame(seq)
            if view is None:
                return 1 << 62
            total += len(view.data)
        return total

    def accept(self, view: FrameView) -> None:
        """Queue ``view`` on the output timeline (or skip it while waiting for a keyframe)."""
        if self._skip_until_keyframe:
            if not view.keyframe:
                self.frames_skipped += 1
                self._skipped_since_request += 1
                # The forced IDR may have been absorbed by coalescing: ask again, paced.
                if self._skipped_since_request >= max(2 * self._catch_up_max, 1):
                    self._skipped_since_request = 0
                    self.request("viewer join: still waiting for a fresh keyframe")
                return
            self._skip_until_keyframe = False
        self._emit(self._take(view), view.pts, view.keyframe, view.capture_time_us, rebase=True)

    def _emit(
        self, taken: T, pts: int, keyframe: bool, capture_us: int, *, rebase: bool
    ) -> None:
        out = pts + self._offset if rebase else pts
        last = self._last_pts
        if last is not None and out <= last:
            # Source restarted or went backwards: keep the output timeline moving forward.
            step = (last + self._frame_interval) - out
            out += step
            if rebase:
                self._offset += step
        self._last_pts = out
        self.queue.append((taken, out, keyframe, capture_us))
