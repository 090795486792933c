"""Preparation steps that ``scripts/test`` runs in the background while pytest runs.

The arm64 image (``tests/prepare.d/image-arm64``) is about ten minutes of mostly single-threaded
qemu emulation; run before pytest it doubled the suite's time on a 2-core machine. A
``tests/prepare.d`` script with the line ``# run: background`` is started by ``scripts/test`` in
its own process group, its output goes to ``artifacts/prepare/NAME.log`` and, when it ends, its
exit status to ``NAME.rc``; ``$TEST_BACKGROUND_PREPARE`` tells pytest that directory.

Tests that need such a step carry ``@pytest.mark.background_prepare("NAME")``. ``tests/conftest.py``
runs them last, and before each one (outside its pytest-timeout, so the wait does not eat the
test's own budget) waits for the step to end. :func:`failure` is then the reason the step did not
succeed, with the tail of its log, for the test to fail with: a broken preparation is never a
silent skip. ``scripts/test`` also fails the run itself when a background step failed, and kills
the step's process group when pytest ends early or is interrupted.

Without ``$TEST_BACKGROUND_PREPARE`` (plain ``pytest``) nothing waits: the tests find the cached
layers or not, as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

ENV = "TEST_BACKGROUND_PREPARE"
# CI's hard limit is 90 minutes; a step still running after an hour of waiting is stuck.
WAIT_LIMIT_S = 3600.0
LOG_TAIL_LINES = 60


def status_dir() -> Path | None:
    """Where scripts/test keeps the background steps' logs and exit statuses (None: no step)."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


def _paths(name: str) -> tuple[Path, Path, Path] | None:
    """(started marker, exit status, log) of step ``name``; None when it was not started."""
    directory = status_dir()
    if directory is None or not (directory / f"{name}.started").exists():
        return None
    return directory / f"{name}.started", directory / f"{name}.rc", directory / f"{name}.log"


def exit_status(name: str) -> int | None:
    """The step's exit status, or None while it runs (or when it was never started)."""
    paths = _paths(name)
    if paths is None:
        return None
    try:
        return int(paths[1].read_text().strip())
    except (OSError, ValueError):
        return None


def wait(name: str, report: Callable[[str], None], limit: float = WAIT_LIMIT_S) -> None:
    """Block until step ``name`` has ended (or ``limit`` seconds passed); no-op if not started."""
    paths = _paths(name)
    if paths is None or exit_status(name) is not None:
        return
    log = paths[2]
    report(f"waiting for the background preparation {name} (log: {log})")
    began = time.monotonic()
    while exit_status(name) is None and time.monotonic() - began < limit:
        time.sleep(1)
    status = exit_status(name)
    report(f"background preparation {name}: "
           + (f"exit {status}" if status is not None else "still running")
           + f" after waiting {time.monotonic() - began:.0f} s")


def failure(name: str) -> str | None:
    """Why step ``name`` did not succeed, with its log's tail; None if it succeeded or was not
    started by scripts/test (then the test checks its cached layers as usual)."""
    paths = _paths(name)
    if paths is None:
        return None
    status = exit_status(name)
    if status == 0:
        return None
    what = (f"exited with status {status}" if status is not None
            else f"was still running after {WAIT_LIMIT_S:.0f} s of waiting")
    try:
        lines = paths[2].read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError as exc:
        lines = [f"(no log: {exc})"]
    return (f"the background preparation tests/prepare.d/{name} {what}; "
            f"last lines of {paths[2]}:\n" + "\n".join(lines))
