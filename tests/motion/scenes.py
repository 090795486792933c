"""Clips whose truth is known: numpy pictures encoded with libx264 (as the cameras' H.264)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import av
import numpy as np

from ruseon_appliance.capture.access_unit import VIDEO_CLOCK_RATE

START_US = 1_700_000_000_000_000
Render = Callable[[int, float], Any]  # (frame number, seconds) -> uint8 luma (h, w)


@dataclass(frozen=True)
class Unit:
    """One encoded access unit as the ring holds it."""

    data: bytes
    pts: int
    keyframe: bool
    capture_time_us: int


class Scene:
    """A still, noisy scene (a textured wall with sensor noise) and what can happen in it."""

    def __init__(self, width: int = 320, height: int = 180, *, noise: float = 4.0,
                 seed: int = 7) -> None:
        self.width, self.height, self.noise = width, height, noise
        self._rng = np.random.default_rng(seed)
        yy, xx = np.mgrid[0:height, 0:width]
        cells = self._rng.integers(60, 190, size=(height // 16 + 1, width // 16 + 1))
        blocks = np.repeat(np.repeat(cells, 16, axis=0), 16, axis=1)[:height, :width]
        self.wall = (0.6 * blocks + 0.4 * (80 + 60 * xx / width + 30 * yy / height)
                     ).astype(np.float32)

    def still(self, brightness: float = 0.0) -> Any:
        """The wall (plus ``brightness``) with fresh noise (float; see :meth:`to_luma`)."""
        picture = self.wall + brightness + self._rng.normal(0, self.noise, self.wall.shape)
        return picture

    @staticmethod
    def to_luma(picture: Any) -> Any:
        return np.clip(picture, 16, 235).astype(np.uint8)

    def crossing(self, start_s: float, duration_s: float, *, x0: float = 0.0, x1: float = 1.0,
                 y: float = 0.5, size: float = 0.18) -> Render:
        """A dark object crossing from ``x0`` to ``x1`` (normalised) during
        [start_s, start_s + duration_s], centred at height ``y``."""

        def render(_n: int, t: float) -> Any:
            picture = self.still()
            if start_s <= t < start_s + duration_s:
                w, h = self.width, self.height
                side = int(size * h)
                cx = (x0 + (x1 - x0) * (t - start_s) / duration_s) * w
                cy = y * h
                left, top = int(cx - side / 2), int(cy - side / 2)
                picture[max(0, top):max(0, top + side), max(0, left):max(0, left + side)] = 30
            return self.to_luma(picture)

        return render

    def brightness_step(self, at_s: float, step: float = 70.0) -> Render:
        """The light goes on at ``at_s``: everything ``step`` brighter from then on."""

        def render(_n: int, t: float) -> Any:
            return self.to_luma(self.still(step if t >= at_s else 0.0))

        return render

    def static(self) -> Render:
        """Nothing happens."""
        return lambda _n, _t: self.to_luma(self.still())


def encode(render: Render, seconds: float, *, width: int, height: int, fps: int = 30,
           gop: int = 30, start_us: int = START_US, bitrate: int = 1_000_000) -> list[Unit]:
    """``seconds`` of ``render``'s pictures, encoded as the synthetic camera encodes."""
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.time_base = Fraction(1, fps)
    ctx.framerate = Fraction(fps, 1)
    ctx.gop_size = gop
    ctx.max_b_frames = 0
    ctx.bit_rate = bitrate
    ctx.options = {"preset": "ultrafast", "tune": "zerolatency", "profile": "baseline",
                   "bf": "0", "threads": "1",
                   "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:repeat-headers=1"}
    chroma = np.full((height // 2, width), 128, dtype=np.uint8)
    units: list[Unit] = []

    def take(packets: Any) -> None:
        for packet in packets:
            units.append(Unit(bytes(packet), packet.pts * VIDEO_CLOCK_RATE // fps,
                              bool(packet.is_keyframe), start_us + packet.pts * 1_000_000 // fps))

    for n in range(int(seconds * fps)):
        luma = render(n, n / fps)
        frame = av.VideoFrame.from_ndarray(np.concatenate([luma, chroma]), format="yuv420p")
        frame.pts = n
        take(ctx.encode(frame))
    take(ctx.encode(None))
    return units


def seconds_of(capture_time_us: float) -> float:
    """A capture time (µs, or seconds of the same clock) as seconds since the clip began."""
    return capture_time_us - START_US / 1e6
