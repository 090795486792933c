"""An IP camera's own sound (``audio = "source"``, the default for ``rtsp://``): the audio track
of the stream the camera's video comes from, taken with the video on the same connection.

The video source's reader thread hands each audio packet of its container to
:meth:`TrackSource.take` (nothing in capture/ imports this room: it only calls the two methods of
whatever was set as its ``audio_sink``). The packet is decoded there with FFmpeg's decoder for
the track's codec (AAC, G.711 mu-law/A-law, Opus, ... whatever this FFmpeg decodes) and resampled
to 48 kHz mono s16, stamped with its end by the camera's own clock put on the wall clock by the
least-late line of arrivals (as the video is), less its own length, and queued for the audio
pipeline's worker thread, which reads it like any other source: clock alignment, gain, meter,
and the one Opus and one AAC encode.

An AAC or Opus track's packets also travel with their PCM (:class:`~..format.CodedFrame`), so
the pipeline passes them through, unchanged, to the output of the same codec (the camera's
AAC to HLS, recordings and RTSP; its Opus to WebRTC) and encodes only the other one.

A camera without an audio track, or with one in a codec FFmpeg cannot decode, is reported (once
per reason, by the pipeline's problem and log) and the packets are dropped; the video is never
touched.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np

from ...capture.sources.camera_clock import CameraClock
from ..format import AUDIO_CLOCK_RATE, CodedFrame, PcmChunk
from .base import AudioSourceUnavailable

# Queued chunks (about 20-128 ms each): beyond this the worker is stalled and the oldest go.
QUEUE_CHUNKS = 64
# A read waits this long for the camera's next packet before it looks at close() again.
READ_POLL_S = 0.2
# No audio packet for this long while connected: the track has stopped (reported, retried).
SILENT_TRACK_S = 5.0


class TrackSource:
    """Decoded packets of a container's audio track, pushed by the video source's thread and
    read by the audio pipeline's."""

    kind = "source"

    def __init__(self) -> None:
        self._queue: queue.Queue[PcmChunk] = queue.Queue(QUEUE_CHUNKS)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._decoder: Any = None
        self._resampler: Any = None
        self._stream_key: tuple[Any, ...] | None = None
        self._problem: str | None = None
        self._passthrough: str | None = None
        self._config = b""
        self._coded: list[tuple[bytes, int]] = []  # not yet given to a chunk
        self._last_packet = 0.0
        # The camera's own packet times on the wall clock (capture/sources/camera_clock.py).
        self._clock = CameraClock()
        self.codec = ""
        self.sample_rate = 0
        self.channels = 0
        self.packets = 0
        self.packets_dropped = 0
        self.decode_errors = 0
        self.chunks_dropped = 0

    # -- from the video source's reader thread ---------------------------------------------------

    def missing(self, reason: str) -> None:
        """The stream has no track to take (or one that cannot be decoded): ``reason``."""
        with self._lock:
            self._problem = reason
            self._decoder = self._resampler = None
            self._stream_key = None

    def take(self, packet: Any, stream: Any, arrival_us: int) -> None:
        """One packet of the container's audio ``stream`` (PyAV objects), arrived at
        ``arrival_us`` (wall clock)."""
        self.packets += 1
        decoder = self._decoder_for(stream)
        if decoder is None:
            self.packets_dropped += 1
            return
        try:
            frames = decoder.decode(packet)
        except Exception:  # a broken packet from the camera is skipped, never fatal
            self.decode_errors += 1
            return
        pieces = []
        duration = 0
        for frame in frames:
            if frame.sample_rate:
                duration += frame.samples * AUDIO_CLOCK_RATE // frame.sample_rate
            for out in self._resampler.resample(frame):
                samples = np.asarray(out.to_ndarray()).reshape(-1).astype(np.int16, copy=False)
                if len(samples):
                    pieces.append(samples)
        if self._passthrough is not None and duration:
            data = bytes(packet)
            if data and not (self._passthrough == "aac" and data[:2] >= b"\xff\xf0"):
                # (an ADTS header would mean the frames are not raw: not passed through)
                self._coded.append((data, duration))
        if pieces:
            samples = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            # The packet's end by the camera's clock, put on ours by the least-late line
            # (arrival wobbles by what the reader thread waited for a core: the sample clock
            # then stretched and squeezed the sound, a 440 Hz tone read 450 Hz under load).
            end_s = None
            if packet.pts is not None and packet.time_base is not None:
                end_s = float(packet.pts * packet.time_base) + duration / AUDIO_CLOCK_RATE
            ended = self._clock.time(end_s, arrival_us / 1e6)
            capture = int(ended * 1e6) - len(samples) * 1_000_000 // AUDIO_CLOCK_RATE
            coded: tuple[CodedFrame, ...] = ()
            if self._coded:
                offset = 0
                made = []
                for data, length in self._coded:
                    made.append(CodedFrame(self._passthrough or "", data, self._config,
                                           offset, length))
                    offset += length
                coded = tuple(made)
                self._coded.clear()
            self._put(PcmChunk(samples, capture, coded))
        self._last_packet = time.monotonic()
        if self._problem is not None:
            with self._lock:
                self._problem = None

    def _decoder_for(self, stream: Any) -> Any:
        import av

        params = stream.codec_context
        key = (id(stream), params.name, params.sample_rate, bytes(params.extradata or b""))
        if key == self._stream_key:
            return self._decoder
        self._stream_key = key
        self._clock = CameraClock()  # a new stream (connection): the camera's clock restarts
        try:
            decoder = av.CodecContext.create(params.name, "r")
            if params.extradata:
                decoder.extradata = params.extradata
            if params.sample_rate:
                decoder.sample_rate = params.sample_rate
            if params.layout is not None and params.channels:
                decoder.layout = params.layout
            decoder.open()
        except Exception as exc:
            self.missing(f"the camera's audio is {params.name or 'of an unknown codec'}, "
                         f"which this FFmpeg cannot decode ({type(exc).__name__}): dropped")
            self._stream_key = key  # reported once per stream, not per packet
            return None
        self._decoder = decoder
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_CLOCK_RATE)
        self.codec = str(params.name)
        # The camera's own packets go along with their PCM for the outputs of the same codec:
        # raw AAC frames (RTSP's mpeg4-generic, with the AudioSpecificConfig from the SDP) and
        # Opus (always 48 kHz). Anything else (G.711, LATM, ...) is only decoded.
        extradata = bytes(params.extradata or b"")
        self._passthrough = ("aac" if self.codec == "aac" and len(extradata) >= 2 else
                             "opus" if self.codec == "opus" else None)
        self._config = extradata if self._passthrough == "aac" else b""
        self._coded.clear()
        self.sample_rate = int(params.sample_rate or 0)
        self.channels = int(params.channels or 0)
        return decoder

    def _put(self, chunk: PcmChunk) -> None:
        while True:
            try:
                self._queue.put_nowait(chunk)
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()  # the oldest goes: the worker is behind
                    self.chunks_dropped += 1
                except queue.Empty:
                    pass

    # -- the AudioSource protocol, from the audio pipeline's worker thread ------------------------

    def open(self) -> None:
        """Start reading; a camera without a usable track says so here."""
        self._closed.clear()
        with self._lock:
            problem = self._problem
        if problem is not None and self._queue.empty():
            raise AudioSourceUnavailable(problem)
        self._last_packet = time.monotonic()

    def read(self) -> PcmChunk | None:
        """The next decoded chunk (blocking), None once closed."""
        while not self._closed.is_set():
            try:
                return self._queue.get(timeout=READ_POLL_S)
            except queue.Empty:
                pass
            with self._lock:
                problem = self._problem
            if problem is not None:
                raise AudioSourceUnavailable(problem)
            if time.monotonic() - self._last_packet > SILENT_TRACK_S:
                raise AudioSourceUnavailable(
                    f"no audio from the camera for {SILENT_TRACK_S:.0f} s")
        return None

    def close(self) -> None:
        """Stop reading (a blocked read returns)."""
        self._closed.set()

    def stats(self) -> dict[str, Any]:
        """The track's codec and counters."""
        return {"codec": self.codec, "passthrough": self._passthrough,
                "sample_rate": self.sample_rate, "channels": self.channels,
                "packets": self.packets, "packets_dropped": self.packets_dropped,
                "decode_errors": self.decode_errors, "chunks_dropped": self.chunks_dropped,
                "frame_times": "arrival" if self._clock.by_arrival else "camera",
                "clock_resyncs": self._clock.resyncs}
