"""Load test mode: N viewers for S seconds, live ``[WHEP]`` progress, then the headline figures.

The headline is time to first decoded frame, not just the SDP exchange most WHEP load tests stop
at. By default each viewer decodes only until its first picture (``--decode first``) and then
counts access units, so the rig's CPU goes to the WebRTC stack rather than to decoders.
"""

from __future__ import annotations

import argparse
import asyncio

from hil.device import Device, ProcessSample
from hil.fleet import FleetProgress, default_workers, run_fleet
from hil.report import format_ms, percentiles
from hil.viewer import ViewerPlan


async def _sample(url: str, token: str) -> ProcessSample | None:
    try:
        async with Device(url, token) as device:
            return await device.process_sample()
    except Exception:  # the figures are optional; the load test itself must still report
        return None


def run_load(args: argparse.Namespace) -> int:
    """Run the load test; exit 0 when every session decoded video, 1 otherwise."""
    n = args.viewers
    workers = args.workers or default_workers(n)
    plans = [ViewerPlan(index=i, device=args.device, token=args.token,
                        start_delay_s=args.ramp * i / max(1, n),
                        watch_s=max(0.0, args.duration - args.ramp * i / max(1, n)),
                        decode_all=args.decode == "all")
             for i in range(n)]
    print(f"load test: {n} viewers, {args.duration:g} s, {workers} worker processes, "
          f"decode {args.decode}", flush=True)
    before = asyncio.run(_sample(args.device, args.token))

    def show(p: FleetProgress, elapsed: float) -> None:
        if not args.quiet:
            print(f"[{elapsed:6.1f}s] {p.whep_line(elapsed)}", flush=True)

    results = run_fleet(plans, workers=workers, on_progress=show, progress_interval_s=1.0)
    after = asyncio.run(_sample(args.device, args.token))
    ok = [r for r in results if r.get("post_status") == 201]
    decoding = [r for r in results if r.get("frames")]
    packets = sum(r.get("rtp_packets", 0) for r in results)
    watched = [r["watched_s"] for r in results if r.get("watched_s")]
    egress = sum(r.get("rtp_bytes", 0) for r in results) / max(watched, default=1.0) / 1e6

    def col(key: str) -> dict[str, float | int | None]:
        return percentiles(r[key] for r in results if isinstance(r.get(key), int | float))

    print()
    print(f"[WHEP] sessions ok {len(ok)} (err {n - len(ok)}) | decoding {len(decoding)} | "
          f"RTP packets {packets} | egress {egress:.2f} MB/s")
    print(f"handshake (POST→201)     p50/p95/max {format_ms(col('answer_s'))}")
    print(f"connected (ICE+DTLS)     p50/p95/max {format_ms(col('connected_s'))}")
    print(f"first RTP                p50/p95/max {format_ms(col('first_rtp_s'))}")
    print(f"first frame (decoded)    p50/p95/max {format_ms(col('first_frame_s'))}")
    if before is not None and after is not None and after.rss_bytes is not None:
        cpu = ProcessSample.cpu_percent(before, after)
        print(f"device RSS {(before.rss_bytes or 0) / 2**20:.0f} → {after.rss_bytes / 2**20:.0f}"
              f" MiB / CPU {cpu:.0f}% of one core" if cpu is not None else "")
    errors = [f"viewer {r['index']}: {r['error']}" for r in results if r.get("error")]
    for line in errors[:5]:
        print("  " + line)
    if args.report:
        import json

        args.report.write_text(json.dumps({"viewers": results}, indent=1) + "\n")
    return 0 if len(decoding) == n else 1
