"""Many viewers at once, spread over worker processes so the rig is never the bottleneck.

Each worker process runs its share of :class:`ViewerPlan` on its own event loop and reports
progress (packets and bytes received, sessions up) about once a second over a queue; the
coordinator aggregates and prints it, then collects every viewer's result.
"""

from __future__ import annotations

import asyncio
import faulthandler
import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# Extra time a worker gets beyond its longest viewer before it is considered hung.
WORKER_GRACE_S = float(os.environ.get("HIL_WORKER_GRACE_S", "60"))


@dataclass
class FleetProgress:
    """Totals across every worker at one moment."""

    sessions_ok: int = 0
    sessions_err: int = 0
    live: int = 0
    rtp_packets: int = 0
    rtp_bytes: int = 0
    frames: int = 0
    finished: int = 0
    per_worker: dict[int, dict[str, int]] = field(default_factory=dict)

    def update(self, worker: int, counts: dict[str, int]) -> None:
        """Replace ``worker``'s latest counters and recompute the totals."""
        self.per_worker[worker] = counts
        for name in ("sessions_ok", "sessions_err", "live", "rtp_packets", "rtp_bytes",
                     "frames", "finished"):
            setattr(self, name, sum(c.get(name, 0) for c in self.per_worker.values()))

    _mark: tuple[float, int] = (0.0, 0)

    def egress_mb_s(self, elapsed: float) -> float:
        """MB/s received by all viewers since the previous call (the device's video egress)."""
        t, sent = self._mark
        self._mark = (elapsed, self.rtp_bytes)
        return (self.rtp_bytes - sent) / (elapsed - t) / 1e6 if elapsed > t else 0.0

    def whep_line(self, elapsed: float) -> str:
        """The load-test progress line."""
        return (f"[WHEP] sessions ok {self.sessions_ok} (err {self.sessions_err}) | live "
                f"{self.live} | RTP packets {self.rtp_packets} | egress "
                f"{self.egress_mb_s(elapsed):.2f} MB/s | frames {self.frames}")


def default_workers(viewers: int) -> int:
    """One worker per core, at most one per viewer (the decoders are what costs CPU)."""
    return max(1, min(viewers, os.cpu_count() or 1))


def _worker_main(worker: int, plans: list[dict[str, Any]], out: Any) -> None:
    """Entry point of one worker process."""
    # A worker that hangs prints every thread's stack before the coordinator kills it.
    longest = max((p["start_delay_s"] + p["watch_s"] for p in plans), default=0.0)
    faulthandler.dump_traceback_later(longest + WORKER_GRACE_S, exit=False)
    asyncio.run(_worker(worker, plans, out))


async def _worker(worker: int, plans: list[dict[str, Any]], out: Any) -> None:
    import aiohttp

    from hil.viewer import ViewerPlan, watch

    live: dict[int, Any] = {}
    counts = {"sessions_ok": 0, "sessions_err": 0, "live": 0, "rtp_packets": 0,
              "rtp_bytes": 0, "frames": 0, "finished": 0}
    done_packets = done_bytes = done_frames = done_ok = 0

    async def report_progress() -> None:
        while True:
            running = list(live.values())
            counts["rtp_packets"] = done_packets + sum(f.rtp_packets for f in running)
            counts["rtp_bytes"] = done_bytes + sum(f.rtp_bytes for f in running)
            counts["frames"] = done_frames + sum(len(f.frames) for f in running)
            counts["live"] = sum(1 for f in running if f.first_rtp is not None)
            counts["sessions_ok"] = done_ok + counts["live"]
            out.put(("progress", worker, dict(counts)))
            await asyncio.sleep(1.0)

    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        reporter = asyncio.ensure_future(report_progress())

        async def one(plan_dict: dict[str, Any]) -> None:
            nonlocal done_packets, done_bytes, done_frames, done_ok
            index = plan_dict["index"]

            def track(figures: Any) -> None:
                if figures is None:
                    live.pop(index, None)
                else:
                    live[index] = figures

            result = await watch(ViewerPlan(**plan_dict), http, live=track)
            if result.get("post_status") == 201:
                done_ok += 1
            else:
                counts["sessions_err"] += 1
            counts["finished"] += 1
            done_packets += result.get("rtp_packets", 0)
            done_bytes += result.get("rtp_bytes", 0)
            done_frames += result.get("frames", 0)
            out.put(("result", worker, result))

        try:
            await asyncio.gather(*(one(p) for p in plans))
        finally:
            live.clear()
            reporter.cancel()
    counts["live"], counts["sessions_ok"] = 0, done_ok
    out.put(("progress", worker, dict(counts)))
    out.put(("done", worker, None))


def run_fleet(
    plans: Sequence[Any],
    *,
    workers: int,
    on_progress: Callable[[FleetProgress, float], None] | None = None,
    progress_interval_s: float = 2.0,
) -> list[dict[str, Any]]:
    """Run ``plans`` (``ViewerPlan``) over ``workers`` processes; return results by viewer index.

    Blocking: call it from a thread (``asyncio.to_thread``) when an event loop is running.
    """
    ctx = multiprocessing.get_context("spawn")
    out: Any = ctx.Queue()
    shares: list[list[dict[str, Any]]] = [[] for _ in range(max(1, workers))]
    for i, plan in enumerate(plans):
        shares[i % len(shares)].append(asdict(plan))
    shares = [s for s in shares if s]
    procs = [ctx.Process(target=_worker_main, args=(w, share, out), daemon=True)
             for w, share in enumerate(shares)]
    for proc in procs:
        proc.start()
    longest = max((p.start_delay_s + p.watch_s for p in plans), default=0.0)
    deadline = time.monotonic() + longest + WORKER_GRACE_S + 45.0
    results: dict[int, dict[str, Any]] = {}
    progress = FleetProgress()
    done: set[int] = set()
    last_print = time.monotonic()
    t0 = last_print
    try:
        while len(done) < len(procs) and time.monotonic() < deadline:
            try:
                kind, worker, payload = out.get(timeout=0.5)
            except queue.Empty:
                dead = [w for w, p in enumerate(procs) if not p.is_alive() and w not in done]
                for w in dead:
                    # A worker that died without "done" (crash, OOM): its viewers count as errors.
                    if procs[w].exitcode not in (0, None):
                        done.add(w)
                continue
            if kind == "progress":
                progress.update(worker, payload)
            elif kind == "result":
                results[payload["index"]] = payload
            elif kind == "done":
                done.add(worker)
            now = time.monotonic()
            if on_progress is not None and now - last_print >= progress_interval_s:
                on_progress(progress, now - t0)
                last_print = now
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    if on_progress is not None:
        on_progress(progress, time.monotonic() - t0)
    for plan in plans:
        results.setdefault(plan.index, {"index": plan.index, "ok": False,
                                        "error": "worker process died or hung"})
    return [results[p.index] for p in plans]
