"""The archive survives a wrong clock: a real ``ruseon serve`` (synthetic camera, continuous
recording, 2 s segments, default retention) whose wall clock is stepped while it records.

The time shim is PyPI ``libfaketime`` 3.0.1's vendored ``libfaketime.so.1`` (Debian's faketime
breaks ``time.sleep``): the service reads its offset from a file once a second
(``FAKETIME_CACHE_DURATION``), monotonic time stays real, so writing ``-400d`` then ``+0`` steps
the running process's wall clock. Not on every call (``FAKETIME_NO_CACHE``): the shim parses the
file into globals without a lock, and with several threads reading the time about one read in a
thousand came back as the real time (measured: isolated single reads), and now and then a torn
parse made the shim exit the process. Whether the system calls the clock synchronized comes
from a flag file (``recording.clock_sync_file``), created when the "NTP" step is made.

Each scenario: nothing is deleted, the ranges of ``/recordings/list`` are disjoint and ordered,
and every range's clip decodes silently with non-decreasing timestamps (ffmpeg/ffprobe).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ruseon_appliance.cameras.layout import camera_dir
from tests.e2e.test_recording_faults import Serve
from tests.segmenter.stream import ffmpeg_errors, probe_frames
from tests.tooling import require_tool

TOKEN = "clock-test-token"
RETENTION_H = 168  # the default


def _faketime_library() -> Path:
    try:
        import libfaketime  # type: ignore[import-untyped]
    except ImportError:
        pytest.fail("PyPI libfaketime==3.0.1 is a dev dependency: pip install -e '.[dev]'")
    path = Path(libfaketime.__file__).parent / "vendor/libfaketime/src/libfaketime.so.1"
    assert path.is_file(), path
    return path


class ClockedServe(Serve):
    """``ruseon serve`` under the time shim, with a token and a sync flag file."""

    def __init__(self, tmp: Path, offset: str, *, synchronized: bool) -> None:
        self.offset_file = tmp / "faketime-offset"
        self.flag = tmp / "synchronized"
        self.set_clock(offset, synchronized=synchronized)
        super().__init__(tmp, tmp / "rec", **{
            "LD_PRELOAD": str(_faketime_library()),
            "FAKETIME_TIMESTAMP_FILE": str(self.offset_file),
            "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "RUSEON_AUTH_TOKEN": TOKEN,
            "RUSEON_RECORDING_CLOCK_SYNC_FILE": str(self.flag),
            "RUSEON_RECORDING_CONTINUOUS": "true",
            "RUSEON_RECORDING_MAX_AGE_HOURS": str(RETENTION_H),
        })

    def set_clock(self, offset: str, *, synchronized: bool) -> None:
        self.offset_file.write_text(offset + "\n")
        if synchronized:
            self.flag.touch()
        else:
            self.flag.unlink(missing_ok=True)

    def get(self, path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path,
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def closed_at_least(self, n: int, timeout: float = 60) -> dict[str, Any]:
        return self.wait(f"{n} segments closed",
                         lambda s: s["segments_closed_total"] >= n, timeout)


def _parse(text: str) -> int:
    return round(dt.datetime.fromisoformat(text).timestamp() * 1_000_000)


def check_archive(serve: ClockedServe, tmp: Path, *, segments_before: int) -> list[dict[str, Any]]:
    """Nothing deleted, disjoint ordered ranges, every clip clean; returns the ranges."""
    state = serve.json("/api/recording")
    assert state["segments_deleted_total"] == 0, state
    assert not [line for line in serve.output if "deleting" in line], serve.output
    assert state["segments"] >= segments_before, (state["segments"], segments_before)
    ranges = serve.json("/recordings/list")
    assert ranges, state
    bounds = [(_parse(r["start"]), _parse(r["start"]) + round(r["duration"] * 1e6))
              for r in ranges]
    for (lo, hi), (next_lo, _) in itertools.pairwise(bounds):
        assert lo < hi <= next_lo, ("ranges overlap or are out of order", ranges)
    for i, r in enumerate(ranges):
        query = urllib.parse.urlencode({"start": r["start"], "duration": f"{r['duration']:.6f}"})
        status, body = serve.get(f"/recordings/get?{query}")
        assert status == 200, (status, body[:300], r)
        clip = tmp / f"clip-{i}.mp4"
        clip.write_bytes(body)
        assert ffmpeg_errors(clip) == "", (r, ffmpeg_errors(clip))
        times = [t for _, t in probe_frames(clip)]
        assert times and all(b >= a for a, b in itertools.pairwise(times)), r
    return ranges


def _recorded_seconds(ranges: list[dict[str, Any]]) -> float:
    return sum(r["duration"] for r in ranges)


@pytest.fixture(autouse=True)
def _tools() -> None:
    require_tool("ffmpeg", "apt-get install ffmpeg")


def _segments_dir(tmp: Path) -> Path:
    """The one camera's folder in the archive (every camera records into its own)."""
    return camera_dir(tmp / "rec", "cam")


def _closed_files(tmp: Path) -> list[Path]:
    return sorted(_segments_dir(tmp).glob("*.mp4"))


def test_clock_400_days_behind_then_set(tmp_path: Path) -> None:
    first = ClockedServe(tmp_path, "+0", synchronized=True)
    first.start()
    try:
        first.closed_at_least(2)
    finally:
        first.stop()
    before = len(_closed_files(tmp_path))
    serve = ClockedServe(tmp_path, "-400d", synchronized=False)
    serve.start()
    try:
        state = serve.closed_at_least(3)
        assert state["clock"]["state"] == "uncertain", state["clock"]
        # Behind the archive: the new segments were placed after it, marked uncertain.
        assert state["segments_uncertain"] >= 3, state
        serve.set_clock("+0", synchronized=True)  # NTP answers
        state = serve.wait("the step seen", lambda s: s["clock"]["steps_total"] >= 1)
        assert state["clock"]["state"] == "synchronized", state["clock"]
        assert state["clock"]["last_step"]["by_s"] > 399 * 86400, state["clock"]
        closed = state["segments_closed_total"]
        serve.closed_at_least(closed + 2)
        # Past the retention round (every 10 s) after the step.
        serve.wait("a retention round after the step",
                   lambda s: s["clock"]["last_step"]["ago_s"] > 11, timeout=30)
        state = serve.wait("every segment re-timed", lambda s: s["segments_uncertain"] == 0)
        ranges = check_archive(serve, tmp_path, segments_before=before + 5)
        # Re-timed to the real time: nothing is 400 days old, nothing is "time uncertain".
        now = time.time()
        for r in ranges:
            assert abs(_parse(r["start"]) / 1e6 - now) < 3600, r
            assert "time_uncertain" not in r, r
        assert state["segments_retimed_total"] >= 3, state
        status, metrics = serve.get("/metrics")
        assert status == 200
        text = metrics.decode()
        assert "ruseon_clock_synchronized 1.0" in text and "ruseon_clock_steps_total 1.0" in text
        steps = [line for line in serve.output if "clock stepped" in line]
        assert sum("clock stepped by +400 d" in line for line in steps) == 1, steps
    finally:
        serve.stop()
    assert not list(_segments_dir(tmp_path).glob("*~uncertain*")), _closed_files(tmp_path)


def test_power_cut_with_the_clock_behind_the_archive(tmp_path: Path) -> None:
    first = ClockedServe(tmp_path, "+0", synchronized=True)
    first.start()
    try:
        first.closed_at_least(3)
        archive_end = max(_parse(r["start"]) + round(r["duration"] * 1e6)
                          for r in first.json("/recordings/list"))
    finally:
        first.stop(signal.SIGKILL)  # a power cut: the open segment is left as .part
    # Back with the clock at least 15 s behind the archive's end (no RTC), not synchronized.
    serve = ClockedServe(tmp_path, "-25s", synchronized=False)
    serve.start()
    try:
        state = serve.json("/api/recording")
        before = state["segments"]
        state = serve.closed_at_least(3)
        assert state["segments_uncertain"] >= 3, state
        ranges = check_archive(serve, tmp_path, segments_before=before + 3)
        newest = serve.json("/recordings/list")[-1]
        assert _parse(newest["start"]) >= archive_end - 1_000_000, (newest, archive_end)
        serve.set_clock("+0", synchronized=True)
        state = serve.wait("the step seen", lambda s: s["clock"]["steps_total"] >= 1)
        serve.closed_at_least(state["segments_closed_total"] + 2)
        state = serve.wait("re-timed", lambda s: s["segments_uncertain"] == 0)
        ranges = check_archive(serve, tmp_path, segments_before=before + 5)
        assert _recorded_seconds(ranges) >= 10, ranges
    finally:
        serve.stop()


def test_a_clock_that_is_never_set(tmp_path: Path) -> None:
    first = ClockedServe(tmp_path, "+0", synchronized=True)
    first.start()
    try:
        first.closed_at_least(2)
        archive_end = max(_parse(r["start"]) + round(r["duration"] * 1e6)
                          for r in first.json("/recordings/list"))
    finally:
        first.stop()
    before = len(_closed_files(tmp_path))
    for _run in range(2):  # never set, across a restart too
        serve = ClockedServe(tmp_path, "-400d", synchronized=False)
        serve.start()
        try:
            state = serve.closed_at_least(3)
            assert state["clock"]["state"] == "uncertain", state["clock"]
            assert state["clock"]["steps_total"] == 0, state["clock"]
            ranges = check_archive(serve, tmp_path, segments_before=before + 3)
            # The trusted first run, then the uncertain ones after it, in order.
            assert "time_uncertain" not in ranges[0], ranges
            assert ranges[-1].get("time_uncertain") is True, ranges
            assert _parse(ranges[-1]["start"]) >= archive_end, (ranges, archive_end)
            status, body = serve.get("/api/status")
            assert status == 200 and json.loads(body)["clock"]["synchronized"] is False
        finally:
            serve.stop()
        before = len(_closed_files(tmp_path))
