"""A camera's motion settings as changed at run time (the page's tuner and zone editor,
``PATCH /api/camera/<camera>/motion``, Home Assistant's switch and number): detection on or
off, the sensitivity and the zones, kept in ``<state.dir>/cameras/<name>/motion.json`` (0600)
so that a restart keeps them; loaded at start over the configuration's values. A key that
is absent keeps the configuration's value.

Written like the camera controls' file (capture/controls.py ``ControlsFile``): atomically
(temporary file, fsync, rename) in a worker thread, the newest values only (a burst of
changes costs at most two writes), never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .zones import Zone, zone_to_json, zones_from_json

log = logging.getLogger(__name__)

MOTION_FILE = "motion.json"


@dataclass(frozen=True, slots=True)
class SavedMotion:
    """What the file holds; None: not saved (the configuration's value stands)."""

    enabled: bool | None = None
    sensitivity: int | None = None
    zones: tuple[Zone, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """The file's document."""
        out: dict[str, Any] = {}
        if self.enabled is not None:
            out["enabled"] = self.enabled
        if self.sensitivity is not None:
            out["sensitivity"] = self.sensitivity
        if self.zones is not None:
            out["zones"] = [zone_to_json(z) for z in self.zones]
        return out


def parse_saved(document: Any) -> SavedMotion:
    """The file's document, checked (ValueError with the reason)."""
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    enabled = document.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise ValueError(f"enabled = {enabled!r}")
    sensitivity = document.get("sensitivity")
    if sensitivity is not None and (isinstance(sensitivity, bool)
                                    or not isinstance(sensitivity, int)
                                    or not 0 <= sensitivity <= 100):
        raise ValueError(f"sensitivity = {sensitivity!r}")
    zones = document.get("zones")
    return SavedMotion(enabled, sensitivity,
                       zones_from_json(zones) if zones is not None else None)


class MotionFile:
    """``motion.json`` of one camera."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: SavedMotion | None = None
        self._task: asyncio.Task[None] | None = None
        self.writes = 0
        self.write_errors = 0

    def load(self) -> SavedMotion:
        """What was saved (blocking); nothing saved, or a file that does not parse (said
        once, and left for a person to look at until the next change replaces it): empty."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return SavedMotion()
        except OSError as exc:
            log.warning("cannot read the saved motion settings %s: %s", self.path, exc)
            return SavedMotion()
        try:
            return parse_saved(json.loads(text))
        except ValueError as exc:
            log.warning("the saved motion settings %s are not valid (%s); the configuration's "
                        "values stand", self.path, exc)
            return SavedMotion()

    def save(self, saved: SavedMotion) -> None:
        """Write ``saved`` soon (off the loop; the newest values win); at once without a
        running loop."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.write(saved)
            return
        self._pending = saved
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain(), name="motion-settings-save")

    async def flush(self) -> None:
        """Wait until everything handed over is on disk (shutdown, tests)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        while self._pending is not None:
            saved, self._pending = self._pending, None
            await asyncio.to_thread(self.write, saved)

    def write(self, saved: SavedMotion) -> None:
        """Write atomically; a failure is a warning (the settings still apply until a
        restart)."""
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(saved.to_json(), fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            self.writes += 1
        except OSError as exc:
            self.write_errors += 1
            log.warning("cannot save the motion settings to %s: %s", self.path, exc)
