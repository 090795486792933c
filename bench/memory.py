"""Memory benchmark: server RSS per viewer on the fan-out path, and no growth under churn.

The same server and viewer workers as ``bench/fanout.py`` (recorded 720p30 2 Mbit/s stream,
real aiortc viewers in worker processes that drop what they receive). The server's RSS is read
from its own ``/proc/self/status`` after a ``gc.collect()``:

- with 0, 10, 30 and 100 viewers connected (``--quick``: 0, 10, 30), and the increase per
  additional viewer (goal: at most 1 MiB);
- around ``--cycles`` join/leave cycles (default 1,000, in batches of 20), with a checkpoint
  every ``--checkpoint`` cycles: RSS after the first 100 cycles (warm: caches, arenas and pools
  filled) against RSS after all of them, and beside RSS what RSS is made of, so allocator
  noise is not mistaken for a leak: the C heap glibc has handed out and not had back
  (``mallinfo2``), Python's allocated memory blocks, and the count of live engine-side objects
  (peer connections, transports, ICE and SRTP sessions, OpenSSL connections, sessions, ring
  cursors, tasks...), which must return to zero. At the end the heap is trimmed
  (``malloc_trim``) and RSS read again: what remains is memory actually in use.

    .venv/bin/python bench/memory.py [--quick] [--cycles 1000]

``--serve`` measures the real ``ruseon serve --source file:`` instead (the whole appliance:
web, HLS, recorder, default config, no viewers): RSS at ``--at`` seconds after start (default
8 and 45: fresh, and once the ring has wrapped and the HLS window is full), with the largest
mappings from ``/proc/PID/smaps``; ``--baseline DIR`` serves another checkout in the same run.

    .venv/bin/python bench/memory.py --serve --baseline /tmp/base-tree
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fanout import Server, Viewers, churn, recorded_stream


def settle(server: Server, seconds: float = 2.0) -> int:
    time.sleep(seconds)
    return int(server.stats(collect=True)["rss_kib"])


def inspect(server: Server, *, trim: bool = False, collect: bool = True) -> dict[str, Any]:
    """RSS and what it is made of, after a collection (and a heap trim if ``trim``); with
    ``collect=False`` as it is, no collection (and no object census, which collects)."""
    query = ("/stats?gc=1&objects=1" if collect else "/stats?") + ("&trim=1" if trim else "")
    with urllib.request.urlopen(server.url + query) as r:
        stats: dict[str, Any] = json.loads(r.read())
    return stats


def smaps_top(pid: int, count: int = 8) -> list[tuple[str, int]]:
    """The ``count`` largest mappings of a process by RSS (KiB), by file name or kind."""
    sizes: dict[str, int] = {}
    name = ""
    with open(f"/proc/{pid}/smaps") as fh:
        for line in fh:
            first = line.split(maxsplit=6)
            if "-" in first[0] and len(first) >= 5 and ":" in first[3]:
                name = first[5].strip().rsplit("/", 1)[-1] if len(first) > 5 else "[anon]"
            elif first[0] == "Rss:":
                sizes[name] = sizes.get(name, 0) + int(first[1])
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:count]


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def serve_rss(tree: Path, at: list[float]) -> list[dict[str, Any]]:
    """RSS of ``ruseon serve --source file:`` from ``tree`` at each of ``at`` seconds."""
    import subprocess
    import tempfile

    from fanout import free_port

    state = tempfile.mkdtemp()
    config = Path(state) / "empty.toml"
    config.write_text("")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ruseon_appliance", "serve", "--config", str(config),
         "--source", f"file:{recorded_stream()}", "--http", f"127.0.0.1:{free_port()}",
         "--rtc", "127.0.0.1:0", "--advertise", "127.0.0.1", "--state-dir", state,
         "--log-level", "warning"], cwd=tree, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    started = time.monotonic()
    rows = []
    try:
        for seconds in at:
            time.sleep(max(0.0, started + seconds - time.monotonic()))
            if proc.poll() is not None:
                raise RuntimeError(f"ruseon serve in {tree} exited with {proc.returncode}")
            rows.append({"tree": str(tree), "at_s": seconds, "rss_kib": rss_of(proc.pid),
                         "top": smaps_top(proc.pid)})
    finally:
        proc.terminate()
        proc.wait(20)
    return rows


def serve_main(args: argparse.Namespace) -> None:
    recorded_stream()
    trees = [Path(__file__).resolve().parent.parent]
    if args.baseline is not None:
        trees.insert(0, args.baseline.resolve())
    for _ in range(args.runs):
        for tree in trees:
            for row in serve_rss(tree, args.at):
                top = ", ".join(f"{name} {kib / 1024:.1f}" for name, kib in row["top"])
                print(f"serve {tree}: RSS {row['rss_kib'] / 1024:6.1f} MiB at {row['at_s']:.0f} s"
                      f"  ({top})", flush=True)
                print(json.dumps({"figure": "serve_rss", **row}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="0, 10, 30 viewers")
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--checkpoint", type=int, default=100)
    parser.add_argument("--no-collect", action="store_true",
                        help="checkpoints read RSS as it is, without a gc.collect() (only the "
                             "final reading collects): shows what waits for the collector")
    parser.add_argument("--serve", action="store_true",
                        help="the RSS of the real ruseon serve --source file: instead")
    parser.add_argument("--at", type=float, nargs="*", default=[8.0, 45.0],
                        help="--serve: seconds after start to read RSS at")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="--serve: another checkout measured in the same run")
    parser.add_argument("--runs", type=int, default=2, help="--serve: runs (interleaved)")
    args = parser.parse_args()
    if args.serve:
        serve_main(args)
        return
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
        done = 0
        warm: dict[str, Any] = {}
        now: dict[str, Any] = {}
        while done < args.cycles:
            step = min(warm_cycles if done == 0 else args.checkpoint, args.cycles - done)
            churn(server.url, step, args.batch)
            done += step
            time.sleep(2.0)
            now = inspect(server, collect=not args.no_collect)
            if done == warm_cycles:
                warm = now
            alive = {k: v for k, v in now.get("objects", {}).items() if v and k != "Task"}
            print(f"cycles={done:<5} RSS {now['rss_kib'] / 1024:6.1f} MiB  malloc in use "
                  f"{now['malloc_in_use_kib'] / 1024:5.1f} MiB  Python blocks "
                  f"{now['python_blocks']:>8}  full GCs {now.get('gc_full_collections')}  "
                  f"tasks {now.get('tasks', '-')}  engine objects alive "
                  f"{alive or ('not counted' if args.no_collect else 'none')}", flush=True)
            print(json.dumps({"figure": "churn_checkpoint", "cycles": done,
                              "collected": not args.no_collect,
                              **{k: now.get(k) for k in ("rss_kib", "malloc_in_use_kib",
                                                         "python_blocks", "tasks", "objects",
                                                         "mux", "sessions",
                                                         "gc_full_collections")}}),
                  flush=True)
        if args.no_collect:
            now = inspect(server)  # the census (and its collection) once, at the end
        trimmed = inspect(server, trim=True)
        growth = (now["rss_kib"] - warm["rss_kib"]) / 1024
        heap_growth = (now["malloc_in_use_kib"] - warm["malloc_in_use_kib"]) / 1024
        blocks_growth = now["python_blocks"] - warm["python_blocks"]
        alive = {k: v for k, v in now["objects"].items() if v and k != "Task"}
        print(f"join/leave: RSS {warm['rss_kib'] / 1024:.1f} MiB after {warm_cycles} cycles, "
              f"{now['rss_kib'] / 1024:.1f} MiB after {done} ({growth:+.1f} MiB; "
              f"{trimmed['rss_trimmed_kib'] / 1024:.1f} MiB once the heap is trimmed); "
              f"malloc in use {heap_growth:+.2f} MiB, Python blocks {blocks_growth:+d}; "
              f"{now['sessions']} sessions left, engine objects alive: {alive or 'none'}",
              flush=True)
        print(json.dumps({"figure": "churn", "cycles": done, "warm_cycles": warm_cycles,
                          "rss_warm_kib": warm["rss_kib"], "rss_after_kib": now["rss_kib"],
                          "growth_mib": round(growth, 2),
                          "rss_trimmed_kib": trimmed["rss_trimmed_kib"],
                          "malloc_in_use_growth_mib": round(heap_growth, 2),
                          "python_blocks_growth": blocks_growth,
                          "engine_objects_alive": alive, "sessions_left": now["sessions"]}),
              flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
