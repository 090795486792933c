"""Stand-in for picamera2 + libcamera (no camera here), modelled on upstream's behaviour.

Modelled on picamera2 at 3e6dff0 and tags v0.3.31/v0.3.32 (``picamera2/encoders/*.py``,
``outputs/output.py``, ``platform.py``, ``request.py``, ``picamera2.py``):
- ``H264Encoder`` is the V4L2 encoder on VC4 and *is* ``LibavH264Encoder`` on PiSP (BCM2712);
- encoders hand ``Output.outputframe`` immutable ``bytes`` and timestamps in µs from 0 (the
  first frame's sensor timestamp is subtracted);
- the V4L2 encoder drops buffers that hold only SPS/PPS (``_check_for_picture``): at low bitrate
  a forced IDR can come out as exactly such a buffer, and is then lost;
- ``force_key_frame`` exists from v0.3.32 only; the libav encoder's sets ``frame.pict_type =
  "I"``, which PyAV 14+ rejects (TypeError on the encoder thread);
- libcamera: ``AeEnable=False`` fixes exposure *and* gain; ``ExposureTime`` / ``AnalogueGain``
  alone make only that one manual (picamera2 sets ``ExposureTimeMode``/``AnalogueGainMode``).
The hardware encoder is stood in for by libx264 (PyAV): real H.264, an IDR with SPS/PPS in front
every ``iperiod`` frames and on request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from enum import Enum
from fractions import Fraction
from typing import Any

import av
import numpy as np
from av.video.frame import PictureType

from ruseon_appliance.capture.h264 import NAL_PPS, NAL_SPS, START_CODE_4, nal_spans
from ruseon_appliance.capture.sources.picamera import Picamera2Api

# Controls this camera advertises (libcamera rejects others: "Control X is not advertised").
ADVERTISED_CONTROLS = {"FrameRate", "ExposureTime", "AnalogueGain", "AeEnable", "AwbMode",
                       "AwbEnable", "Brightness", "Contrast", "Saturation", "Sharpness"}


class Platform(Enum):
    """``picamera2.platform.Platform``."""

    VC4 = 0
    PISP = 1


class PlatformModule:
    """``picamera2.platform`` for one board."""

    Platform = Platform

    def __init__(self, platform: Platform) -> None:
        self._platform = platform

    def get_platform(self) -> Platform:
        return self._platform


class Output:
    """``picamera2.outputs.Output``."""

    def __init__(self, pts: Any = None) -> None:
        self.recording = False
        self.ptsoutput = pts
        self.needs_pacing = False

    def start(self) -> None:
        self.recording = True

    def stop(self) -> None:
        self.recording = False

    def outputframe(self, frame: Any, keyframe: bool = True, timestamp: int | None = None,
                    packet: Any = None, audio: bool = False) -> None:
        pass


class Encoder:
    """``picamera2.encoders.Encoder``: outputs, start/stop, µs timestamps from 0."""

    def __init__(self) -> None:
        self._output: list[Any] = []
        self._running = False
        self._lock = threading.Lock()
        self.firsttimestamp: int | None = None
        self.width = self.height = 0
        self.outputs_seen: list[tuple[bytes, bool, int]] = []  # what reached the outputs

    @property
    def output(self) -> list[Any]:
        return self._output

    @output.setter
    def output(self, value: Any) -> None:
        self._output = list(value) if isinstance(value, list) else [value]

    def start(self) -> None:
        with self._lock:
            self.firsttimestamp = None
            self._running = True
            for out in self._output:
                out.start()
            self._start()

    def stop(self) -> None:
        with self._lock:
            self._running = False
            for out in self._output:
                out.stop()

    def _start(self) -> None:
        pass

    def _timestamp(self, sensor_ns: int) -> int:
        ts = sensor_ns // 1000
        if self.firsttimestamp is None:
            self.firsttimestamp = ts
            return 0
        return ts - self.firsttimestamp

    def encode(self, frame: av.VideoFrame, sensor_ns: int) -> None:
        with self._lock:
            if self._running:
                self._encode(frame, sensor_ns)

    def _encode(self, frame: av.VideoFrame, sensor_ns: int) -> None:
        raise NotImplementedError

    def outputframe(self, frame: Any, keyframe: bool = True, timestamp: int | None = None,
                    packet: Any = None, audio: bool = False) -> None:
        self.outputs_seen.append((frame, keyframe, timestamp or 0))
        for out in self._output:
            out.outputframe(frame, keyframe, timestamp, packet, audio)


def _x264(width: int, height: int, framerate: float, gop: int) -> av.VideoCodecContext:
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.time_base = Fraction(1, 1_000_000)
    ctx.framerate = Fraction(int(framerate), 1)
    ctx.gop_size = gop
    ctx.thread_count = 1
    ctx.options = {"preset": "ultrafast", "tune": "zerolatency", "profile": "baseline"}
    return ctx


def check_for_picture(buf: bytes) -> bool:
    """Upstream's ``V4L2Encoder._check_for_picture``: does the buffer hold a slice?"""
    if len(buf) > 64:
        return True
    pos = 0
    while (pos := buf.find(b"\x00\x00\x00\x01", pos)) != -1:
        pos += 4
        if pos < len(buf) and buf[pos] & 15 in {5, 1}:
            return True
    return False


class V4L2H264Encoder(Encoder):
    """``H264Encoder`` on VC4 as of v0.3.31: no ``force_key_frame``.

    ``lose_forced_idrs``: how many forced IDRs come out as SPS/PPS-only buffers (a low-bitrate
    encoder skipping the picture), which ``_check_for_picture`` then drops.
    """

    def __init__(self, bitrate: int | None = None, repeat: bool = True,
                 iperiod: int | None = None, framerate: float | None = None,
                 enable_sps_framerate: bool = False, qp: int | None = None,
                 profile: str | None = None) -> None:
        super().__init__()
        self.args = {"bitrate": bitrate, "repeat": repeat, "iperiod": iperiod,
                     "framerate": framerate, "profile": profile}
        self.iperiod = iperiod
        self.framerate = framerate or 30
        self._key_frames_requested = 0
        self._key_frames_generated = 0
        self.lose_forced_idrs = 0
        self.dropped_header_buffers = 0
        self._ctx: av.VideoCodecContext | None = None
        self._headers = b""

    def _start(self) -> None:
        self._ctx = _x264(self.width, self.height, self.framerate, self.iperiod or 60)

    def _encode(self, frame: av.VideoFrame, sensor_ns: int) -> None:
        assert self._ctx is not None
        timestamp_us = self._timestamp(sensor_ns)
        frame.pts = timestamp_us
        if self._key_frames_requested > self._key_frames_generated:
            self._key_frames_generated += 1
            if self.lose_forced_idrs > 0 and self._headers:
                self.lose_forced_idrs -= 1
                if not check_for_picture(self._headers):  # what upstream does with it
                    self.dropped_header_buffers += 1
            else:
                frame.pict_type = PictureType.I  # V4L2_CID_MPEG_VIDEO_FORCE_KEY_FRAME
        for packet in self._ctx.encode(frame):
            data = bytes(packet)  # upstream: mmap.read() -> immutable bytes
            if packet.is_keyframe and not self._headers:
                self._headers = b"".join(START_CODE_4 + data[start:end]
                                         for start, end in nal_spans(data)
                                         if data[start] & 31 in (NAL_SPS, NAL_PPS))
            if check_for_picture(data):
                self.outputframe(data, packet.is_keyframe, timestamp_us)


class V4L2H264Encoder032(V4L2H264Encoder):
    """``H264Encoder`` on VC4 from v0.3.32: ``force_key_frame``."""

    def force_key_frame(self) -> None:
        self._key_frames_requested += 1


class LibavH264Encoder(Encoder):
    """``LibavH264Encoder`` as of v0.3.31 (libx264 through PyAV; no ``force_key_frame``)."""

    def __init__(self, bitrate: int | None = None, repeat: bool = True, iperiod: int = 30,
                 framerate: float = 30, qp: int | None = None,
                 profile: str | None = None) -> None:
        super().__init__()
        self.args = {"bitrate": bitrate, "repeat": repeat, "iperiod": iperiod,
                     "framerate": framerate, "profile": profile}
        self.iperiod = iperiod
        self.framerate = framerate
        self._key_frames_requested = 0
        self._key_frames_generated = 0
        self._container: Any = None
        self._stream: Any = None
        self.errors: list[BaseException] = []

    def _start(self) -> None:
        self._container = av.open("/dev/null", "w", format="null")
        self._stream = self._container.add_stream("libx264", rate=int(self.framerate))
        self._stream.width, self._stream.height = self.width, self.height
        self._stream.pix_fmt = "yuv420p"
        self._stream.codec_context.gop_size = self.iperiod or (1 << 31) - 1
        self._stream.codec_context.time_base = Fraction(1, 1_000_000)
        self._stream.codec_context.options = {"preset": "ultrafast", "tune": "zerolatency"}

    def _encode(self, frame: av.VideoFrame, sensor_ns: int) -> None:
        timestamp_us = self._timestamp(sensor_ns)
        frame.pts = timestamp_us
        try:
            if self._key_frames_requested > self._key_frames_generated:
                self._key_frames_generated += 1
                frame.pict_type = "I"  # upstream's line: TypeError on PyAV >= 14
            for packet in self._stream.encode(frame):
                self.outputframe(bytes(packet), packet.is_keyframe, timestamp=packet.pts,
                                 packet=packet)
        except Exception as exc:  # upstream's encoder thread dies here; record and stop
            self.errors.append(exc)
            self._running = False


class LibavH264Encoder032(LibavH264Encoder):
    """``LibavH264Encoder`` from v0.3.32: ``force_key_frame`` (broken on PyAV >= 14)."""

    def force_key_frame(self) -> None:
        self._key_frames_requested += 1


class Transform:
    """``libcamera.Transform``."""

    def __init__(self, hflip: int = 0, vflip: int = 0) -> None:
        self.hflip, self.vflip = hflip, vflip


class Controls:
    """``libcamera.controls`` (the enum this project uses)."""

    class AwbModeEnum:
        Auto = 0
        Incandescent = 1
        Tungsten = 2
        Fluorescent = 3
        Indoor = 4
        Daylight = 5
        Cloudy = 6
        Custom = 7


class CompletedRequest:
    """``picamera2.request.CompletedRequest`` as a ``post_callback`` sees it: ``make_array``
    of the lores stream is the ISP's scaled-down YUV420 (nearest pixels here), as a
    ``(height * 3 // 2, width)`` array."""

    def __init__(self, luma: Any, lores_size: tuple[int, int], sensor_ns: int) -> None:
        self._luma = luma
        self._size = lores_size
        self._sensor_ns = sensor_ns

    def get_metadata(self) -> dict[str, Any]:
        return {"SensorTimestamp": self._sensor_ns}

    def make_array(self, name: str) -> Any:
        if name != "lores":
            raise KeyError(name)
        width, height = self._size
        rows = np.arange(height) * self._luma.shape[0] // height
        cols = np.arange(width) * self._luma.shape[1] // width
        y = self._luma[rows][:, cols]
        return np.concatenate([y, np.full((height // 2, width), 128, dtype=np.uint8)])


class Picamera2:
    """``picamera2.Picamera2`` with a camera that produces a moving picture at ``FrameRate``."""

    instances: list[Picamera2] = []
    # Sizes the sensor has no mode for: configure() refuses them, as libcamera does.
    refused_sizes: set[tuple[int, int]] = set()
    # While True no camera is connected (a loose ribbon cable): none is listed, and opening one
    # fails as picamera2 does with no camera (an IndexError from its camera list).
    unplugged = False
    # While set, opening a camera blocks until it is cleared (a driver call that hangs).
    hang_open: threading.Event | None = None
    # What the sensor sees: frame number -> the main stream's Y plane (uint8, height x width);
    # None: a gradient scrolling sideways.
    scene: Callable[[int], Any] | None = None
    # While True a second encoder cannot be opened (another process holds the V4L2 encoder
    # device): start_encoder(name="lores") fails as opening /dev/video11 would.
    lores_encoder_busy = False

    def __init__(self, camera_num: int = 0) -> None:
        hang = Picamera2.hang_open
        if hang is not None:
            hang.wait(60)
        if Picamera2.unplugged:
            raise IndexError("list index out of range")
        self.camera_num = camera_num
        self.config: dict[str, Any] = {}
        self.closed = False
        self.encoder: Any = None
        # Every started encoder by the stream it encodes (picamera2's start_encoder name=).
        self.encoders: dict[str, Any] = {}
        self.set_controls_calls: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Called with each completed request on the camera thread, as picamera2 does.
        self.post_callback: Callable[[Any], None] | None = None
        Picamera2.instances.append(self)

    @staticmethod
    def global_camera_info() -> list[dict[str, Any]]:
        return [] if Picamera2.unplugged else [{"Model": "imx708", "Num": 0}]

    def create_video_configuration(self, main: dict[str, Any] | None = None,
                                   lores: dict[str, Any] | None = None,
                                   controls: dict[str, Any] | None = None,
                                   transform: Any = None) -> dict[str, Any]:
        return {"main": main or {}, "lores": lores, "controls": controls or {},
                "transform": transform}

    def set_controls(self, controls: dict[str, Any]) -> None:
        """Live controls while running (refuses what libcamera would not advertise)."""
        for name in controls:
            if name not in ADVERTISED_CONTROLS:
                raise RuntimeError(f"Control {name} is not advertised by libcamera")
        self.config["controls"] = {**self.config["controls"], **controls}
        self.set_controls_calls.append(dict(controls))

    def configure(self, config: dict[str, Any]) -> None:
        size = tuple(config["main"].get("size", ()))
        if size in Picamera2.refused_sizes:
            raise RuntimeError(f"Failed to configure camera: no sensor mode for {size}")
        lores = config.get("lores")
        if lores is not None:  # upstream's check_camera_config
            lores_w, lores_h = lores["size"]
            if lores_w > size[0] or lores_h > size[1]:
                raise RuntimeError("lores stream dimensions may not exceed main stream")
            if lores.get("format") != "YUV420":
                raise RuntimeError("lores stream must be YUV")
        for name in config["controls"]:
            if name not in ADVERTISED_CONTROLS:
                raise RuntimeError(f"Control {name} is not advertised by libcamera")
        self.config = config

    @property
    def auto_exposure(self) -> bool:
        """Whether libcamera's AGC still chooses the exposure time."""
        controls = self.config["controls"]
        return controls.get("AeEnable", True) is not False and not controls.get("ExposureTime")

    @property
    def auto_gain(self) -> bool:
        """Whether libcamera's AGC still chooses the analogue gain."""
        controls = self.config["controls"]
        return controls.get("AeEnable", True) is not False and not controls.get("AnalogueGain")

    def start_encoder(self, encoder: Encoder, output: Any = None, pts: Any = None,
                      quality: Any = None, name: str | None = None) -> None:
        """Upstream's start_encoder: the encoder takes the named stream's size."""
        name = name or "main"
        stream = self.config.get(name)
        if not stream:
            raise RuntimeError(f"Encode stream {name} was not defined")
        if name == "lores" and Picamera2.lores_encoder_busy:
            raise OSError(16, "Device or resource busy: '/dev/video11'")
        encoder.width, encoder.height = stream["size"]
        if output is not None:
            encoder.output = output
        encoder.start()
        self.encoders[name] = encoder
        if name == "main":
            self.encoder = encoder

    def stop_encoder(self, encoders: Any = None) -> None:
        """Upstream's stop_encoder: the given encoder, or every one."""
        for name, encoder in list(self.encoders.items()):
            if encoders is None or encoder is encoders:
                encoder.stop()
                del self.encoders[name]

    def start(self) -> None:
        fps = float(self.config["controls"].get("FrameRate", 30.0))
        self._thread = threading.Thread(target=self._run, args=(fps,), daemon=True)
        self._thread.start()

    def start_recording(self, encoder: Encoder, output: Any, pts: Any = None,
                        config: Any = None, quality: Any = None, name: Any = None) -> None:
        self.start_encoder(encoder, output, name=name)
        self.start()

    def freeze(self) -> None:
        """The sensor stops sending (a ribbon cable pulled while streaming): no more frames,
        and picamera2 reports nothing."""
        self._stop.set()

    def _run(self, fps: float) -> None:
        encoder = self.encoders["main"]
        width, height = self.config["main"]["size"]
        y = np.tile(np.arange(width, dtype=np.uint8), (height, 1))
        uv = np.full((height // 2, width), 128, dtype=np.uint8)
        sensor_ns = 8_123_456_789_000  # nanoseconds since boot, never 0
        interval = 1 / fps
        n = 0
        scene = Picamera2.scene
        while not self._stop.wait(interval if n else 0):
            luma = scene(n) if scene is not None else np.roll(y, 4 * n, axis=1)
            picture = np.concatenate([luma, uv])
            timestamp = sensor_ns + n * int(1e9 / fps)
            encoder.encode(av.VideoFrame.from_ndarray(picture, format="yuv420p"), timestamp)
            callback, lores = self.post_callback, self.config.get("lores")
            request = CompletedRequest(luma, lores["size"], timestamp) if lores else None
            lores_encoder = self.encoders.get("lores")
            if lores_encoder is not None and request is not None:
                # The ISP's scaled-down YUV420 of the same frame, same sensor timestamp.
                lores_encoder.encode(av.VideoFrame.from_ndarray(
                    request.make_array("lores"), format="yuv420p"), timestamp)
            if callback is not None and request is not None:
                callback(request)
            n += 1

    def stop_recording(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for encoder in self.encoders.values():  # upstream: stop_encoder() stops them all
            encoder.stop()

    def close(self) -> None:
        self.closed = True


def make_api(*, platform: Platform = Platform.VC4, version: tuple[int, int, int] = (0, 3, 32),
             with_platform_module: bool = True) -> Picamera2Api:
    """The names ``load_picamera2`` would return from this picamera2 version on this board."""
    new = version >= (0, 3, 32)
    libav = LibavH264Encoder032 if new else LibavH264Encoder
    v4l2 = V4L2H264Encoder032 if new else V4L2H264Encoder
    # picamera2/encoders/__init__.py: H264Encoder is LibavH264Encoder unless the platform is VC4.
    h264 = v4l2 if platform is Platform.VC4 else libav
    return Picamera2Api(Picamera2, h264, Output, LibavH264Encoder=libav, Transform=Transform,
                        controls=Controls,
                        platform=PlatformModule(platform) if with_platform_module else None)
