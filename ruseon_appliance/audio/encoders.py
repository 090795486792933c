"""One Opus and one AAC encoder per camera (PyAV), shared by every viewer, client and file."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import av
import numpy as np

from .format import AAC_FRAME_SAMPLES, AUDIO_CLOCK_RATE, FRAME_SAMPLES

OPUS_BITRATE = 32_000
AAC_BITRATE = 64_000


class AudioEncoder:
    """Encodes int16 mono PCM at 48 kHz into packets of ``frame_samples`` each.

    ``encode(samples, pts)`` takes any number of samples whose first one is at ``pts`` (in
    1/48000 s, the pipeline's sample clock; consecutive calls must be contiguous) and returns
    the ``(payload, pts)`` of the packets completed. Packets the codec makes before its first
    input sample (AAC's priming frame) are dropped: outputs start at the first real one.

    ``sample_rate`` and ``channels`` other than 48 kHz mono (an AAC encode that must match an
    IP camera's own AAC, see the pipeline's passthrough) resample and upmix the input first;
    ``frame_samples`` is then in the encoder's rate, the returned pts still in 1/48000 s.
    """

    def __init__(self, codec: str, *, frame_samples: int, sample_format: str, bitrate: int,
                 options: dict[str, str] | None = None, sample_rate: int = AUDIO_CLOCK_RATE,
                 channels: int = 1) -> None:
        self.codec = codec
        self.sample_rate = sample_rate
        self.channels = channels
        self._layout = "mono" if channels == 1 else "stereo"
        ctx = av.CodecContext.create(codec, "w")
        ctx.sample_rate = sample_rate
        ctx.layout = self._layout
        ctx.format = sample_format
        ctx.bit_rate = bitrate
        ctx.time_base = Fraction(1, sample_rate)
        ctx.options = options or {}
        ctx.open()
        self._ctx: Any = ctx
        self.frame_samples = ctx.frame_size or frame_samples
        self._float = sample_format in ("flt", "fltp")
        self._format = "fltp" if self._float else "s16"
        self._convert = sample_rate != AUDIO_CLOCK_RATE or channels != 1
        self._resampler: Any = None
        self._pending: Any = np.zeros((1, 0), dtype=np.int16)
        self._pending_pts = 0  # in the encoder's rate
        self._input_pts0: int | None = None
        self._shift: int | None = None
        self.packets = 0
        self.bytes = 0

    @property
    def extradata(self) -> bytes:
        """The codec's configuration (AAC: the AudioSpecificConfig; Opus: its ID header)."""
        return bytes(self._ctx.extradata or b"")

    def restart_at(self, pts: int) -> None:
        """The next input starts at ``pts`` (after a hole): the samples of an unfinished packet
        are dropped."""
        self._pending = self._pending[:, :0]
        self._pending_pts = self._rate_ticks(pts)
        self._resampler = None

    def _rate_ticks(self, pts: int) -> int:
        return pts * self.sample_rate // AUDIO_CLOCK_RATE

    def _planes(self, samples: np.ndarray) -> np.ndarray:
        """48 kHz mono int16 as (channels, n) in the encoder's rate and sample format."""
        if not self._convert:
            data = samples.astype(np.float32) / 32768.0 if self._float else samples
            return data.reshape(1, -1)
        if self._resampler is None:
            self._resampler = av.AudioResampler(format=self._format, layout=self._layout,
                                                 rate=self.sample_rate)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = AUDIO_CLOCK_RATE
        out: list[np.ndarray] = [f.to_ndarray() for f in self._resampler.resample(frame)]
        if not out:
            return np.zeros((self.channels, 0), dtype=np.float32)
        return out[0] if len(out) == 1 else np.concatenate(out, axis=1)

    def encode(self, samples: np.ndarray, pts: int) -> list[tuple[bytes, int]]:
        """Encode; return the packets completed, each with its pts."""
        if self._input_pts0 is None:
            self._input_pts0 = self._rate_ticks(pts)
        if not self._pending.shape[1]:
            self._pending_pts = self._rate_ticks(pts)
        planes = self._planes(samples)
        self._pending = (np.concatenate([self._pending, planes], axis=1)
                         if self._pending.shape[1] else planes)
        out: list[tuple[bytes, int]] = []
        n = self.frame_samples
        while self._pending.shape[1] >= n:
            block, self._pending = self._pending[:, :n], self._pending[:, n:]
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(block),
                                               format=self._format, layout=self._layout)
            frame.sample_rate = self.sample_rate
            frame.pts = self._pending_pts
            frame.time_base = Fraction(1, self.sample_rate)
            self._pending_pts += n
            for packet in self._ctx.encode(frame):
                if packet.pts is None:
                    continue
                if self._shift is None:
                    # AAC's priming frame ends where the input starts: dropped. Opus's first
                    # packet starts its pre-skip (2.5 ms) early: it is the first input frame.
                    if packet.pts + (packet.duration or n) <= self._input_pts0:
                        continue
                    self._shift = max(0, self._input_pts0 - int(packet.pts))
                payload = bytes(packet)
                self.packets += 1
                self.bytes += len(payload)
                ticks = int(packet.pts) + self._shift
                out.append((payload, ticks if not self._convert
                            else ticks * AUDIO_CLOCK_RATE // self.sample_rate))
        return out


def opus_encoder(bitrate: int = OPUS_BITRATE) -> AudioEncoder:
    """libopus, 20 ms frames, low delay (no look-ahead beyond 2.5 ms)."""
    return AudioEncoder("libopus", frame_samples=FRAME_SAMPLES, sample_format="s16",
                        bitrate=bitrate, options={"frame_duration": "20",
                                                  "application": "lowdelay"})


def aac_encoder(bitrate: int = AAC_BITRATE, sample_rate: int = AUDIO_CLOCK_RATE,
                channels: int = 1) -> AudioEncoder:
    """FFmpeg's native AAC-LC encoder, 1024-sample frames (48 kHz mono unless told)."""
    return AudioEncoder("aac", frame_samples=AAC_FRAME_SAMPLES, sample_format="fltp",
                        bitrate=bitrate, sample_rate=sample_rate, channels=channels)
