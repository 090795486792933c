"""Recording under faults, with a real ``ruseon serve``: ``kill -9`` mid-segment, and a full disk
(a tiny tmpfs). Closed segments survive untouched and stay clip-able; the open one is repaired;
a full disk stops recording with a clear status while the live view keeps playing, and
recording resumes by itself once there is room again."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aioice.ice
import pytest

from ruseon_appliance.cameras.layout import camera_dir
from tests.e2e.whep_viewer import watch
from tests.segmenter.stream import ffmpeg_errors, probe_frames
from tests.tooling import free_port, require_root, require_tool, stop_process

REPO = Path(__file__).resolve().parents[2]


class Serve:
    """``python -m ruseon_appliance serve --record-dir DIR`` with a small synthetic camera."""

    def __init__(self, tmp: Path, record_dir: Path, **env: str) -> None:
        self.http = free_port()
        self.url = f"http://127.0.0.1:{self.http}"
        self.command = [
            sys.executable, "-m", "ruseon_appliance", "serve", "--config", "/dev/null",
            "--source", "synthetic", "--http", f"127.0.0.1:{self.http}",
            "--rtc", f"127.0.0.1:{free_port(kind=2)}", "--advertise", "127.0.0.1",
            "--state-dir", str(tmp / "state"), "--record-dir", str(record_dir),
        ]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RUSEON_")}
        self.env.update({"RUSEON_CAMERA_WIDTH": "320", "RUSEON_CAMERA_HEIGHT": "240",
                         "RUSEON_CAMERA_KEYFRAME_INTERVAL": "30",
                         "RUSEON_RECORDING_SEGMENT_S": "2", **env})
        self.output: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        ready = threading.Event()
        self.proc = subprocess.Popen(self.command, cwd=REPO, env=self.env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

        def pump(proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.output.append(line)
                if "ready: open" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=pump, args=(self.proc,), daemon=True).start()
        if not ready.wait(90) or self.proc.poll() is not None:
            self.stop()
            raise AssertionError("ruseon serve did not get ready:\n" + "".join(self.output))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        stop_process(self.proc, sig)
        self.proc = None

    def get(self, path: str) -> tuple[int, bytes]:
        """GET with the admin secret the service made in its state dir (/metrics and the
        status details are admin)."""
        secret = (Path(self.command[self.command.index("--state-dir") + 1])
                  / "admin-secret").read_text().strip()
        request = urllib.request.Request(self.url + path,
                                         headers={"Authorization": f"Bearer {secret}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)

    def wait(self, what: str, check: Callable[[dict[str, Any]], bool],
             timeout: float = 90) -> dict[str, Any]:
        """Poll /api/recording until ``check``; the timeout only stops a broken run."""
        deadline = time.monotonic() + timeout
        while True:
            state: dict[str, Any] = self.json("/api/recording")
            if check(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"never reached: {what}; last {state}\n"
                                     + "".join(self.output[-30:]))
            time.sleep(0.25)


@contextlib.contextmanager
def serving(tmp: Path, record_dir: Path, **env: str) -> Iterator[Serve]:
    serve = Serve(tmp, record_dir, **{"RUSEON_RECORDING_SEGMENT_S": "4", **env})
    serve.start()
    try:
        yield serve
    finally:
        serve.stop()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_kill_9_mid_segment_keeps_closed_segments_and_repairs_the_open_one(
        tmp_path: Path) -> None:
    record_dir = tmp_path / "rec"
    segments = camera_dir(record_dir, "cam")  # the one camera's folder, as every camera's
    # 4 s segments: the open one gets its first batch (2 s flush interval) well before it ends.
    serve = Serve(tmp_path, record_dir, RUSEON_RECORDING_SEGMENT_S="4")
    serve.start()
    try:
        serve.wait("two closed segments and data in the open one",
                   lambda s: s["segments_closed_total"] >= 2
                   and any(segments.glob("*.mp4.part"))
                   and all(p.stat().st_size > 2000 for p in segments.glob("*.mp4.part")))
    finally:
        serve.stop(signal.SIGKILL)
    closed = {p.name: digest(p) for p in segments.glob("*.mp4")}
    parts = list(segments.glob("*.mp4.part"))
    assert len(closed) >= 2 and len(parts) == 1
    with serving(tmp_path, record_dir) as again:
        state = again.json("/api/recording")
        assert state["segments_repaired_total"] + state["segments_set_aside_total"] == 1
        assert any("recording: repaired" in line or "recording: set " in line
                   for line in again.output)
        # Closed segments were not touched, and each one is listed and clip-able.
        for name, sha in closed.items():
            assert digest(segments / name) == sha, name
        ranges = again.json("/recordings/list")
        for name in sorted(closed):
            stamp = name.removesuffix(".mp4")
            start = f"{stamp[:10]}T{stamp[11:13]}:{stamp[14:16]}:{stamp[17:19]}.{stamp[20:]}Z"
            at = dt.datetime.fromisoformat(start)
            assert any(dt.datetime.fromisoformat(r["start"]) <= at
                       < dt.datetime.fromisoformat(r["start"]) + dt.timedelta(seconds=r["duration"])
                       for r in ranges), (start, ranges)
            status, body = again.get("/recordings/get?" + urllib.parse.urlencode(
                {"start": start, "duration": "1.5"}))
            assert status == 200, (name, body[:200])
            clip = tmp_path / f"{stamp}.mp4"
            clip.write_bytes(body)
            assert ffmpeg_errors(clip) == ""
            frames = probe_frames(clip)
            assert frames[0][0] and len(frames) >= 30
        repaired = segments / (parts[0].name.removesuffix(".part"))
        if state["segments_repaired_total"]:
            assert repaired.exists() and ffmpeg_errors(repaired) == ""


def test_a_full_disk_stops_recording_clearly_live_continues_and_recording_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_root("mounts a small tmpfs")
    mount = require_tool("mount", "apt-get install mount")
    umount = require_tool("umount", "apt-get install mount")
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run([mount, "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(small)],
                   check=True)
    try:
        with serving(tmp_path, small, RUSEON_CAMERA_BITRATE="1500000") as serve:
            full = serve.wait("the disk is full", lambda s: s["state"] == "disk_full")
            assert "full" in full["reason"] and full["write_errors_total"] >= 1
            assert any("recording stopped: the disk is full" in line for line in serve.output)
            _, metrics = serve.get("/metrics")
            # prometheus-client writes every value as a float ("1.0").
            assert re.search(rb'\nruseon_recording_states\{key="disk_full"\} 1(\.0)?\n', metrics)
            status = serve.json("/api/status")
            assert status["recording"]["state"] == "disk_full"
            # The live view does not notice: a real WHEP viewer decodes frames now.
            width, height, _ = asyncio.run(watch(serve.url, frames=15))
            assert (width, height) == (320, 240)
            assert serve.get("/healthz")[0] == 200
            # What was written before the disk filled is closed and valid.
            closed = sorted(camera_dir(small, "cam").glob("*.mp4"))
            assert closed and not list(camera_dir(small, "cam").glob("*.mp4.part"))
            for f in closed:
                assert ffmpeg_errors(f) == ""
            # Make room: recording comes back by itself.
            for f in closed:
                f.unlink()
            back = serve.wait("recording resumed",
                              lambda s: s["state"] == "recording" and s["resumed_total"] >= 1)
            assert back["reason"] is None
            assert any("recording resumed" in line for line in serve.output)
    finally:
        subprocess.run([umount, str(small)], check=False)
