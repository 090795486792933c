"""Memory benchmark: server RSS per viewer on the fan-out path, and no growth under churn.

The same server and viewer workers as ``bench/fanout.py`` (recorded 720p30 2 Mbit/s stream,
real aiortc viewers in worker processes that drop what they receive). The server's RSS is read
from its own ``/proc/self/status`` after a ``gc.collect()``:

- with 0, 10, 30 and 100 viewers connected (``--quick``: 0, 10, 30), and the increase per
  additional viewer (goal: at most 1 MiB);
- around ``--cycles`` join/leave cycles (default 1,000, in batches of 20): RSS after the first
  100 cycles (warm: caches, arenas and pools filled) against RSS after all of them.

    .venv/bin/python bench/memory.py [--quick] [--cycles 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fanout import Server, Viewers, churn, recorded_stream


def settle(server: Server, seconds: float = 2.0) -> int:
    time.sleep(seconds)
    return int(server.stats(collect=True)["rss_kib"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="0, 10, 30 viewers")
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=20)
    args = parser.parse_args()
    recorded_stream()
    counts = [10, 30] if args.quick else [10, 30, 100]

    server = Server("fanout", max_viewers=250)
    try:
        base = settle(server)
        rows = [{"viewers": 0, "rss_kib": base}]
        print(f"viewers=0   RSS {base / 1024:7.1f} MiB", flush=True)
        print(json.dumps({"figure": "rss", "viewers": 0, "rss_kib": base}), flush=True)
        for n in counts:
            group = Viewers(server.url, n)
            try:
                rss = settle(server, 3.0)
                connected = server.stats()["connected"]
            finally:
                group.close()
            per = (rss - base) / n / 1024
            rows.append({"viewers": n, "rss_kib": rss})
            print(f"viewers={n:<3} RSS {rss / 1024:7.1f} MiB  (+{per:.3f} MiB per viewer, "
                  f"{connected} connected)", flush=True)
            print(json.dumps({"figure": "rss", "viewers": n, "rss_kib": rss,
                              "mib_per_viewer": round(per, 3), "connected": connected}),
                  flush=True)
            time.sleep(1.0)

        warm_cycles = min(100, args.cycles)
        churn(server.url, warm_cycles, args.batch)
        warm = settle(server)
        churn(server.url, args.cycles - warm_cycles, args.batch)
        after = settle(server)
        left = server.stats()["sessions"]
        growth = (after - warm) / 1024
        print(f"join/leave: RSS {warm / 1024:.1f} MiB after {warm_cycles} cycles, "
              f"{after / 1024:.1f} MiB after {args.cycles} ({growth:+.1f} MiB), "
              f"{left} sessions left", flush=True)
        print(json.dumps({"figure": "churn", "cycles": args.cycles, "warm_cycles": warm_cycles,
                          "rss_warm_kib": warm, "rss_after_kib": after,
                          "growth_mib": round(growth, 2), "sessions_left": left}), flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
