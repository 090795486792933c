"""What making the open segment durable every ``recording.sync_interval_s`` costs the disk
(SD-card wear): the same real-time recording with each interval, counted three ways.

- ``syncs``: fdatasync calls while segments were open (the recorder's counter);
- ``proc_write_bytes``: this process's ``write_bytes`` in ``/proc/self/io`` (bytes of page cache
  it dirtied: a partial last page made durable and then written again counts twice);
- ``device_write_bytes`` (with ``--device``, root): sectors written to a loop device holding a
  fresh ext4 (``/sys/block/loopN/stat``), after a final ``sync``: data, metadata and the
  journal's commits, what a card actually receives.

The ring is fed in real time (30 fps) from bench/recording.py's cached libx264 streams for
``--seconds``; the recorder writes to a temporary directory (or the loop device's ext4). Figures
per hour are the window's scaled by 3600 / seconds.

    .venv/bin/python bench/recording_sync.py --seconds 60              # page-cache figures
    sudo .venv/bin/python bench/recording_sync.py --seconds 60 --device  # + device writes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from recording import FPS, PROFILES, stream  # noqa: E402  (bench/recording.py)

from ruseon_appliance.capture.access_unit import AccessUnit  # noqa: E402
from ruseon_appliance.capture.ring import RingBuffer  # noqa: E402
from ruseon_appliance.recording import Recorder, RecorderSettings  # noqa: E402


def proc_write_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("no write_bytes in /proc/self/io")


def sectors_written(device: str) -> int:
    # Field 7 of /sys/block/DEV/stat: sectors written (512 bytes each).
    return int(Path(f"/sys/block/{Path(device).name}/stat").read_text().split()[6])


@contextlib.contextmanager
def loop_ext4(work: Path, size_mib: int = 1024) -> Iterator[tuple[Path, str]]:
    """A fresh ext4 on a loop device (default mount options: data=ordered, commit=5)."""
    image, mount = work / "ext4.img", work / "mnt"
    with image.open("wb") as f:
        f.truncate(size_mib << 20)
    # Inode tables and journal written now, not by ext4lazyinit during the measurement.
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                    str(image)], check=True)
    device = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True,
                            text=True, check=True).stdout.strip()
    mount.mkdir()
    try:
        subprocess.run(["mount", device, str(mount)], check=True)
        try:
            yield mount, device
        finally:
            subprocess.run(["umount", str(mount)], check=True)
    finally:
        subprocess.run(["losetup", "-d", device], check=True)


async def record(units: list[tuple[bytes, bool]], seconds: float, directory: Path,
                 sync_interval_s: float, device: str | None) -> dict[str, Any]:
    ring = RingBuffer(32 * 1024 * 1024, 2048)
    recorder = Recorder(RecorderSettings(directory=directory, continuous=True,
                                         sync_interval_s=sync_interval_s), ring)
    await recorder.start()
    os.sync()
    io0 = proc_write_bytes()
    dev0 = sectors_written(device) if device else 0
    tick = 90_000 // FPS
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < seconds:
        data, key = units[i % len(units)]
        ring.write(AccessUnit(data, i * tick, key, time.time_ns() // 1000))
        i += 1
        await asyncio.sleep(max(0.0, start + i / FPS - time.monotonic()))
    await recorder.end()  # the open segment closed (fsync), inside the window
    os.sync()  # what is still dirty reaches the device, for both settings alike
    wall = time.monotonic() - start
    out: dict[str, Any] = {
        "sync_interval_s": sync_interval_s, "seconds": round(wall, 1),
        "syncs": recorder.syncs, "segments_closed": recorder.segments_closed,
        "recorded_bytes": recorder.bytes_written, "writes": recorder.writes,
        "proc_write_bytes": proc_write_bytes() - io0,
    }
    out["proc_overhead_bytes"] = out["proc_write_bytes"] - out["recorded_bytes"]
    if device:
        out["device_write_bytes"] = (sectors_written(device) - dev0) * 512
        out["device_overhead_bytes"] = out["device_write_bytes"] - out["recorded_bytes"]
    await recorder.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--intervals", default="0,5", help="sync_interval_s values (a,b,...)")
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument("--device", action="store_true",
                        help="record onto a fresh ext4 on a loop device and count its writes "
                             "(root)")
    args = parser.parse_args()
    for name in args.profiles.split(","):
        units = stream(*PROFILES[name])
        rows = []
        for interval in (float(x) for x in args.intervals.split(",")):
            with tempfile.TemporaryDirectory(dir=ROOT / ".cache") as tmp:
                if args.device:
                    with loop_ext4(Path(tmp)) as (mount, device):
                        row = asyncio.run(record(units, args.seconds, mount / "rec", interval,
                                                 device))
                else:
                    row = asyncio.run(record(units, args.seconds, Path(tmp) / "rec", interval,
                                             None))
            scale = 3600 / row["seconds"]
            row.update({f"{key}_per_hour": round(row[key] * scale) for key in (
                "syncs", "recorded_bytes", "proc_write_bytes", "device_write_bytes",
                "proc_overhead_bytes", "device_overhead_bytes") if key in row})
            rows.append(row)
            print(json.dumps({"figure": "recording_sync", "stream": name, **row}), flush=True)
        # Beyond the recorded bytes themselves (the same media at every setting).
        for row in rows:
            for key in ("proc_overhead_bytes_per_hour", "device_overhead_bytes_per_hour"):
                if key in row:
                    share = 100 * row[key] / row["recorded_bytes_per_hour"]
                    print(f"{name}: sync_interval_s {row['sync_interval_s']:g}: {key} "
                          f"{row[key] / 1e6:.2f} MB/h = {share:.2f} "
                          f"% of {row['recorded_bytes_per_hour'] / 1e6:.0f} MB/h recorded, "
                          f"{row['syncs_per_hour']} fdatasync/h", flush=True)


if __name__ == "__main__":
    main()
