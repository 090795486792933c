"""What the detector is fed: small luma planes, from either path.

- :class:`DecodeAnalyser`: the H.264 a camera's ring already holds, decoded with PyAV (one
  thread, the loop filter skipped: the detector needs no deblocked picture), every frame
  decoded (P-frames need their references) but only :attr:`MotionSettings.analysis_fps`
  of them scaled down (swscale's area filter, straight to the small grey plane) and analysed.
- :class:`LoresAnalyser`: a Y plane the ISP made already (picamera2's lores stream), no decode.

Both are synchronous and know nothing of threads or the event loop (:mod:`.monitor` runs them
in a worker thread); tests feed them directly.

PyAV (about 21 MiB of RSS) is imported by the decode path when it starts, and by the lores path
only for an event's snapshot: a Pi camera detecting motion on its lores stream does not load it
at start (picamera2 itself imports PyAV only for its software encoders).
"""

from __future__ import annotations

import fractions
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .detector import PLANE_WIDTH, Analysis, MotionDetector, MotionSettings
from .tracker import MotionTracker, Transition

if TYPE_CHECKING:
    import av

# mjpeg quantiser range for event snapshots (as web/snapshot.py's).
JPEG_QMIN, JPEG_QMAX = 3, 5


def frame_to_jpeg(frame: av.VideoFrame) -> bytes:
    """One decoded picture as JPEG."""
    import av

    encoder = av.CodecContext.create("mjpeg", "w")
    encoder.width, encoder.height = frame.width, frame.height
    encoder.pix_fmt = "yuvj420p"
    encoder.time_base = fractions.Fraction(1, 1)
    encoder.qmin, encoder.qmax = JPEG_QMIN, JPEG_QMAX
    packets = list(encoder.encode(frame.reformat(format="yuvj420p")))
    packets += list(encoder.encode(None))
    return b"".join(bytes(p) for p in packets)


def luma_to_jpeg(luma: Any) -> bytes:
    """A grey picture (``uint8`` Y plane, even sizes) as JPEG (the lores path's snapshot)."""
    import av

    frame = av.VideoFrame.from_ndarray(luma, format="gray")
    return frame_to_jpeg(frame)


# Called with each transition and a function making the JPEG of the event's peak frame.
OnTransition = Callable[[Transition, Callable[[], bytes] | None], None]


class _Analyser:
    """Rate limit, detector and tracker, shared by both paths."""

    def __init__(self, settings: MotionSettings, on_transition: OnTransition | None = None
                 ) -> None:
        self.detector = MotionDetector(settings)
        self.tracker = MotionTracker(settings)
        self.on_transition = on_transition
        self.analysed = 0
        self.last: Analysis | None = None
        self.transitions: list[Transition] = []  # every one, for tests and the bench
        self._next_t: float | None = None
        self._peak_picture: Callable[[], bytes] | None = None
        self._peak_snapshot: bytes | None = None

    @property
    def settings(self) -> MotionSettings:
        """The settings in force (the detector's)."""
        return self.detector.settings

    def due(self, t: float) -> bool:
        """Whether the frame at ``t`` (seconds) is one to analyse (the rate limit)."""
        interval = 1.0 / self.settings.analysis_fps if self.settings.analysis_fps > 0 else 0.0
        # A quarter interval of slack: frames of a 30 fps camera land on a 10 fps grid.
        if self._next_t is not None and t < self._next_t - interval / 4:
            return False
        self._next_t = t + interval
        return True

    def _analysed(self, plane: Any, t: float, picture: Callable[[], bytes]) -> Analysis:
        analysis = self.detector.analyse(plane, t)
        self.analysed += 1
        self.last = analysis
        for transition in self.tracker.update(t, analysis):
            if transition.kind in ("started", "peak"):
                self._peak_picture = picture
                self._peak_snapshot = None
            self._emit(transition)
        return analysis

    def _emit(self, transition: Transition) -> None:
        self.transitions.append(transition)
        if self.on_transition is not None:
            self.on_transition(transition, self._snapshot if self._peak_picture else None)
        if transition.kind == "ended":
            self._peak_picture = self._peak_snapshot = None

    def _snapshot(self) -> bytes:
        if self._peak_snapshot is None and self._peak_picture is not None:
            self._peak_snapshot = self._peak_picture()
        return self._peak_snapshot or b""

    def finish(self) -> None:
        """End an event that lasts (the feed stops)."""
        if self.tracker.event is not None:
            self._emit(self.tracker.finish())


class DecodeAnalyser(_Analyser):
    """The decode path: feed it the ring's access units in order (:meth:`feed`)."""

    def __init__(self, settings: MotionSettings, on_transition: OnTransition | None = None
                 ) -> None:
        super().__init__(settings, on_transition)
        self.decoded = 0
        self.decode_errors = 0
        self._decoder: Any = None
        self._plane_size: tuple[int, int, int] | None = None  # source width, small w, h
        self.picture: tuple[int, int] | None = None  # the decoded pictures' size
        # One scaler for every picture: VideoFrame.reformat makes a new one per frame, and with
        # it a new swscale context (its filter set up anew: 0.1-0.8 ms of the ~0.2-1 ms that
        # scaling a 720p picture took here, at analysis_fps per camera).
        self._scaler: Any = None  # made with the first decoder (PyAV loads then)
        self._av: Any = None  # the PyAV module, once the first decoder is opened

    def _open(self) -> Any:
        import av
        from av.video.reformatter import VideoReformatter

        if self._scaler is None:
            self._scaler = VideoReformatter()
            self._av = av
        decoder = av.CodecContext.create("h264", "r")
        decoder.thread_count = 1
        decoder.options = {"skip_loop_filter": "all"}
        return decoder

    def restart(self) -> None:
        """Drop the decoder state (frames were skipped: wait for the next keyframe)."""
        self._decoder = None

    def feed(self, data: bytes, keyframe: bool, capture_time_us: int) -> Analysis | None:
        """Decode one access unit; analyse its picture if due. None when not analysed."""
        if self._decoder is None:
            if not keyframe:
                return None
            self._decoder = self._open()
        av = self._av
        try:
            frames = self._decoder.decode(av.Packet(data))
        except av.FFmpegError:
            self.decode_errors += 1
            self._decoder = None
            return None
        result = None
        t = capture_time_us / 1e6
        for frame in frames:
            self.decoded += 1
            if not self.due(t):
                continue
            if self._plane_size is None or self._plane_size[0] != frame.width:
                self.picture = (frame.width, frame.height)
                w = min(PLANE_WIDTH, frame.width)
                self._plane_size = (frame.width, w, max(1, round(frame.height * w / frame.width)))
            _, w, h = self._plane_size
            small = self._scaler.reformat(frame, width=w, height=h, format="gray",
                                          interpolation="AREA")
            result = self._analysed(small.to_ndarray(), t, _jpeg_of(frame))
        return result


def _jpeg_of(frame: av.VideoFrame) -> Callable[[], bytes]:
    return lambda: frame_to_jpeg(frame)


class LoresAnalyser(_Analyser):
    """The lores path: feed it the ISP's small Y plane (:meth:`feed`)."""

    def feed(self, luma: Any, t: float) -> Analysis | None:
        """Analyse ``luma`` (``uint8`` Y plane, stride already cut) taken at ``t`` if due."""
        if not self.due(t):
            return None
        return self.analyse(luma.copy(), t)  # the camera reuses its buffers

    def analyse(self, luma: Any, t: float) -> Analysis:
        """Analyse a plane that is due and ours to keep (:meth:`due` asked already)."""
        return self._analysed(luma, t, lambda: luma_to_jpeg(luma))
