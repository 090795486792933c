"""``make run`` as a newcomer types it: it prints a URL, and that URL answers HTTP 200."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.tooling import free_port, require_tool

REPO = Path(__file__).resolve().parent.parent
READY = re.compile(r"ready: open (\S+)")


def test_make_run_prints_a_url_that_answers_200(tmp_path: Path) -> None:
    make = require_tool("make")
    http, rtc = free_port(), free_port()
    args = (f"--config /dev/null --http 127.0.0.1:{http} --rtc 127.0.0.1:{rtc} "
            f"--advertise 127.0.0.1 --state-dir {tmp_path} --source synthetic")
    proc = subprocess.Popen(
        [make, "--no-print-directory", "run", f"ARGS={args}"], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    url, seen = None, []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            match = READY.search(line)
            if match:
                url = match.group(1)
        assert url, "no ready line; output was:\n" + "".join(seen)
        assert url == f"http://127.0.0.1:{http}/"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert b"<video" in response.read()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    # SIGTERM shuts the service down cleanly (the log says so last).
    assert "stopped" in rest, rest
