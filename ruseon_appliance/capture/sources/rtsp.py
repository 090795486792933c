"""The network camera source: H.264 pulled from an IP camera's RTSP server, passed through.

FFmpeg's RTSP demuxer (through PyAV) depacketizes the camera's RTP into access units; they go to
the ring as they are, never decoded or re-encoded, so the camera's own encoder settings (size,
bitrate, GOP) are what viewers get. The demuxer blocks, so it runs on a worker thread and hands
each access unit to the loop. When the camera drops (power cut, network, a reboot) the source
reconnects with a doubling back-off; pts carry on across reconnects.

Frame times are the camera's own (its RTP timestamps) put on this machine's monotonic clock by
the least-late line (camera_clock.py), not the moment a frame was read: a frame read late under
load keeps its place, and the frame rate HLS, recordings and NVRs see is the camera's.

Parameter sets: many cameras send SPS/PPS only in the SDP (``sprop-parameter-sets``), which
FFmpeg puts in the stream's extradata; they are prepended to every IDR that lacks them, so each
IDR decodes on its own as the ring expects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ...config import CameraConfig
from ...tasks import cancel_and_wait
from ..access_unit import VIDEO_CLOCK_RATE, AccessUnit
from .base import Deliver
from .camera_clock import CameraClock

log = logging.getLogger(__name__)

# Seconds to wait for the camera to answer (connect, DESCRIBE/SETUP/PLAY) and for each packet.
OPEN_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 5.0
# How long stop() waits for the reader thread to let go of the connection (it does at its next
# packet). A thread blocked connecting to a camera that never answers cannot be interrupted
# (FFmpeg gives it up at OPEN_TIMEOUT_S): stop() does not wait for it, and it hands over nothing.
STOP_JOIN_S = 1.0
SPS, PPS, IDR = 7, 8, 5


def nal_types(annexb: bytes) -> list[int]:
    """NAL unit types of an Annex B buffer, in order."""
    types = []
    i = annexb.find(b"\x00\x00\x01")
    while i >= 0 and i + 3 < len(annexb):
        types.append(annexb[i + 3] & 0x1F)
        i = annexb.find(b"\x00\x00\x01", i + 3)
    return types


def avcc_to_annex_b(extradata: bytes) -> bytes:
    """SPS/PPS from an ``avcC`` record (extradata starting with version 1) as Annex B."""
    if not extradata or extradata[0] != 1 or len(extradata) < 7:
        return extradata
    out = bytearray()
    pos = 5
    for count_mask in (0x1F, 0xFF):
        if pos >= len(extradata):
            break
        count = extradata[pos] & count_mask
        pos += 1
        for _ in range(count):
            size = int.from_bytes(extradata[pos:pos + 2], "big")
            out += b"\x00\x00\x00\x01" + extradata[pos + 2:pos + 2 + size]
            pos += 2 + size
    return bytes(out)


def redact(url: str) -> str:
    """The URL without credentials, for logs and status."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        # The last '@' ends the credentials: a password may carry an '@' of its own.
        authority = "***@" + authority.rpartition("@")[2]
    return scheme + sep + authority + slash + path


class RtspSource:
    """Pulls H.264 from ``rtsp://`` (or ``rtsps://``) and delivers it without re-encoding.

    ``backoff_s`` is the first and the largest delay between reconnects.

    Each connection is read on a thread of its own, never the loop's default executor: a
    reader holds its thread for as long as the camera streams, so a few RTSP cameras would
    otherwise take every worker of the executor that snapshots, file reads and the engine's
    certificate share (and ``asyncio.run`` waits for that executor at exit).
    """

    kind = "rtsp"
    # It restarts its own child / reconnects with back-off: the camera's supervisor leaves a
    # stall to it (cameras/camera.py).
    recovers_by_itself = True
    # RTSP has no standard way to ask a camera for an IDR: requests are answered from the ring.
    keyframes_on_demand = False

    def __init__(self, camera: CameraConfig, url: str, *,
                 backoff_s: tuple[float, float] = (0.5, 10.0),
                 transport: str = "tcp",
                 timeout_s: tuple[float, float] = (OPEN_TIMEOUT_S, READ_TIMEOUT_S)) -> None:
        self._camera = camera
        self._timeout = timeout_s
        self._thread: threading.Thread | None = None
        self.url = url
        self._backoff = backoff_s
        self._transport = transport
        self._task: asyncio.Task[None] | None = None
        # Bumped by stop(): a worker thread still blocked in a read from before hands over
        # nothing once it wakes (a stop/start pair must not leave two readers delivering).
        self._generation = 0
        self._t0 = 0.0
        self._last_pts = -1
        # The connection's camera clock (its timestamps restart with each connection).
        self._clock = CameraClock()
        self.clock_resyncs = 0
        self.connects = 0
        self.disconnects = 0
        self.frames = 0
        self.bytes = 0
        self.connected = False
        self.last_error = ""
        self.parameter_sets_added = 0
        # Who takes the stream's audio track (audio/sources/track.py TrackSource: its
        # ``take(packet, stream, arrival_us)`` and ``missing(reason)``), None: not read.
        self.audio_sink: Any = None
        self.audio_packets = 0

    async def start(self, deliver: Deliver) -> None:
        """Start the connect/read/reconnect task (the first connection is made in it)."""
        if self._task is not None:
            return
        self._t0 = time.monotonic() - (self._last_pts + 1) / VIDEO_CLOCK_RATE
        self._task = asyncio.create_task(self._supervise(deliver), name="rtsp-source")

    async def stop(self) -> None:
        """Stop reading; the worker thread lets go of the connection at its next packet (or
        read timeout) and delivers nothing more."""
        self._generation += 1
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self.connected = False
        thread = self._thread
        if thread is not None:
            # A streaming reader sees the new generation at its next packet and closes the
            # connection (TEARDOWN); one still connecting is left to FFmpeg's open timeout.
            deadline = time.monotonic() + STOP_JOIN_S
            while thread.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if thread.is_alive():
                log.debug("rtsp source %s: the reader is still connecting; left to time out",
                          redact(self.url))

    def request_keyframe(self) -> None:
        """RTSP has no standard way to ask for an IDR; viewers wait for the camera's next."""

    def stats(self) -> dict[str, Any]:
        """Connection counters."""
        return {
            "url": redact(self.url),
            "connected": self.connected,
            "connects": self.connects,
            "disconnects": self.disconnects,
            "frames": self.frames,
            "bytes": self.bytes,
            "parameter_sets_added": self.parameter_sets_added,
            "audio_packets": self.audio_packets,
            # Frames timed by the camera's own timestamps (or, when it has none that hold, by
            # arrival), and how often its clock had to be picked up anew.
            "frame_times": "arrival" if self._clock.by_arrival else "camera",
            "clock_resyncs": self.clock_resyncs + self._clock.resyncs,
            "last_error": self.last_error,
        }

    async def _supervise(self, deliver: Deliver) -> None:
        loop = asyncio.get_running_loop()
        delay = self._backoff[0]
        generation = self._generation

        def current() -> bool:
            return generation == self._generation

        def emit(data: bytes, keyframe: bool, camera_s: float | None, arrived: float) -> None:
            # On the loop thread; nothing after stop() reaches the pipeline.
            if current():
                self._emit(deliver, data, keyframe, self._clock.time(camera_s, arrived))

        def hand_over(data: bytes, keyframe: bool, camera_s: float | None) -> None:
            # The arrival is read here, on the reader's thread: a busy loop's delay in running
            # emit is not the camera's.
            loop.call_soon_threadsafe(emit, data, keyframe, camera_s, time.monotonic())

        while current():
            began = loop.time()
            # Emits of the connection before have all run (the reader settles after them).
            self.clock_resyncs += self._clock.resyncs
            self._clock = CameraClock()
            try:
                await self._in_thread(loop, hand_over, current)
                self.last_error = "the camera ended the stream"
            except Exception as exc:  # av.FFmpegError, OSError: the camera is unreachable
                # FFmpeg's messages quote the URL: never its password.
                self.last_error = (str(exc) or type(exc).__name__).replace(
                    self.url, redact(self.url))
            self.connected = False
            if not current():
                return
            self.disconnects += 1
            if loop.time() - began > 30:
                delay = self._backoff[0]  # it streamed for a while: start the back-off afresh
            log.warning("rtsp source %s: %s; reconnecting in %.1f s", redact(self.url),
                        self.last_error, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._backoff[1])

    async def _in_thread(self, loop: asyncio.AbstractEventLoop,
                         hand_over: Callable[[bytes, bool, float | None], None],
                         current: Callable[[], bool]) -> None:
        """Run one connection's :meth:`_read_stream` on a daemon thread of its own and wait
        for it (a cancelled wait leaves the thread to end by itself; see :meth:`stop`)."""
        done: asyncio.Future[None] = loop.create_future()

        def settle(exc: BaseException | None) -> None:
            if done.done():
                return
            if exc is None:
                done.set_result(None)
            else:
                done.set_exception(exc)

        def run() -> None:
            failure: BaseException | None = None
            try:
                self._read_stream(hand_over, current)
            except Exception as exc:  # handed to the loop as the connection's outcome
                failure = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, failure)

        thread = threading.Thread(target=run, name=f"rtsp-{self._camera.name}", daemon=True)
        self._thread = thread
        thread.start()
        await done

    def _read_stream(self, hand_over: Callable[[bytes, bool, float | None], None],
                     current: Callable[[], bool]) -> None:
        """On a worker thread: connect, then hand over each access unit until the stream ends,
        fails, or :meth:`stop`."""
        import av

        options = {"rtsp_transport": self._transport, "fflags": "nobuffer"}
        container = av.open(self.url, options=options, timeout=self._timeout)
        try:
            if not current():
                return  # stopped while connecting: no connect counted, nothing handed over
            streams = [s for s in container.streams.video if s.codec_context.name == "h264"]
            if not streams:
                offered = ", ".join(f"{s.type} {s.codec_context.name}"
                                    for s in container.streams) or "no stream"
                raise ValueError(f"the camera offers no H.264 video stream ({offered})")
            stream = streams[0]
            sink = self.audio_sink
            audio = list(container.streams.audio) if sink is not None else []
            if sink is not None and not audio:
                sink.missing("the camera's stream has no audio track")
            parameter_sets = avcc_to_annex_b(bytes(stream.codec_context.extradata or b""))
            self.connects += 1
            self.connected = True
            log.info("rtsp source %s: connected (%dx%d)", redact(self.url),
                     stream.codec_context.width, stream.codec_context.height)
            for packet in container.demux(stream, *audio[:1]):
                if not current():
                    return
                if packet.size == 0:
                    continue
                if packet.stream is not stream:
                    # The sound: handed over on this thread (decoded by the sink), never
                    # through the video path; a failure there costs the sound, not the video.
                    self.audio_packets += 1
                    try:
                        sink.take(packet, packet.stream, time.time_ns() // 1000)
                    except Exception:
                        log.exception("rtsp source %s: the audio track failed", redact(self.url))
                    continue
                data = bytes(packet)
                types = nal_types(data)
                keyframe = IDR in types
                if keyframe and SPS not in types and parameter_sets:
                    data = parameter_sets + data
                    self.parameter_sets_added += 1
                # The camera's own time for the frame (FFmpeg's RTP demuxer: the RTP timestamp,
                # or after an RTCP sender report its NTP time), mapped onto ours on the loop.
                camera_s = (None if packet.pts is None or packet.time_base is None
                            else float(packet.pts * packet.time_base))
                hand_over(data, keyframe, camera_s)
        finally:
            container.close()

    def _emit(self, deliver: Deliver, data: bytes, keyframe: bool, at: float) -> None:
        # The frame's time on our monotonic clock (CameraClock) as pts, strictly increasing;
        # across a reconnect it carries on (the camera's clock restarts, ours does not).
        pts = int((at - self._t0) * VIDEO_CLOCK_RATE)
        pts = max(pts, self._last_pts + 1)
        self._last_pts = pts
        self.frames += 1
        self.bytes += len(data)
        deliver(AccessUnit(data, pts, keyframe, time.time_ns() // 1000))
