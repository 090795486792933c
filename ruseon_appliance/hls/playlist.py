"""The media playlist (RFC 8216 and its LL-HLS extensions in RFC 8216bis) for a live window, and
the multivariant playlist that lists a camera's renditions (main and sub-stream).

One playlist serves both kinds of player. Low-latency players read ``EXT-X-PART``,
``EXT-X-PRELOAD-HINT`` and ``EXT-X-SERVER-CONTROL`` and reload with ``_HLS_msn``/``_HLS_part``;
older players ignore tags they do not know (RFC 8216 §4.1 requires it) and see an ordinary live
playlist of complete segments with a stable ``EXT-X-TARGETDURATION``. A second, LL-free playlist
would only double what caches hold and could drift from the first.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ruseon_appliance.hls.window import LiveWindow

VERSION = 6


def init_name(run_id: str, generation: int) -> str:
    """File name of an init segment."""
    return f"init-{run_id}-{generation}.mp4"


def segment_name(run_id: str, msn: int) -> str:
    """File name of a complete media segment."""
    return f"seg-{run_id}-{msn}.m4s"


def part_name(run_id: str, number: int) -> str:
    """File name of a partial segment (numbered globally, see :mod:`.window`)."""
    return f"part-{run_id}-{number}.m4s"


def program_date_time(capture_time_us: int) -> str:
    """ISO 8601 with milliseconds in UTC, as ``EXT-X-PROGRAM-DATE-TIME`` wants it."""
    moment = dt.datetime.fromtimestamp(capture_time_us / 1e6, tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def part_hold_back(part_target_s: float) -> float:
    """``PART-HOLD-BACK``: three part targets (the spec's minimum is two)."""
    return round(3 * part_target_s, 3)


def render(window: LiveWindow, *, query: str = "") -> str:
    """The playlist for the window as it is now.

    ``query`` (e.g. ``"?token=…"``) is appended to every URI: native players that were given the
    token in the playlist's URL need it on every request that follows.
    """
    run = window.run_id
    target = window.target_duration
    lines = [
        "#EXTM3U",
        f"#EXT-X-VERSION:{VERSION}",
        f"#EXT-X-TARGETDURATION:{target}",
        "#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,"
        f"PART-HOLD-BACK={part_hold_back(window.part_target_s):.3f},"
        f"HOLD-BACK={3 * target:.3f}",
        f"#EXT-X-PART-INF:PART-TARGET={window.part_target_s:.3f}",
        f"#EXT-X-MEDIA-SEQUENCE:{window.first_msn}",
        f"#EXT-X-DISCONTINUITY-SEQUENCE:{window.discontinuity_sequence}",
    ]
    generation: int | None = None
    for segment, with_parts in window.part_lists():
        # The oldest segment's own discontinuity is implied by EXT-X-DISCONTINUITY-SEQUENCE.
        if segment.discontinuity and generation is not None:
            lines.append("#EXT-X-DISCONTINUITY")
        if segment.init_generation != generation:
            generation = segment.init_generation
            lines.append(f'#EXT-X-MAP:URI="{init_name(run, generation)}{query}"')
        lines.append(f"#EXT-X-PROGRAM-DATE-TIME:{program_date_time(segment.capture_time_us)}")
        if with_parts:
            for part in segment.parts:
                independent = ",INDEPENDENT=YES" if part.independent else ""
                lines.append(
                    f"#EXT-X-PART:DURATION={part.duration_s:.5f},"
                    f'URI="{part_name(run, part.number)}{query}"{independent}'
                )
        if segment.complete:
            lines.append(f"#EXTINF:{segment.duration_s:.5f},")
            lines.append(f"{segment_name(run, segment.msn)}{query}")
    lines.append(
        f'#EXT-X-PRELOAD-HINT:TYPE=PART,URI="{part_name(run, window.next_part_number)}{query}"'
    )
    return "\n".join(lines) + "\n"


# -- the multivariant playlist ------------------------------------------------------------------

MULTIVARIANT_NAME = "multivariant.m3u8"


@dataclass(frozen=True, slots=True)
class Variant:
    """One rendition as a multivariant playlist lists it (RFC 8216bis §4.4.6.2).

    ``bandwidth`` is the peak segment bit rate (bits/s), ``average_bandwidth`` the mean one;
    ``codecs`` the RFC 6381 string (``avc1.64001f``); ``uri`` the media playlist's, relative to
    the multivariant playlist's own URL."""

    uri: str
    bandwidth: int
    average_bandwidth: int
    codecs: str
    width: int
    height: int
    frame_rate: float


def render_multivariant(variants: list[Variant], *, query: str = "") -> str:
    """A multivariant playlist listing ``variants`` in the order given (players that do not
    choose by bandwidth themselves start with the first). Every segment of every rendition
    starts at an IDR, hence ``EXT-X-INDEPENDENT-SEGMENTS``; ``query`` as in :func:`render`."""
    lines = ["#EXTM3U", f"#EXT-X-VERSION:{VERSION}", "#EXT-X-INDEPENDENT-SEGMENTS"]
    for variant in variants:
        lines.append(
            f"#EXT-X-STREAM-INF:BANDWIDTH={variant.bandwidth},"
            f"AVERAGE-BANDWIDTH={variant.average_bandwidth},"
            f'CODECS="{variant.codecs}",RESOLUTION={variant.width}x{variant.height},'
            f"FRAME-RATE={variant.frame_rate:.3f}")
        lines.append(f"{variant.uri}{query}")
    return "\n".join(lines) + "\n"
