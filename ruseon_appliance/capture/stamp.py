"""A machine-readable time stamp drawn into pictures, and the reader for decoded frames.

The stamp is a 16 x 7 grid of black/white blocks at the top-left corner: 64 bits of capture time
(wall clock, µs), 32 bits of frame number and a CRC-16 over both, most significant bit first, row
by row. Blocks are at least 8 x 8 pixels (``width // 64`` when larger) so they survive H.264
compression; reading samples each block's centre and rejects the stamp when the CRC fails. Below
it, the frame number and the capture time are also drawn as block-digit text for humans.

The HIL harness uses :func:`read_stamp` on decoded frames to measure capture-to-decode latency.

For glass-to-glass latency a camera films a display instead, so the stamp lands anywhere in the
picture, scaled, slightly rotated and in perspective. :func:`draw_glass_pattern` draws the same
112 bits as a full-screen picture framed by four finder marks (the QR code's 1:1:3:1:1 squares);
:func:`locate_stamp` finds the marks, maps the pattern with a homography and verifies it with the
marks' own cells and the CRC; :func:`read_stamp_anywhere` and :class:`GlassStampReader` read it.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

COLUMNS = 16
ROWS = 7
BITS = COLUMNS * ROWS  # 64 time + 32 frame + 16 CRC
# Video-range luma: what black and white really are in the encoded picture.
BLACK = 16
WHITE = 235

# 3 x 5 block glyphs, one string per row.
_GLYPHS: dict[str, tuple[str, ...]] = {
    "0": ("###", "#.#", "#.#", "#.#", "###"),
    "1": (".#.", "##.", ".#.", ".#.", "###"),
    "2": ("###", "..#", "###", "#..", "###"),
    "3": ("###", "..#", "###", "..#", "###"),
    "4": ("#.#", "#.#", "###", "..#", "..#"),
    "5": ("###", "#..", "###", "..#", "###"),
    "6": ("###", "#..", "###", "#.#", "###"),
    "7": ("###", "..#", ".#.", ".#.", ".#."),
    "8": ("###", "#.#", "###", "#.#", "###"),
    "9": ("###", "#.#", "###", "..#", "###"),
    ":": ("...", ".#.", "...", ".#.", "..."),
    ".": ("...", "...", "...", "...", ".#."),
    "#": ("#.#", "###", "#.#", "###", "#.#"),
    " ": ("...", "...", "...", "...", "..."),
}
_GLYPH_BITS = {
    ch: np.array([[c == "#" for c in row] for row in rows], dtype=bool)
    for ch, rows in _GLYPHS.items()
}


def block_size(width: int) -> int:
    """Side of one stamp block in pixels for a picture ``width`` wide (even, at least 8)."""
    return max(8, (width // 64) & ~1)


def stamp_region(width: int) -> tuple[int, int, int, int]:
    """``(x, y, w, h)`` of the stamp's blocks (the quiet border of one block is extra)."""
    b = block_size(width)
    return b, b, COLUMNS * b, ROWS * b


def _crc16(data: bytes) -> int:
    """CRC-16/CCITT-FALSE."""
    crc = 0xFFFF
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _payload_bits(capture_time_us: int, frame_number: int) -> np.ndarray[Any, Any]:
    payload = (capture_time_us & (2**64 - 1)).to_bytes(8, "big") + (
        frame_number & 0xFFFFFFFF
    ).to_bytes(4, "big")
    raw = payload + _crc16(payload).to_bytes(2, "big")
    return np.unpackbits(np.frombuffer(raw, dtype=np.uint8))


def _luma_of(frame: Any) -> tuple[np.ndarray[Any, Any], bool]:
    """Return a writable 2-D (or H x W x 3) uint8 array sharing memory with ``frame``."""
    if isinstance(frame, np.ndarray):
        return frame, frame.ndim == 3
    plane = frame.planes[0]  # av.VideoFrame in a planar YUV format: plane 0 is luma
    arr = np.frombuffer(memoryview(plane), dtype=np.uint8).reshape(-1, plane.line_size)
    return arr[: frame.height, : frame.width], False


def _fill(img: np.ndarray[Any, Any], y: int, x: int, h: int, w: int, value: int) -> None:
    img[y : y + h, x : x + w] = value


def draw_stamp(frame: Any, capture_time_us: int, frame_number: int) -> None:
    """Draw the block stamp and the human-readable text into ``frame`` in place.

    ``frame`` is a luma plane (2-D uint8 ndarray), an RGB image (H x W x 3 uint8), or a planar
    YUV ``av.VideoFrame`` (its luma plane is written). The picture must be at least
    ``18 * block_size(width)`` wide and ``9 * block_size(width)`` high.
    """
    img, rgb = _luma_of(frame)
    height, width = img.shape[0], img.shape[1]
    b = block_size(width)
    if width < (COLUMNS + 2) * b or height < (ROWS + 2) * b:
        raise ValueError(f"picture {width}x{height} is too small for the stamp")
    black, white = (0, 255) if rgb else (BLACK, WHITE)
    # Quiet border of one block so the grid never blends into the moving background.
    _fill(img, 0, 0, (ROWS + 2) * b, (COLUMNS + 2) * b, white)
    bits = _payload_bits(capture_time_us, frame_number)
    for index in range(BITS):
        row, col = divmod(index, COLUMNS)
        _fill(img, b + row * b, b + col * b, b, b, white if bits[index] else black)
    seconds = capture_time_us // 1_000_000
    clock = time.strftime("%H:%M:%S", time.gmtime(seconds))
    text = f"#{frame_number % 1_000_000:06d} {clock}.{(capture_time_us // 1000) % 1000:03d}"
    scale = max(2, b // 4)
    _draw_text(img, text, b, (ROWS + 2) * b + scale, scale, black, white)


def _draw_text(
    img: np.ndarray[Any, Any], text: str, x: int, y: int, scale: int, ink: int, paper: int
) -> None:
    height, width = img.shape[0], img.shape[1]
    advance = 4 * scale
    if y + 6 * scale > height:
        return  # no room under the stamp in a tiny picture: the blocks are what matters
    box_w = min(width - x, len(text) * advance + scale)
    _fill(img, y - scale // 2, x - scale // 2, 6 * scale, box_w + scale // 2, paper)
    for i, ch in enumerate(text):
        gx = x + i * advance
        if gx + 3 * scale > width:
            break
        glyph = _GLYPH_BITS.get(ch)
        if glyph is None:
            continue
        big = np.repeat(np.repeat(glyph, scale, axis=0), scale, axis=1)
        region = img[y : y + 5 * scale, gx : gx + 3 * scale]
        region[big] = ink


def _gray_of(frame: Any) -> np.ndarray[Any, Any]:
    """The picture's luma as a 2-D array (a view of the plane when the format allows it)."""
    if isinstance(frame, np.ndarray):
        return frame if frame.ndim == 2 else frame.mean(axis=2)
    if frame.format.name in ("yuv420p", "yuvj420p", "nv12", "yuv422p", "yuv444p", "gray"):
        return _luma_of(frame)[0]
    gray: np.ndarray[Any, Any] = frame.to_ndarray(format="gray")
    return gray


def read_stamp(frame: Any) -> tuple[int, int] | None:
    """Read ``(capture_time_us, frame_number)`` from a decoded picture, or None if absent.

    ``frame`` is an ``av.VideoFrame`` (any format PyAV can turn into gray) or a luma ndarray.
    Returns None when the CRC does not match (no stamp, or too damaged to trust).
    """
    luma = _gray_of(frame)
    height, width = luma.shape[0], luma.shape[1]
    b = block_size(width)
    if width < (COLUMNS + 2) * b or height < (ROWS + 2) * b:
        return None
    q = max(1, b // 4)
    # Mean of each block's centre (half its side): robust to ringing at the block edges.
    grid: np.ndarray[Any, Any] = luma[b : b + ROWS * b, b : b + COLUMNS * b].astype(np.float32)
    grid = grid.reshape(ROWS, b, COLUMNS, b)[:, q : b - q, :, q : b - q]
    means = grid.mean(axis=(1, 3)).reshape(-1)
    bits = (means > (BLACK + WHITE) / 2).astype(np.uint8)
    raw = np.packbits(bits).tobytes()
    if _crc16(raw[:12]) != int.from_bytes(raw[12:14], "big"):
        return None
    return int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:12], "big")


# --- The glass pattern: the stamp as a full-screen picture that a camera films ---------------
#
# Layout in cells (one cell = one data block), 32 x 15, with a quiet zone of QUIET cells around:
#
#   rows 0-6:  finder | gap | 16 x 7 data blocks (the same bits as the stamp) | gap | finder
#   row 7:     gap
#   rows 8-14: finder | gap | the clock and frame number for people              | gap | finder
#
# A finder is the QR code's finder pattern: a 3 x 3 dark core, a light ring and a dark ring, so any
# line through its centre crosses dark/light/dark/light/dark runs in the ratio 1:1:3:1:1 whatever
# the scale, rotation or (mild) perspective. Their four centres give the homography.

GLASS_COLUMNS = 32
GLASS_ROWS = 15
QUIET = 2
FINDER = 7
# Top-left cell of each finder, clockwise from the top-left one: (column, row).
_FINDER_ORIGINS = ((0, 0), (25, 0), (25, 8), (0, 8))
_DATA_ORIGIN = (8, 0)
_TEXT_ORIGIN = (8, 8)
# Run-length tolerance: each run may be off by this fraction of its ideal length (blur, threshold
# bias, perspective); the cell-by-cell verification after the homography is the strict check.
_RUN_TOLERANCE = 0.6
# Smallest finder module the scanner looks for, in pixels (below that H.264 erases the blocks).
_MIN_MODULE_PX = 2.5
# The darkest and lightest finder cells must differ by this much (8-bit luma) to be trusted.
_MIN_CONTRAST = 16.0
# A pixel is dark when this far (8-bit luma) below its surroundings' mean: flat areas with sensor
# noise then stay light instead of breaking into speckle (thousands of runs to scan).
_DARK_MARGIN = 6.0
# How many finder candidates (strongest first) are tried in groups of four.
_MAX_CANDIDATES = 8


def _finder_cells() -> np.ndarray[Any, Any]:
    ring = np.maximum(*np.abs(np.mgrid[0:FINDER, 0:FINDER] - FINDER // 2))
    # Dark: the 3 x 3 core (rings 0 and 1) and the outer ring (3).
    dark: np.ndarray[Any, Any] = ring != 2
    return dark


def _glass_cells(capture_time_us: int, frame_number: int) -> np.ndarray[Any, Any]:
    """The layout as a ``(GLASS_ROWS, GLASS_COLUMNS)`` array, True where the cell is dark."""
    cells: np.ndarray[Any, Any] = np.zeros((GLASS_ROWS, GLASS_COLUMNS), dtype=bool)
    finder = _finder_cells()
    for col, row in _FINDER_ORIGINS:
        cells[row : row + FINDER, col : col + FINDER] = finder
    col, row = _DATA_ORIGIN
    bits = _payload_bits(capture_time_us, frame_number).reshape(ROWS, COLUMNS)
    cells[row : row + ROWS, col : col + COLUMNS] = bits == 0  # a 1 bit is white, as in the stamp
    return cells


def glass_module(width: int, height: int) -> int:
    """Side of one glass-pattern cell in pixels on a ``width`` x ``height`` display."""
    return min(width // (GLASS_COLUMNS + 2 * QUIET), height // (GLASS_ROWS + 2 * QUIET))


def draw_glass_pattern(
    width: int, height: int, capture_time_us: int, frame_number: int
) -> np.ndarray[Any, Any]:
    """Render the glass pattern as a ``height`` x ``width`` video-range luma picture.

    The pattern is as large as the picture allows, centred, on white. Raises ValueError when a
    cell would be smaller than 4 pixels (the picture is too small to be filmed and read back).
    """
    m = glass_module(width, height)
    if m < 4:
        raise ValueError(f"picture {width}x{height} is too small for the glass pattern")
    img: np.ndarray[Any, Any] = np.full((height, width), WHITE, dtype=np.uint8)
    x0 = (width - GLASS_COLUMNS * m) // 2
    y0 = (height - GLASS_ROWS * m) // 2
    dark = np.repeat(np.repeat(_glass_cells(capture_time_us, frame_number), m, axis=0), m, axis=1)
    img[y0 : y0 + GLASS_ROWS * m, x0 : x0 + GLASS_COLUMNS * m][dark] = BLACK
    # The same figures for people, in the band between the lower finders.
    seconds = capture_time_us // 1_000_000
    millis = (capture_time_us // 1000) % 1000
    clock = time.strftime("%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}"
    band_w = (COLUMNS - 1) * m
    scale = max(1, band_w // (len(clock) * 4))
    tx = x0 + _TEXT_ORIGIN[0] * m + m // 2
    ty = y0 + _TEXT_ORIGIN[1] * m + m
    _draw_text(img, clock, tx, ty, scale, BLACK, WHITE)
    _draw_text(img, f"#{frame_number % 1_000_000:06d}", tx, ty + 7 * scale, scale, BLACK, WHITE)
    return img


@dataclass(frozen=True, eq=False)
class StampPlacement:
    """Where a glass pattern lies in a picture.

    ``homography`` maps layout coordinates in cells (column, row; a cell's centre is at
    ``(c + 0.5, r + 0.5)``) to pixel coordinates (x, y; a pixel's centre is at its index).
    """

    homography: np.ndarray[Any, Any]

    def to_pixels(
        self, columns: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Map layout points (cells) to pixel coordinates."""
        h = self.homography
        w = h[2, 0] * columns + h[2, 1] * rows + h[2, 2]
        x = (h[0, 0] * columns + h[0, 1] * rows + h[0, 2]) / w
        y = (h[1, 0] * columns + h[1, 1] * rows + h[1, 2]) / w
        return x, y

    @property
    def module_px(self) -> float:
        """Mean side of one cell in pixels (how large the pattern appears)."""
        x, y = self.to_pixels(np.array([3.5, 28.5, 28.5, 3.5]), np.array([3.5, 3.5, 11.5, 11.5]))
        d = np.hypot(np.diff(np.append(x, x[0])), np.diff(np.append(y, y[0])))
        return float(d.sum() / (2 * (25 + 8)))


def _layout_samples() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any],
                               np.ndarray[Any, Any], int]:
    """Cells the reader samples: the known ones (finders, gaps) then the data blocks.

    Returns the cells' (column, row) centres, each cell's expected darkness (known cells only),
    each known cell's finder index (-1 for gaps) and the number of known cells.
    """
    cols: list[float] = []
    rows: list[float] = []
    dark: list[bool] = []
    owner: list[int] = []
    finder = _finder_cells()
    for index, (c0, r0) in enumerate(_FINDER_ORIGINS):
        for r in range(FINDER):
            for c in range(FINDER):
                cols.append(c0 + c + 0.5)
                rows.append(r0 + r + 0.5)
                dark.append(bool(finder[r, c]))
                owner.append(index)
    gaps = [(7, r) for r in range(15)] + [(24, r) for r in range(15)]
    gaps += [(c, 7) for c in range(GLASS_COLUMNS) if c not in (7, 24)]
    for c, r in gaps:
        cols.append(c + 0.5)
        rows.append(r + 0.5)
        dark.append(False)
        owner.append(-1)
    known = len(cols)
    for r in range(ROWS):
        for c in range(COLUMNS):
            cols.append(_DATA_ORIGIN[0] + c + 0.5)
            rows.append(_DATA_ORIGIN[1] + r + 0.5)
    return np.array(cols), np.array(rows), np.array(dark), np.array(owner), known


_SAMPLE_COLS, _SAMPLE_ROWS, _EXPECTED_DARK, _SAMPLE_FINDER, _KNOWN = _layout_samples()
# Each cell is read as the mean of a 3 x 3 grid of points spread over its middle half.
_SPREAD = np.array([-0.25, 0.0, 0.25])
_POINT_COLS = (_SAMPLE_COLS[:, None, None] + _SPREAD[None, None, :]).repeat(3, axis=1).reshape(-1)
_POINT_ROWS = (_SAMPLE_ROWS[:, None, None] + _SPREAD[None, :, None]).repeat(3, axis=2).reshape(-1)
_FINDER_CENTRES = np.array([(c + FINDER / 2, r + FINDER / 2) for c, r in _FINDER_ORIGINS])


def _decode_at(gray: np.ndarray[Any, Any], placement: StampPlacement) -> tuple[int, int] | None:
    """Sample the pattern where ``placement`` says it is; the payload if every check passes."""
    height, width = gray.shape[0], gray.shape[1]
    x, y = placement.to_pixels(_POINT_COLS, _POINT_ROWS)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return None
    xi = np.rint(x).astype(np.intp)
    yi = np.rint(y).astype(np.intp)
    if xi.min() < 0 or yi.min() < 0 or xi.max() >= width or yi.max() >= height:
        return None  # part of the pattern is out of the picture
    cells = gray[yi, xi].astype(np.float32).reshape(-1, 9).mean(axis=1)
    # Black and white as each finder shows them; the threshold between them is interpolated
    # across the pattern, so uneven exposure (vignetting, a reflection) shifts it locally.
    mids = np.empty(4)
    for index in range(4):
        mine = index == _SAMPLE_FINDER
        black = cells[: _KNOWN][mine & _EXPECTED_DARK].mean()
        white = cells[: _KNOWN][mine & ~_EXPECTED_DARK].mean()
        if white - black < _MIN_CONTRAST:
            return None
        mids[index] = (black + white) / 2
    s = np.clip((_SAMPLE_COLS - 3.5) / 25.0, 0.0, 1.0)
    t = np.clip((_SAMPLE_ROWS - 3.5) / 8.0, 0.0, 1.0)
    threshold = ((1 - s) * (1 - t) * mids[0] + s * (1 - t) * mids[1] + s * t * mids[2]
                 + (1 - s) * t * mids[3])
    dark = cells < threshold
    # Every finder and gap cell must read as drawn: this rejects a wrong homography (or a wrong
    # guess of which finder is which) before the CRC is even looked at.
    if (dark[: _KNOWN] != _EXPECTED_DARK).any():
        return None
    bits = (~dark[_KNOWN:]).astype(np.uint8)
    raw = np.packbits(bits).tobytes()
    if _crc16(raw[:12]) != int.from_bytes(raw[12:14], "big"):
        return None
    return int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:12], "big")


def _dark_mask(gray: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Threshold against the local mean (tiles of ~1/32 of the short side, window ~1/4 of it)."""
    height, width = gray.shape[0], gray.shape[1]
    tile = max(4, min(height, width) // 32)
    th, tw = -(-height // tile), -(-width // tile)
    padded = np.pad(gray, ((0, th * tile - height), (0, tw * tile - width)), mode="edge")
    tiles = padded.reshape(th, tile, tw, tile).mean(axis=(1, 3), dtype=np.float32)
    # Box mean over (2k+1)^2 tiles through an integral image, shrunk at the edges.
    k = 4
    integral = np.zeros((th + 1, tw + 1), dtype=np.float64)
    integral[1:, 1:] = tiles.cumsum(axis=0).cumsum(axis=1)
    r0 = np.clip(np.arange(th) - k, 0, th)
    r1 = np.clip(np.arange(th) + k + 1, 0, th)
    c0 = np.clip(np.arange(tw) - k, 0, tw)
    c1 = np.clip(np.arange(tw) + k + 1, 0, tw)
    box = (integral[r1][:, c1] - integral[r0][:, c1] - integral[r1][:, c0]
           + integral[r0][:, c0])
    local = box / ((r1 - r0)[:, None] * (c1 - c0)[None, :])
    full = np.repeat(np.repeat(local.astype(np.float32), tile, axis=0), tile, axis=1)
    dark: np.ndarray[Any, Any] = gray < full[:height, :width] - _DARK_MARGIN
    return dark


def _pattern_hits(
    dark: np.ndarray[Any, Any],
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Rows of ``dark`` that cross dark/light/dark/light/dark runs in the ratio 1:1:3:1:1.

    Returns each hit's row, the centre column of its middle run and the five runs' total length.
    """
    height, width = dark.shape[0], dark.shape[1]
    line = np.empty((height, width + 1), dtype=np.int8)
    line[:, 0] = 2  # a sentinel column: runs never continue from one row into the next
    line[:, 1:] = dark
    flat = line.reshape(-1)
    starts = np.concatenate(([0], np.flatnonzero(flat[1:] != flat[:-1]) + 1))
    lengths: np.ndarray[Any, Any] = np.diff(np.append(starts, flat.size))
    colour = flat[starts]
    n = len(starts) - 4
    empty = np.empty(0)
    if n <= 0:
        return empty, empty, empty
    ok = (colour[:n] == 1) & (colour[1 : n + 1] == 0) & (colour[2 : n + 2] == 1)
    ok &= (colour[3 : n + 3] == 0) & (colour[4 : n + 4] == 1)
    runs: list[np.ndarray[Any, Any]] = [lengths[i : n + i].astype(np.float32) for i in range(5)]
    total = runs[0] + runs[1] + runs[2] + runs[3] + runs[4]
    module = total / 7
    tol = _RUN_TOLERANCE * module
    ok &= module >= _MIN_MODULE_PX
    for i in (0, 1, 3, 4):
        ok &= np.abs(runs[i] - module) < tol
    ok &= np.abs(runs[2] - 3 * module) < 3 * tol
    index = np.flatnonzero(ok)
    core = starts[index + 2]
    row = core // (width + 1)
    centre = (core % (width + 1) - 1) + (runs[2][index] - 1) / 2
    return row.astype(np.float64), centre.astype(np.float64), total[index].astype(np.float64)


@dataclass
class _Finder:
    """A finder candidate: its centre, module (pixels) and how many rows crossed it."""

    x: float
    y: float
    module: float
    rows: int


def _cross_check(column: np.ndarray[Any, Any], y: int, total: float) -> float | None:
    """The centre row of the 1:1:3:1:1 runs through ``y`` down ``column``, or None."""
    if not column[y]:
        return None
    edges: np.ndarray[Any, Any] = np.flatnonzero(column[1:] != column[:-1]) + 1
    k = int(np.searchsorted(edges, y, side="right"))  # index of the run holding y
    bounds = np.concatenate(([0], edges, [len(column)]))
    if k < 2 or k + 3 >= len(bounds):
        return None
    runs = np.diff(bounds[k - 2 : k + 4]).astype(np.float64)
    vertical = runs.sum()
    module = vertical / 7
    tol = _RUN_TOLERANCE * module
    if not (0.5 * total < vertical < 2 * total):
        return None
    if any(abs(runs[i] - module) >= tol for i in (0, 1, 3, 4)):
        return None
    if abs(runs[2] - 3 * module) >= 3 * tol:
        return None
    return float(bounds[k] + (runs[2] - 1) / 2)


def _find_finders(gray: np.ndarray[Any, Any]) -> list[_Finder]:
    """Finder candidates in ``gray``, the most crossed first."""
    dark = _dark_mask(gray)
    rows, centres, totals = _pattern_hits(dark)
    # Group hits that continue each other from row to row (same centre, same size).
    groups: list[list[float]] = []  # [sum_x, sum_total, count, last_row, last_x, first_row]
    active: list[list[float]] = []
    for row, x, total in zip(rows.tolist(), centres.tolist(), totals.tolist(), strict=True):
        module = total / 7
        still: list[list[float]] = []
        joined = False
        for g in active:
            g_module = g[1] / g[2] / 7
            if row - g[3] > max(2.0, 0.5 * g_module):
                continue  # ended
            still.append(g)
            if (not joined and row > g[3] and abs(x - g[4]) <= max(1.5, 0.5 * g_module)
                    and abs(module - g_module) <= 0.4 * g_module):
                g[0] += x
                g[1] += total
                g[2] += 1
                g[3] = row
                g[4] = x
                joined = True
        if not joined:
            g = [x, total, 1, row, x, row]
            still.append(g)
            groups.append(g)
        active = still
    finders: list[_Finder] = []
    for sum_x, sum_total, count, last_row, _, first_row in groups:
        module = sum_total / count / 7
        if count < max(3.0, 0.8 * module):
            continue  # too few rows for a 3-module core
        x = sum_x / count
        xi = min(max(round(x), 1), dark.shape[1] - 2)
        # Down the majority of three columns: one noisy pixel must not split a run.
        column = dark[:, xi - 1 : xi + 2].sum(axis=1) >= 2
        y = _cross_check(column, round((first_row + last_row) / 2), sum_total / count)
        if y is None:
            continue
        finders.append(_Finder(x, y, module, int(count)))
    finders.sort(key=lambda f: -f.rows)
    return finders


def _homography(
    src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any] | None:
    """The projective map taking four ``src`` points to four ``dst`` points (None if degenerate)."""
    a = np.zeros((8, 8))
    b = np.zeros(8)
    for i, ((u, v), (x, y)) in enumerate(zip(src, dst, strict=True)):
        a[2 * i] = (u, v, 1, 0, 0, 0, -u * x, -v * x)
        a[2 * i + 1] = (0, 0, 0, u, v, 1, -u * y, -v * y)
        b[2 * i], b[2 * i + 1] = x, y
    try:
        h = np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        return None
    return np.append(h, 1.0).reshape(3, 3)


def _placements(finders: list[_Finder]) -> Any:
    """Plausible placements from groups of four finders, the strongest groups first."""
    candidates = finders[:_MAX_CANDIDATES]
    for group in itertools.combinations(candidates, 4):
        cx = sum(f.x for f in group) / 4
        cy = sum(f.y for f in group) / 4
        # Clockwise on screen (y grows downwards), as _FINDER_ORIGINS.
        ring = sorted(group, key=lambda f: math.atan2(f.y - cy, f.x - cx))
        pts = np.array([(f.x, f.y) for f in ring])
        modules = [f.module for f in ring]
        if max(modules) > 2.5 * min(modules):
            continue
        edge = np.roll(pts, -1, axis=0) - pts
        after = np.roll(edge, -1, axis=0)
        cross = edge[:, 0] * after[:, 1] - edge[:, 1] * after[:, 0]
        if not ((cross > 0).all() or (cross < 0).all()):
            continue  # not a convex quadrilateral
        sides = np.hypot(edge[:, 0], edge[:, 1])
        module = sum(modules) / 4
        for first in range(4):
            # Sides 0 and 2 of the layout are the long ones (25 cells), 1 and 3 the short (8).
            long = (sides[first % 4] + sides[(first + 2) % 4]) / 2 / 25
            short = (sides[(first + 1) % 4] + sides[(first + 3) % 4]) / 2 / 8
            if not (0.5 < long / module < 2.0 and 0.5 < short / module < 2.0):
                continue
            dst = np.roll(pts, -first, axis=0)
            h = _homography(_FINDER_CENTRES, dst)
            if h is not None:
                yield StampPlacement(h)


def _locate(gray: np.ndarray[Any, Any]) -> tuple[StampPlacement, tuple[int, int]] | None:
    for placement in _placements(_find_finders(gray)):
        payload = _decode_at(gray, placement)
        if payload is not None:
            return placement, payload
    return None


def locate_stamp(gray: np.ndarray[Any, Any]) -> StampPlacement | None:
    """Find a readable glass pattern anywhere in a luma picture; None when there is none.

    The placement is returned only when the pattern at it reads back completely (every finder
    and gap cell as drawn, and the CRC), so it never points at something that merely looks alike.
    """
    found = _locate(_gray_of(gray))
    return found[0] if found else None


def read_stamp_anywhere(frame: Any) -> tuple[int, int] | None:
    """Read ``(capture_time_us, frame_number)`` from a glass pattern anywhere in the picture.

    ``frame`` is an ``av.VideoFrame`` or a luma / RGB ndarray, as for :func:`read_stamp`.
    Returns None when no pattern is found or it is too damaged to trust (CRC).
    """
    found = _locate(_gray_of(frame))
    return found[1] if found else None


class GlassStampReader:
    """Reads glass patterns from consecutive pictures of one camera.

    The camera and the display stand still, so the last placement is tried first (a fraction of
    a millisecond); only when it no longer reads is the whole picture searched again (a few
    milliseconds at 720p). After a search that found nothing, the next ``search_every - 1``
    pictures are only tried at the last placement, so a camera that sees no pattern at all does
    not cost a full search per frame.
    """

    def __init__(self, search_every: int = 5) -> None:
        self.placement: StampPlacement | None = None
        self.search_every = max(1, search_every)
        self._skip = 0

    def read(self, frame: Any) -> tuple[int, int] | None:
        """``(capture_time_us, frame_number)`` or None, as :func:`read_stamp_anywhere`."""
        gray = _gray_of(frame)
        if self.placement is not None:
            payload = _decode_at(gray, self.placement)
            if payload is not None:
                self._skip = 0
                return payload
        if self._skip > 0:
            self._skip -= 1
            return None
        found = _locate(gray)
        if found is None:
            self._skip = self.search_every - 1
            return None
        self.placement = found[0]
        return found[1]
