"""Soak benchmark: many real join/leave cycles against one server, with checkpoints.

Each cycle is a real aiortc viewer (in worker processes) doing the whole WHEP life: POST offer,
ICE, DTLS, the first RTP packet received, then DELETE and close. ``--batch`` viewers join at a
time per worker (two workers), so several handshakes always overlap. The server is the same
one ``bench/fanout.py`` and ``bench/memory.py`` run (fan-out send path, recorded 720p30 stream).

At every ``--checkpoint`` cycles the server is asked, after a ``gc.collect()``, for its RSS,
the C heap in use, Python's allocated blocks, its asyncio tasks, its sessions, mux routes and
tracked sources, and the census of live engine-side objects (peer connections, transports,
ICE/SRTP/OpenSSL objects, sessions, cursors); its open file descriptors and threads are read
from ``/proc/<pid>``. Goal: flat after warm-up (the first checkpoint).

    nice .venv/bin/python bench/soak.py [--cycles 10000] [--checkpoint 500] [--batch 10]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fanout import Server, churn, recorded_stream
from memory import inspect


def process_counts(pid: int) -> dict[str, int]:
    """Open file descriptors and threads of process ``pid``."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            threads = int(line.split()[1])
    return {"fds": fds, "threads": threads}


def checkpoint(server: Server, cycles: int, started: float) -> dict[str, Any]:
    """One reading of everything the soak watches."""
    time.sleep(2.0)  # let the last sessions' closes finish
    stats = inspect(server)
    alive = {k: v for k, v in stats.get("objects", {}).items() if v and k != "Task"}
    row = {"figure": "soak_checkpoint", "cycles": cycles,
           "elapsed_s": round(time.monotonic() - started, 1),
           "rss_kib": stats["rss_kib"], "malloc_in_use_kib": stats["malloc_in_use_kib"],
           "python_blocks": stats["python_blocks"], "tasks": stats.get("tasks"),
           "sessions": stats["sessions"], "mux": stats.get("mux"),
           "offers_accepted": stats.get("offers_accepted"),
           "sessions_ended": stats.get("sessions_ended"),
           "engine_objects_alive": alive, **process_counts(server.proc.pid)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--checkpoint", type=int, default=500)
    parser.add_argument("--batch", type=int, default=10,
                        help="viewers joining at once per worker (two workers)")
    args = parser.parse_args()
    recorded_stream()
    server = Server("fanout", max_viewers=250)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    try:
        rows.append(checkpoint(server, 0, started))
        done = 0
        while done < args.cycles:
            step = min(args.checkpoint, args.cycles - done)
            churn(server.url, step, args.batch)
            done += step
            rows.append(checkpoint(server, done, started))
            r = rows[-1]
            print(f"cycles={done:<6} {r['elapsed_s']:7.0f} s  RSS {r['rss_kib'] / 1024:6.1f} MiB  "
                  f"malloc {r['malloc_in_use_kib'] / 1024:5.1f} MiB  blocks "
                  f"{r['python_blocks']:>8}  fds {r['fds']:>3}  threads {r['threads']:>2}  "
                  f"tasks {r['tasks']}  sessions {r['sessions']}  answered "
                  f"{r['offers_accepted']}  ended {r['sessions_ended']}  mux {r['mux']}  "
                  f"engine objects alive {r['engine_objects_alive'] or 'none'}", flush=True)
            print(json.dumps(r), flush=True)
    finally:
        server.close()
    if len(rows) >= 3:
        warm, last = rows[1], rows[-1]
        summary = {"figure": "soak", "cycles": last["cycles"], "warm_cycles": warm["cycles"],
                   "seconds": last["elapsed_s"],
                   "rss_growth_after_warm_mib": round(
                       (last["rss_kib"] - warm["rss_kib"]) / 1024, 2),
                   "malloc_growth_after_warm_mib": round(
                       (last["malloc_in_use_kib"] - warm["malloc_in_use_kib"]) / 1024, 2),
                   "python_blocks_growth_after_warm": last["python_blocks"] - warm["python_blocks"],
                   "fds": [warm["fds"], last["fds"]], "threads": [warm["threads"], last["threads"]],
                   "tasks": [warm["tasks"], last["tasks"]],
                   "engine_objects_alive": last["engine_objects_alive"],
                   "sessions_left": last["sessions"],
                   "offers_accepted": last["offers_accepted"],
                   "sessions_ended": last["sessions_ended"]}
        print(f"soak: {summary['cycles']} cycles in {summary['seconds']:.0f} s; after warm-up "
              f"({warm['cycles']} cycles) RSS {summary['rss_growth_after_warm_mib']:+.2f} MiB, "
              f"malloc {summary['malloc_growth_after_warm_mib']:+.2f} MiB, Python blocks "
              f"{summary['python_blocks_growth_after_warm']:+d}, fds {warm['fds']}->{last['fds']}, "
              f"threads {warm['threads']}->{last['threads']}, tasks {warm['tasks']}->"
              f"{last['tasks']}, engine objects alive: {last['engine_objects_alive'] or 'none'}",
              flush=True)
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
