"""The one interface every camera source has, so adding a source means copying a pattern."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..access_unit import AccessUnit

# Called on the event loop thread with each encoded picture, in order.
Deliver = Callable[[AccessUnit], None]


class SourceUnavailable(RuntimeError):
    """The chosen source cannot run here (missing library, binary or camera); ``str`` says why."""


class Source(Protocol):
    """A camera (real or stand-in) that delivers Annex B access units to the pipeline.

    ``start`` begins delivery on the running loop (frames arrive via ``deliver`` on the loop
    thread); ``stop`` ends it and releases the camera; ``request_keyframe`` asks for an IDR as
    soon as the source can make one (already coalesced by the pipeline); ``stats`` is a flat
    dict of counters for status pages.

    Optional attributes (read with ``getattr``, these defaults when absent):
    ``keyframes_on_demand = True``: ``request_keyframe`` really makes an IDR soon and cheaply;
    False (rpicam-vid, a file, an IP camera) and the engine answers a viewer's PLI/FIR from the
    ring for that viewer alone. ``recovers_by_itself = False``: True when the source restarts
    or reconnects by itself after a failure, so its camera's supervisor leaves stalls to it.
    """

    @property
    def kind(self) -> str:
        """"synthetic", "picamera", "rpicam" or "file" (a plain class attribute will do)."""

    async def start(self, deliver: Deliver) -> None:
        """Begin delivering access units."""

    async def stop(self) -> None:
        """Stop delivering and release the camera or child process."""

    def request_keyframe(self) -> None:
        """Make the next picture (or the next possible one) an IDR."""

    def stats(self) -> dict[str, Any]:
        """Source-specific counters."""
