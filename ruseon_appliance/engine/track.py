"""The viewer's own video track on the stock aiortc sender path: a cursor into the ring buffer
(``stream/cursor.py``: the join logic) yielding pass-through packets.

aiortc's sender packetizes an ``av.Packet`` (Annex B access unit with ``pts`` and ``time_base``)
without re-encoding. Each viewer needs its own track object: a sender stops its track when it ends.
"""

from __future__ import annotations

import fractions
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from ruseon_appliance.capture.ring import FrameView
from ruseon_appliance.stream.cursor import VideoFeed, ViewerCursor

if TYPE_CHECKING:
    import av

TIME_BASE = fractions.Fraction(1, 90_000)


def _copy(view: FrameView) -> bytes:
    return bytes(view.data)


def _no_keyframe_request(reason: str) -> None:
    """A stopped track's keyframe requests go nowhere."""


class ViewerTrack(MediaStreamTrack):  # type: ignore[misc]
    """One viewer's pass-through H.264 track over the shared ring buffer (the stock aiortc
    sender path, ``send_path = "aiortc"``)."""

    kind = "video"

    def __init__(
        self,
        feed: VideoFeed,
        *,
        frame_interval: int,
        catch_up_max_frames: int,
        keyframe_interval_frames: int,
        on_keyframe_request: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self.cursor: ViewerCursor[bytes] = ViewerCursor(
            feed, _copy, frame_interval=frame_interval, catch_up_max_frames=catch_up_max_frames,
            keyframe_interval_frames=keyframe_interval_frames,
            on_keyframe_request=on_keyframe_request)
        self.frames_sent = 0
        self.keyframes_sent = 0
        self.bytes_sent = 0
        self.last_capture_time_us = 0

    @property
    def join_mode(self) -> str:
        """How this viewer joined (see ``stream/cursor.py``)."""
        return self.cursor.join_mode

    @property
    def frames_skipped(self) -> int:
        """Frames never sent to this viewer (stale after joining, or dropped to catch up)."""
        return self.cursor.frames_skipped

    @property
    def _request(self) -> Callable[[str], None]:
        return self.cursor.request

    @_request.setter
    def _request(self, request: Callable[[str], None]) -> None:
        self.cursor.request = request

    # -- MediaStreamTrack ------------------------------------------------------------------------

    async def recv(self) -> av.Packet:  # type: ignore[override]
        """The next access unit as an ``av.Packet`` (pts in 1/90000 s)."""
        if self.readyState != "live":
            raise MediaStreamError
        cursor = self.cursor
        if cursor.reader is None:
            cursor.join()
        while not cursor.queue:
            reader = cursor.reader
            assert reader is not None
            try:
                view = await reader.next()
            except EOFError:
                raise MediaStreamError from None
            cursor.accept(view)
        data, pts, keyframe, capture_us = cursor.queue.popleft()
        import av  # PyAV loads with the first viewer on this path, not at start

        packet = av.Packet(data)
        packet.pts = pts
        packet.dts = pts
        packet.time_base = TIME_BASE
        self.frames_sent += 1
        self.keyframes_sent += keyframe
        self.bytes_sent += len(data)
        self.last_capture_time_us = capture_us
        return packet

    def refresh(self) -> bool:
        """A keyframe request answered from the ring (:meth:`ViewerCursor.refresh`)."""
        return self.cursor.refresh()

    def stop(self) -> None:
        """End the track and release its ring cursor."""
        super().stop()
        self.cursor.close()
        # The session's keyframe callback closes over the session, which holds this track.
        self.cursor.request = _no_keyframe_request
