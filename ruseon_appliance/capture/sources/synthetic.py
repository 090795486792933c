"""The synthetic camera: a moving test picture encoded with libx264, for development and CI.

It behaves like the hardware path: real-time paced, no B-frames, IDR every ``keyframe_interval``
frames or on request, SPS/PPS only where libx264 puts them. Every picture carries the
machine-readable :mod:`~ruseon_appliance.capture.stamp` (capture time, frame number) so latency
can be measured end to end. Encoding runs on a worker thread; frames go to the loop with
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import av
import numpy as np
from av.video.frame import PictureType

from ...config import CameraConfig
from ..access_unit import VIDEO_CLOCK_RATE, AccessUnit
from ..controls import camera_with
from ..stamp import draw_stamp
from .base import Deliver

if TYPE_CHECKING:
    from ..substream import SubstreamTap

log = logging.getLogger(__name__)

# x264's profile is only a ceiling: ultrafast turns CABAC and 8x8 transforms off, which makes
# every stream Constrained Baseline. Switch on the tools that make each profile what it says.
X264_PROFILE_TOOLS = {"baseline": "", "main": "cabac=1:", "high": "cabac=1:8x8dct=1:"}


@dataclasses.dataclass(frozen=True, slots=True)
class PictureControls:
    """What the synthetic "ISP" does to the picture (picamera2's ranges and neutral values)."""

    brightness: float = 0.0
    contrast: float = 1.0
    saturation: float = 1.0
    hflip: bool = False
    vflip: bool = False

    @property
    def neutral_tone(self) -> bool:
        """Brightness and contrast leave the scene as drawn."""
        return self.brightness == 0.0 and self.contrast == 1.0


class MovingPicture:
    """The moving picture: a drifting block texture, a sweeping bar, and the stamp."""

    def __init__(self, width: int, height: int, seed: int = 1) -> None:
        self.width = width
        self.height = height
        rng = np.random.default_rng(seed)
        # Coarse random blocks (8 px) give x264 real work without being pure noise.
        cells = rng.integers(40, 215, size=(height // 8 + 2, width // 8 + 2), dtype=np.uint8)
        texture = np.repeat(np.repeat(cells, 8, axis=0), 8, axis=1)
        self._texture = np.concatenate([texture, texture], axis=1)  # wraps horizontally
        self._buffer: np.ndarray[Any, Any] = np.empty((height * 3 // 2, width), dtype=np.uint8)
        self._buffer[height:] = 128  # neutral chroma
        # A picture too small for the stamp (a tiny sub-stream) goes without it.
        try:
            draw_stamp(np.zeros((height, width), dtype=np.uint8), 0, 0)
        except ValueError:
            self.stamped = False
        else:
            self.stamped = True

    def render(self, frame_number: int, capture_time_us: int,
               controls: PictureControls = PictureControls()) -> av.VideoFrame:
        """Return a yuv420p frame for ``frame_number`` stamped with ``capture_time_us``.

        Brightness, contrast and saturation change the scene but not the stamp (an overlay
        burned in after the ISP, so latency stays measurable whatever the tuning); the flips
        turn the whole picture, stamp included, as a sensor's readout order would.
        """
        w, h = self.width, self.height
        tex_w = self._texture.shape[1] // 2
        shift = (frame_number * 2) % tex_w
        luma = self._buffer[:h]
        luma[:] = self._texture[:h, shift : shift + w]
        bar = (frame_number * 4) % w
        luma[:, bar : bar + max(2, w // 40)] = 235
        if not controls.neutral_tone:
            scene = (luma.astype(np.float32) - 128.0) * controls.contrast
            scene += 128.0 + controls.brightness * 110.0
            luma[:] = np.clip(scene, 16, 235).astype(np.uint8)
        # Chroma drifts slowly so colour changes are visible too; it is uniform, so the flips
        # below need not touch it.
        chroma = 40 * np.sin(frame_number / 50) * controls.saturation
        self._buffer[h : h + h // 4] = int(np.clip(128 + chroma, 16, 240))
        if self.stamped:
            draw_stamp(luma, capture_time_us, frame_number)
        if controls.hflip:
            luma[:] = luma[:, ::-1]
        if controls.vflip:
            luma[:] = luma[::-1]
        return av.VideoFrame.from_ndarray(self._buffer, format="yuv420p")


class SyntheticSource:
    """Test camera: PyAV + libx264, ``tune=zerolatency``, paced at the configured frame rate."""

    kind = "synthetic"
    # Live camera controls (capture/controls.py): True applies at the next frame, False
    # restarts the encoder (the ring, and so every viewer, carries on; the new stream starts
    # with an IDR and its timestamps continue where the old one stopped).
    controls = {"brightness": True, "contrast": True, "saturation": True, "hflip": True,
                "vflip": True, "bitrate": False, "framerate": False, "resolution": False}

    def __init__(self, camera: CameraConfig, *, threads: int = 1) -> None:
        self._camera = camera
        self._configured = camera
        self._picture = PictureControls(hflip=camera.hflip, vflip=camera.vflip)
        self._deliver: Deliver | None = None
        self._pts_offset = 0
        self._pts_next = 0
        self._threads = threads
        self._stop = threading.Event()
        self._force_idr = False
        self._thread: threading.Thread | None = None
        self.frames_encoded = 0
        self.frames_late = 0
        self.keyframes_forced = 0
        # The sub-stream (capture/substream.py): a second encoder at its size, fed the same
        # pictures (drawn at that size) on the same clock, every frame or fewer.
        self.substream: SubstreamTap | None = None
        self._force_sub_idr = False
        self.sub_frames_encoded = 0

    def attach_substream(self, tap: SubstreamTap) -> None:
        """Encode the sub-stream too, into ``tap`` (from the next start)."""
        self.substream = tap
        tap.main_kind = self.kind
        tap.keyframe_hook = self._request_sub_keyframe

    def _request_sub_keyframe(self) -> None:
        self._force_sub_idr = True

    def _encoder(self, camera: CameraConfig | None = None) -> Any:
        cam = camera or self._camera
        ctx = av.CodecContext.create("libx264", "w")
        ctx.width = cam.width
        ctx.height = cam.height
        ctx.pix_fmt = "yuv420p"
        ctx.time_base = Fraction(1, cam.framerate)
        ctx.framerate = Fraction(cam.framerate, 1)
        ctx.bit_rate = cam.bitrate
        ctx.gop_size = cam.keyframe_interval
        ctx.max_b_frames = 0
        # VBV of about one second keeps the rate near the target without CBR filler NAL units.
        ctx.options = {
            "preset": "ultrafast",
            "tune": "zerolatency",
            "profile": cam.profile,
            "forced-idr": "1",
            "bf": "0",
            "threads": str(self._threads),
            "x264-params": (
                f"{X264_PROFILE_TOOLS[cam.profile]}keyint={cam.keyframe_interval}:min-keyint={cam.keyframe_interval}:scenecut=0:"
                f"vbv-maxrate={cam.bitrate // 1000}:vbv-bufsize={cam.bitrate // 1000}:"
                "repeat-headers=1:aud=0"
            ),
        }
        ctx.open()
        return ctx

    async def start(self, deliver: Deliver) -> None:
        """Start the worker thread; frames are delivered on the running loop."""
        if self._thread is not None:
            return
        loop = asyncio.get_running_loop()
        encoder = await asyncio.to_thread(self._encoder)
        sub_encoder = None
        tap = self.substream
        if tap is not None:
            try:
                sub_encoder = await asyncio.to_thread(self._encoder, tap.camera)
            except Exception as exc:  # the main stream runs without it
                log.exception("synthetic camera: the sub-stream's encoder failed to open")
                tap.fail(f"the sub-stream's encoder failed to open: {exc}")
            else:
                tap.clear()
        self._deliver = deliver
        self._pts_offset = self._pts_next
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(loop, deliver, encoder, sub_encoder), name="synthetic-camera",
            daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        """Stop the worker thread and wait for it."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        await asyncio.to_thread(thread.join)

    async def apply_controls(self, values: Any) -> bool:
        """Picture controls at the next frame; bitrate, frame rate and size restart the encoder
        (True) when running."""
        self._picture = PictureControls(
            brightness=float(values.get("brightness", 0.0)),
            contrast=float(values.get("contrast", 1.0)),
            saturation=float(values.get("saturation", 1.0)),
            hflip=bool(values.get("hflip", self._configured.hflip)),
            vflip=bool(values.get("vflip", self._configured.vflip)),
        )
        camera = camera_with(self._configured, {k: v for k, v in values.items()
                                                 if k in ("bitrate", "framerate", "resolution")})
        if camera == self._camera:
            return False
        self._camera = camera
        deliver = self._deliver
        if self._thread is None or deliver is None:
            return False
        await self.stop()
        await self.start(deliver)
        return True

    def request_keyframe(self) -> None:
        """Make the next encoded picture an IDR."""
        self._force_idr = True

    def stats(self) -> dict[str, Any]:
        """Counters of the worker thread."""
        return {
            "frames_encoded": self.frames_encoded,
            "frames_late": self.frames_late,
            "keyframes_forced": self.keyframes_forced,
            **({"sub_frames_encoded": self.sub_frames_encoded} if self.substream else {}),
        }

    def _encode_sub(self, encoder: Any, pattern: MovingPicture, index: int, sub_index: int,
                    capture_us: int, pts: int) -> None:
        """One picture of the sub-stream (on the worker thread), stamped as the main one."""
        tap = self.substream
        assert tap is not None
        frame = pattern.render(index, capture_us, self._picture)
        frame.pts = sub_index
        if self._force_sub_idr:
            self._force_sub_idr = False
            frame.pict_type = PictureType.I
        for packet in encoder.encode(frame):
            self.sub_frames_encoded += 1
            tap.offer(AccessUnit(bytes(packet), pts, bool(packet.is_keyframe), capture_us))

    def _run(self, loop: asyncio.AbstractEventLoop, deliver: Deliver, encoder: Any,
             sub_encoder: Any = None) -> None:
        cam = self._camera
        pattern = MovingPicture(cam.width, cam.height)
        tap = self.substream
        sub_pattern = sub_fps = None
        if tap is not None and sub_encoder is not None:
            sub_pattern = MovingPicture(tap.camera.width, tap.camera.height)
            sub_fps = min(tap.camera.framerate, cam.framerate)
        sub_last = -1
        interval = 1.0 / cam.framerate
        start = time.monotonic()
        index = 0
        try:
            while not self._stop.is_set():
                due = start + index * interval
                delay = due - time.monotonic()
                if delay > 0:
                    if self._stop.wait(delay):
                        break
                elif delay < -interval:
                    # Fell behind (a busy machine): skip the missed slots rather than burst.
                    missed = int(-delay / interval)
                    self.frames_late += missed
                    index += missed
                # The picture is of its slot's moment (a sensor exposes on schedule; the
                # picture may only come out late): its capture time is that moment on the wall
                # clock, as its pts is on the 90 kHz one. Stamped with the moment the thread
                # got to run, a late picture showed a later stamp than its pts placed it at:
                # its sound, stamped on time, measured 30-85 ms out of sync under load.
                late_us = max(0, round((time.monotonic() - (start + index * interval)) * 1e6))
                capture_us = time.time_ns() // 1000 - late_us
                frame = pattern.render(index, capture_us, self._picture)
                frame.pts = index
                if self._force_idr:
                    self._force_idr = False
                    frame.pict_type = PictureType.I
                    self.keyframes_forced += 1
                for packet in encoder.encode(frame):
                    pts = self._pts_offset + packet.pts * VIDEO_CLOCK_RATE // cam.framerate
                    self._pts_next = pts + VIDEO_CLOCK_RATE // cam.framerate
                    au = AccessUnit(bytes(packet), pts, bool(packet.is_keyframe), capture_us)
                    self.frames_encoded += 1
                    try:
                        loop.call_soon_threadsafe(deliver, au)
                    except RuntimeError:  # the loop is closed: nobody to deliver to
                        return
                if sub_pattern is not None and sub_fps is not None:
                    sub_index = index * sub_fps // cam.framerate  # fewer frames: some skipped
                    if sub_index != sub_last:
                        sub_last = sub_index
                        pts = self._pts_offset + index * VIDEO_CLOCK_RATE // cam.framerate
                        try:
                            self._encode_sub(sub_encoder, sub_pattern, index, sub_index,
                                             capture_us, pts)
                        except Exception as exc:  # the main stream carries on without it
                            log.exception("synthetic camera: the sub-stream's encoder failed")
                            if tap is not None:
                                tap.fail(f"the sub-stream's encoder failed: {exc}")
                            sub_pattern = None
                index += 1
        except Exception:
            log.exception("synthetic camera failed")
            raise
