"""The sub-stream: a camera's second, smaller H.264 stream, encoded by its source itself.

The main stream is never re-encoded. Which sources have one (``[[camera]] substream``):

- the synthetic camera: a second libx264 encoder at the sub size, fed the same pictures on the
  same clock (``sources/synthetic.py``);
- picamera2: a second H.264 encoder on the ISP's ``lores`` stream (``sources/picamera.py``; on
  by default only where H.264 is in hardware, not on BCM2712 boards: Pi 5, CM5, Pi 500);
- ``auto``: whichever of those it finds (rpicam-vid found instead: no sub-stream);
- an rtsp:// camera with ``substream_url``: that second URL, passed through;
- rpicam-vid (one encoder) and files (one stream): none.

Where the main source encodes both, the sub pipeline's source is a :class:`SubstreamTap`: the
main source hands it the second encoder's access units, and its start/stop only connect the sub
pipeline's ring to them (the camera starts and stops with the main source).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from ..config import SUBSTREAM_REFUSED, CameraConfig, SubstreamConfig
from .access_unit import AccessUnit
from .sources.base import Deliver
from .sources.soc import is_bcm2712

NETWORK_SUB_RING_BYTES = 4 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class SubstreamPlan:
    """What a camera's sub-stream is: its settings (``camera``), or why it has none."""

    camera: CameraConfig | None
    reason: str = ""


def sub_camera(cam: CameraConfig) -> CameraConfig:
    """The sub-stream's own CameraConfig: its size, frame rate and bitrate, the same name; an
    rtsp:// camera's source is its ``substream_url``. Its ring is sized from its bitrate."""
    sub = cam.substream
    framerate = sub.framerate or cam.framerate
    keyframes = max(1, cam.keyframe_interval * framerate // cam.framerate)
    # An IP camera's sub-stream has its own bitrate (unknown here): 4 MiB holds 16 s of 2 Mbit/s.
    ring = NETWORK_SUB_RING_BYTES if cam.substream_url else 0
    return dataclasses.replace(
        cam, source=cam.substream_url or cam.source, width=min(sub.width, cam.width),
        height=min(sub.height, cam.height), framerate=framerate, bitrate=sub.bitrate,
        keyframe_interval=keyframes, ring_bytes=ring, motion=False,
        substream=SubstreamConfig(mode="off"), substream_url="",
        max_frame_bytes=min(cam.max_frame_bytes, 1024 * 1024))


def plan_substream(cam: CameraConfig, *,
                   software_encoder: Callable[[], bool] = is_bcm2712) -> SubstreamPlan:
    """Whether ``cam`` has a sub-stream here and with which settings (config.py validated
    them: an explicit one is possible). ``software_encoder``: whether picamera2 would encode
    H.264 in software on this board (then "auto" leaves it off)."""
    sub = cam.substream
    if sub.mode == "off":
        return SubstreamPlan(None, "substream = false")
    kind = "file" if cam.source.startswith("file:") else cam.source_kind
    if kind in SUBSTREAM_REFUSED:
        return SubstreamPlan(None, f"the {kind} source has none ({SUBSTREAM_REFUSED[kind]})")
    if cam.source.startswith(("rtsp://", "rtsps://")):
        if not cam.substream_url:
            return SubstreamPlan(None, "no substream_url for this rtsp:// camera")
        return SubstreamPlan(sub_camera(cam))
    if sub.mode == "auto":
        if sub.width >= cam.width and sub.height >= cam.height:
            return SubstreamPlan(None, f"the main stream ({cam.width}x{cam.height}) is no "
                                       f"larger than a sub-stream ({sub.width}x{sub.height})")
        if kind in ("picamera", "auto") and software_encoder():
            return SubstreamPlan(None, "this board encodes H.264 in software (BCM2712); set "
                                       "substream = true to encode one anyway")
    return SubstreamPlan(sub_camera(cam))


class SubstreamTap:
    """The sub pipeline's source where the main source runs the second encoder.

    The main source calls :meth:`offer` (any thread) with each access unit of its second
    encoder, :meth:`fail` when that encoder could not run (the main stream carries on) and
    :meth:`clear` when it runs again; it sets :attr:`keyframe_hook` to force the second
    encoder's next picture to an IDR."""

    # The main source restarts (and so this stream) by itself: the camera's supervisor does
    # not restart a stalled sub-stream on its own.
    recovers_by_itself = True

    def __init__(self, camera: CameraConfig) -> None:
        self.camera = camera
        self.main_kind = "auto"
        self.error: str | None = None
        # The main source turned out to have no second encoder (auto found rpicam-vid): the
        # camera then has no sub-stream at all (cameras/camera.py drops it).
        self.unsupported = False
        self.keyframe_hook: Callable[[], None] | None = None
        self.keyframes_on_demand = True
        self.frames = 0
        self._deliver: Deliver | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def kind(self) -> str:
        """The main source's kind (the sub-stream comes from the same camera)."""
        return self.main_kind

    async def start(self, deliver: Deliver) -> None:
        """Connect the sub pipeline: the second encoder's frames reach ``deliver`` from now."""
        self._loop = asyncio.get_running_loop()
        self._deliver = deliver

    async def stop(self) -> None:
        """Disconnect (the main source keeps running)."""
        self._deliver = None

    def offer(self, au: AccessUnit) -> None:
        """One access unit of the second encoder (any thread); dropped while disconnected."""
        deliver, loop = self._deliver, self._loop
        if deliver is None or loop is None:
            return
        self.frames += 1
        with contextlib.suppress(RuntimeError):  # the loop is closing
            loop.call_soon_threadsafe(deliver, au)

    def fail(self, reason: str) -> None:
        """The second encoder could not run (the main stream runs without it)."""
        self.error = reason

    def refuse(self, reason: str) -> None:
        """The main source cannot encode a sub-stream at all."""
        self.error = reason
        self.unsupported = True

    def clear(self) -> None:
        """The second encoder runs."""
        self.error = None

    def request_keyframe(self) -> None:
        """Ask the main source to make the second encoder's next picture an IDR."""
        hook = self.keyframe_hook
        if hook is not None:
            hook()

    def stats(self) -> dict[str, Any]:
        """Frames passed on, and why the second encoder does not run (``last_error``)."""
        out: dict[str, Any] = {"frames": self.frames}
        if self.error:
            out["last_error"] = self.error
        return out
