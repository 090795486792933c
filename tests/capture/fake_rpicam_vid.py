"""Stand-in for ``rpicam-vid``: writes a recorded libx264 stream to stdout like the real one.

It accepts (and records) rpicam-vid's arguments, then writes one access unit per frame at the
requested frame rate, each in a single write as ``--flush`` does, looping the recording.
Environment: ``FAKE_RPICAM_STREAM`` (the .h264 to replay), ``FAKE_RPICAM_LOG`` (append argv,
one line per start), ``FAKE_RPICAM_EXIT_AFTER`` (die with status 1 after N frames, mid-frame),
``FAKE_RPICAM_NO_CAMERA`` (``--list-cameras`` reports none).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ruseon_appliance.capture.h264 import AccessUnitSplitter


def main() -> int:
    args = sys.argv[1:]
    if "--list-cameras" in args:
        if os.environ.get("FAKE_RPICAM_NO_CAMERA"):
            print("No cameras available!")
        else:
            print("Available cameras\n-----------------\n0 : imx708 [4608x2592 10-bit RGGB]")
        return 0
    if log := os.environ.get("FAKE_RPICAM_LOG"):
        with open(log, "a") as fh:
            fh.write(" ".join(args) + "\n")
    fps = int(args[args.index("--framerate") + 1]) if "--framerate" in args else 30
    units = AccessUnitSplitter().split_all(Path(os.environ["FAKE_RPICAM_STREAM"]).read_bytes())
    exit_after = int(os.environ.get("FAKE_RPICAM_EXIT_AFTER", "0"))
    print("fake rpicam-vid: camera started", file=sys.stderr, flush=True)
    out = sys.stdout.buffer
    start = time.monotonic()
    n = 0
    while True:
        for data, _ in units:
            delay = start + n / fps - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if exit_after and n == exit_after:
                out.write(data[: len(data) // 2])  # die mid-frame, like a crash would
                out.flush()
                print("fake rpicam-vid: simulated failure", file=sys.stderr, flush=True)
                return 1
            out.write(data)
            out.flush()
            n += 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(0)
