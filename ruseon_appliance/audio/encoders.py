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
    """

    def __init__(self, codec: str, *, frame_samples: int, sample_format: str, bitrate: int,
                 options: dict[str, str] | None = None) -> None:
        self.codec = codec
        ctx = av.CodecContext.create(codec, "w")
        ctx.sample_rate = AUDIO_CLOCK_RATE
        ctx.layout = "mono"
        ctx.format = sample_format
        ctx.bit_rate = bitrate
        ctx.time_base = Fraction(1, AUDIO_CLOCK_RATE)
        ctx.options = options or {}
        ctx.open()
        self._ctx: Any = ctx
        self.frame_samples = ctx.frame_size or frame_samples
        self._float = sample_format in ("flt", "fltp")
        self._pending: Any = np.zeros(0, dtype=np.int16)
        self._pending_pts = 0
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
        self._pending = np.zeros(0, dtype=np.int16)
        self._pending_pts = pts

    def encode(self, samples: np.ndarray, pts: int) -> list[tuple[bytes, int]]:
        """Encode; return the packets completed, each with its pts."""
        if self._input_pts0 is None:
            self._input_pts0 = pts
        if not len(self._pending):
            self._pending_pts = pts
        self._pending = np.concatenate([self._pending, samples]) if len(self._pending) else samples
        out: list[tuple[bytes, int]] = []
        n = self.frame_samples
        while len(self._pending) >= n:
            block, self._pending = self._pending[:n], self._pending[n:]
            data = block.astype(np.float32) / 32768.0 if self._float else block
            frame = av.AudioFrame.from_ndarray(data.reshape(1, -1),
                                               format="fltp" if self._float else "s16",
                                               layout="mono")
            frame.sample_rate = AUDIO_CLOCK_RATE
            frame.pts = self._pending_pts
            frame.time_base = Fraction(1, AUDIO_CLOCK_RATE)
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
                out.append((payload, int(packet.pts) + self._shift))
        return out


def opus_encoder(bitrate: int = OPUS_BITRATE) -> AudioEncoder:
    """libopus, 20 ms frames, low delay (no look-ahead beyond 2.5 ms)."""
    return AudioEncoder("libopus", frame_samples=FRAME_SAMPLES, sample_format="s16",
                        bitrate=bitrate, options={"frame_duration": "20",
                                                  "application": "lowdelay"})


def aac_encoder(bitrate: int = AAC_BITRATE) -> AudioEncoder:
    """FFmpeg's native AAC-LC encoder, 1024-sample frames."""
    return AudioEncoder("aac", frame_samples=AAC_FRAME_SAMPLES, sample_format="fltp",
                        bitrate=bitrate)
