"""Feed a segmenter from a ring reader, the same way for every consumer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from ..capture.ring import FrameView, RingBuffer, RingReader
from .fmp4 import Fmp4Segmenter, Fragment, parse_aac_config

log = logging.getLogger(__name__)


class AacFeed(Protocol):
    """A camera's AAC, as the segmenter's consumers take it (``audio.pipeline.AudioPipeline``
    is one): its ring of 1024-sample frames, its AudioSpecificConfig, and which one a ring
    frame has (it changes when an IP camera's own AAC is passed through)."""

    @property
    def aac_ring(self) -> RingBuffer: ...

    @property
    def aac_config(self) -> bytes: ...

    def aac_config_for(self, seq: int) -> bytes: ...


def push_audio_frame(segmenter: Fmp4Segmenter, view: FrameView,
                     feed: AacFeed | None) -> list[Fragment]:
    """``view`` (an AAC ring frame) into ``segmenter``, after telling it the frame's
    AudioSpecificConfig when ``feed`` says it changed (a configuration that cannot be muxed
    loses its frames, never the pictures)."""
    if feed is not None:
        config = feed.aac_config_for(view.seq)
        if config != segmenter.audio_config:
            try:
                segmenter.set_audio_config(config)
            except ValueError:
                return []
    return segmenter.push_audio(view.data, view.pts, view.capture_time_us)


def usable_audio(audio: AacFeed | None) -> AacFeed | None:
    """``audio`` when its AudioSpecificConfig can be muxed, else None (with a warning): a
    broken encoder configuration costs the sound, never the pictures."""
    if audio is None:
        return None
    try:
        parse_aac_config(audio.aac_config)
    except ValueError as exc:
        log.warning("AAC configuration %r unusable (%s): HLS and recordings go without sound",
                    audio.aac_config.hex(), exc)
        return None
    return audio


def open_audio(segmenter: Fmp4Segmenter, ring: RingBuffer, feed: AacFeed | None = None
               ) -> tuple[RingReader, list[Fragment]]:
    """A reader of the AAC ``ring`` from its next write, with every frame the ring already
    holds pushed into ``segmenter`` first (it keeps only what its video reaches), so the
    video read from the ring's past has its sound too. Synchronous: nothing is written to
    the ring in between, so nothing is missed or pushed twice. Returns the reader (for
    :func:`run_segmenter`'s ``audio``) and the fragments that became complete. With ``feed``
    (whose ``aac_ring`` ``ring`` is), each frame's configuration is followed
    (:func:`push_audio_frame`)."""
    reader = ring.reader("next")
    out: list[Fragment] = []
    for seq in range(ring.oldest_seq, reader.position):
        view = ring.frame(seq)
        if view is not None:
            out.extend(push_audio_frame(segmenter, view, feed))
    return reader, out


# Awaited before each wait for the next access unit (with the video's reader): a consumer that
# may read in batches (the HLS stream while nobody watches it) sleeps here.
Between = Callable[[RingReader], Awaitable[None]]


async def run_segmenter(reader: RingReader, segmenter: Fmp4Segmenter,
                        sink: Callable[[list[Fragment]], None], *,
                        audio: RingReader | None = None, feed: AacFeed | None = None,
                        between: Between | None = None) -> None:
    """Push every access unit ``reader`` yields into ``segmenter``; hand finished fragments to
    ``sink`` (called only with a non-empty list, on the event loop, so keep it quick).

    A ring overrun (the reader was lapped and jumped ahead to a keyframe) is a gap in time:
    the segmenter is reset so the next fragment starts cleanly at that keyframe. Frames already
    waiting in the ring are drained without awaiting. When the reader is closed or the task is
    cancelled, the open fragment is flushed to ``sink`` before returning.

    ``audio`` (a reader of the camera's AAC ring, see :func:`open_audio`; ``feed`` the camera's
    sound it reads, whose configuration changes are followed) is read by a second task on the
    same loop into :meth:`Fmp4Segmenter.push_audio`; fragments it completes go to
    ``sink`` at once. It never stops the video: a failure in it is logged and the video goes
    on without sound (the segmenter stops waiting for audio that does not come); an exception
    from ``sink`` there is raised here, as it would be from the video's own.

    ``between`` is awaited (with ``reader``) before each wait for the next access unit: what it
    lets pile up in the ring meanwhile is then read in one go.
    """
    if audio is None:
        await _run_video(reader, segmenter, sink, between)
        return
    video_task = asyncio.current_task()
    failed: list[BaseException] = []
    audio_task = asyncio.create_task(_run_audio(audio, segmenter, sink, failed, video_task,
                                                feed),
                                     name="segmenter-audio")
    try:
        await _run_video(reader, segmenter, sink, between)
    except asyncio.CancelledError:
        if failed and video_task is not None and video_task.uncancel() == 0:
            raise failed[0] from None
        raise
    finally:
        audio_task.cancel()
        await asyncio.gather(audio_task, return_exceptions=True)


async def _run_video(reader: RingReader, segmenter: Fmp4Segmenter,
                     sink: Callable[[list[Fragment]], None], between: Between | None) -> None:
    overruns = reader.overruns
    try:
        while True:
            if between is not None:
                await between(reader)
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
                                          current.capture_time_us, current.seq))
                current = reader.poll()
            if out:
                sink(out)
    finally:
        rest = segmenter.flush()
        if rest:
            sink(rest)


async def _run_audio(reader: RingReader, segmenter: Fmp4Segmenter,
                     sink: Callable[[list[Fragment]], None], failed: list[BaseException],
                     video_task: asyncio.Task[object] | None, feed: AacFeed | None) -> None:
    while True:
        try:
            view = await reader.next()
        except EOFError:
            return
        out: list[Fragment] = []
        current: FrameView | None = view
        try:
            while current is not None:
                out.extend(push_audio_frame(segmenter, current, feed))
                current = reader.poll()
        except Exception:
            log.exception("the audio of a segmenter failed; the video goes on without it")
            return
        if out:
            try:
                sink(out)
            except Exception as exc:  # the consumer's own failure: the video's loop raises it
                failed.append(exc)
                if video_task is not None:
                    video_task.cancel()
                return
