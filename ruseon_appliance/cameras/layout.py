"""Where each camera keeps its files, the same for every camera, and the one-time move of an
archive and controls file made by the single-camera layout.

Every camera has ``<recording.dir>/cameras/<name>/`` for its segments and
``<state.dir>/cameras/<name>/`` for its saved controls. Before there were several cameras the
one camera kept both at the top (``<recording.dir>/*.mp4``, ``<state.dir>/camera-controls.json``),
and later the first camera kept doing so while the others got the ``cameras/<name>/`` folders.
:func:`migrate_top_level` moves what such a layout left at the top into the folder of the camera
that made it (the first listed: the one that always had the top), once, by renaming (the same
file system: nothing is copied, nothing can be half-moved); it runs at every start and finds
nothing to do after the first.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..capture.controls import CONTROLS_FILE
from ..recording.archive import (
    DIR_MODE,
    OPEN_SUFFIX,
    SEGMENT_SUFFIX,
    SET_ASIDE_DIR,
    TRIM_SUFFIX,
    fsync_dir,
    parse_segment_name,
)

log = logging.getLogger(__name__)

CAMERAS_DIR = "cameras"
# A segment's file names: closed, being written, a cut in progress.
_SEGMENT_SUFFIXES = (OPEN_SUFFIX, TRIM_SUFFIX, SEGMENT_SUFFIX)


def camera_dir(root: Path, name: str) -> Path:
    """A camera's own folder under ``root`` (the archive or the state directory)."""
    return root / CAMERAS_DIR / name


def _is_segment(name: str) -> bool:
    for suffix in _SEGMENT_SUFFIXES:
        if name.endswith(suffix):
            return parse_segment_name(name.removesuffix(suffix)) is not None
    return False


@dataclass
class Migration:
    """What :func:`migrate_top_level` moved, and what it left because its place was taken."""

    moved: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def _move(source: Path, target: Path, result: Migration) -> None:
    if target.exists():
        # Never overwrite: two files of one name are two recordings of one moment, or a
        # controls file the camera already has; the old one stays where it was, said once.
        result.left.append(str(source))
        return
    target.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.rename(source, target)
    result.moved.append(str(source))


def migrate_top_level(archive: Path, state: Path, camera: str) -> Migration:
    """Move the single-camera layout's segments (with their set-aside folder) and controls
    file into ``camera``'s folders; blocking (a start-up step, before anything records)."""
    result = Migration()
    if archive.is_dir():
        target = camera_dir(archive, camera)
        for path in sorted(archive.iterdir()):
            if path.is_file() and _is_segment(path.name):
                _move(path, target / path.name, result)
        aside = archive / SET_ASIDE_DIR
        if aside.is_dir():
            for path in sorted(aside.iterdir()):
                if path.is_file():
                    _move(path, target / SET_ASIDE_DIR / path.name, result)
            if not any(aside.iterdir()):
                aside.rmdir()
        if result.moved:
            fsync_dir(target)
            fsync_dir(archive)
    controls = state / CONTROLS_FILE
    if controls.is_file():
        _move(controls, camera_dir(state, camera) / CONTROLS_FILE, result)
    if result.moved:
        log.info("moved %d files of the single-camera layout into camera %s's folders "
                 "(%s/, %s/)", len(result.moved), camera, camera_dir(archive, camera),
                 camera_dir(state, camera), extra={"EVENT": "layout_migrated", "CAMERA": camera})
    if result.left:
        log.warning("left %d files of the single-camera layout where they are: camera %s "
                    "already has files of the same names (%s)", len(result.left), camera,
                    ", ".join(result.left[:3]), extra={"EVENT": "layout_conflict"})
    return result
