"""The live window: the segmenter's fragments as LL-HLS parts, grouped into segments at IDRs.

Everything lives in memory and the window is bounded (by media duration and by bytes), so the SD
card never sees a segment. Numbering never goes backwards while the process runs:

- a segment's media sequence number (MSN) grows by one per segment;
- a part's number is global (one per fragment, across segments), so the preload hint always
  names the very next part, whether or not it turns out to start a new segment;
- a timeline break (the segmenter was reset after a ring overrun, the camera restarted, or the
  SPS/PPS changed and with them the init segment) marks the next segment with a discontinuity,
  and the discontinuity sequence counts the ones that have left the window.

Names carry a per-process run id, so an HTTP cache in front can never hand out a part from a
previous run of the service under the same name.

One copy of the pictures (issue 31): fragments of a segmenter reading by reference
(:attr:`Fragment.media`) stay references into the camera's ring, put together when a client
asks; the few a request just needed are kept (:data:`HOT_PARTS`, :data:`HOT_SEGMENTS`), since
every LL-HLS client asks for the same parts at the live edge. The window pins the ring
(:meth:`RingBuffer.pin`): a part whose pictures the ring's writer is about to overwrite is
copied out first, so a window longer than the ring holds (a bitrate above the configured one,
a reader that fell behind) costs memory as before, never a part.
"""

from __future__ import annotations

import math
import secrets
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.segmenter import Fragment
from ruseon_appliance.segmenter.ring_media import NO_SEQ, RingMedia

TIMESCALE = 90_000
# A fragment continuing the previous one starts exactly where it ended (the segmenter derives
# durations from the next frame's pts); this much slack absorbs rounding in other timescales.
CONTINUITY_SLACK_TICKS = 90
# Parts and complete segments put together for a request, kept for the next client's.
HOT_PARTS = 12
HOT_SEGMENTS = 2


@dataclass(slots=True)
class Part:
    """One LL-HLS partial segment: one fragment (moof+mdat) of the segmenter."""

    number: int
    msn: int
    index: int  # position inside its segment (the _HLS_part of blocking requests)
    data: bytes | memoryview | None  # None while ``media`` refers to the ring
    duration_s: float
    independent: bool
    capture_time_us: int
    media: RingMedia | None = None
    size: int = 0  # bytes of moof + mdat

    def content(self) -> bytes | memoryview | None:
        """moof + mdat (None: the ring lost its pictures)."""
        if self.data is not None:
            return self.data
        return self.media.resolve() if self.media is not None else None


@dataclass(slots=True)
class Segment:
    """A media segment: the parts from one IDR (or a forced split) to the next."""

    msn: int
    init_generation: int
    discontinuity: bool
    capture_time_us: int
    # Discontinuity sequence number: discontinuities up to and including this segment's own.
    dsn: int = 0
    parts: list[Part] = field(default_factory=list)
    complete: bool = False
    data: bytes | None = None  # the parts joined, once complete (parts held as bytes)

    @property
    def duration_s(self) -> float:
        """Sum of the parts' durations."""
        return sum(p.duration_s for p in self.parts)

    @property
    def size(self) -> int:
        """Bytes of its parts (held, or by reference to the ring)."""
        return sum(p.size for p in self.parts)

    def content(self) -> bytes | None:
        """The parts joined (None: the ring lost a picture of one)."""
        if self.data is not None:
            return self.data
        pieces = []
        for part in self.parts:
            piece = part.content()
            if piece is None:
                return None
            pieces.append(piece)
        return b"".join(pieces)


@dataclass(frozen=True, slots=True)
class Position:
    """Where the live edge is: the open segment's MSN and how many parts it has so far."""

    msn: int
    parts: int


class LiveWindow:
    """A bounded window of segments and parts, fed fragment by fragment.

    ``target_duration`` is the playlist's ``EXT-X-TARGETDURATION`` (whole seconds); it never
    changes, so a segment that would outgrow it is split before the next part even without an
    IDR (that segment then starts with a non-independent part, which HLS allows).
    ``window_s`` is how much complete media is kept; at least three target durations plus the
    open segment are kept whatever it says, as RFC 8216 asks of a live playlist.
    """

    def __init__(
        self,
        *,
        target_duration: int,
        part_target_s: float,
        window_s: float,
        max_bytes: int = 64 * 1024 * 1024,
        run_id: str | None = None,
        first_msn: int = 0,
    ) -> None:
        self.target_duration = max(1, target_duration)
        self.part_target_s = part_target_s
        self.window_s = max(window_s, 3 * self.target_duration + part_target_s)
        self.max_bytes = max_bytes
        self.run_id = run_id or secrets.token_hex(4)
        self.segments: deque[Segment] = deque()
        self.inits: dict[int, bytes] = {}
        self._parts_by_number: dict[int, Part] = {}
        self._next_msn = first_msn
        self._next_part = 0
        self._expected_pts: int | None = None
        self._generation: int | None = None
        self._break_pending = False
        self._bytes = 0
        self._held_bytes = 0  # of those, held as bytes (the rest refers to the ring)
        self._hot: OrderedDict[tuple[str, int], bytes | memoryview] = OrderedDict()
        self._refs: deque[Part] = deque()  # parts by reference, oldest first (the pin's)
        self._pinned: RingBuffer | None = None
        self.parts_added = 0
        self.segments_split = 0
        self.discontinuities = 0
        self.parts_copied_out = 0  # parts by reference copied before the ring reached them
        self.parts_lost = 0  # parts (with their segments) the ring lost all the same (a bug)

    # -- feeding ---------------------------------------------------------------------------

    def add_init(self, generation: int, init: bytes) -> None:
        """Remember the init segment (ftyp+moov) for ``generation``."""
        self.inits.setdefault(generation, init)

    def mark_break(self) -> None:
        """The timeline is broken (camera restarted, ring overrun): the next part opens a new
        segment after an ``EXT-X-DISCONTINUITY``."""
        self._break_pending = True

    def add(self, fragment: Fragment) -> Part:
        """Add one fragment as the next part; returns it."""
        duration_s = fragment.duration / TIMESCALE
        broken = self._break_pending or (
            self._generation is not None and fragment.init_generation != self._generation
        ) or (
            self._expected_pts is not None
            and abs(fragment.start_pts - self._expected_pts) > CONTINUITY_SLACK_TICKS
        )
        self._break_pending = False
        open_segment = self.segments[-1] if self.segments and not self.segments[-1].complete \
            else None
        starts_segment = open_segment is None or broken or fragment.independent
        if open_segment is not None and not starts_segment and (
            nearest_second(open_segment.duration_s + duration_s) > self.target_duration
        ):
            starts_segment = True  # keep every EXTINF within TARGETDURATION
            self.segments_split += 1
        if starts_segment:
            if open_segment is not None:
                self._complete(open_segment)
            first = self.parts_added == 0
            open_segment = Segment(
                msn=self._next_msn,
                init_generation=fragment.init_generation,
                discontinuity=broken and not first,
                capture_time_us=fragment.capture_time_us,
            )
            if open_segment.discontinuity:
                self.discontinuities += 1
            open_segment.dsn = self.discontinuities
            self._next_msn += 1
            self.segments.append(open_segment)
        assert open_segment is not None
        part = Part(
            number=self._next_part,
            msn=open_segment.msn,
            index=len(open_segment.parts),
            data=fragment.data if fragment.media is None else None,
            duration_s=duration_s,
            independent=fragment.independent,
            capture_time_us=fragment.capture_time_us,
            media=fragment.media,
            size=fragment.size,
        )
        self._next_part += 1
        open_segment.parts.append(part)
        self._parts_by_number[part.number] = part
        self._bytes += part.size
        if part.media is None:
            self._held_bytes += part.size
        else:
            if part.media.ring is not self._pinned:
                part.media.ring.pin(self)
                self._pinned = part.media.ring
            self._refs.append(part)
        self._generation = fragment.init_generation
        self._expected_pts = fragment.start_pts + fragment.duration
        self.parts_added += 1
        self._evict()
        return part

    def _complete(self, segment: Segment) -> None:
        segment.complete = True
        if any(p.data is None for p in segment.parts):
            return  # by reference: put together on request
        # One buffer per segment; the parts become views into it, so a complete segment is not
        # held twice.
        joined = b"".join(bytes(p.data) for p in segment.parts if p.data is not None)
        view = memoryview(joined)
        offset = 0
        for part in segment.parts:
            part.data = view[offset:offset + part.size]
            offset += part.size
        segment.data = joined

    @property
    def seq(self) -> int:
        """The oldest ring frame a part still refers to (:class:`RingPin`)."""
        refs = self._refs
        while refs and refs[0].media is None:
            refs.popleft()
        return refs[0].media.first_seq if refs and refs[0].media is not None else NO_SEQ

    def before_lap(self, oldest: int) -> None:
        """The ring's writer is about to overwrite the frames before ``oldest``: the parts that
        refer to them are copied out now (:class:`RingPin`)."""
        refs = self._refs
        lost_msn: int | None = None
        while refs:
            part = refs[0]
            media = part.media
            if media is not None and media.first_seq >= oldest:
                break
            refs.popleft()
            if media is None:
                continue
            data = media.resolve()
            part.media = None
            if data is None:  # never (the frames are intact during the call): not served wrong
                lost_msn = part.msn
                continue
            part.data = data
            self._held_bytes += part.size
            self.parts_copied_out += 1
            self._hot.pop(("part", part.number), None)
        if lost_msn is not None:
            while self.segments and self.segments[0].msn <= lost_msn:
                self.parts_lost += len(self.segments[0].parts)
                self._drop_oldest()
            if not self.segments:  # the open one went too: the next part starts anew
                self._break_pending = True

    def _drop_oldest(self) -> None:
        oldest = self.segments.popleft()
        self._bytes -= oldest.size
        self._held_bytes -= sum(p.size for p in oldest.parts if p.data is not None)
        for part in oldest.parts:
            self._parts_by_number.pop(part.number, None)
            self._hot.pop(("part", part.number), None)
            part.media = None  # (the pin forgets it)
        self._hot.pop(("seg", oldest.msn), None)

    def _evict(self) -> None:
        complete_s = sum(s.duration_s for s in self.segments if s.complete)
        while len(self.segments) > 1 and self.segments[0].complete:
            oldest = self.segments[0]
            too_long = complete_s - oldest.duration_s >= self.window_s
            too_big = self._bytes > self.max_bytes and len(self.segments) > 2
            if not (too_long or too_big):
                break
            self._drop_oldest()
            complete_s -= oldest.duration_s
        live = {s.init_generation for s in self.segments}
        for generation in [g for g in self.inits if g not in live]:
            if generation != self._generation:
                del self.inits[generation]

    # -- reading ---------------------------------------------------------------------------

    @property
    def empty(self) -> bool:
        """True until the first part arrived."""
        return not self.segments

    @property
    def position(self) -> Position:
        """The live edge (the newest segment's MSN and its part count)."""
        if not self.segments:
            return Position(self._next_msn - 1, 0)
        newest = self.segments[-1]
        return Position(newest.msn, len(newest.parts))

    @property
    def next_part_number(self) -> int:
        """The number the next part will get (the preload hint names it)."""
        return self._next_part

    @property
    def first_msn(self) -> int:
        """The oldest segment's MSN (``EXT-X-MEDIA-SEQUENCE``); before the first part, the MSN
        the first segment will get."""
        return self.segments[0].msn if self.segments else self._next_msn

    @property
    def discontinuity_sequence(self) -> int:
        """``EXT-X-DISCONTINUITY-SEQUENCE``: the oldest segment's discontinuity number (its own
        discontinuity, if it has one, is then implied and not tagged again)."""
        return self.segments[0].dsn if self.segments else 0

    @property
    def size(self) -> int:
        """Bytes of media in the window (held, or by reference to the ring)."""
        return self._bytes

    @property
    def held_bytes(self) -> int:
        """Bytes the window holds itself (the rest is in the ring)."""
        return self._held_bytes

    def part_content(self, number: int) -> bytes | memoryview | None:
        """The bytes of part ``number`` (None: not in the window, or lost by the ring)."""
        part = self._parts_by_number.get(number)
        if part is None:
            return None
        if part.data is not None:
            return part.data
        return self._hot_content(("part", number), part.content, HOT_PARTS)

    def segment_content(self, msn: int) -> bytes | memoryview | None:
        """The bytes of complete segment ``msn`` (None: not in the window, or lost)."""
        segment = self.segment(msn)
        if segment is None:
            return None
        if segment.data is not None:
            return segment.data
        return self._hot_content(("seg", msn), segment.content, HOT_SEGMENTS)

    def _hot_content(self, key: tuple[str, int],
                     make: Callable[[], bytes | memoryview | None],
                     keep: int) -> bytes | memoryview | None:
        hot = self._hot
        data = hot.get(key)
        if data is not None:
            hot.move_to_end(key)
            return data
        data = make()
        if data is not None:
            hot[key] = data
            kind = key[0]
            kept = [k for k in hot if k[0] == kind]
            for old in kept[:max(0, len(kept) - keep)]:
                del hot[old]
        return data

    def satisfies(self, msn: int, part: int | None) -> bool:
        """Does the window already hold what a blocking reload for ``msn``/``part`` waits for?

        Without ``part``: segment ``msn`` is complete. With it: part ``part`` of segment ``msn``
        exists, or a later segment has begun (segment ``msn`` ended with fewer parts).
        """
        if not self.segments:
            return False
        newest = self.segments[-1]
        if part is None:
            last_complete = newest.msn if newest.complete else newest.msn - 1
            return msn <= last_complete
        return msn < newest.msn or (msn == newest.msn and part < len(newest.parts))

    def part(self, number: int) -> Part | None:
        """The part with that global number, if still in the window."""
        return self._parts_by_number.get(number)

    def segment(self, msn: int) -> Segment | None:
        """The complete segment ``msn``, if still in the window."""
        if not self.segments:
            return None
        index = msn - self.segments[0].msn
        if 0 <= index < len(self.segments):
            segment = self.segments[index]
            return segment if segment.complete else None
        return None

    def init(self, generation: int) -> bytes | None:
        """The init segment of ``generation``, if any segment in the window still uses it."""
        return self.inits.get(generation)

    def recent_segments(self) -> Sequence[Segment]:
        """All segments, oldest first (the newest may be open)."""
        return self.segments

    def part_lists(self) -> Iterator[tuple[Segment, bool]]:
        """Every segment with whether its parts are listed: those within three target durations
        of the live edge (RFC 8216bis: older parts may be left out of the playlist)."""
        horizon = 3 * self.target_duration
        edge = 0.0
        listed: set[int] = set()
        for segment in reversed(self.segments):
            if edge < horizon:
                listed.add(segment.msn)
            edge += segment.duration_s
        for segment in self.segments:
            yield segment, segment.msn in listed


# Media sequence numbers start from the wall clock (this many per second), not from 0: a
# restarted service then numbers its segments above the previous run's (a player that lives
# through the restart never sees the media sequence go back), and a cache in front, which keys
# blocking reloads on ?_HLS_msn=, cannot answer one with a playlist of the previous run.
MSN_PER_SECOND = 10


def first_msn_for(wall_clock_s: float) -> int:
    """The first media sequence number of a stream started at ``wall_clock_s``."""
    return max(0, int(wall_clock_s * MSN_PER_SECOND))


def nearest_second(duration_s: float) -> int:
    """A duration rounded to the nearest integer as RFC 8216 compares EXTINF with
    TARGETDURATION: halves go up (Python's ``round`` takes 2.5 s to 2, a validator to 3). The
    slack covers float sums of frame durations landing a hair under a half."""
    return math.floor(duration_s + 0.5 + 1e-6)


def target_duration_for(keyframe_interval: int, framerate: int) -> int:
    """``EXT-X-TARGETDURATION`` for a camera with that GOP: the GOP rounded up to seconds."""
    return max(1, math.ceil(keyframe_interval / max(1, framerate) - 1e-9))


@dataclass(frozen=True, slots=True)
class PartLayout:
    """How parts are cut: ``frames`` per part (the segmenter closes a fragment once it holds
    ``fragment_max_s``) and the ``part_target_s`` the playlist advertises as PART-TARGET."""

    frames: int
    fragment_max_s: float
    part_target_s: float


# RFC 8216bis 4.4.4.9: a part lasts at most PART-TARGET and at least this share of it (but for
# INDEPENDENT parts and a segment's final part).
PART_MIN_SHARE = 0.85
# Share of a bound that parts are cut to stay within (frame timing jitters).
LAYOUT_SLACK = 0.98


def layout_fits(layout: PartLayout, framerate: float) -> bool:
    """Would parts cut by ``layout`` at ``framerate`` stay within PART-TARGET and above 85% of
    it (the segmenter closes a part once it holds ``fragment_max_s``)?"""
    fps = max(1.0, framerate)
    frames = max(1, math.ceil(layout.fragment_max_s * fps - 1e-9))
    duration = frames / fps
    return (PART_MIN_SHARE * layout.part_target_s / LAYOUT_SLACK <= duration
            <= layout.part_target_s * LAYOUT_SLACK)


def part_layout(part_duration_s: float, framerate: float) -> PartLayout:
    """Parts for a configured ``part_duration_s`` at ``framerate``.

    Parts are whole frames: as many as fill at most 98% of ``part_duration_s`` (so a late frame,
    or a camera a little slower than measured, does not push a part over PART-TARGET).
    PART-TARGET is then ``part_duration_s`` unless the frames fill less than 85% of it (0.25 s
    at 15 fps is 3 frames, 0.2 s), in which case it shrinks to what those frames fill at 85%
    (with the same 2% to spare), still leaving them room for timing jitter. A camera so slow
    that one frame outlasts ``part_duration_s`` gets parts of one frame and a PART-TARGET 2%
    above it (exactly one frame was refused by :func:`layout_fits`, and the stream then laid
    its parts out anew at every keyframe without end).
    """
    fps = max(1.0, framerate)
    frames = max(1, math.floor(part_duration_s * fps * LAYOUT_SLACK + 1e-9))
    filled = frames / fps
    part_target = min(part_duration_s,
                      math.floor(filled / PART_MIN_SHARE * LAYOUT_SLACK * 1000) / 1000)
    roomy = math.ceil(filled / LAYOUT_SLACK * 1000 - 1e-9) / 1000
    # The segmenter closes a fragment once it holds this much: half a frame short of the part.
    return PartLayout(frames, (frames - 0.5) / fps, max(roomy, part_target))


def fragment_max_for(part_target_s: float, framerate: float) -> float:
    """What to ask of the segmenter so no part outgrows ``part_target_s`` (see
    :func:`part_layout`)."""
    return part_layout(part_target_s, framerate).fragment_max_s
