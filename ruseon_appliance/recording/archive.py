"""The archive on disk: one fMP4 file per segment, named by its start time, indexed in memory.

``2026-11-30_20-45-01-123456.mp4`` starts at that UTC wall-clock time (the capture time of its
first frame). ``...~uncertain.mp4`` was recorded while the clock was not known to be right (never
synchronized, or behind what was already recorded: it is then placed after the archive's end,
keeping the order); the recorder renames it with its corrected start when the clock is set.
The segment being written is ``<name>.mp4.part`` and becomes ``<name>.mp4`` when it
is closed (fsynced, then renamed), so a closed segment is never written to again. At start-up the
index is rebuilt from the files: a ``.part`` left by a crash or power loss is cut back to its last
complete fragment and closed, or moved to ``set-aside/`` when nothing in it is usable.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime as dt
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .segment_file import FragmentIndex, SegmentFormatError, read_segment

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".mp4"
OPEN_SUFFIX = ".mp4.part"
SET_ASIDE_DIR = "set-aside"
TRIM_SUFFIX = ".mp4.trim"  # a cut in progress; removed at start-up if a crash left one
_NAME_FORMAT = "%Y-%m-%d_%H-%M-%S-%f"
# What a camera saw is private: segments are the service user's alone, whatever the umask
# (the systemd unit sets 0077, but `ruseon serve --record-dir` from a shell usually has 0022).
FILE_MODE = 0o600
DIR_MODE = 0o700
UNCERTAIN_MARK = "~uncertain"
# Two segments whose ends are closer than this belong to one continuous range.
CONTIGUOUS_TOLERANCE_US = 1_000_000


def segment_name(start_us: int, uncertain: bool = False) -> str:
    """The file name (without suffix) of a segment starting at ``start_us`` (UTC µs)."""
    when = dt.datetime.fromtimestamp(start_us // 1_000_000, tz=dt.UTC)
    name = when.replace(microsecond=start_us % 1_000_000).strftime(_NAME_FORMAT)
    return name + UNCERTAIN_MARK if uncertain else name


def parse_segment_name(name: str) -> int | None:
    """The start time in µs encoded in ``name`` (suffix removed), or None if it is not ours."""
    name = name.removesuffix(UNCERTAIN_MARK)
    try:
        when = dt.datetime.strptime(name, _NAME_FORMAT).replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    return int(when.timestamp()) * 1_000_000 + when.microsecond


def rfc3339(us: int) -> str:
    """``us`` (UTC µs) as RFC 3339 with microseconds and a ``Z``."""
    when = dt.datetime.fromtimestamp(us // 1_000_000, tz=dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S") + f".{us % 1_000_000:06d}Z"


@dataclass(slots=True)
class Segment:
    """One segment file: where it is, when it starts, how long and how big it is."""

    path: Path
    start_us: int
    duration_us: int
    size: int
    open: bool = False
    uncertain: bool = False  # recorded while the clock was not known to be right
    # The monotonic µs of its first frame, for a segment recorded since this start-up: its age
    # is then measured on the monotonic clock, whatever the wall clock did.
    mono_start_us: int | None = None

    @property
    def end_us(self) -> int:
        """When its last frame ends."""
        return self.start_us + self.duration_us

    def __lt__(self, other: Segment) -> bool:
        return self.start_us < other.start_us


def segment_info(path: Path) -> Segment:
    """Index ``path`` (a closed segment); raises OSError or SegmentFormatError."""
    name = path.name.removesuffix(OPEN_SUFFIX).removesuffix(SEGMENT_SUFFIX)
    start = parse_segment_name(name)
    if start is None:
        raise SegmentFormatError(f"{path.name} is not a segment name")
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        index = read_segment(f, size)
    return Segment(path, start, index.duration * 1_000_000 // index.timescale, size,
                   uncertain=name.endswith(UNCERTAIN_MARK))


@dataclass
class ScanReport:
    """What rebuilding the index found."""

    segments: list[Segment] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)


class Archive:
    """The in-memory index of closed segments in one directory, oldest first.

    Blocking methods (:meth:`scan`, :meth:`repair`) touch the disk: call them off the event loop.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.segments: list[Segment] = []

    # -- rebuilding ------------------------------------------------------------------------

    def scan(self) -> ScanReport:
        """Rebuild the index from the files; repair or set aside what a crash left behind."""
        report = ScanReport()
        if not self.directory.is_dir():
            self.segments = []
            return report  # created with the first segment
        for entry in sorted(self.directory.iterdir()):
            if not entry.is_file():
                continue
            if entry.name.endswith(TRIM_SUFFIX):
                entry.unlink(missing_ok=True)  # the original is still there, whole
                continue
            if entry.name.endswith(OPEN_SUFFIX):
                segment = self.repair(entry, report)
            elif entry.name.endswith(SEGMENT_SUFFIX):
                try:
                    segment = segment_info(entry)
                except (OSError, SegmentFormatError) as exc:
                    self._set_aside(entry, f"unreadable ({exc})", report)
                    continue
                if segment.duration_us == 0:
                    self._set_aside(entry, "no complete fragment", report)
                    continue
            else:
                continue
            if segment is not None:
                report.segments.append(segment)
        self.segments = sorted(report.segments)
        return report

    def repair(self, path: Path, report: ScanReport) -> Segment | None:
        """Cut an unfinished segment back to its last complete fragment and close it."""
        final = path.with_name(path.name.removesuffix(OPEN_SUFFIX) + SEGMENT_SUFFIX)
        try:
            with path.open("r+b") as f:
                size = os.fstat(f.fileno()).st_size
                index = read_segment(f, size)
                if not index.fragments:
                    raise SegmentFormatError("no complete fragment")
                if index.valid_end < size:
                    f.truncate(index.valid_end)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path, final)
            fsync_dir(self.directory)
            segment = segment_info(final)
        except (OSError, SegmentFormatError) as exc:
            self._set_aside(path, str(exc), report)
            return None
        report.repaired.append(final.name)
        log.warning("recording: repaired %s (cut %d bytes of an unfinished fragment)",
                    final.name, size - index.valid_end,
                    extra={"EVENT": "recording_repaired", "SEGMENT": final.name})
        return segment

    def _set_aside(self, path: Path, reason: str, report: ScanReport) -> None:
        target = self.directory / SET_ASIDE_DIR
        try:
            target.mkdir(DIR_MODE, exist_ok=True)
            os.replace(path, target / path.name)
        except OSError as exc:
            log.error("recording: cannot set %s aside: %s", path.name, exc)
        report.set_aside.append(path.name)
        log.warning("recording: set %s aside (%s)", path.name, reason,
                    extra={"EVENT": "recording_set_aside", "SEGMENT": path.name})

    # -- the index -------------------------------------------------------------------------

    def add(self, segment: Segment) -> None:
        """Insert a newly closed segment."""
        bisect.insort(self.segments, segment)

    def resort(self) -> None:
        """Order again after segments were re-timed."""
        self.segments.sort()

    @property
    def end_us(self) -> int:
        """Where the newest closed segment ends (0 when there is none)."""
        return max((s.end_us for s in self.segments), default=0)

    def forget(self, segments: list[Segment]) -> None:
        """Drop segments from the index (their files are deleted separately)."""
        gone = {id(s) for s in segments}
        self.segments = [s for s in self.segments if id(s) not in gone]

    @property
    def total_bytes(self) -> int:
        """Bytes of all closed segments."""
        return sum(s.size for s in self.segments)

    def with_open(self, current: Segment | None) -> list[Segment]:
        """The closed segments plus the one being written (if it has media yet)."""
        if current is None or current.duration_us <= 0:
            return list(self.segments)
        return [*self.segments, current]

    def ranges(self, current: Segment | None = None) -> list[tuple[int, int]]:
        """Continuous recorded ranges ``(start_us, end_us)``; a gap splits them."""
        return [(lo, hi) for lo, hi, _ in self.timed_ranges(current)]

    def timed_ranges(self, current: Segment | None = None) -> list[tuple[int, int, bool]]:
        """``(start_us, end_us, uncertain)``: a gap, or a change between trusted and uncertain
        time, splits them."""
        out: list[tuple[int, int, bool]] = []
        for s in self.with_open(current):
            if out and s.uncertain == out[-1][2] and (
                    s.start_us - out[-1][1] <= CONTIGUOUS_TOLERANCE_US):
                out[-1] = (out[-1][0], max(out[-1][1], s.end_us), s.uncertain)
            else:
                out.append((s.start_us, s.end_us, s.uncertain))
        return out

    def overlapping(self, start_us: int, end_us: int,
                    current: Segment | None = None) -> list[Segment]:
        """Segments with media in ``[start_us, end_us)``, oldest first."""
        return [s for s in self.with_open(current) if s.start_us < end_us and s.end_us > start_us]

    def expired(self, *, max_bytes: int, max_age_us: int, age_us: Callable[[Segment], int | None],
                open_bytes: int = 0, kept_longer: Callable[[Segment], bool] | None = None,
                longer_age_us: int = 0) -> list[Segment]:
        """Closed segments retention removes now: oldest first, until the archive (with the
        open segment's ``open_bytes``) fits ``max_bytes``, and every one older than the age.

        ``age_us(segment)`` is how long ago it ended, or None when that cannot be trusted (it
        then never expires by age): a wall clock that stepped must not make anything "old".
        A segment ``kept_longer`` says holds an event (motion) expires by age only after
        ``longer_age_us`` (Frigate's tiers); the size bound takes the oldest either way.
        """
        out: list[Segment] = []
        total = self.total_bytes + open_bytes
        for s in self.segments:
            too_big = max_bytes > 0 and total > max_bytes
            if not too_big:
                age = age_us(s) if max_age_us > 0 else None
                if age is None or age <= max_age_us:
                    break  # newer ones are younger (or as untrusted)
                if kept_longer is not None and age <= longer_age_us and kept_longer(s):
                    continue  # an event's footage, within its own age
            out.append(s)
            total -= s.size
        return out


def fsync_dir(directory: Path) -> None:
    """Make a rename durable (the directory entry, not only the file)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)




def cut_segment(segment: Segment, start_us: int, end_us: int) -> list[Segment]:
    """Remove ``[start_us, end_us)`` from a closed segment, at fragment boundaries; blocking.

    What stays is the fragments wholly before ``start_us`` (kept under the original name) and
    those from the first independent fragment at or after ``end_us`` (a new segment named by its
    start). Each part is written beside the original as ``.mp4.trim``, fsynced, then renamed; the
    original is replaced last, so a crash leaves the original or its parts, never neither.
    """
    with segment.path.open("rb") as f:
        index = read_segment(f, os.fstat(f.fileno()).st_size)
        first = index.first_decode_time
        ts = index.timescale

        def at(decode_time: int) -> int:
            return segment.start_us + (decode_time - first) * 1_000_000 // ts

        head = [x for x in index.fragments if at(x.decode_time + x.duration) <= start_us]
        tail_from = next((i for i, x in enumerate(index.fragments)
                          if at(x.decode_time) >= end_us and x.sync and x.sync[0]), None)
        tail = list(index.fragments[tail_from:]) if tail_from is not None else []

        def write(name: str, fragments: list[FragmentIndex]) -> Path:
            tmp = segment.path.with_name(name + TRIM_SUFFIX)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
            with os.fdopen(fd, "wb") as out:
                out.write(index.init)
                f.seek(fragments[0].offset)
                left = fragments[-1].end - fragments[0].offset
                while left:
                    chunk = f.read(min(left, 1024 * 1024))
                    if not chunk:
                        raise OSError("the segment ended early")
                    out.write(chunk)
                    left -= len(chunk)
                out.flush()
                os.fsync(out.fileno())
            return tmp

        base = segment.path.name.removesuffix(SEGMENT_SUFFIX)
        tail_tmp = (write(segment_name(at(tail[0].decode_time), segment.uncertain), tail)
                    if tail else None)
        head_tmp = write(base, head) if head else None
    made: list[Path] = []
    if tail_tmp is not None:
        final = tail_tmp.with_name(tail_tmp.name.removesuffix(TRIM_SUFFIX) + SEGMENT_SUFFIX)
        os.replace(tail_tmp, final)
        made.append(final)
    if head_tmp is not None:
        os.replace(head_tmp, segment.path)
        made.insert(0, segment.path)
    else:
        segment.path.unlink(missing_ok=True)
    fsync_dir(segment.path.parent)
    return [segment_info(p) for p in made]
