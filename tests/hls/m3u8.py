"""A strict parser for the media playlists the appliance serves, with the RFC 8216 / 8216bis
rules checked as it goes. Written for the tests, independently of the code that renders them:
it knows the spec, not ``ruseon_appliance.hls.playlist``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
from dataclasses import dataclass, field

HEADER_TAGS = ("#EXT-X-VERSION", "#EXT-X-TARGETDURATION", "#EXT-X-SERVER-CONTROL",
               "#EXT-X-PART-INF", "#EXT-X-MEDIA-SEQUENCE", "#EXT-X-DISCONTINUITY-SEQUENCE")
_ATTR = re.compile(r'([A-Z0-9-]+)=("[^"]*"|[^,]*)')


def attributes(text: str) -> dict[str, str]:
    """An attribute list (``A=1,B="x"``) as a dict, quotes removed."""
    return {k: v.strip('"') for k, v in _ATTR.findall(text)}


@dataclass
class PartEntry:
    uri: str
    duration: float
    independent: bool


@dataclass
class SegmentEntry:
    """One media segment as listed (``uri`` None while it is still being filled by parts)."""

    msn: int
    dsn: int
    map_uri: str
    program_date_time: dt.datetime | None
    discontinuity: bool
    parts: list[PartEntry] = field(default_factory=list)
    duration: float | None = None
    uri: str | None = None


@dataclass
class MediaPlaylist:
    version: int
    target_duration: int
    media_sequence: int
    discontinuity_sequence: int
    server_control: dict[str, str]
    part_target: float
    segments: list[SegmentEntry]
    preload_hint: dict[str, str] | None


class Violation(AssertionError):
    """The playlist breaks a rule of the spec."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise Violation(message)


def parse(text: str, *, split_parts: int = 0, stalled_parts: int = 0) -> MediaPlaylist:
    """Parse and check one media playlist; raises :class:`Violation` naming the broken rule.

    ``split_parts``: how many parts the appliance says it closed short because the next frame
    would have taken them past PART-TARGET (its ``parts_split_at_target``, read after the
    playlist was fetched). A camera that skipped frames (a busy machine) leaves a sample
    several frame times long, and then one of RFC 8216bis 4.4.4.9's two rules must give: a
    part either outlasts PART-TARGET or stays under 85% of it. The appliance keeps the first
    and counts each such part; up to that many parts under 85% are accepted, and none on a
    stream that skipped nothing. ``stalled_parts``: likewise, the parts of a single frame that
    outlast PART-TARGET because the camera stalled for longer than a part (its
    ``parts_over_target``): up to that many such parts are accepted.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    _check(bool(lines) and lines[0] == "#EXTM3U", "the first line must be #EXTM3U")
    header: dict[str, str] = {}
    index = 1
    while index < len(lines) and lines[index].split(":", 1)[0] in HEADER_TAGS:
        name, _, value = lines[index].partition(":")
        _check(name not in header, f"{name} appears twice")
        header[name] = value
        index += 1
    for name in HEADER_TAGS:
        _check(name in header, f"{name} missing from the header")
    target = int(header["#EXT-X-TARGETDURATION"])
    control = attributes(header["#EXT-X-SERVER-CONTROL"])
    part_target = float(attributes(header["#EXT-X-PART-INF"])["PART-TARGET"])
    _check(control.get("CAN-BLOCK-RELOAD") == "YES", "CAN-BLOCK-RELOAD=YES missing")
    _check(float(control["PART-HOLD-BACK"]) >= 2 * part_target,
           "PART-HOLD-BACK must be at least twice PART-TARGET")
    msn = int(header["#EXT-X-MEDIA-SEQUENCE"])
    dsn = int(header["#EXT-X-DISCONTINUITY-SEQUENCE"])
    segments: list[SegmentEntry] = []
    current_map = ""
    pending_discontinuity = False
    pending_pdt: dt.datetime | None = None
    current: SegmentEntry | None = None
    hint: dict[str, str] | None = None
    short: list[str] = []
    long: list[str] = []

    def open_segment() -> SegmentEntry:
        nonlocal current, pending_discontinuity, pending_pdt, dsn
        if current is None:
            _check(bool(current_map), "a segment before any EXT-X-MAP")
            if pending_discontinuity:
                dsn += 1
            current = SegmentEntry(msn + len(segments), dsn, current_map, pending_pdt,
                                   pending_discontinuity)
            pending_discontinuity, pending_pdt = False, None
        return current

    while index < len(lines):
        line = lines[index]
        index += 1
        _check(hint is None, f"{line!r} after EXT-X-PRELOAD-HINT (it must come last)")
        name, _, value = line.partition(":")
        if name in HEADER_TAGS:
            raise Violation(f"{name} after the first media segment tag")
        if name == "#EXT-X-DISCONTINUITY":
            _check(current is None, "EXT-X-DISCONTINUITY inside a segment's parts")
            pending_discontinuity = True
        elif name == "#EXT-X-MAP":
            _check(current is None, "EXT-X-MAP inside a segment's parts")
            current_map = attributes(value)["URI"]
        elif name == "#EXT-X-PROGRAM-DATE-TIME":
            _check(current is None, "EXT-X-PROGRAM-DATE-TIME inside a segment's parts")
            pending_pdt = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        elif name == "#EXT-X-PART":
            attrs = attributes(value)
            duration = float(attrs["DURATION"])
            if duration > part_target + 1e-6:
                long.append(attrs["URI"])
                _check(len(long) <= stalled_parts,
                       f"part {attrs['URI']} lasts {duration} > PART-TARGET {part_target} "
                       f"(parts over it: {long}; stalls the appliance counted: {stalled_parts})")
            open_segment().parts.append(
                PartEntry(attrs["URI"], duration, attrs.get("INDEPENDENT") == "YES"))
        elif name == "#EXTINF":
            segment = open_segment()
            segment.duration = float(value.split(",", 1)[0])
            # "Rounded to the nearest integer": halves go up (not Python's round-half-even).
            _check(math.floor(segment.duration + 0.5) <= target,
                   f"EXTINF {segment.duration} rounds above TARGETDURATION {target}")
            _check(index < len(lines) and not lines[index].startswith("#"),
                   "EXTINF must be followed by the segment URI")
            segment.uri = lines[index]
            index += 1
            if segment.parts:
                # RFC 8216bis 4.4.4.9: at least 85% of PART-TARGET, but for INDEPENDENT parts
                # and a segment's final part (known only once the segment is complete).
                for entry in segment.parts[:-1]:
                    if entry.independent or entry.duration >= 0.85 * part_target - 1e-5:
                        continue
                    short.append(entry.uri)
                    _check(len(short) <= split_parts,
                           f"part {entry.uri} lasts {entry.duration} < 85% of PART-TARGET "
                           f"{part_target} (parts under 85%: {short}; split at PART-TARGET "
                           f"by the appliance: {split_parts})")
                total = sum(p.duration for p in segment.parts)
                _check(abs(total - segment.duration) < 0.002,
                       f"segment {segment.uri}: parts sum to {total}, EXTINF {segment.duration}")
            segments.append(segment)
            current = None
        elif name == "#EXT-X-PRELOAD-HINT":
            hint = attributes(value)
            _check(hint.get("TYPE") == "PART", "the preload hint must be TYPE=PART")
        else:
            raise Violation(f"unexpected line {line!r}")
    if current is not None:
        segments.append(current)  # the segment still being filled: parts only
    _check(hint is not None, "EXT-X-PRELOAD-HINT missing")
    for earlier, later in itertools.pairwise(segments):
        if earlier.program_date_time and later.program_date_time and not later.discontinuity:
            _check(later.program_date_time > earlier.program_date_time,
                   "EXT-X-PROGRAM-DATE-TIME goes backwards without a discontinuity")
    return MediaPlaylist(
        version=int(header["#EXT-X-VERSION"]), target_duration=target, media_sequence=msn,
        discontinuity_sequence=int(header["#EXT-X-DISCONTINUITY-SEQUENCE"]),
        server_control=control, part_target=part_target, segments=segments, preload_hint=hint,
    )


class ContinuityChecker:
    """Checks a series of playlists from one stream against each other: a segment keeps its
    media sequence number and discontinuity sequence number for as long as it is listed, media
    sequence never goes back, and no segment is skipped between two playlists."""

    def __init__(self) -> None:
        self.msn_of: dict[str, int] = {}
        self.dsn_of: dict[str, int] = {}
        self.last_media_sequence = -1
        self.last_listed_msn = -1

    def add(self, playlist: MediaPlaylist) -> None:
        """Check ``playlist`` against the ones before it."""
        _check(playlist.media_sequence >= self.last_media_sequence,
               f"EXT-X-MEDIA-SEQUENCE went back to {playlist.media_sequence}")
        if self.last_listed_msn >= 0:
            _check(playlist.media_sequence <= self.last_listed_msn + 1,
                   f"segments {self.last_listed_msn + 1}..{playlist.media_sequence - 1} were "
                   "never listed")
        self.last_media_sequence = playlist.media_sequence
        for segment in playlist.segments:
            if segment.uri is None:
                continue
            known = self.msn_of.setdefault(segment.uri, segment.msn)
            _check(known == segment.msn, f"{segment.uri} moved from MSN {known} to {segment.msn}")
            dsn = self.dsn_of.setdefault(segment.uri, segment.dsn)
            _check(dsn == segment.dsn, f"{segment.uri} moved from DSN {dsn} to {segment.dsn}")
            self.last_listed_msn = max(self.last_listed_msn, segment.msn)


# -- multivariant playlists (RFC 8216bis §4.4.6) -------------------------------------------------

# Tags only a media playlist may carry (§4.1: a playlist is one kind or the other).
MEDIA_ONLY_TAGS = (
    *(t for t in HEADER_TAGS if t != "#EXT-X-VERSION"),
    "#EXTINF", "#EXT-X-PART", "#EXT-X-MAP", "#EXT-X-PRELOAD-HINT", "#EXT-X-PROGRAM-DATE-TIME",
    "#EXT-X-DISCONTINUITY", "#EXT-X-ENDLIST", "#EXT-X-PLAYLIST-TYPE", "#EXT-X-BYTERANGE",
)
_RESOLUTION = re.compile(r"^([1-9][0-9]*)x([1-9][0-9]*)$")
_DECIMAL = re.compile(r"^[0-9]{1,20}$")
_FLOAT = re.compile(r"^[0-9]+(\.[0-9]+)?$")
# RFC 6381 for H.264: avc1 (or avc3) and the SPS's profile, constraints and level in hex.
_AVC = re.compile(r"^avc[13]\.[0-9A-Fa-f]{6}$")
_AAC = re.compile(r"^mp4a\.40\.(2|5|29)$")


@dataclass
class VariantEntry:
    uri: str
    bandwidth: int
    average_bandwidth: int | None
    codecs: list[str]
    width: int
    height: int
    frame_rate: float


@dataclass
class MultivariantPlaylist:
    version: int | None
    independent_segments: bool
    variants: list[VariantEntry]


def _attribute_list(text: str) -> dict[str, str]:
    """An attribute list, checked: names unique (§4.2), quoted strings closed."""
    names = [k for k, _ in _ATTR.findall(text)]
    _check(len(names) == len(set(names)), f"an attribute appears twice in {text!r}")
    _check(text.count('"') % 2 == 0, f"an unclosed quoted string in {text!r}")
    return attributes(text)


def parse_multivariant(text: str) -> MultivariantPlaylist:
    """Parse and check a multivariant playlist of H.264 video renditions; raises
    :class:`Violation` naming the broken rule."""
    lines = [line for line in text.splitlines() if line.strip()]
    _check(bool(lines) and lines[0] == "#EXTM3U", "the first line must be #EXTM3U")
    version: int | None = None
    independent = False
    variants: list[VariantEntry] = []
    index = 1
    while index < len(lines):
        line = lines[index]
        index += 1
        name, _, value = line.partition(":")
        _check(name not in MEDIA_ONLY_TAGS,
               f"{name} is a media playlist tag; a multivariant playlist must not have it")
        if name == "#EXT-X-VERSION":
            _check(version is None, "EXT-X-VERSION appears twice")
            _check(bool(_DECIMAL.match(value)), f"EXT-X-VERSION {value!r} is not an integer")
            version = int(value)
        elif name == "#EXT-X-INDEPENDENT-SEGMENTS":
            _check(not independent, "EXT-X-INDEPENDENT-SEGMENTS appears twice")
            independent = True
        elif name == "#EXT-X-STREAM-INF":
            attrs = _attribute_list(value)
            _check("BANDWIDTH" in attrs, "EXT-X-STREAM-INF without BANDWIDTH (required)")
            _check(bool(_DECIMAL.match(attrs["BANDWIDTH"])), "BANDWIDTH is not an integer")
            bandwidth = int(attrs["BANDWIDTH"])
            _check(bandwidth > 0, "BANDWIDTH must be positive")
            average = None
            if "AVERAGE-BANDWIDTH" in attrs:
                _check(bool(_DECIMAL.match(attrs["AVERAGE-BANDWIDTH"])),
                       "AVERAGE-BANDWIDTH is not an integer")
                average = int(attrs["AVERAGE-BANDWIDTH"])
                _check(0 < average <= bandwidth,
                       f"AVERAGE-BANDWIDTH {average} above the peak BANDWIDTH {bandwidth}")
            # CODECS and RESOLUTION are SHOULDs for video; FRAME-RATE too (players that
            # switch by bandwidth, and UniFi-style clients, want all three): required here.
            _check('CODECS="' in value, "CODECS missing or not a quoted string")
            codecs = [c.strip() for c in attrs["CODECS"].split(",")]
            _check(bool(codecs) and _AVC.match(codecs[0]) is not None
                   and all(_AVC.match(c) or _AAC.match(c) for c in codecs[1:])
                   and sum(1 for c in codecs if _AVC.match(c)) == 1,
                   f"CODECS {codecs} are not H.264's (one, then AAC-LC if any)")
            _check("RESOLUTION" in attrs, "RESOLUTION missing")
            size = _RESOLUTION.match(attrs["RESOLUTION"])
            _check(size is not None, f"RESOLUTION {attrs['RESOLUTION']!r} is not WxH")
            assert size is not None
            _check("FRAME-RATE" in attrs and bool(_FLOAT.match(attrs["FRAME-RATE"])),
                   "FRAME-RATE missing or not a decimal")
            frame_rate = float(attrs["FRAME-RATE"])
            _check(0 < frame_rate <= 240, f"FRAME-RATE {frame_rate} is implausible")
            _check(len(attrs["FRAME-RATE"].partition(".")[2]) <= 3,
                   "FRAME-RATE should be rounded to three decimal places")
            # §4.4.6.2: the next line is the variant's URI.
            _check(index < len(lines) and not lines[index].startswith("#"),
                   "EXT-X-STREAM-INF must be followed by its URI")
            uri = lines[index]
            index += 1
            variants.append(VariantEntry(uri, bandwidth, average, codecs, int(size.group(1)),
                                         int(size.group(2)), frame_rate))
        elif line.startswith("#EXT"):
            raise Violation(f"unexpected tag {line!r}")
        elif line.startswith("#"):
            continue  # a comment
        else:
            raise Violation(f"a URI without EXT-X-STREAM-INF before it: {line!r}")
    _check(bool(variants), "a multivariant playlist lists at least one variant")
    _check(len({v.uri for v in variants}) == len(variants), "a variant URI is listed twice")
    return MultivariantPlaylist(version, independent, variants)
