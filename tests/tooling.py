"""What a test needs from the machine: a tool that must exist, a free loopback port, and a child
process stopped for sure.

Outside CI a missing tool skips the test with the command that installs it; in CI (``CI=true``)
it fails, because CI installs everything through ``scripts/install-system-deps``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess

import pytest

IN_CI = os.environ.get("CI") == "true"


def require_tool(name: str, install_hint: str = "") -> str:
    """Return the path of executable ``name``; skip (or fail in CI) when it is missing."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed" + (f" ({install_hint})" if install_hint else "")
    if IN_CI:
        pytest.fail(message + "; CI must install it via scripts/install-system-deps")
    pytest.skip(message)


def require_root(reason: str) -> None:
    """Skip (or fail in CI, which runs as root) when not root."""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail(f"needs root: {reason}")
        pytest.skip(f"needs root: {reason}")


def free_port(kind: int = socket.SOCK_STREAM, host: str = "127.0.0.1") -> int:
    """A port on ``host`` that is free right now (bound and released)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str],
                 sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> None:
    """Send ``sig`` (a service's orderly stop) and wait ``timeout_s``; SIGKILL if it is still
    there then. A process that has already exited is only reaped."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
