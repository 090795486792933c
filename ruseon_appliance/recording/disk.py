"""The disk side of recording: every file operation runs on one worker thread, in order.

The event loop only hands over whole batches of fragments (large sequential writes, no fsync per
frame). While a segment is open, a batch can ask for ``fdatasync`` after it is written
(``recording.sync_interval_s``: whole fragments become durable every few seconds, so a power cut
loses seconds, not the open segment); a segment is fsynced when it is closed, before it is
renamed to its final name.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .archive import DIR_MODE, FILE_MODE, Segment, fsync_dir, segment_info
from .segment_file import SegmentFormatError

# Errors that mean "the disk cannot take more now" rather than a bug.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def classify(exc: BaseException) -> str:
    """``disk_full``, ``read_only`` or ``error`` for a failed write."""
    code = getattr(exc, "errno", None)
    if code in DISK_FULL_ERRNOS:
        return "disk_full"
    if code in READ_ONLY_ERRNOS:
        return "read_only"
    return "error"


class SegmentFile:
    """The segment being written (``.part``). Its methods run on the disk thread only.

    After a failed write the file is cut back to the last batch that was written whole (each
    batch holds whole fragments), and later writes are skipped, so closing it leaves a valid
    segment with everything written before the failure.
    """

    def __init__(self, part: Path, final: Path) -> None:
        self.part = part
        self.final = final
        self._fd: int | None = None
        self.good = 0  # bytes known written whole
        self.init_size = 0
        self.failed: OSError | None = None
        self.closed = False
        self._dir_synced = False  # the .part's directory entry is durable

    def append(self, data: bytes, *, init: bool = False, sync: bool = False) -> None:
        """Write ``data`` at the end (and with ``sync``, make everything written so far
        durable); raises OSError (once) when the disk refuses it."""
        if self.failed is not None:
            return
        try:
            if self._fd is None:
                self.part.parent.mkdir(DIR_MODE, parents=True, exist_ok=True)
                self._fd = os.open(self.part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                                   FILE_MODE)
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            if sync:
                self._sync(self._fd)
        except OSError as exc:
            self.failed = exc
            if self._fd is not None:
                try:
                    os.ftruncate(self._fd, self.good)
                    os.lseek(self._fd, self.good, os.SEEK_SET)
                except OSError:
                    pass
            raise
        self.good += len(data)
        if init:
            self.init_size = self.good

    def sync(self) -> None:
        """Make what was written so far durable (nothing to do before the first write)."""
        if self._fd is not None:
            self.append(b"", sync=True)

    def _sync(self, fd: int) -> None:
        # fdatasync: the data and the size, not the times (one journal commit, no inode
        # time update). The directory entry of the new .part once, so the file itself is there.
        os.fdatasync(fd)
        if not self._dir_synced:
            fsync_dir(self.part.parent)
            self._dir_synced = True

    def rename(self, part: Path, final: Path) -> bool:
        """Give the segment new names (its start was re-timed): the ``.part`` while it is
        written, the closed file after. True when a file was renamed."""
        renamed = False
        if self._fd is not None:
            os.replace(self.part, part)
            renamed = True
        elif self.closed and self.final.exists():
            os.replace(self.final, final)
            renamed = True
        self.part, self.final = part, final
        if renamed:
            fsync_dir(final.parent)
        return renamed

    def close(self) -> Segment | None:
        """fsync, rename to the final name and index it; None when nothing usable was written."""
        fd, self._fd = self._fd, None
        self.closed = True
        if fd is None:
            return None
        try:
            if self.good <= self.init_size:
                os.close(fd)
                os.unlink(self.part)
                return None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self.part, self.final)
            fsync_dir(self.final.parent)
            return segment_info(self.final)
        except (OSError, SegmentFormatError):
            return None


def unlink_all(paths: list[Path]) -> int:
    """Delete files; return how many were deleted (missing ones are fine)."""
    done = 0
    for path in paths:
        try:
            path.unlink()
            done += 1
        except FileNotFoundError:
            pass
        except OSError:
            continue
    return done


def free_bytes(directory: Path) -> int | None:
    """Bytes available to us on the file system of ``directory``."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_size(directory: Path) -> int:
    """Total bytes of the file system of ``directory`` (0 if unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return 0
    return st.f_blocks * st.f_frsize


def writable(directory: Path, probe_bytes: int) -> bool:
    """Whether ``probe_bytes`` can be written in ``directory`` now (written, then removed)."""
    probe = directory / ".write-probe"
    try:
        directory.mkdir(DIR_MODE, parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            os.write(fd, bytes(probe_bytes))
        finally:
            os.close(fd)
            probe.unlink()
    except OSError:
        return False
    return True
