"""The picamera source: picamera2 with the hardware H.264 encoder (libx264 on BCM2712 boards).

picamera2 needs libcamera's Python bindings, which only Raspberry Pi OS's apt provides, so it is
an optional import: without it, choosing this source fails with a message saying what to
install. The encoder calls our ``Output.outputframe`` on its own thread; frames are handed to the
event loop with ``call_soon_threadsafe``. Keyframe requests call ``force_key_frame()`` where the
encoder has it (picamera2 0.3.32 and later, and always on the libav path, which we fix).

Facts relied on (picamera2 at 3e6dff0, tags v0.3.31/v0.3.32): ``picamera2/encoders/__init__.py``
binds ``H264Encoder`` to ``LibavH264Encoder`` when ``platform.get_platform()`` is not VC4 (every
BCM2712 board); the V4L2 encoder hands ``outputframe`` an immutable ``bytes`` read from its mmap,
the libav one ``bytes(packet)``, with timestamps in µs from 0; ``force_key_frame`` is absent in
v0.3.31; libcamera's ``AeEnable=False`` fixes exposure and gain together, while picamera2 sets
``ExposureTimeMode``/``AnalogueGainMode`` manual only for the control given (``request.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...config import CameraConfig
from ..access_unit import VIDEO_CLOCK_RATE, AccessUnit
from ..controls import RESTART_PROOF_S, ControlRejected, camera_with, frames_arrived
from .base import Deliver, SourceUnavailable

if TYPE_CHECKING:
    from ..substream import SubstreamTap

log = logging.getLogger(__name__)

# Our tone controls -> libcamera's names and neutral values (picamera2's documented ranges).
TONE = {"brightness": ("Brightness", 0.0), "contrast": ("Contrast", 1.0),
        "saturation": ("Saturation", 1.0), "sharpness": ("Sharpness", 1.0)}

INSTALL_HINT = ("install python3-picamera2 from Raspberry Pi OS's apt and create the venv with "
                "--system-site-packages")


@dataclass(frozen=True)
class Picamera2Api:
    """The picamera2/libcamera names this source uses (tests pass stand-ins)."""

    Picamera2: Any
    H264Encoder: Any
    Output: Any
    LibavH264Encoder: Any | None = None
    Transform: Any | None = None
    controls: Any | None = None  # libcamera.controls, for AwbModeEnum
    platform: Any | None = None  # picamera2.platform (get_platform, Platform)


def load_picamera2() -> Picamera2Api:
    """Import picamera2 and libcamera; raise SourceUnavailable with an install hint."""
    try:
        from picamera2 import Picamera2
        from picamera2.encoders import H264Encoder
        from picamera2.outputs import Output
    except ImportError as exc:
        raise SourceUnavailable(f"camera.source = picamera needs picamera2 ({exc}): "
                                f"{INSTALL_HINT}") from None
    return Picamera2Api(
        Picamera2,
        H264Encoder,
        Output,
        LibavH264Encoder=_optional("picamera2.encoders", "LibavH264Encoder"),
        Transform=_optional("libcamera", "Transform"),
        controls=_optional("libcamera", "controls"),
        platform=_module_optional("picamera2.platform"),
    )


def _optional(module: str, name: str) -> Any:
    """``module.name`` if importable (older picamera2 lacks the libav encoder), else None."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _module_optional(module: str) -> Any:
    """The module if importable (older picamera2 lacks ``platform``), else None."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def uses_libav(api: Picamera2Api) -> bool:
    """Whether picamera2 encodes H.264 with libx264 here (BCM2712: Pi 5, CM5, Pi 500).

    Asks picamera2 itself: it binds ``H264Encoder`` to ``LibavH264Encoder`` when its platform
    is not VC4; older releases without that binding still have ``platform.get_platform()``.
    """
    if api.LibavH264Encoder is not None and api.H264Encoder is api.LibavH264Encoder:
        return True
    platform = api.platform
    if platform is None:
        return False
    try:
        return bool(platform.get_platform() != platform.Platform.VC4)
    except Exception:  # an unexpected platform module: keep the hardware path
        return False


def camera_present(api: Picamera2Api) -> bool:
    """Whether libcamera sees at least one camera."""
    try:
        return bool(api.Picamera2.global_camera_info())
    except Exception:  # libcamera errors come in many types; absent is the safe answer
        return False


class KeyframeStream:
    """Wraps a PyAV stream so a pending keyframe request marks the next frame ``PictureType.I``.

    picamera2's ``LibavH264Encoder`` (the Pi 5 path) sets ``frame.pict_type = "I"``, which PyAV
    14+ rejects; this proxy sets the enum instead and the encoder's own request counter is
    never used.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.pending = False
        self.forced = 0

    def encode(self, frame: Any = None) -> Any:
        """Encode ``frame``, as an IDR if one was requested."""
        if frame is not None and self.pending:
            from av.video.frame import PictureType

            self.pending = False
            frame.pict_type = PictureType.I
            self.forced += 1
        return self._stream.encode(frame)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def fixed_libav_encoder_class(base: Any) -> Any:
    """A subclass of picamera2's ``LibavH264Encoder`` whose keyframe requests work on PyAV 14+."""

    class FixedLibavH264Encoder(base):  # type: ignore[misc,valid-type]
        def _start(self) -> None:
            super()._start()
            self._stream: Any = KeyframeStream(self._stream)

        def force_key_frame(self) -> None:
            stream = getattr(self, "_stream", None)
            if isinstance(stream, KeyframeStream):
                stream.pending = True

    return FixedLibavH264Encoder


def output_class(base: Any) -> Any:
    """An ``Output`` subclass that hands each encoded frame to the asyncio loop."""

    class LoopOutput(base):  # type: ignore[misc,valid-type]
        def __init__(self, source: PicameraSource, loop: asyncio.AbstractEventLoop,
                     deliver: Deliver) -> None:
            super().__init__()
            self._source = source
            self._loop = loop
            self._deliver = deliver

        def outputframe(self, frame: Any, keyframe: bool = True, timestamp: int | None = None,
                        packet: Any = None, audio: bool = False) -> None:
            if audio:
                return
            au = self._source.make_access_unit(frame, keyframe, timestamp)
            # RuntimeError: the loop is closing while the camera is being stopped.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._deliver, au)

    return LoopOutput


class Timeline:
    """An encoder's timestamps (µs, from 0 again at every start) as pts that carry on across
    restarts; one per encoder (the main one and the sub-stream's)."""

    def __init__(self) -> None:
        self._last_pts = -1
        self._last_monotonic = 0.0
        # The encoder's timestamp of the first frame since the camera (re)started, and the pts
        # it maps to: picamera2 counts from 0 again on every start.
        self._origin: int | None = None
        self._base = 0

    def restart(self) -> None:
        """The encoder starts again (its timestamps from 0)."""
        self._origin = None

    def access_unit(self, frame: Any, keyframe: bool, timestamp_us: int | None) -> AccessUnit:
        """Turn one encoder buffer into an AccessUnit (runs on the encoder thread)."""
        # picamera2 hands over immutable bytes (V4L2: read from its mmap; libav:
        # bytes(packet)): keep that object. Anything else (a view the encoder may reuse) is
        # copied once.
        data = frame if isinstance(frame, bytes) else bytes(frame)
        now_us = time.time_ns() // 1000
        if timestamp_us is None:
            timestamp_us = time.monotonic_ns() // 1000
        now = time.monotonic()
        if self._origin is None:
            self._origin = timestamp_us
            # After a restart, carry on from the last pts plus the time the camera was away.
            self._base = 0 if self._last_pts < 0 else self._last_pts + max(
                1, int((now - self._last_monotonic) * VIDEO_CLOCK_RATE))
        pts = self._base + (timestamp_us - self._origin) * VIDEO_CLOCK_RATE // 1_000_000
        pts = max(pts, self._last_pts + 1)
        self._last_pts = pts
        self._last_monotonic = now
        return AccessUnit(data, pts, bool(keyframe), now_us)


def sub_output_class(base: Any) -> Any:
    """An ``Output`` subclass for the lores encoder: each frame to the sub-stream's tap."""

    class TapOutput(base):  # type: ignore[misc,valid-type]
        def __init__(self, timeline: Timeline, tap: SubstreamTap) -> None:
            super().__init__()
            self._timeline = timeline
            self._tap = tap

        def outputframe(self, frame: Any, keyframe: bool = True, timestamp: int | None = None,
                        packet: Any = None, audio: bool = False) -> None:
            if not audio:
                self._tap.offer(self._timeline.access_unit(frame, keyframe, timestamp))

    return TapOutput


# The ISP's second, small stream for motion detection (picamera2's capture_motion.py size):
# its Y plane is analysed directly, nothing is decoded.
LORES_SIZE = (320, 240)

# Called on the camera thread with a function that copies the lores Y plane (valid only during
# the call) and the wall-clock time in seconds.
LoresSink = Callable[[Callable[[], Any], float], None]


class PicameraSource:
    """Camera via picamera2, hardware-encoded (or libx264 on a Pi 5).

    With ``camera.motion`` the camera is configured with a ``lores`` stream too and every
    completed request's lores Y plane is offered to :attr:`lores_sink` (the motion detector),
    from picamera2's ``post_callback`` on the camera thread."""

    kind = "picamera"
    # Live camera controls (capture/controls.py): True goes through set_controls at the next
    # frame; False needs the camera reconfigured (transform, encoder, size), i.e. a restart.
    controls = {"exposure_us": True, "analogue_gain": True, "awb": True, "brightness": True,
                "contrast": True, "saturation": True, "sharpness": True, "framerate": True,
                "hflip": False, "vflip": False, "bitrate": False, "resolution": False}

    def __init__(self, camera: CameraConfig, *, api: Picamera2Api | None = None,
                 libav: bool | None = None) -> None:
        self._camera = camera
        self._configured = camera
        # Brightness, Contrast, Saturation, Sharpness when set away from libcamera's defaults.
        self._tone: dict[str, float] = {}
        self._deliver: Deliver | None = None
        self._api = api
        self._libav = libav  # None: ask picamera2 (uses_libav)
        self._picam2: Any = None
        self._encoder: Any = None
        self._can_force = False
        self._logged_no_force = False
        self.libav: bool | None = None
        self._timeline = Timeline()
        self.frames = 0
        self.keyframe_requests = 0
        self.keyframe_requests_unsupported = 0
        self.lores_sink: LoresSink | None = None
        self.lores_errors = 0
        self._lores_offset: float | None = None
        # The sub-stream (capture/substream.py): a second H.264 encoder on the lores stream,
        # which is then the sub-stream's size (motion reads that plane too).
        self.substream: SubstreamTap | None = None
        self._sub_timeline = Timeline()
        self._sub_encoder: Any = None

    def attach_substream(self, tap: SubstreamTap) -> None:
        """Encode the lores stream as the sub-stream into ``tap`` (from the next start)."""
        self.substream = tap
        tap.main_kind = self.kind
        tap.keyframe_hook = self._request_sub_keyframe

    def _request_sub_keyframe(self) -> None:
        encoder = self._sub_encoder
        force = getattr(encoder, "force_key_frame", None)
        if callable(force):
            force()

    @property
    def offers_lores(self) -> bool:
        """Whether the camera runs a lores stream for the motion detector."""
        return self._camera.motion

    @property
    def lores_size(self) -> tuple[int, int]:
        """:data:`LORES_SIZE`, or the main size where that is smaller (libcamera wants the
        lores stream no larger than the main one); the sub-stream's size while its encoder
        runs on the lores stream."""
        cam = self._camera
        if self._sub_encoder is not None and self.substream is not None:
            sub = self.substream.camera
            return min(sub.width, cam.width), min(sub.height, cam.height)
        return min(LORES_SIZE[0], cam.width), min(LORES_SIZE[1], cam.height)

    def _lores_time(self, request: Any) -> float:
        """The frame's wall-clock time in seconds: its sensor timestamp (CLOCK_BOOTTIME ns,
        exact frame spacing) put on the wall clock by the offset seen at the first frame."""
        sensor_ns = request.get_metadata().get("SensorTimestamp")
        if not isinstance(sensor_ns, int):
            return time.time()
        if self._lores_offset is None:
            self._lores_offset = time.time() - sensor_ns / 1e9
        return sensor_ns / 1e9 + self._lores_offset

    def _on_request(self, request: Any) -> None:
        """picamera2's ``post_callback``: hand the lores Y plane to the sink (copied there,
        only if it wants this frame)."""
        sink = self.lores_sink
        if sink is None:
            return
        width, height = self.lores_size
        try:
            sink(lambda: request.make_array("lores")[:height, :width], self._lores_time(request))
        except Exception:  # the picture must go on whatever the detector does
            self.lores_errors += 1
            if self.lores_errors == 1:
                log.exception("picamera: the lores plane could not be taken")

    def make_access_unit(self, frame: Any, keyframe: bool, timestamp_us: int | None) -> AccessUnit:
        """Turn one encoder buffer into an AccessUnit (runs on the encoder thread)."""
        self.frames += 1
        return self._timeline.access_unit(frame, keyframe, timestamp_us)

    def _make_encoder(self, api: Picamera2Api, camera: CameraConfig | None = None) -> Any:
        cam = camera or self._camera
        libav = uses_libav(api) if self._libav is None else self._libav
        self.libav = libav
        if libav and api.LibavH264Encoder is not None:
            cls = fixed_libav_encoder_class(api.LibavH264Encoder)
            return cls(bitrate=cam.bitrate, repeat=True, iperiod=cam.keyframe_interval,
                       framerate=cam.framerate, profile=cam.profile)
        try:
            return api.H264Encoder(bitrate=cam.bitrate, repeat=True,
                                   iperiod=cam.keyframe_interval, framerate=cam.framerate,
                                   profile=cam.profile)
        except TypeError:  # picamera2 before 0.3.17 knows only these three
            return api.H264Encoder(cam.bitrate, repeat=True, iperiod=cam.keyframe_interval)

    def _controls(self, api: Picamera2Api) -> dict[str, Any]:
        cam = self._camera
        controls: dict[str, Any] = {"FrameRate": float(cam.framerate)}
        if cam.exposure_us:
            controls["ExposureTime"] = cam.exposure_us
        if cam.gain:
            controls["AnalogueGain"] = cam.gain
        # No AeEnable: False would fix exposure *and* gain; picamera2 makes only the control
        # given manual, so exposure_us alone keeps the gain automatic and vice versa (as
        # rpicam-vid's --shutter / --gain do).
        if cam.awb and cam.awb != "auto":
            enum = getattr(getattr(api.controls, "AwbModeEnum", None), cam.awb.capitalize(), None)
            if enum is None:
                log.warning("camera.awb = %r is not known to libcamera; keeping auto", cam.awb)
            else:
                controls["AwbMode"] = enum
        controls.update(self._tone)
        return controls

    async def apply_controls(self, values: Mapping[str, Any]) -> bool:
        """Exposure, gain, white balance, tone and frame rate through ``set_controls`` (live);
        flips, bitrate and size reconfigure the camera (a restart: True)."""
        camera = camera_with(self._configured, values)
        tone = {libcamera: float(values[name]) for name, (libcamera, neutral) in TONE.items()
                if name in values and float(values[name]) != neutral}
        reconfigure = (camera.hflip, camera.vflip, camera.bitrate, camera.width,
                       camera.height) != (self._camera.hflip, self._camera.vflip,
                                          self._camera.bitrate, self._camera.width,
                                          self._camera.height)
        previous_camera, previous_tone = self._camera, self._tone
        self._camera, self._tone = camera, tone
        picam2, deliver = self._picam2, self._deliver
        if picam2 is None or deliver is None:
            return False  # before start(): _open() configures it all
        if reconfigure:
            failure = await self._restart_proven(deliver)
            if failure is None:
                return True
            self._camera, self._tone = previous_camera, previous_tone
            log.warning("the camera did not run with the new controls (%s); reopening it with "
                        "the previous ones", failure)
            again = await self._restart_proven(deliver)
            raise ControlRejected(
                f"the camera did not run with them: {failure}; "
                + ("the previous values are back" if again is None else
                   f"and the previous values did not run either ({again})"))
        api = self._api if self._api is not None else load_picamera2()
        live = self._controls(api)
        # Back to automatic: picamera2 makes a control manual when it is given, so an automatic
        # one is handed back to the AGC through its mode control (libcamera >= 0.5:
        # ExposureTimeMode / AnalogueGainMode, 0 = Auto) or, on older libcamera, AeEnable.
        # Not checked on a camera here (the stand-in records what is sent).
        advertised = getattr(picam2, "camera_controls", None) or {}
        for value, mode in ((camera.exposure_us, "ExposureTimeMode"),
                            (camera.gain, "AnalogueGainMode")):
            if not value:
                if mode in advertised:
                    live[mode] = 0
                elif not camera.exposure_us and not camera.gain:
                    live["AeEnable"] = True
        # A tone control set back to neutral must be sent as its neutral value.
        for libcamera, neutral in TONE.values():
            if libcamera in previous_tone and libcamera not in tone:
                live[libcamera] = neutral
        if camera.awb == "auto":
            enum = getattr(getattr(api.controls, "AwbModeEnum", None), "Auto", None)
            if enum is not None:
                live["AwbMode"] = enum
        await asyncio.to_thread(picam2.set_controls, live)
        return False

    async def _restart_proven(self, deliver: Deliver) -> str | None:
        """Reopen the camera with the current settings: None once a frame came, else why not."""
        with contextlib.suppress(Exception):
            await self.stop()
        before = self.frames
        try:
            await self.start(deliver)
        except Exception as exc:  # libcamera refusing the configuration, the encoder failing
            with contextlib.suppress(Exception):
                await self.stop()
            return str(exc) or type(exc).__name__
        return await frames_arrived(lambda: self.frames, before, RESTART_PROOF_S)

    def _open(self, loop: asyncio.AbstractEventLoop, deliver: Deliver) -> None:
        api = self._api if self._api is not None else load_picamera2()
        cam = self._camera
        picam2 = api.Picamera2(cam.sensor_index)  # picamera:N: the Nth CSI camera
        try:
            self._configure_and_record(api, picam2, loop, deliver)
        except BaseException:
            with contextlib.suppress(Exception):
                picam2.close()  # else the camera stays held and the next open fails "busy"
            raise

    def _configure(self, api: Picamera2Api, picam2: Any,
                   lores: tuple[int, int] | None) -> None:
        cam = self._camera
        kwargs: dict[str, Any] = {
            "main": {"size": (cam.width, cam.height), "format": "YUV420"},
            "controls": self._controls(api),
        }
        if api.Transform is not None:
            kwargs["transform"] = api.Transform(hflip=int(cam.hflip), vflip=int(cam.vflip))
        if lores is not None:
            # YUV420: the only lores format VC4 (Pi 4) has, and what both encoders take.
            kwargs["lores"] = {"size": lores, "format": "YUV420"}
        picam2.configure(picam2.create_video_configuration(**kwargs))

    def _start_substream(self, api: Picamera2Api, picam2: Any, tap: SubstreamTap) -> bool:
        """Configure the lores stream at the sub-stream's size and start its H.264 encoder on it
        (picamera2's ``start_encoder(..., name="lores")``, as in its capture_video_multiple.py);
        False, with the reason kept in the tap, where the camera or encoder refuses (the main
        stream then runs without it)."""
        cam, sub = self._camera, tap.camera
        encoder = None
        try:
            self._configure(api, picam2, (min(sub.width, cam.width), min(sub.height, cam.height)))
            encoder = self._make_encoder(api, sub)
            self._sub_timeline.restart()
            output = sub_output_class(api.Output)(self._sub_timeline, tap)
            picam2.start_encoder(encoder, output, name="lores")
        except Exception as exc:  # libcamera refusing the lores size, the encoder failing
            log.warning("picamera: the sub-stream (%dx%d on the lores stream) could not start: "
                        "%s; the main stream runs without it", sub.width, sub.height, exc)
            tap.fail(f"picamera2 could not encode the lores stream: {exc}")
            if encoder is not None:
                with contextlib.suppress(Exception):
                    picam2.stop_encoder(encoder)
            return False
        self._sub_encoder = encoder
        tap.keyframes_on_demand = callable(getattr(encoder, "force_key_frame", None))
        tap.clear()
        return True

    def _configure_and_record(self, api: Picamera2Api, picam2: Any,
                              loop: asyncio.AbstractEventLoop, deliver: Deliver) -> None:
        self._sub_encoder = None
        tap = self.substream
        if tap is None or not self._start_substream(api, picam2, tap):
            self._configure(api, picam2, self.lores_size if self.offers_lores else None)
        if self.offers_lores:
            picam2.post_callback = self._on_request
        encoder = self._make_encoder(api)
        self._can_force = callable(getattr(encoder, "force_key_frame", None))
        if not self._can_force:
            self._log_no_force()
        output = output_class(api.Output)(self, loop, deliver)
        picam2.start_recording(encoder, output)
        self._picam2, self._encoder = picam2, encoder

    def _close(self) -> None:
        picam2, self._picam2 = self._picam2, None
        self._encoder = self._sub_encoder = None
        if picam2 is not None:
            try:
                picam2.stop_recording()
            finally:
                picam2.close()

    async def start(self, deliver: Deliver) -> None:
        """Open the camera and start recording (off the loop: libcamera calls block)."""
        if self._picam2 is not None:
            return
        self._deliver = deliver
        self._timeline.restart()  # the new encoder's timestamps start at 0
        self._lores_offset = None  # put the sensor clock on the wall clock again
        await asyncio.to_thread(self._open, asyncio.get_running_loop(), deliver)

    async def stop(self) -> None:
        """Stop recording and release the camera."""
        await asyncio.to_thread(self._close)

    @property
    def keyframes_on_demand(self) -> bool:
        """True unless this picamera2 has no ``force_key_frame`` (before 0.3.32): then keyframe
        requests are answered from the ring, as for rpicam-vid."""
        return self._encoder is None or self._can_force

    def _log_no_force(self) -> None:
        if self._logged_no_force:
            return
        self._logged_no_force = True
        log.warning("this picamera2 has no force_key_frame (added in 0.3.32): keyframe requests "
                    "wait for the next periodic IDR (every %d frames); upgrade python3-picamera2",
                    self._camera.keyframe_interval)

    def request_keyframe(self) -> None:
        """Ask the encoder for an IDR (V4L2 FORCE_KEY_FRAME, or the libav fix).

        Without ``force_key_frame`` (picamera2 before 0.3.32) nothing can be forced: the
        periodic IDR (``camera.keyframe_interval``) serves the request; logged once.
        """
        self.keyframe_requests += 1
        encoder = self._encoder
        if encoder is None:
            return
        if not self._can_force:
            self.keyframe_requests_unsupported += 1
            self._log_no_force()
            return
        encoder.force_key_frame()

    def stats(self) -> dict[str, Any]:
        """Frame and request counters."""
        return {"frames": self.frames, "keyframe_requests": self.keyframe_requests,
                "keyframe_requests_unsupported": self.keyframe_requests_unsupported,
                "libav": self.libav}
