"""The SPS/PPS muxer: every IDR that leaves it starts with the current parameter sets.

Browsers can only start decoding at an IDR that carries (or follows) SPS and PPS. Some encoders
repeat them in every IDR (the Pi's, with ``repeat=True``), many files and encoders do not. The
muxer caches the newest SPS and PPS and rebuilds every IDR access unit as
``00 00 00 01 SPS 00 00 00 01 PPS 00 00 00 01 slice...`` in one buffer allocated once. Other
access units pass through untouched unless they need cleaning.
"""

from __future__ import annotations

import logging

from .access_unit import AccessUnit
from .h264 import (
    NAL_AUD,
    NAL_IDR,
    NAL_PPS,
    NAL_SLICE,
    NAL_SPS,
    START_CODE_4,
    BitstreamError,
    StreamInfo,
    nal_spans,
    parse_sps,
)
from .ring import zeroed_buffer

log = logging.getLogger(__name__)


class Muxer:
    """Normalise access units: cached SPS/PPS before every IDR, 4-byte start codes, no junk.

    :meth:`push` returns an :class:`AccessUnit` whose ``data`` may be a view of the muxer's own
    buffer: it is valid until the next :meth:`push`, so copy it (the ring does) before then.
    Bad input is dropped with a counter and one log line per kind; nothing raises.
    """

    def __init__(self, max_frame_bytes: int = 1024 * 1024) -> None:
        # Only the pages the largest frame so far reached are resident (not max_frame_bytes).
        self._buf = zeroed_buffer(max_frame_bytes)
        self._view = memoryview(self._buf)
        self._sps: bytes | None = None
        self._pps: bytes | None = None
        self.stream_info: StreamInfo | None = None
        self._seen_keyframe = False
        self._logged: set[str] = set()
        self.counters: dict[str, int] = {
            "empty": 0,
            "no_start_code": 0,
            "invalid_nal": 0,
            "invalid_sps": 0,
            "no_picture": 0,
            "idr_without_parameter_sets": 0,
            "before_first_keyframe": 0,
            "oversized": 0,
            "parameter_set_changes": 0,
            "rebuilt": 0,
        }

    @property
    def sps(self) -> bytes | None:
        """The cached sequence parameter set NAL unit (header included), if any."""
        return self._sps

    @property
    def pps(self) -> bytes | None:
        """The cached picture parameter set NAL unit (header included), if any."""
        return self._pps

    def _drop(self, kind: str, detail: str) -> None:
        self.counters[kind] += 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("muxer dropped an access unit (%s): %s; further ones only counted",
                        kind, detail)

    def push(self, au: AccessUnit) -> AccessUnit | None:
        """Take one access unit from a source; return what should go into the ring, or None."""
        data = au.data
        if isinstance(data, memoryview):
            data = bytes(data)  # sources hand over bytes; a view is rare enough to copy
        if not data:
            self._drop("empty", "zero-length frame")
            return None
        spans = nal_spans(data)
        if not spans:
            self._drop("no_start_code", "no Annex B start code")
            return None
        idr = picture = False
        clean = True
        for start, end in spans:
            header = data[start]
            kind = header & 0x1F
            if header & 0x80 or kind == 0:
                # forbidden_zero_bit set or unspecified type: garbage between start codes.
                clean = False
                self.counters["invalid_nal"] += 1
                continue
            if kind == NAL_SPS:
                self._update_sps(data[start:end])
            elif kind == NAL_PPS:
                pps = data[start:end]
                if pps != self._pps:
                    self._pps = bytes(pps)
            elif kind == NAL_IDR:
                idr = picture = True
            elif kind == NAL_SLICE:
                picture = True
        if not picture:
            self.counters["no_picture"] += 1  # parameter sets or SEI alone: cached, not emitted
            return None
        if idr:
            if self._sps is None or self._pps is None:
                self._drop("idr_without_parameter_sets", "IDR before any SPS/PPS")
                return None
            return self._assemble(data, spans, au, with_parameter_sets=True)
        if not self._seen_keyframe:
            # A P frame before the first IDR cannot be decoded by anyone.
            self.counters["before_first_keyframe"] += 1
            return None
        if clean and data[:4] == START_CODE_4:
            return au if au.data is data else AccessUnit(data, au.pts, False, au.capture_time_us)
        return self._assemble(data, spans, au, with_parameter_sets=False)

    def _update_sps(self, sps: bytes | bytearray) -> None:
        if sps == self._sps:
            return
        try:
            info = parse_sps(sps)
        except BitstreamError as exc:
            self._drop("invalid_sps", str(exc))
            return
        if self._sps is not None:
            self.counters["parameter_set_changes"] += 1
            log.info("stream parameters changed: %s %dx%d", info.profile_level_id, info.width,
                     info.height)
        self._sps = bytes(sps)
        self.stream_info = info

    def _assemble(
        self,
        data: bytes | bytearray,
        spans: list[tuple[int, int]],
        au: AccessUnit,
        *,
        with_parameter_sets: bool,
    ) -> AccessUnit | None:
        # Write through the memoryview: assigning to a bytearray slice from anything but a
        # bytearray makes a temporary copy of the source first (CPython), a memoryview does not.
        out = self._view
        limit = len(out)
        pos = 0
        if with_parameter_sets:
            assert self._sps is not None and self._pps is not None
            for ps in (self._sps, self._pps):
                end = pos + 4 + len(ps)
                if end > limit:
                    self._drop("oversized", f"access unit over {limit} bytes")
                    return None
                out[pos : pos + 4] = START_CODE_4
                out[pos + 4 : end] = ps
                pos = end
        # Slicing a memoryview copies nothing; slicing bytes would copy each payload once more.
        source = memoryview(data)
        for start, stop in spans:
            header = data[start]
            kind = header & 0x1F
            if header & 0x80 or kind == 0 or kind == NAL_AUD:
                continue
            if with_parameter_sets and kind in (NAL_SPS, NAL_PPS):
                continue  # already written from the cache, first
            end = pos + 4 + stop - start
            if end > limit:
                self._drop("oversized", f"access unit over {limit} bytes")
                return None
            out[pos : pos + 4] = START_CODE_4
            out[pos + 4 : end] = source[start:stop]
            pos = end
        self.counters["rebuilt"] += 1
        if with_parameter_sets:
            self._seen_keyframe = True
        return AccessUnit(self._view[:pos], au.pts, with_parameter_sets, au.capture_time_us)
