"""``ruseon serve`` ends promptly on SIGTERM at every phase (a hang check, not a timing test).

A real subprocess gets SIGTERM:
- during start-up while the camera source is stuck in a blocking open (a FIFO nobody writes, as
  a hung camera driver or network file would be): the signal cancels the start, and the
  executor thread that can never finish is left behind: the process ends at the hard bound
  and names what was still running;
- during start-up of a synthetic camera, as soon as capture starts;
- while running with recording, HLS, a relay and an MQTT broker that accepts TCP and never
  answers: a clean stop, exit status 0.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.tooling import free_port

# Far above the appliance's own bound (SHUTDOWN_HARD_S = 15 s after the signal): only a hang
# (the process ignoring SIGTERM) fails this, never a slow machine.
EXIT_BOUND_S = 45.0


@contextmanager
def appliance(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``ruseon serve`` on loopback in its own process group; killed for good at the end."""
    state = tmp_path / "state"
    log = tmp_path / "appliance.log"
    env = {**os.environ, "RUSEON_CAMERA_WIDTH": "320", "RUSEON_CAMERA_HEIGHT": "240"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ruseon_appliance", "serve", "--config", "/dev/null",
             "--http", f"127.0.0.1:{free_port()}", "--rtc", "127.0.0.1:0",
             "--advertise", "127.0.0.1", "--state-dir", str(state), *args],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def wait_for_line(proc: subprocess.Popen[bytes], log: Path, text: str,
                  timeout: float = 120.0) -> None:
    """Wait until ``text`` is in the log (the appliance must still be running)."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"the appliance exited:\n{log.read_text(errors='replace')}"
        assert time.monotonic() < deadline, f"no {text!r}:\n{log.read_text(errors='replace')}"
        time.sleep(0.05)


def terminate(proc: subprocess.Popen[bytes], log: Path) -> int:
    """SIGTERM to the process group; its exit status, or a failure naming the hang."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ruseon serve ignored SIGTERM for {EXIT_BOUND_S:.0f} s:\n"
                    + log.read_text(errors="replace")[-4000:])


def test_sigterm_while_the_camera_source_blocks_start_up(tmp_path: Path) -> None:
    fifo = tmp_path / "camera.h264"
    os.mkfifo(fifo)  # opening it blocks until a writer comes: never
    with appliance(tmp_path, "--source", f"file:{fifo}") as (proc, log):
        wait_for_line(proc, log, "capture starting")
        time.sleep(0.5)  # into the blocking open
        status = terminate(proc, log)
        output = log.read_text(errors="replace")
        assert "during start-up" in output, output
        # The stuck thread cannot be stopped: the hard bound ended the process and said why.
        assert status == 1 and "exiting without a clean stop" in output, output
        assert "read_annex_b_units" in output, output  # its stack was logged


def test_sigterm_as_capture_starts(tmp_path: Path) -> None:
    with appliance(tmp_path, "--source", "synthetic") as (proc, log):
        wait_for_line(proc, log, "capture starting")
        status = terminate(proc, log)
        output = log.read_text(errors="replace")
        assert status == 0 and "stopped" in output, output
        assert "Traceback" not in output, output


def test_sigterm_while_running_with_everything_and_a_silent_broker(tmp_path: Path) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # accepts TCP (the kernel does) and never answers
        with appliance(tmp_path, "--source", "synthetic",
                       "--mqtt", f"mqtt://127.0.0.1:{silent.getsockname()[1]}",
                       "--record-dir", str(tmp_path / "recordings"),
                       "--relay", f"rtp://127.0.0.1:{free_port()}") as (proc, log):
            wait_for_line(proc, log, "ready: open")
            time.sleep(1.0)  # MQTT is waiting for its CONNACK, the recorder is writing
            status = terminate(proc, log)
            output = log.read_text(errors="replace")
            assert status == 0 and "event=stopped" in output, output
            assert "Traceback" not in output, output
