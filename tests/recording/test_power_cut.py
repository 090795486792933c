"""A power cut while recording, without a VM: ``ruseon serve`` records onto an ext4 of its own
(a loop device), the file system is cut off the way a power cut does it, and the service is
killed with SIGKILL; mounted again (journal replay) and started again, the open segment is
repaired and keeps all but the last ``sync_interval_s`` (and a fragment).

The cut is ext4's shutdown ioctl with ``EXT4_GOING_FLAGS_NOLOGFLUSH`` (what xfstests uses for
its crash tests): from that moment nothing reaches the device, neither the page cache's dirty
data nor the journal, so what the next mount finds is what was durable at the cut. A plain
``kill -9`` would lose nothing written (the page cache outlives the process) and could not show
whether the recorder made anything durable.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import random
import signal
import struct
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from ruseon_appliance.cameras.layout import camera_dir
from tests.e2e.test_recording_faults import Serve
from tests.segmenter.stream import ffmpeg_errors, probe_frames
from tests.tooling import require_root, require_tool

FS_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
GOING_FLAGS_NOLOGFLUSH = 2  # flush neither the data nor the journal: a power cut
SEGMENT_S = 40  # longer than any cut moment below: the cut is always inside the open segment
FRAGMENT_S = 1.0  # the recorder's fragments (recording/recorder.py FRAGMENT_S)
# Scheduling on a shared 2-core machine between a fragment's arrival and its fdatasync.
SLACK_S = 1.5


@contextlib.contextmanager
def ext4_on_loop(work: Path, size_mib: int = 256) -> Iterator[tuple[Path, str]]:
    require_root("mounts an ext4 on a loop device")
    for tool, package in (("losetup", "mount"), ("mkfs.ext4", "e2fsprogs"), ("mount", "mount")):
        require_tool(tool, f"apt-get install {package}")
    image, mount = work / "ext4.img", work / "mnt"
    with image.open("wb") as f:
        f.truncate(size_mib << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    device = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True,
                            text=True, check=True).stdout.strip()
    mount.mkdir()
    try:
        subprocess.run(["mount", device, str(mount)], check=True)
        yield mount, device
    finally:
        subprocess.run(["umount", str(mount)], check=False, capture_output=True)
        # The device can still be busy for a moment after the unmount.
        for _ in range(50):
            if subprocess.run(["losetup", "-d", device], check=False,
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)


def power_cut(mount: Path) -> None:
    """Nothing more reaches the device from this moment on (ext4 shutdown, no flush)."""
    fd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_SHUTDOWN, struct.pack("I", GOING_FLAGS_NOLOGFLUSH))
    finally:
        os.close(fd)


def name_start(name: str) -> dt.datetime:
    stamp = name.removesuffix(".mp4.part").removesuffix(".mp4").removesuffix("~uncertain")
    return dt.datetime.strptime(stamp, "%Y-%m-%d_%H-%M-%S-%f").replace(tzinfo=dt.UTC)


def test_a_power_cut_loses_at_most_the_sync_interval_of_the_open_segment(
        tmp_path: Path) -> None:
    with ext4_on_loop(tmp_path) as (mount, device):
        record_dir = mount / "rec"
        serve = Serve(tmp_path, record_dir, RUSEON_RECORDING_SEGMENT_S=str(SEGMENT_S))
        serve.start()
        try:
            state = serve.wait("recording", lambda s: s["state"] == "recording")
            interval = float(state["sync_interval_s"])
            assert interval > 0, state
            began = time.monotonic()
            # A random moment well past the first sync, inside the first (open) segment.
            age = random.uniform(interval + 4, min(SEGMENT_S - 5, interval + 14))
            serve.wait("the open segment's age", lambda s: time.monotonic() - began >= age,
                       timeout=age + 30)
            syncs = serve.json("/api/recording")["syncs_total"]
            power_cut(mount)
            cut_at = dt.datetime.now(dt.UTC)
        finally:
            serve.stop(signal.SIGKILL)
        print(f"\n[power-cut] cut {age:.1f} s into the recording, sync_interval_s {interval:g}, "
              f"{syncs} fdatasync calls before it")
        assert syncs >= 1
        subprocess.run(["umount", str(mount)], check=True)
        subprocess.run(["mount", device, str(mount)], check=True)  # the journal is replayed
        segments = camera_dir(record_dir, "cam")  # the one camera's folder, as every camera's
        parts = sorted(segments.glob("*.mp4.part"))
        assert len(parts) == 1 and not list(segments.glob("*.mp4")), list(segments.iterdir())

        again = Serve(tmp_path, record_dir, RUSEON_RECORDING_SEGMENT_S=str(SEGMENT_S))
        again.start()  # READY
        try:
            state = again.json("/api/recording")
            assert (state["segments_repaired_total"], state["segments_set_aside_total"]) == (1, 0)
            repaired = segments / parts[0].name.removesuffix(".part")
            assert repaired.exists() and ffmpeg_errors(repaired) == ""
            frames = probe_frames(repaired)
            fps = (len(frames) - 1) / (frames[-1][1] - frames[0][1])
            end = name_start(repaired.name) + dt.timedelta(
                seconds=frames[-1][1] - frames[0][1] + 1 / fps)
            lost = (cut_at - end).total_seconds()
            print(f"[power-cut] the repaired segment ends {lost:.2f} s before the cut "
                  f"({len(frames)} frames kept)")
            assert -0.5 <= lost <= interval + FRAGMENT_S + SLACK_S, (lost, interval)
            # Listed, and clip-able to its end.
            ranges = again.json("/recordings/list")
            start = name_start(repaired.name)
            assert any(dt.datetime.fromisoformat(r["start"]) <= start + dt.timedelta(seconds=1)
                       and dt.datetime.fromisoformat(r["start"])
                       + dt.timedelta(seconds=r["duration"]) >= end - dt.timedelta(seconds=1)
                       for r in ranges), (start, end, ranges)
            clip_start = (end - dt.timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            status, body = again.get("/recordings/get?" + urllib.parse.urlencode(
                {"start": clip_start, "duration": "2"}))
            assert status == 200, body[:300]
            clip = tmp_path / "clip.mp4"
            clip.write_bytes(body)
            assert ffmpeg_errors(clip) == "" and len(probe_frames(clip)) >= 15
        finally:
            again.stop()
