"""One camera's motion events on disk: ``events.jsonl`` (one JSON line per change of an
event; the last line of an id wins) and ``snapshots/<id>.jpg`` (the frame of peak motion), in
the camera's recording folder, so they survive a restart and go with the recordings.

Written from the detector's worker thread, read by the web layer on the event loop: a lock
guards the in-memory index; the file is appended to, and rewritten only when pruned.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

EVENTS_FILE = "events.jsonl"
SNAPSHOTS_DIR = "snapshots"
# At most this many events per camera are kept (the oldest go first), whatever the age.
MAX_EVENTS = 5000
_ID = re.compile(r"^[0-9]{13}-[A-Za-z0-9_-]{1,64}$")


def is_event_id(text: str) -> bool:
    """Whether ``text`` has the shape of an event id (``<start ms>-<camera>``)."""
    return bool(_ID.match(text))


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event as kept and served: wall-clock seconds; ``end`` None while it lasts."""

    id: str
    camera: str
    kind: str
    start: float
    end: float | None
    peak_score: float
    peak_time: float
    zone: str = ""
    snapshot: bool = False

    def to_json(self) -> dict[str, Any]:
        """The ``/api/events`` item (the snapshot URL when there is a picture)."""
        out = asdict(self)
        out["snapshot"] = f"/api/events/{self.id}/snapshot.jpg" if self.snapshot else None
        return out


class EventStore:
    """The events of one camera (``directory``: its recording folder's ``events/``)."""

    def __init__(self, directory: Path, camera: str, *, max_age_s: float = 0.0,
                 max_events: int = MAX_EVENTS, clock: Callable[[], float] = time.time,
                 trusted: Callable[[], bool] = lambda: True) -> None:
        self.directory = directory
        self.camera = camera
        self.max_age_s = max_age_s
        self.max_events = max_events
        self._clock = clock
        # Whether the wall clock is known to be right: ages are judged only then (as the
        # recordings' retention is), or a Pi whose NTP sets its clock 400 days forward would
        # delete every event recorded before.
        self._trusted = trusted
        self._lock = threading.Lock()
        self._events: dict[str, StoredEvent] = {}
        self._lines = 0
        self.write_errors = 0
        self.pruned = 0

    @property
    def path(self) -> Path:
        """The events file."""
        return self.directory / EVENTS_FILE

    def snapshot_path(self, event_id: str) -> Path:
        """Where the event's JPEG is kept."""
        return self.directory / SNAPSHOTS_DIR / f"{event_id}.jpg"

    def load(self) -> int:
        """Read the file (blocking); a torn last line (a power cut) is skipped. Returns the
        number of events."""
        events: dict[str, StoredEvent] = {}
        lines = 0
        with contextlib.suppress(FileNotFoundError), self.path.open(encoding="utf-8") as f:
            for line in f:
                lines += 1
                try:
                    item = json.loads(line)
                    event = StoredEvent(**item)
                except (ValueError, TypeError):
                    continue
                events[event.id] = event
        with self._lock:
            self._events = dict(sorted(events.items(), key=lambda kv: kv[1].start))
            self._lines = lines
        return len(events)

    def put(self, event: StoredEvent, jpeg: bytes | None = None) -> None:
        """Add or update ``event`` (blocking: the worker thread), with its snapshot."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if jpeg:
                target = self.snapshot_path(event.id)
                target.parent.mkdir(exist_ok=True)
                partial = target.with_suffix(".part")
                partial.write_bytes(jpeg)
                os.replace(partial, target)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(asdict(event), separators=(",", ":")) + "\n")
        except OSError as exc:
            self.write_errors += 1
            log.warning("camera %s: motion event %s not saved: %s", self.camera, event.id, exc)
        with self._lock:
            self._events[event.id] = event
            self._lines += 1
            due = (len(self._events) > self.max_events or self._lines > 2 * self.max_events
                   or (event.end is not None and self.max_age_s > 0))
        if due:
            self.prune()

    def prune(self) -> int:
        """Drop events older than ``max_age_s`` (ended before it) and beyond ``max_events``,
        with their snapshots; rewrite the file when anything went or it holds stale lines."""
        cutoff = (self._clock() - self.max_age_s
                  if self.max_age_s > 0 and self._trusted() else None)
        with self._lock:
            kept = [e for e in self._events.values()
                    if cutoff is None or e.end is None or e.end >= cutoff]
            kept = kept[-self.max_events:]
            kept_ids = {e.id for e in kept}
            gone = [i for i in self._events if i not in kept_ids]
            if not gone and self._lines <= len(self._events) + self.max_events:
                return 0
            self._events = {e.id: e for e in kept}
            self._lines = len(kept)
            text = "".join(json.dumps(asdict(e), separators=(",", ":")) + "\n" for e in kept)
        try:
            partial = self.path.with_suffix(".part")
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, self.path)
        except OSError as exc:
            self.write_errors += 1
            log.warning("camera %s: motion events not pruned: %s", self.camera, exc)
        for event_id in gone:
            with contextlib.suppress(OSError):
                self.snapshot_path(event_id).unlink()
        self.pruned += len(gone)
        return len(gone)

    def get(self, event_id: str) -> StoredEvent | None:
        """The event with that id, or None."""
        with self._lock:
            return self._events.get(event_id)

    def query(self, *, since: float | None = None, until: float | None = None
              ) -> list[StoredEvent]:
        """Events overlapping [since, until] (either open), oldest first."""
        with self._lock:
            events = list(self._events.values())
        return [e for e in events
                if (since is None or (e.end if e.end is not None else float("inf")) >= since)
                and (until is None or e.start <= until)]

    def windows(self, start_us: int, end_us: int, *, before_s: float = 0.0,
                after_s: float = 0.0) -> list[tuple[int, int]]:
        """The events' spans widened by ``before_s``/``after_s`` (a recording's pre- and
        post-roll), in wall µs, merged where they overlap, clipped to ``[start_us, end_us)``;
        an event that lasts reaches to ``end_us``."""
        before, after = round(before_s * 1e6), round(after_s * 1e6)
        spans: list[tuple[int, int]] = []
        with self._lock:
            events = list(self._events.values())
        for e in events:  # in start order
            lo = round(e.start * 1e6) - before
            hi = end_us if e.end is None else round(e.end * 1e6) + after
            lo, hi = max(lo, start_us), min(hi, end_us)
            if hi <= lo:
                continue
            if spans and lo <= spans[-1][1]:
                spans[-1] = (spans[-1][0], max(spans[-1][1], hi))
            else:
                spans.append((lo, hi))
        return spans

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)
