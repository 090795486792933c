"""ISO BMFF (MP4) box writing and reading: the few primitives the segmenter and clip writer need.

Boxes are built as ``bytes`` from already-built children, so each one's size is known when its
header is packed. Reading walks box headers with offsets and never copies payloads.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

_U32 = struct.Struct(">I")
_HEADER = struct.Struct(">I4s")
_FULL = struct.Struct(">I4sI")


def box(kind: bytes, *payload: bytes) -> bytes:
    """A plain box: 32-bit size, four-character type, payload."""
    body = b"".join(payload)
    return _HEADER.pack(8 + len(body), kind) + body


def full_box(kind: bytes, version: int, flags: int, *payload: bytes) -> bytes:
    """A full box: a plain box whose payload starts with version (8 bits) and flags (24 bits)."""
    body = b"".join(payload)
    return _FULL.pack(12 + len(body), kind, (version << 24) | flags) + body


def box_header(kind: bytes, payload_size: int) -> bytes:
    """The header alone, for a box whose payload is streamed after it (mdat); 64-bit if needed."""
    if payload_size + 8 <= 0xFFFFFFFF:
        return _HEADER.pack(8 + payload_size, kind)
    return _HEADER.pack(1, kind) + struct.pack(">Q", 16 + payload_size)


def iter_boxes(data: bytes | memoryview, start: int = 0,
               end: int | None = None) -> Iterator[tuple[bytes, int, int]]:
    """Yield ``(type, payload_start, box_end)`` for each box in ``data[start:end]``.

    Stops (without raising) at the first header that does not fit: a truncated tail is simply
    not yielded, which is what a reader of a half-written file wants.
    """
    stop = len(data) if end is None else end
    pos = start
    while pos + 8 <= stop:
        size, kind = _HEADER.unpack_from(data, pos)
        header = 8
        if size == 1:
            if pos + 16 > stop:
                return
            size = struct.unpack_from(">Q", data, pos + 8)[0]
            header = 16
        elif size == 0:
            size = stop - pos
        if size < header or pos + size > stop:
            return
        yield bytes(kind), pos + header, pos + size
        pos += size


def find_box(data: bytes | memoryview, path: list[bytes], start: int = 0,
             end: int | None = None) -> tuple[int, int] | None:
    """``(payload_start, box_end)`` of the first box along ``path`` (e.g. [b"moov", b"trak"])."""
    lo, hi = start, len(data) if end is None else end
    for kind in path:
        for k, payload, box_end in iter_boxes(data, lo, hi):
            if k == kind:
                lo, hi = payload, box_end
                break
        else:
            return None
    return lo, hi


def read_top_level(f: BinaryIO, size: int) -> Iterator[tuple[bytes, int, int, int]]:
    """Yield ``(type, box_start, header_size, box_size)`` for top-level boxes of an open file.

    Reads only the headers (seeking over payloads); stops at a header that runs past ``size``.
    """
    pos = 0
    while pos + 8 <= size:
        f.seek(pos)
        head = f.read(16)
        if len(head) < 8:
            return
        box_size, kind = _HEADER.unpack_from(head, 0)
        header = 8
        if box_size == 1:
            if len(head) < 16:
                return
            box_size = struct.unpack_from(">Q", head, 8)[0]
            header = 16
        elif box_size == 0:
            box_size = size - pos
        if box_size < header or pos + box_size > size:
            return
        yield bytes(kind), pos, header, box_size
        pos += box_size


def u32(value: int) -> bytes:
    """Big-endian unsigned 32-bit."""
    return _U32.pack(value)
