"""``ruseon serve`` as a real subprocess, for tests that must kill it like a power cut."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.tooling import free_port


class ApplianceProcess:
    """A synthetic-camera appliance on loopback; its output goes to ``log``."""

    def __init__(self, state_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self.http = free_port()
        self.args = args
        self.env = {**os.environ, "RUSEON_CAMERA_WIDTH": "320", "RUSEON_CAMERA_HEIGHT": "240",
                    **(env or {})}
        self.log = state_dir / "appliance.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    def start(self, timeout: float = 90.0) -> None:
        """Start and wait for the ready line."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # The log is appended to across restarts: only this run's lines count, or a restart would
        # "see" the previous run's ready line and return while the new process is starting.
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ruseon_appliance", "serve", "--config", "/dev/null",
             "--http", f"127.0.0.1:{self.http}", "--rtc", "127.0.0.1:0",
             "--advertise", "127.0.0.1", "--state-dir", str(self.state_dir),
             "--source", "synthetic", *self.args],
            stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b"ready: open" in self.log.read_bytes()[self._log_start:]:
                return
            if self.proc.poll() is not None:
                raise AssertionError("the appliance exited:\n" + self.output())
            time.sleep(0.1)
        raise AssertionError("the appliance did not become ready:\n" + self.output())

    def output(self) -> str:
        """Everything it printed so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` and reap it."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
                raise AssertionError(f"the appliance ignored signal {sig} for 60 s:\n"
                                     + self.output()[-4000:]) from None
