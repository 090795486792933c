"""Recording and playback: the fMP4 archive on the board, clips by time, pre-roll from the ring.

Reads the ring like any viewer (through the segmenter); knows nothing of HTTP or WebRTC.
"""

from .archive import Archive, Segment, rfc3339
from .clip import Clip, ClipError, plan_clip
from .recorder import Recorder, RecorderSettings

__all__ = ["Archive", "Clip", "ClipError", "Recorder", "RecorderSettings", "Segment",
           "plan_clip", "rfc3339"]
