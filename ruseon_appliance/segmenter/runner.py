"""Feed a segmenter from a ring reader, the same way for every consumer."""

from __future__ import annotations

from collections.abc import Callable

from ..capture.ring import FrameView, RingReader
from .fmp4 import Fmp4Segmenter, Fragment


async def run_segmenter(reader: RingReader, segmenter: Fmp4Segmenter,
                        sink: Callable[[list[Fragment]], None]) -> None:
    """Push every access unit ``reader`` yields into ``segmenter``; hand finished fragments to
    ``sink`` (called only with a non-empty list, on the event loop, so keep it quick).

    A ring overrun (the reader was lapped and jumped ahead to a keyframe) is a gap in time:
    the segmenter is reset so the next fragment starts cleanly at that keyframe. Frames already
    waiting in the ring are drained without awaiting. When the reader is closed or the task is
    cancelled, the open fragment is flushed to ``sink`` before returning.
    """
    overruns = reader.overruns
    try:
        while True:
            try:
                view = await reader.next()
            except EOFError:
                return
            out: list[Fragment] = []
            current: FrameView | None = view
            while current is not None:
                if reader.overruns != overruns:
                    overruns = reader.overruns
                    segmenter.reset()
                out.extend(segmenter.push(current.data, current.pts, current.keyframe,
                                          current.capture_time_us))
                current = reader.poll()
            if out:
                sink(out)
    finally:
        rest = segmenter.flush()
        if rest:
            sink(rest)
