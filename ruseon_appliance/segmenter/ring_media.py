"""A fragment whose pictures are still in the camera's ring: one copy of each access unit.

The live HLS window used to hold every part as its own bytes (moof + mdat), a second copy of
the ring's last 12 s (3.5 MiB per camera at 2 Mbit/s, issue 31). A :class:`RingMedia` keeps
what the ring does not have (the moof, the mdat header, the AAC frames) and, per video sample,
the ring's sequence number and the spans of the NAL units that go into the sample. The bytes
are put together when a client asks (:meth:`RingMedia.resolve`): each NAL unit preceded by its
4-byte length (AVCC), exactly what the copying segmenter wrote.

A ring frame is never changed once written, only lapped, and the ring says which frames are
intact (:meth:`RingBuffer.frame`), so a resolved fragment is either right or refused (None):
never another frame's bytes. Whoever holds references pins the ring (:meth:`RingBuffer.pin`):
the writer tells it before it overwrites a frame it refers to, and it copies that frame out
(the segmenter a sample: :meth:`Fmp4Segmenter.before_lap`; the window a part), so nothing is
lost however far the ring's writer runs ahead.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..capture.ring import RingBuffer

_LEN = struct.Struct(">I")

# One video sample: the ring frame's seq and the (start, end) spans, in the frame, of the NAL
# units the sample keeps (SPS, PPS and AUD are left out as the copying segmenter leaves them);
# or the AVCC sample itself, copied out of the ring before its writer reached the frame.
Spans = tuple[tuple[int, int], ...]
Sample = tuple[int, Spans] | bytes

# A seq after every frame: the "oldest frame referred to" of a holder that refers to none.
NO_SEQ = 1 << 62


def avcc(ring: RingBuffer, seq: int, spans: Spans) -> bytes | None:
    """Frame ``seq``'s NAL units at ``spans`` as an AVCC sample (None: no longer in the ring)."""
    view = ring.frame(seq)
    if view is None:
        return None
    data = view.data
    pack = _LEN.pack
    return b"".join(piece for start, end in spans for piece in (pack(end - start),
                                                                  data[start:end]))


class RingMedia:
    """moof + mdat of one fragment, its video samples by reference into ``ring``."""

    __slots__ = ("head", "ring", "samples", "size", "tail")

    def __init__(self, ring: RingBuffer, head: bytes, samples: list[Sample], tail: bytes
                 ) -> None:
        self.ring = ring
        self.head = head  # moof + the mdat header
        self.samples = samples
        self.tail = tail  # what follows the video in the mdat (the AAC frames)
        self.size = len(head) + len(tail) + sum(
            len(sample) if isinstance(sample, bytes)
            else 4 * len(sample[1]) + sum(end - start for start, end in sample[1])
            for sample in samples)

    @property
    def first_seq(self) -> int:
        """The ring seq of the oldest picture referred to (:data:`NO_SEQ`: none is)."""
        for sample in self.samples:
            if not isinstance(sample, bytes):
                return sample[0]
        return NO_SEQ

    def resolve(self) -> bytes | None:
        """The fragment's bytes, or None when the ring no longer holds one of its pictures."""
        pieces = [self.head]
        for sample in self.samples:
            data = sample if isinstance(sample, bytes) else avcc(self.ring, *sample)
            if data is None:
                return None
            pieces.append(data)
        pieces.append(self.tail)
        return b"".join(pieces)
