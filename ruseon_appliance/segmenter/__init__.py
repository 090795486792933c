"""The fMP4 segmenter: H.264 access units from the ring in, CMAF fragmented MP4 out.

Shared by recording and HLS (see /work/notes/segmenter-contract.md): both read the ring like any
viewer through :func:`run_segmenter` and get the same fragments.
"""

from .fmp4 import Fmp4Segmenter, Fragment
from .runner import AacFeed, open_audio, run_segmenter, usable_audio

__all__ = ["AacFeed", "Fmp4Segmenter", "Fragment", "open_audio", "run_segmenter",
           "usable_audio"]
