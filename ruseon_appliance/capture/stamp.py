"""A machine-readable time stamp drawn into pictures, and the reader for decoded frames.

The stamp is a 16 x 7 grid of black/white blocks at the top-left corner: 64 bits of capture time
(wall clock, µs), 32 bits of frame number and a CRC-16 over both, most significant bit first, row
by row. Blocks are at least 8 x 8 pixels (``width // 64`` when larger) so they survive H.264
compression; reading samples each block's centre and rejects the stamp when the CRC fails. Below
it, the frame number and the capture time are also drawn as block-digit text for humans.

The HIL harness uses :func:`read_stamp` on decoded frames to measure capture-to-decode latency.
"""

from __future__ import annotations

import time
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


def read_stamp(frame: Any) -> tuple[int, int] | None:
    """Read ``(capture_time_us, frame_number)`` from a decoded picture, or None if absent.

    ``frame`` is an ``av.VideoFrame`` (any format PyAV can turn into gray) or a luma ndarray.
    Returns None when the CRC does not match (no stamp, or too damaged to trust).
    """
    if isinstance(frame, np.ndarray):
        luma = frame if frame.ndim == 2 else frame.mean(axis=2)
    elif frame.format.name in ("yuv420p", "yuvj420p", "nv12", "yuv422p", "yuv444p", "gray"):
        luma = _luma_of(frame)[0]
    else:
        luma = frame.to_ndarray(format="gray")
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
