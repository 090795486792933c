"""The glass pattern is found and read wherever a camera films it, through libx264 and back.

Each case films the pattern the way a bench camera would: scaled to 0.3-0.9 of the picture, turned
a few degrees, in mild perspective, on a cluttered background with the display's dark bezel
around it, blurred, with exposure (gain/offset) changed and sensor noise; a few frames of it are
encoded with libx264 at a realistic bitrate and decoded back with PyAV. The reader must return the
exact capture time and frame number or None, never anything else.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from hil.glass import render
from hil.receive_tap import FrameDecoder, TapFigures
from ruseon_appliance.capture.sources.synthetic import MovingPicture
from ruseon_appliance.capture.stamp import (
    GlassStampReader,
    draw_glass_pattern,
    locate_stamp,
    read_stamp_anywhere,
)

DISPLAY = (960, 540)
BASE_US = 1_764_000_000_123_456


@dataclass
class Filming:
    """How one camera sees the display."""

    width: int
    height: int
    scale: float  # the display's width as a fraction of the picture's
    angle_deg: float
    perspective: float  # each corner moves up to this fraction of the display's size
    blur: int  # box-blur radius, applied twice (close to a Gaussian)
    noise: float  # sensor noise, luma levels (sigma)
    gain: float
    offset: float
    bitrate: int
    seed: int


def corners(f: Filming, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """Where the display's four corners land in the picture (TL, TR, BR, BL)."""
    w = f.scale * f.width
    h = w * DISPLAY[1] / DISPLAY[0]
    a = math.radians(f.angle_deg)
    rot = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    box = np.array([(-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2)])
    box = box + rng.uniform(-f.perspective, f.perspective, (4, 2)) * (w, h)
    box = box @ rot.T
    span = box.max(axis=0) - box.min(axis=0)
    room = np.maximum((f.width, f.height) - span, 0)
    centre = box.min(axis=0) * -1 + rng.uniform(0, 1, 2) * room
    placed: np.ndarray[Any, Any] = box + centre
    return placed


def homography(src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    a, b = [], []
    for (u, v), (x, y) in zip(src, dst, strict=True):
        a.append((u, v, 1, 0, 0, 0, -u * x, -v * x))
        a.append((0, 0, 0, u, v, 1, -u * y, -v * y))
        b += [x, y]
    return np.append(np.linalg.solve(np.array(a), np.array(b)), 1.0).reshape(3, 3)


def background(f: Filming, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """A cluttered scene: smooth shading plus random boxes and bars of any grey."""
    small = rng.uniform(40, 200, (f.height // 40 + 2, f.width // 40 + 2))
    shading = np.repeat(np.repeat(small, 40, axis=0), 40, axis=1)
    img: np.ndarray[Any, Any] = shading[: f.height, : f.width].copy()
    for _ in range(60):
        x, y = rng.integers(0, f.width), rng.integers(0, f.height)
        w, h = rng.integers(3, f.width // 6), rng.integers(3, f.height // 6)
        img[y : y + h, x : x + w] = rng.uniform(0, 255)
    return img


class Camera:
    """Films the display: a fixed warp, background and bezel; exposure, blur and noise."""

    def __init__(self, f: Filming) -> None:
        self.f = f
        self.rng = np.random.default_rng(f.seed)
        quad = corners(f, self.rng)
        # The bezel: the display's panel is 4 % smaller than its dark frame.
        dw, dh = DISPLAY
        src = np.array([(-0.04 * dw, -0.04 * dh), (1.04 * dw, -0.04 * dh),
                        (1.04 * dw, 1.04 * dh), (-0.04 * dw, 1.04 * dh)])
        to_display = np.linalg.inv(homography(src, quad))
        ys, xs = np.mgrid[0 : f.height, 0 : f.width].astype(np.float64)
        w = to_display[2, 0] * xs + to_display[2, 1] * ys + to_display[2, 2]
        u = (to_display[0, 0] * xs + to_display[0, 1] * ys + to_display[0, 2]) / w
        v = (to_display[1, 0] * xs + to_display[1, 1] * ys + to_display[1, 2]) / w
        self.bezel = (u >= -0.04 * dw) & (u < 1.04 * dw) & (v >= -0.04 * dh) & (v < 1.04 * dh)
        self.panel = (u >= 0) & (u <= dw - 1) & (v >= 0) & (v <= dh - 1)
        u = np.clip(u, 0, dw - 1.001)
        v = np.clip(v, 0, dh - 1.001)
        self.u0, self.v0 = u.astype(np.intp), v.astype(np.intp)
        self.fu, self.fv = u - self.u0, v - self.v0
        self.scene = background(f, self.rng)

    def film(self, display: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        d: np.ndarray[Any, Any] = display.astype(np.float64)
        u0, v0, fu, fv = self.u0, self.v0, self.fu, self.fv
        warped = ((d[v0, u0] * (1 - fu) + d[v0, u0 + 1] * fu) * (1 - fv)
                  + (d[v0 + 1, u0] * (1 - fu) + d[v0 + 1, u0 + 1] * fu) * fv)
        img = np.where(self.panel, warped, np.where(self.bezel, 20.0, self.scene))
        for _ in range(2):
            img = box_blur(img, self.f.blur)
        img = img * self.f.gain + self.f.offset
        img = img + self.rng.normal(0, self.f.noise, img.shape)
        filmed: np.ndarray[Any, Any] = np.clip(np.rint(img), 0, 255).astype(np.uint8)
        return filmed


def box_blur(img: np.ndarray[Any, Any], radius: int) -> np.ndarray[Any, Any]:
    if radius <= 0:
        return img
    for axis in (0, 1):
        padded = np.pad(img, [(radius, radius) if a == axis else (0, 0) for a in (0, 1)],
                        mode="edge")
        c = np.cumsum(padded, axis=axis)
        c = np.insert(c, 0, 0, axis=axis)
        n = img.shape[axis]
        hi = np.take(c, np.arange(2 * radius + 1, n + 2 * radius + 1), axis=axis)
        lo = np.take(c, np.arange(0, n), axis=axis)
        img = (hi - lo) / (2 * radius + 1)
    return img


def encode_decode(lumas: list[np.ndarray[Any, Any]], bitrate: int) -> list[av.VideoFrame]:
    """libx264 (as a camera encoder would: ultrafast, zerolatency, 30 fps) and back with PyAV."""
    h, w = lumas[0].shape
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = w, h, "yuv420p"
    enc.time_base = Fraction(1, 30)
    enc.bit_rate = bitrate
    enc.options = {"preset": "ultrafast", "tune": "zerolatency", "threads": "1"}
    dec = av.CodecContext.create("h264", "r")
    chroma = np.full((h // 2, w), 128, np.uint8)
    out: list[av.VideoFrame] = []
    for i, luma in enumerate(lumas):
        frame = av.VideoFrame.from_ndarray(np.concatenate([luma, chroma]), format="yuv420p")
        frame.pts = i
        for packet in enc.encode(frame):
            out.extend(dec.decode(packet))
    for packet in enc.encode(None):
        out.extend(dec.decode(packet))
    out.extend(dec.decode(None))
    return out


def sweep(count: int, seed: int) -> list[Filming]:
    """``count`` filmings spread over the ranges a bench camera gives, reproducibly."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        big = i % 2 == 0
        out.append(Filming(
            width=1280 if big else 640, height=720 if big else 360,
            scale=float(rng.uniform(0.3, 0.9)), angle_deg=float(rng.uniform(-6, 6)),
            perspective=float(rng.uniform(0, 0.04)), blur=int(rng.integers(0, 3 if big else 2)),
            noise=float(rng.uniform(1, 6)), gain=float(rng.uniform(0.35, 1.0)),
            offset=float(rng.uniform(0, 70)), bitrate=2_000_000 if big else 600_000,
            seed=int(rng.integers(2**31)),
        ))
    return out


FRAMES_PER_CASE = 6


def film_and_read(f: Filming) -> tuple[list[tuple[int, int]], list[tuple[int, int] | None]]:
    camera = Camera(f)
    sent = [(BASE_US + f.seed + i * 16_667, f.seed + i) for i in range(FRAMES_PER_CASE)]
    lumas = [camera.film(draw_glass_pattern(*DISPLAY, t, n)) for t, n in sent]
    decoded = encode_decode(lumas, f.bitrate)
    return sent, [read_stamp_anywhere(frame) for frame in decoded]


def test_read_across_a_sweep_of_filmings() -> None:
    """Nearly every filmed frame reads back exactly, and none reads back wrong."""
    cases = sweep(20, seed=2024)
    read = wrong = total = 0
    for f in cases:
        sent, got = film_and_read(f)
        assert len(got) == len(sent)
        case_read = sum(g == s for s, g in zip(sent, got, strict=True))
        wrong += sum(g is not None and g != s for s, g in zip(sent, got, strict=True))
        assert case_read >= FRAMES_PER_CASE - 1, f"only {case_read}/{len(sent)} read for {f}"
        read += case_read
        total += len(sent)
    assert wrong == 0
    assert read >= 0.97 * total, f"{read}/{total} read"


def test_reader_keeps_the_placement_and_finds_a_moved_pattern() -> None:
    first = Filming(1280, 720, 0.5, -3.0, 0.02, 1, 3.0, 0.8, 10.0, 2_000_000, seed=11)
    moved = replace(first, scale=0.8, angle_deg=4.0, seed=12)
    sent = [(BASE_US + i * 16_667, 100 + i) for i in range(6)]
    cam_a, cam_b = Camera(first), Camera(moved)
    lumas = [cam_a.film(draw_glass_pattern(*DISPLAY, t, n)) for t, n in sent[:3]]
    lumas += [cam_b.film(draw_glass_pattern(*DISPLAY, t, n)) for t, n in sent[3:]]
    decoded = encode_decode(lumas, first.bitrate)
    reader = GlassStampReader()
    assert reader.read(decoded[0]) == sent[0]
    placement = reader.placement
    assert placement is not None
    assert reader.read(decoded[1]) == sent[1]
    assert reader.placement is placement  # read at the known place, no new search
    assert [reader.read(frame) for frame in decoded[2:]] == sent[2:]
    assert reader.placement is not placement  # the camera moved: found again
    # The pattern's cells appear about as large as the filming made them.
    expected = 0.8 * 1280 / DISPLAY[0] * (DISPLAY[0] // 36)
    assert reader.placement is not None
    assert 0.85 < reader.placement.module_px / expected < 1.15


def test_locate_stamp_maps_the_layout_onto_the_picture() -> None:
    luma: np.ndarray[Any, Any] = np.full((720, 1280), 90, np.uint8)
    pattern = draw_glass_pattern(640, 360, 5_000_000, 3)
    luma[200:560, 300:940] = pattern  # unscaled, at a known offset
    placement = locate_stamp(luma)
    assert placement is not None
    module = 640 // 36
    x0, y0 = 300 + (640 - 32 * module) // 2, 200 + (360 - 15 * module) // 2
    x, y = placement.to_pixels(np.array([0.5, 31.5]), np.array([0.5, 14.5]))
    assert np.allclose(x, [x0 + 0.5 * module - 0.5, x0 + 31.5 * module - 0.5], atol=1.0)
    assert np.allclose(y, [y0 + 0.5 * module - 0.5, y0 + 14.5 * module - 0.5], atol=1.0)
    assert read_stamp_anywhere(luma) == (5_000_000, 3)


def test_full_range_values_and_rgb_frames() -> None:
    pattern = draw_glass_pattern(*DISPLAY, 2**64 - 1, 2**32 - 1)
    assert read_stamp_anywhere(pattern) == (2**64 - 1, 2**32 - 1)
    rgb = np.repeat(pattern[:, :, None], 3, axis=2)
    assert read_stamp_anywhere(rgb) == (2**64 - 1, 2**32 - 1)
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
    assert read_stamp_anywhere(frame) == (2**64 - 1, 2**32 - 1)


def test_pictures_without_a_pattern_read_as_none() -> None:
    rng = np.random.default_rng(3)
    pictures: list[Any] = [np.full((720, 1280), v, np.uint8) for v in (0, 128, 255)]
    pictures.append(rng.integers(0, 256, (720, 1280), dtype=np.uint8))
    for i in range(8):
        f = Filming(1280, 720, 0.5, 0, 0, i % 3, 4.0, 1.0, 0.0, 0, seed=100 + i)
        pictures.append(np.clip(background(f, np.random.default_rng(i)), 0, 255).astype(np.uint8))
    # The synthetic source's pictures carry the small fixed stamp, not the glass pattern.
    moving = MovingPicture(1280, 720)
    pictures += [moving.render(n, BASE_US + n) for n in range(0, 90, 30)]
    for picture in pictures:
        assert read_stamp_anywhere(picture) is None
        assert locate_stamp(np.asarray(picture.to_ndarray(format="gray")
                                       if isinstance(picture, av.VideoFrame) else picture)) is None


def test_damaged_or_cropped_patterns_read_as_none() -> None:
    t, n = BASE_US, 77
    module = DISPLAY[0] // 36
    x0, y0 = (DISPLAY[0] - 32 * module) // 2, (DISPLAY[1] - 15 * module) // 2
    clean = draw_glass_pattern(*DISPLAY, t, n)
    assert read_stamp_anywhere(clean) == (t, n)
    damaged = []
    for col, row in [(8, 0), (15, 3), (23, 6)]:  # one data block inverted: the CRC catches it
        img = clean.copy()
        block = img[y0 + row * module : y0 + (row + 1) * module,
                    x0 + col * module : x0 + (col + 1) * module]
        block[:] = 251 - block  # 16 <-> 235
        damaged.append(img)
    smudged = clean.copy()  # a reflection over half the data
    smudged[y0 : y0 + 7 * module, x0 + 8 * module : x0 + 16 * module] = 128
    damaged.append(smudged)
    covered = clean.copy()  # one finder covered
    covered[y0 : y0 + 7 * module, x0 : x0 + 7 * module] = 235
    damaged.append(covered)
    damaged.append(clean[:, : DISPLAY[0] // 2])  # half out of the picture
    blurred = box_blur(box_blur(clean.astype(np.float64), module), module)  # far out of focus
    damaged.append(np.clip(blurred, 0, 255).astype(np.uint8))
    for img in damaged:
        assert read_stamp_anywhere(img) is None


@pytest.mark.parametrize("size", [(640, 360), (1920, 1080), (800, 600)])
def test_pattern_fills_the_display(size: tuple[int, int]) -> None:
    width, height = size
    img = draw_glass_pattern(width, height, 123, 4)
    assert img.shape == (height, width)
    dark_rows = np.flatnonzero((img < 128).any(axis=1))
    dark_cols = np.flatnonzero((img < 128).any(axis=0))
    # Only the quiet zone (2 cells) and rounding are left around the pattern.
    assert (dark_cols[-1] - dark_cols[0] + 1) > 0.8 * width or \
        (dark_rows[-1] - dark_rows[0] + 1) > 0.75 * height
    assert read_stamp_anywhere(img) == (123, 4)
    with pytest.raises(ValueError):
        draw_glass_pattern(100, 60, 0, 0)


def read_y4m(data: bytes) -> list[np.ndarray[Any, Any]]:
    header, _, body = data.partition(b"\n")
    fields = {f[:1]: f[1:] for f in header.split()[1:]}
    w, h = int(fields[b"W"]), int(fields[b"H"])
    size = w * h + 2 * (w // 2) * (h // 2)
    frames = []
    while body.startswith(b"FRAME"):
        body = body.partition(b"\n")[2]
        frames.append(np.frombuffer(body[: w * h], np.uint8).reshape(h, w))
        body = body[size:]
    return frames


def test_hil_glass_output_films_and_reads_as_the_rigs_clock(tmp_path: Path) -> None:
    """``python -m hil glass`` → display → camera → H.264 → the rig's clock at rendering time."""
    out = tmp_path / "glass.y4m"
    before = time.time_ns() // 1000
    assert render(out, DISPLAY[0], DISPLAY[1], fps=50, seconds=0.2) == 0
    after = time.time_ns() // 1000
    shown = read_y4m(out.read_bytes())
    assert len(shown) == 10
    camera = Camera(Filming(1280, 720, 0.7, 2.0, 0.02, 1, 3.0, 0.75, 20.0, 2_000_000, seed=5))
    got = [read_stamp_anywhere(f) for f in encode_decode([camera.film(s) for s in shown],
                                                          2_000_000)]
    assert [g[1] if g else None for g in got] == list(range(10))
    times = [g[0] for g in got if g]
    assert times == sorted(times) and before <= times[0] and times[-1] <= after


def test_hil_viewer_decoder_reads_glass_latency() -> None:
    """The harness's decoder (``run --glass``) reads the rig's clock from filmed frames."""
    f = Filming(1280, 720, 0.45, -2.0, 0.02, 1, 3.0, 0.8, 15.0, 2_000_000, seed=21)
    camera = Camera(f)
    now = time.time_ns() // 1000
    sent = [(now - 200_000 + i * 33_333, i) for i in range(8)]
    lumas = [camera.film(draw_glass_pattern(*DISPLAY, t, n)) for t, n in sent]
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = 1280, 720, "yuv420p"
    enc.time_base = Fraction(1, 30)
    enc.bit_rate = f.bitrate
    enc.options = {"preset": "ultrafast", "tune": "zerolatency", "threads": "1"}
    access_units: list[bytes] = []
    chroma: np.ndarray[Any, Any] = np.full((360, 1280), 128, np.uint8)
    for i, luma in enumerate(lumas):
        frame = av.VideoFrame.from_ndarray(np.concatenate([luma, chroma]), format="yuv420p")
        frame.pts = i
        access_units += [bytes(p) for p in enc.encode(frame)]
    access_units += [bytes(p) for p in enc.encode(None)]
    figures = TapFigures()
    decoder = FrameDecoder(figures, lambda: None, read=GlassStampReader().read)
    for au in access_units:
        decoder.feed(au)
    decoder.close()
    assert [r.stamp for r in figures.frames] == sent
    assert figures.idr_capture_us == [sent[0][0]]
    # now - capture time is what the latency check reports: positive, a fraction of a second.
    assert all(0 < r.wall_us - r.stamp[0] < 60_000_000 for r in figures.frames if r.stamp)


def test_upside_down_and_tilted_cameras_read() -> None:
    for angle in (180.0, 172.0, -14.0):
        f = Filming(1280, 720, 0.5, angle, 0.03, 1, 3.0, 0.8, 10.0, 2_000_000,
                    seed=int(angle) + 400)
        camera = Camera(f)
        sent = (BASE_US + 99, 99)
        decoded = encode_decode([camera.film(draw_glass_pattern(*DISPLAY, *sent))], f.bitrate)
        assert read_stamp_anywhere(decoded[0]) == sent, angle


def test_reader_searches_sparingly_while_no_pattern_is_in_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ruseon_appliance.capture import stamp

    searches: list[int] = []
    real_locate = stamp._locate

    def counting(gray: Any) -> Any:
        searches.append(1)
        return real_locate(gray)

    monkeypatch.setattr(stamp, "_locate", counting)
    reader = GlassStampReader(search_every=5)
    empty: np.ndarray[Any, Any] = np.full((360, 640), 120, np.uint8)
    assert [reader.read(empty) for _ in range(10)] == [None] * 10
    assert len(searches) == 2  # pictures 0 and 5
    pattern = draw_glass_pattern(640, 360, 7, 8)
    results = [reader.read(pattern) for _ in range(5)]
    assert results[-1] == (7, 8) and len(searches) == 3  # found at the next search, then kept
