"""The battery: every check, in order, against one device, collected into a :class:`Report`.

Checks are independent where they can be: one that errors does not stop the others. The viewer
checks (viewers, time-to-first-frame, latency, steady-state) share one run of N concurrent viewers
for ``--duration`` seconds, because that is what a release is judged on: what a room full of
viewers sees at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shlex
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from hil import whep_conformance
from hil.browser import SAFARI, PageWatch, WebDriverSession, watch_page
from hil.device import Device, ProcessSample
from hil.fleet import FleetProgress, run_fleet
from hil.report import CheckResult, Progress, Report, Verdict, format_ms, percentiles
from hil.viewer import ViewerPlan, watch

CHECKS = (
    "page", "healthz", "status", "whep", "viewers", "first-frame", "latency", "steady-state",
    "browser", "churn", "restart", "watchdog", "power",
)


@dataclass
class Expectation:
    """What the device is configured to send (``--expect-*`` or the simulated device's config)."""

    width: int | None = None
    height: int | None = None
    fps: float | None = None
    bitrate: int | None = None
    keyframe_interval: int | None = None


@dataclass
class RigOptions:
    """Everything a run needs to know, from the command line."""

    device: str
    token: str = ""
    ssh: str | None = None
    power_cmd: str | None = None
    # Rig-side command equivalent to `systemctl restart ruseon` (default over --ssh).
    restart_cmd: str | None = None
    # Rig-side command that SIGSTOPs the service, for the watchdog check (default over --ssh).
    stop_cmd: str | None = None
    # How long the power stays off in the power check.
    power_off_s: float = 3.0
    # The device is the simulated rig's (no systemd there: the watchdog check cannot run).
    simulated: bool = False
    viewers: int = 5
    duration_s: float = 20.0
    workers: int = 2
    skip: set[str] = field(default_factory=set)
    expect: Expectation = field(default_factory=Expectation)
    # The stamp's clock is the rig's (simulated device on this machine, or --glass).
    clock_shared: bool = False
    glass: bool = False
    max_latency_ms: float = 400.0
    # Share of watched time a viewer may spend frozen (gaps > 200 ms) before steady-state fails.
    max_freeze_ratio: float = 0.05
    # Longest single gap between pictures that steady-state tolerates.
    max_gap_s: float = 1.0
    # Share of the watch the rig itself may spend starved of CPU (left out of the freezes)
    # before steady-state says it could not judge (an error, not a pass).
    max_rig_starved_ratio: float = 0.25
    fps_tolerance: float = 0.10
    status_tolerance: float = 0.20
    churn_s: float = 10.0
    churn_rss_margin_mb: float = 24.0
    recover_timeout_s: float = 90.0
    ssh_service: str = "ruseon"
    # Most sessions the whep check opens to reach the device's max_viewers (lock-out case).
    whep_fill_limit: int = 32
    # Seconds after the last viewer's planned start before the device's viewer count is compared
    # with the harness's (and only once the workers report every viewer live).
    settle_s: float = 1.0
    # A real browser in the rig (the browser check): its WebDriver endpoint (safaridriver on a
    # Mac, through an SSH tunnel), the session's capabilities, the page's address as that
    # browser reaches it (default: device), what must have played ("webrtc": the page's default
    # transport; "native-hls": HLS chosen by hand, played by the browser itself) and how long
    # each transport is watched.
    webdriver: str | None = None
    browser_capabilities: dict[str, Any] = field(default_factory=lambda: dict(SAFARI))
    browser_url: str | None = None
    browser_expect: frozenset[str] = frozenset()
    browser_watch_s: float = 5.0


def _skip(name: str, reason: str) -> CheckResult:
    return CheckResult(name, Verdict.SKIP, reason)


def _within(measured: float | None, expected: float | None, tolerance: float) -> bool:
    if expected is None or measured is None:
        return measured is not None
    return abs(measured - expected) <= tolerance * expected


class Battery:
    """Runs the checks and fills the report; see :data:`CHECKS` for the names."""

    def __init__(self, options: RigOptions, progress: Progress) -> None:
        self.opts = options
        self.progress = progress
        self.report = Report(device=options.device)
        self.fingerprint: str | None = None

    async def run(self) -> Report:
        """Run every check that is not skipped; return the report."""
        o = self.opts
        self.report.settings = {
            "viewers": o.viewers, "duration_s": o.duration_s, "workers": o.workers,
            "skip": sorted(o.skip), "clock_shared": o.clock_shared, "glass": o.glass,
            "ssh": o.ssh or "", "power_cmd": o.power_cmd or "",
            "restart_cmd": o.restart_cmd or "", "stop_cmd": o.stop_cmd or "",
            "simulated": o.simulated, "webdriver": o.webdriver or "",
            "browser_expect": sorted(o.browser_expect),
            "expect": {k: v for k, v in vars(o.expect).items() if v is not None},
            # The limits the latency and steady-state checks judged by (a release gate runs
            # with the defaults; a report judged more leniently says so).
            "max_latency_ms": o.max_latency_ms, "max_freeze_ratio": o.max_freeze_ratio,
            "max_gap_s": o.max_gap_s,
        }
        async with Device(o.device, o.token) as device:
            self.device = device
            await self._check("page", self.check_page)
            await self._check("healthz", self.check_healthz)
            await self._check("status", self.check_status)
            await self._check("whep", self.check_whep)
            await self._viewer_checks()
            await self._check("browser", self.check_browser)
            await self._check("churn", self.check_churn)
            await self._check("restart", self.check_restart)
            await self._check("watchdog", self.check_watchdog)
            await self._check("power", self.check_power)
        return self.report

    async def _check(self, name: str, body: Callable[[], Awaitable[CheckResult]]) -> None:
        if name in self.opts.skip:
            self._add(_skip(name, "skipped by --skip"), 0.0)
            return
        self.progress.line(name, "running")
        t0 = time.monotonic()
        try:
            result = await body()
        except Exception as exc:  # a check that crashes is an ERROR, and the run goes on
            result = CheckResult(name, Verdict.ERROR, f"{type(exc).__name__}: {exc}")
        self._add(result, time.monotonic() - t0)

    def _add(self, result: CheckResult, seconds: float) -> None:
        result.duration_s = seconds
        self.report.add(result)
        self.progress.verdict(result)

    # --- HTTP -------------------------------------------------------------------------------

    async def check_page(self) -> CheckResult:
        """The device page loads: 200, HTML, and it names the WHEP endpoint or a video."""
        answer = await self.device.request("GET", "/")
        ctype = answer.header("Content-Type") or ""
        figures = {"status": answer.status, "content_type": ctype, "bytes": len(answer.body),
                   "seconds": answer.seconds}
        if answer.status != 200 or "text/html" not in ctype:
            return CheckResult("page", Verdict.FAIL, f"GET / answered {answer.status} {ctype}",
                               figures)
        if "<video" not in answer.text.lower() and "whep" not in answer.text.lower():
            return CheckResult("page", Verdict.FAIL, "the page has no <video> and no WHEP client",
                               figures)
        return CheckResult("page", Verdict.PASS, f"200 text/html, {len(answer.body)} bytes",
                           figures)

    async def check_healthz(self) -> CheckResult:
        """``/healthz`` answers 200."""
        answer = await self.device.request("GET", "/healthz")
        figures = {"status": answer.status, "seconds": answer.seconds,
                   "body": answer.text[:200]}
        if answer.status != 200:
            return CheckResult("healthz", Verdict.FAIL,
                               f"/healthz answered {answer.status}: {answer.text[:120]}", figures)
        return CheckResult("healthz", Verdict.PASS, "200", figures)

    async def check_status(self) -> CheckResult:
        """``/api/status`` is JSON with resolution, fps and bitrate matching the config ±20%."""
        doc = await self.device.status()
        source = doc.get("source", {})
        exp, tol = self.opts.expect, self.opts.status_tolerance
        self.fingerprint = (doc.get("webrtc") or {}).get("fingerprint") or self.fingerprint
        measured = {k: source.get(k) for k in ("kind", "width", "height", "fps", "bitrate")}
        figures: dict[str, Any] = {"measured": measured,
                                   "expected": {k: v for k, v in vars(exp).items() if v},
                                   "viewers": (doc.get("viewers") or {}).get("count"),
                                   "fingerprint": self.fingerprint}
        problems = []
        for key, want in (("width", exp.width), ("height", exp.height)):
            got = source.get(key)
            if not isinstance(got, int) or got <= 0 or (want is not None and got != want):
                problems.append(f"{key} {got} (want {want or '> 0'})")
        for key, want_f in (("fps", exp.fps), ("bitrate", exp.bitrate)):
            got_f = source.get(key)
            if not isinstance(got_f, int | float) or got_f <= 0 or not _within(
                    float(got_f), float(want_f) if want_f else None, tol):
                problems.append(f"{key} {got_f} (want {want_f or '> 0'} ±{tol:.0%})")
        if problems:
            return CheckResult("status", Verdict.FAIL, "; ".join(problems), figures)
        return CheckResult(
            "status", Verdict.PASS,
            f"{measured['width']}x{measured['height']} {float(measured['fps']):.1f} fps "
            f"{float(measured['bitrate']) / 1e6:.2f} Mbit/s", figures)

    async def check_whep(self) -> CheckResult:
        """Status codes and headers for good and bad WHEP requests."""
        cases = await whep_conformance.run_cases(self.device,
                                                 fill_limit=self.opts.whep_fill_limit)
        failed = [c for c in cases if not c.ok]
        skipped = [c for c in cases if c.skipped]
        figures = {"cases": [c.to_json() for c in cases], "failed": len(failed),
                   "skipped": len(skipped)}
        if failed:
            reason = "; ".join(f"{c.name}: {c.detail}" for c in failed[:4])
            return CheckResult("whep", Verdict.FAIL, f"{len(failed)}/{len(cases)} cases failed: "
                               + reason, figures)
        tried = len(cases) - len(skipped)
        extra = "".join(f"; not tried: {c.name} ({c.detail})" for c in skipped)
        return CheckResult("whep", Verdict.PASS, f"{tried} cases ok" + extra, figures)

    # --- viewers ----------------------------------------------------------------------------

    def _gop_s(self) -> float:
        exp = self.opts.expect
        if exp.keyframe_interval and exp.fps:
            return exp.keyframe_interval / exp.fps
        return 2.0

    async def _viewer_checks(self) -> None:
        names = ("viewers", "first-frame", "latency", "steady-state")
        if all(n in self.opts.skip for n in names):
            for n in names:
                self._add(_skip(n, "skipped by --skip"), 0.0)
            return
        o = self.opts
        # Spread the joins over a GOP and a half so viewers join at every phase of the GOP:
        # most of them mid-GOP, which is where a server that waits for the next IDR is slow.
        spread = 1.5 * self._gop_s()
        plans = [
            ViewerPlan(index=i, device=o.device, token=o.token, glass=o.glass,
                       start_delay_s=spread * i / max(1, o.viewers),
                       watch_s=max(1.0, o.duration_s - spread * i / max(1, o.viewers)))
            for i in range(o.viewers)
        ]
        self.progress.line("viewers", f"{o.viewers} viewers over {o.workers} worker processes "
                           f"for {o.duration_s:.0f} s")
        before = await self._sample()
        t0 = time.monotonic()

        # The workers' latest count of viewers receiving RTP (written by the fleet's thread).
        fleet_live = [0]

        def show(p: FleetProgress, elapsed: float) -> None:
            fleet_live[0] = p.live
            self.progress.line("viewers", _whep_line(p, elapsed))

        # While every viewer is watching, the device must count exactly as many as we run: from
        # when the workers report all of them live until just before the first one leaves.
        window = (spread + o.settle_s, o.duration_s - 0.5)
        samples: list[tuple[float, int | None]] = []
        counting = asyncio.ensure_future(
            self._count_device_viewers(t0, window, samples,
                                       all_live=lambda: fleet_live[0] >= o.viewers))
        try:
            results = await asyncio.to_thread(run_fleet, plans, workers=o.workers,
                                              on_progress=show)
        finally:
            counting.cancel()
        elapsed = time.monotonic() - t0
        after = await self._sample()
        analysis = analyse_viewers(results, self.opts)
        analysis["device_count"] = device_count_figures(
            samples, window, sum(1 for r in results if r.get("ok")))
        for name, make in (("viewers", self._viewers_result),
                           ("first-frame", self._first_frame_result),
                           ("latency", self._latency_result),
                           ("steady-state", self._steady_result)):
            if name in o.skip:
                self._add(_skip(name, "skipped by --skip"), 0.0)
                continue
            result = make(results, analysis, before, after)
            self._add(result, elapsed)

    async def _count_device_viewers(self, t0: float, window: tuple[float, float],
                                    samples: list[tuple[float, int | None]],
                                    all_live: Callable[[], bool]) -> None:
        """Append ``(seconds since t0, /api/status viewers.count)`` about once a second within
        ``window`` once ``all_live()`` (runs until cancelled)."""
        while True:
            now = time.monotonic() - t0
            if now > window[1]:
                return
            if now >= window[0] and all_live():
                try:
                    doc = await self.device.status()
                    count = (doc.get("viewers") or {}).get("count")
                    samples.append((time.monotonic() - t0,
                                    count if isinstance(count, int) else None))
                except (TimeoutError, RuntimeError, ValueError, aiohttp.ClientError, OSError):
                    samples.append((time.monotonic() - t0, None))
            await asyncio.sleep(1.0)

    async def _sample(self) -> ProcessSample | None:
        try:
            return await self.device.process_sample()
        except (TimeoutError, RuntimeError, aiohttp.ClientError, OSError):
            return None

    def _viewers_result(self, results: list[dict[str, Any]], a: dict[str, Any],
                        before: ProcessSample | None, after: ProcessSample | None) -> CheckResult:
        o = self.opts
        figures = {"viewers": o.viewers, "connected": a["connected"], "decoding": a["decoding"],
                   "first_au_keyframe": a["first_au_keyframe"], "decode_errors": a["decode_errors"],
                   "start_lost": a["start_lost"],
                   "fps": a["fps"], "source_fps": o.expect.fps,
                   "device_count": a.get("device_count"),
                   "per_viewer": [_viewer_row(r) for r in results]}
        problems = []
        count = a.get("device_count") or {}
        if count.get("mismatches"):
            problems.append(f"/api/status counted {count['counts']} viewers while the harness "
                            f"ran {count['expected']} (steady window "
                            f"{count['window_s'][0]:.0f}-{count['window_s'][1]:.0f} s)")
        errors = [f"viewer {r['index']}: {r['error']}" for r in results if r.get("error")]
        if a["connected"] < o.viewers:
            problems.append(f"{o.viewers - a['connected']} of {o.viewers} viewers did not connect")
        if a["decoding"] < o.viewers:
            problems.append(f"{o.viewers - a['decoding']} of {o.viewers} decoded no picture")
        # A viewer whose stream's first packets the network lost (its first packet was not the
        # SPS every viewer's stream starts with) cannot have a whole first access unit; it is
        # judged by decoding after the keyframe it asked for. All viewers losing their start
        # is the device's doing, not the network's.
        wrong_start = a["decoding"] - a["first_au_keyframe"] - a["start_lost"]
        if wrong_start > 0:
            problems.append(f"{wrong_start} viewers' first access unit was not an IDR with "
                            "SPS+PPS")
        if a["start_lost"] and a["start_lost"] >= max(2, a["decoding"]):
            problems.append(f"every viewer's stream ({a['start_lost']}) began without its SPS")
        if a["decode_errors"]:
            problems.append(f"{a['decode_errors']} decode errors")
        if o.expect.fps:
            slow = [r for r in results if r.get("fps") is not None
                    and not _within(r["fps"], o.expect.fps, o.fps_tolerance)]
            if slow:
                worst = min(slow, key=lambda r: r["fps"])
                problems.append(f"{len(slow)} viewers' fps outside {o.expect.fps:g} "
                                f"±{o.fps_tolerance:.0%} (worst {worst['fps']:.1f})")
        if problems:
            return CheckResult("viewers", Verdict.FAIL,
                               "; ".join(problems + errors[:2]), figures)
        fps = a["fps"]
        counted = (f"; device counts {count['expected']} in {len(count['counts'])} samples"
                   if count.get("counts") else "; device count not sampled (window too short)")
        return CheckResult("viewers", Verdict.PASS,
                           f"{o.viewers}/{o.viewers} decoding, first AU IDR+SPS+PPS, fps "
                           f"{fps['p50']:.1f} (min {fps['min']:.1f})" + counted, figures)

    def _first_frame_result(self, results: list[dict[str, Any]], a: dict[str, Any],
                            before: ProcessSample | None,
                            after: ProcessSample | None) -> CheckResult:
        figures = {k: a[k] for k in ("answer_s", "connected_s", "first_rtp_s", "first_frame_s")}
        reason = (f"POST→201 {format_ms(a['answer_s'])}; connected {format_ms(a['connected_s'])}; "
                  f"first RTP {format_ms(a['first_rtp_s'])}; first frame "
                  f"{format_ms(a['first_frame_s'])}")
        if a["first_frame_s"]["n"] < self.opts.viewers:
            return CheckResult("first-frame", Verdict.FAIL,
                               f"only {a['first_frame_s']['n']} of {self.opts.viewers} viewers "
                               "got a first frame; " + reason, figures)
        return CheckResult("first-frame", Verdict.PASS, reason, figures)

    def _latency_result(self, results: list[dict[str, Any]], a: dict[str, Any],
                        before: ProcessSample | None, after: ProcessSample | None) -> CheckResult:
        o = self.opts
        lat = a["latency_s"]
        figures = {"latency_s": lat, "latency_decoded_s": a["latency_decoded_s"],
                   "first_frame_latency_s": a["first_frame_latency_s"],
                   "catch_up_latency_s": a["catch_up_latency_s"],
                   "catch_up_frames": a["catch_up_frames"],
                   "latency_all_s": a["latency_all_s"],
                   "mid_gop": a["mid_gop"], "stamps_read": a["stamps_read"],
                   "kind": "glass-to-glass" if o.glass else "capture-to-decode",
                   "max_latency_ms": o.max_latency_ms,
                   "per_viewer": [{"index": r["index"], "latency_s": r.get("latency_s"),
                                   "join_phase": r.get("join_phase"),
                                   "first_frame_latency_s": r.get("first_frame_latency_s"),
                                   "catch_up_frames": r.get("catch_up_frames"),
                                   "catch_up_latency_s": r.get("catch_up_latency_s"),
                                   "latency_all_s": r.get("latency_all_s")}
                                  for r in results]}
        if not lat["n"]:
            return CheckResult("latency", Verdict.FAIL,
                               "no picture carried a readable stamp", figures)
        mid = a["mid_gop"]
        reason = (f"live p50/p95/max {format_ms(lat)} over {lat['n']} frames (to the decoder's "
                  f"input, the rig's starvation left out; timed at decoding "
                  f"{format_ms(a['latency_decoded_s'])}); mid-GOP joiners "
                  f"{mid['viewers']} (their p95 {format_ms(mid['latency_s'])}); first picture "
                  f"age {format_ms(a['first_frame_latency_s'])} ({a['catch_up_frames']} pictures "
                  "captured before their viewer connected, not judged)")
        if not o.clock_shared:
            return CheckResult("latency", Verdict.SKIP,
                               "not judged: the device clock is not the rig's (use --glass or "
                               "--clock-synced); " + reason, figures)
        worst = max(lat["p95"], mid["latency_s"]["p95"] or 0.0)
        if worst * 1000 > o.max_latency_ms:
            return CheckResult("latency", Verdict.FAIL,
                               f"p95 {worst * 1000:.0f} ms > {o.max_latency_ms:.0f} ms; " + reason,
                               figures)
        return CheckResult("latency", Verdict.PASS, reason, figures)

    def _steady_result(self, results: list[dict[str, Any]], a: dict[str, Any],
                       before: ProcessSample | None, after: ProcessSample | None) -> CheckResult:
        o = self.opts
        device = _device_figures(before, after)
        figures = {k: a[k] for k in ("freezes", "freeze_ratio", "max_gap_s", "max_gap_s_raw",
                                     "freeze_s_raw", "rig_starved_ratio", "bitrate_bps",
                                     "packets_lost", "packets_unrecovered", "packets_expected",
                                     "rtx_packets", "nacks_sent", "plis_sent", "nack_retries",
                                     "packets_abandoned")}
        figures["device"] = device
        figures["limits"] = {"max_gap_s": o.max_gap_s, "max_freeze_ratio": o.max_freeze_ratio}
        problems = []
        if a["max_gap_s"] > o.max_gap_s:
            problems.append(f"a {a['max_gap_s']:.2f} s gap between pictures (> {o.max_gap_s} s)")
        if a["freeze_ratio"]["max"] is not None and a["freeze_ratio"]["max"] > o.max_freeze_ratio:
            problems.append(f"a viewer was frozen {a['freeze_ratio']['max']:.1%} of the time "
                            f"(> {o.max_freeze_ratio:.0%})")
        if not a["bitrate_bps"]["n"]:
            problems.append("no bitrate measured")
        reason = (f"freezes {a['freezes']}, max gap {a['max_gap_s'] * 1000:.0f} ms, bitrate p50 "
                  f"{(a['bitrate_bps']['p50'] or 0) / 1e6:.2f} Mbit/s, lost "
                  f"{a['packets_lost']}/{a['packets_expected']} "
                  f"(unrecovered {a['packets_unrecovered']}), NACKs {a['nacks_sent']} "
                  f"(+{a['nack_retries']} retries), PLIs "
                  f"{a['plis_sent']}; device {_device_text(device)}")
        if a["rig_starved_ratio"]:
            reason += (f"; the rig itself was starved of CPU up to {a['rig_starved_ratio']:.1%} "
                       f"of the time (left out; max gap as timed "
                       f"{a['max_gap_s_raw'] * 1000:.0f} ms)")
        if problems:
            return CheckResult("steady-state", Verdict.FAIL, "; ".join(problems) + "; " + reason,
                               figures)
        if a["rig_starved_ratio"] > o.max_rig_starved_ratio:
            # What the rig could watch was fine, but it watched too little to vouch for it.
            return CheckResult("steady-state", Verdict.ERROR,
                               f"the rig was starved of CPU {a['rig_starved_ratio']:.0%} of the "
                               f"time (> {o.max_rig_starved_ratio:.0%}): too little watched to "
                               "judge; " + reason, figures)
        return CheckResult("steady-state", Verdict.PASS, reason, figures)

    # --- churn ------------------------------------------------------------------------------

    async def check_churn(self) -> CheckResult:
        """Viewers join and leave for a while; afterwards no session remains and RSS is back."""
        o = self.opts
        before = await self.device.process_sample()
        # Short-lived viewers, two at a time per worker, joining every 0.5 s for churn_s.
        count = max(2, int(o.churn_s / 0.5))
        plans = [ViewerPlan(index=i, device=o.device, token=o.token, start_delay_s=i * 0.5,
                            watch_s=0.5 + (i % 3) * 0.5, decode_all=False)
                 for i in range(count)]
        results = await asyncio.to_thread(
            run_fleet, plans, workers=o.workers,
            on_progress=lambda p, t: self.progress.line("churn", _whep_line(p, t)))
        ok = sum(1 for r in results if r.get("ok"))
        # Every viewer DELETEd its session: the count must reach zero promptly.
        t0 = time.monotonic()
        after = await self.device.process_sample()
        while (after.viewers or 0) > 0 and time.monotonic() - t0 < 10.0:
            await asyncio.sleep(0.25)
            after = await self.device.process_sample()
        drain_s = time.monotonic() - t0
        rss_growth = ((after.rss_bytes or 0) - (before.rss_bytes or 0)) / 2**20
        figures = {"sessions": count, "sessions_ok": ok, "viewers_after": after.viewers,
                   "drain_s": drain_s, "rss_before_mb": (before.rss_bytes or 0) / 2**20,
                   "rss_after_mb": (after.rss_bytes or 0) / 2**20, "rss_growth_mb": rss_growth,
                   "rss_margin_mb": o.churn_rss_margin_mb,
                   "errors": [r["error"] for r in results if r.get("error")][:5]}
        problems = []
        if ok < count:
            problems.append(f"{count - ok} of {count} churn sessions failed")
        if after.viewers is None:
            problems.append("/metrics has no ruseon_viewers")
        elif after.viewers > 0:
            problems.append(f"{after.viewers:.0f} viewers remain 10 s after all left")
        if before.rss_bytes is None or after.rss_bytes is None:
            problems.append("/metrics has no process_resident_memory_bytes")
        elif rss_growth > o.churn_rss_margin_mb:
            problems.append(f"RSS grew {rss_growth:.1f} MiB (> {o.churn_rss_margin_mb:.0f})")
        reason = (f"{ok}/{count} sessions, viewers back to {after.viewers} in {drain_s:.1f} s, "
                  f"RSS {rss_growth:+.1f} MiB")
        if problems:
            return CheckResult("churn", Verdict.FAIL, "; ".join(problems) + "; " + reason, figures)
        return CheckResult("churn", Verdict.PASS, reason, figures)

    # --- restart, watchdog, power -----------------------------------------------------------

    async def _probe_video(self, timeout_s: float) -> tuple[float | None, str | None]:
        """Seconds until a fresh viewer decodes a picture, and its answer's fingerprint."""
        o = self.opts
        t0 = time.monotonic()
        last_error = None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            while time.monotonic() - t0 < timeout_s:
                result = await watch(ViewerPlan(index=0, device=o.device, token=o.token,
                                                watch_s=0.0, decode_all=False), http)
                if result.get("ok"):
                    return time.monotonic() - t0, result.get("fingerprint")
                last_error = result.get("error")
                await asyncio.sleep(0.25)
        self.progress.line("probe", f"no video within {timeout_s:.0f} s: {last_error}")
        return None, None

    async def _status_identity(self, timeout_s: float) -> tuple[str | None, float | None]:
        """``webrtc.fingerprint`` and ``uptime_s`` from ``/api/status``, retried while the device
        comes up."""
        t0 = time.monotonic()
        while True:
            try:
                doc = await self.device.status()
                fingerprint = (doc.get("webrtc") or {}).get("fingerprint")
                uptime = doc.get("uptime_s")
                if isinstance(fingerprint, str) and fingerprint:
                    return fingerprint, float(uptime) if isinstance(uptime, int | float) else None
            except (TimeoutError, RuntimeError, ValueError, aiohttp.ClientError, OSError):
                pass
            if time.monotonic() - t0 > timeout_s:
                return None, None
            await asyncio.sleep(0.25)

    async def _run_command(self, what: str, command: str) -> str | None:
        """Run a rig-side command (no shell); None when it succeeded, else why it did not."""
        try:
            done = await asyncio.to_thread(subprocess.run, shlex.split(command),
                                           capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{what} ({command}) could not run: {exc}"
        if done.returncode != 0:
            return (f"{what} ({command}) failed with {done.returncode}: "
                    f"{(done.stderr or done.stdout).strip()[:200]}")
        return None

    async def _recovery(self, name: str, disrupt: Callable[[], Awaitable[str | None]]
                        ) -> CheckResult:
        """Common shape: video and certificate before, disrupt, time until a fresh viewer decodes
        again, and the certificate (``/api/status`` ``webrtc.fingerprint``) unchanged."""
        _, answer_fp_before = await self._probe_video(15.0)
        if answer_fp_before is None:
            return CheckResult(name, Verdict.FAIL, "no video before the disruption")
        status_fp_before, _ = await self._status_identity(5.0)
        t0 = time.monotonic()
        problem = await disrupt()
        if problem:
            return CheckResult(name, Verdict.ERROR, problem)
        t_done = time.monotonic()
        back, answer_fp_after = await self._probe_video(self.opts.recover_timeout_s)
        t_back = time.monotonic()
        status_fp_after, uptime_after = (await self._status_identity(10.0) if back is not None
                                         else (None, None))
        since_disrupt = time.monotonic() - t0
        figures = {
            # From the start of the disruption until a fresh viewer decoded a picture.
            "outage_s": t_back - t0 if back is not None else None,
            # From the moment the command returned (power back on, restart issued).
            "video_back_s": t_back - t_done if back is not None else None,
            "disrupt_s": t_done - t0,
            "fingerprint_before": status_fp_before, "fingerprint_after": status_fp_after,
            "answer_fingerprint_before": answer_fp_before,
            "answer_fingerprint_after": answer_fp_after,
            # The device's own uptime afterwards: proof that it really went down.
            "uptime_after_s": uptime_after,
        }
        if back is None:
            return CheckResult(name, Verdict.FAIL,
                               f"video not back within {self.opts.recover_timeout_s:.0f} s",
                               figures)
        problems = []
        # Uptime longer than the time since the disruption began: the process never restarted
        # (a command that did nothing must not pass). One second of slack for clock granularity.
        if uptime_after is not None and uptime_after > since_disrupt + 1.0:
            problems.append(f"the device did not restart (uptime {uptime_after:.1f} s, "
                            f"disrupted {since_disrupt:.1f} s ago)")
        if status_fp_before is None or status_fp_after is None:
            problems.append("/api/status has no webrtc.fingerprint")
        elif same_fingerprint(status_fp_before, status_fp_after) is False:
            problems.append(f"certificate fingerprint changed ({status_fp_before} -> "
                            f"{status_fp_after})")
        if not same_fingerprint(answer_fp_before, answer_fp_after):
            problems.append("the answers' a=fingerprint changed")
        if status_fp_after and not same_fingerprint(status_fp_after, answer_fp_after):
            problems.append("/api/status and the SDP answer disagree on the fingerprint")
        reason = (f"video back {t_back - t_done:.1f} s after the {name} command returned "
                  f"(outage {t_back - t0:.1f} s)")
        if problems:
            return CheckResult(name, Verdict.FAIL, "; ".join(problems) + "; " + reason, figures)
        return CheckResult(name, Verdict.PASS, reason + ", certificate unchanged", figures)

    async def check_browser(self) -> CheckResult:
        """A real browser in the rig (Safari through ``safaridriver``) plays the device page as
        a visitor opens it, then with HLS chosen by hand: a moving picture each time, and what
        played is what ``browser_expect`` asks (Safari: WebRTC H.264, native HLS)."""
        o = self.opts
        if not o.webdriver:
            return _skip("browser", "needs --webdriver URL (safaridriver on a Mac in the rig; "
                                    "see hil/README.md)")
        url = o.browser_url or o.device
        watches: list[PageWatch] = []
        async with aiohttp.ClientSession() as http:
            session = await WebDriverSession.open(http, o.webdriver, o.browser_capabilities)
            try:
                for asked in ("webrtc", "hls"):
                    watches.append(await watch_page(session, url, asked,
                                                    watch_s=o.browser_watch_s))
                viewers = (await self.device.status()).get("viewers", {})
            finally:
                await session.close()
        problems = []
        for seen in watches:
            if seen.problem:
                problems.append(f"{seen.asked}: {seen.problem}")
            elif not seen.moving(o.browser_watch_s):
                problems.append(f"{seen.asked}: the picture did not move "
                                f"({seen.figures()['frames']} frames presented)")
        played = {w.asked: w.played for w in watches}
        reasons = {w.asked: w.last.get("reason") for w in watches}
        if "webrtc" in o.browser_expect and played["webrtc"] != "webrtc":
            problems.append(f"WebRTC expected, the page played {played['webrtc'] or 'nothing'}"
                            f" ({reasons['webrtc']})")
        if "native-hls" in o.browser_expect and played["hls"] != "native-hls":
            problems.append(f"native HLS expected, the page played {played['hls'] or 'nothing'}")
        figures = {"url": url, "capabilities": o.browser_capabilities,
                   "expect": sorted(o.browser_expect),
                   "watches": [w.figures() for w in watches],
                   "device_viewers_during_hls": viewers.get("by_transport")}
        first = ", ".join(f"{w.played or w.asked} first frame {w.first_frame_s:.2f} s"
                          for w in watches if w.first_frame_s is not None)
        if problems:
            return CheckResult("browser", Verdict.FAIL, "; ".join(problems), figures)
        return CheckResult("browser", Verdict.PASS, first, figures)

    async def check_restart(self) -> CheckResult:
        """``systemctl restart`` (``--restart-cmd``, or over ``--ssh``): time until video is
        back; same certificate."""
        command = self.opts.restart_cmd
        if not command:
            return _skip("restart", "needs --ssh user@host or --restart-cmd CMD")

        async def disrupt() -> str | None:
            return await self._run_command("restart", command)

        return await self._recovery("restart", disrupt)

    async def check_watchdog(self) -> CheckResult:
        """``kill -STOP`` of the service (``--stop-cmd``, or over ``--ssh``): time until systemd's
        watchdog restarted it and video is back."""
        command = self.opts.stop_cmd
        if not command:
            if self.opts.simulated:
                return _skip("watchdog", "needs systemd; covered by tests/e2e/test_systemd.py")
            return _skip("watchdog", "needs --ssh user@host or --stop-cmd CMD")

        async def disrupt() -> str | None:
            return await self._run_command("stop", command)

        return await self._recovery("watchdog", disrupt)

    async def check_power(self) -> CheckResult:
        """Power cycle through ``--power-cmd``: off, a pause, on; time until video is back."""
        if not self.opts.power_cmd:
            return _skip("power", "needs --power-cmd 'CMD {on|off}'")
        template = self.opts.power_cmd

        async def disrupt() -> str | None:
            for state, pause in (("off", self.opts.power_off_s), ("on", 0.0)):
                problem = await self._run_command(f"power {state}", power_command(template, state))
                if problem:
                    return problem
                await asyncio.sleep(pause)
            return None

        return await self._recovery("power", disrupt)


def power_command(template: str, state: str) -> str:
    """``--power-cmd`` with ``{on|off}`` (or ``{}``) replaced by ``state``."""
    return template.replace("{on|off}", state).replace("{}", state)


def same_fingerprint(a: str | None, b: str | None) -> bool | None:
    """Whether two ``[sha-256] AB:CD:...`` fingerprints name the same certificate (None when one
    is missing); the algorithm prefix, case and spacing do not matter."""
    if not a or not b:
        return None

    def digest(value: str) -> str:
        return value.strip().split()[-1].replace(":", "").lower()

    return digest(a) == digest(b)


# --- analysis ---------------------------------------------------------------------------------


def _viewer_row(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("index", "ok", "error", "post_status", "answer_s", "connected_s", "first_rtp_s",
            "first_frame_s", "frames", "fps", "decode_errors", "first_au_nals",
            "first_au_keyframe", "start_lost", "first_rtp_nal", "aus_before_keyframe",
            "freezes", "freeze_s", "freeze_s_raw", "watched_s",
            "observed_s", "rig_starved_s", "freeze_detail", "max_gap_s", "max_gap_s_raw",
            "bitrate_bps", "packets_lost",
            "packets_unrecovered", "nacks_sent", "plis_sent", "join_phase", "delete_status")
    return {k: r.get(k) for k in keys}


def _spread(values: list[float]) -> dict[str, Any]:
    out = dict(percentiles(values))
    out["min"] = min(values) if values else None
    out["mean"] = statistics.fmean(values) if values else None
    return out


def analyse_viewers(results: list[dict[str, Any]], opts: RigOptions) -> dict[str, Any]:
    """Aggregate per-viewer results; also date each viewer's join within the device's GOP."""
    # Capture times of every IDR any viewer saw: the GOP boundaries on the device's clock.
    idrs = sorted({t for r in results for t in r.get("idr_capture_us", [])})
    gop_s = (opts.expect.keyframe_interval / opts.expect.fps
             if opts.expect.keyframe_interval and opts.expect.fps else None)
    if gop_s is None and len(idrs) > 1:
        gop_s = statistics.median(b - a for a, b in itertools.pairwise(idrs)) / 1e6
    frame_s = 1.0 / opts.expect.fps if opts.expect.fps else 1 / 30
    mid_latency: list[float] = []
    mid_viewers = 0
    for r in results:
        post = r.get("post_wall_us")
        earlier = [t for t in idrs if post is not None and t <= post]
        if post is None or not earlier or not gop_s:
            r["join_phase"] = None
            continue
        phase = ((post - earlier[-1]) / 1e6) / gop_s
        r["join_phase"] = round(phase, 3)
        # Mid-GOP: more than a frame after an IDR and more than a frame before the next one.
        if frame_s / gop_s < phase < 1 - frame_s / gop_s and r.get("latency_s", {}).get("n"):
            mid_viewers += 1
            mid_latency.append(r["latency_s"]["p95"])

    def col(key: str) -> list[float]:
        return [r[key] for r in results if isinstance(r.get(key), int | float)]

    # Frozen share of the time the rig could watch (its own CPU starvation left out: viewer.py).
    watched = [r.get("freeze_s", 0.0) / observed for r in results
               if (observed := r.get("observed_s", r.get("watched_s")))]
    starved = [r.get("rig_starved_s", 0.0) / r["watched_s"] for r in results
               if r.get("watched_s")]
    return {
        "connected": sum(1 for r in results if r.get("connected_s") is not None),
        "decoding": sum(1 for r in results if r.get("frames")),
        "first_au_keyframe": sum(1 for r in results if r.get("first_au_keyframe")),
        "start_lost": sum(1 for r in results
                          if r.get("start_lost") and not r.get("first_au_keyframe")),
        "decode_errors": sum(r.get("decode_errors", 0) for r in results),
        "fps": _spread(col("fps")),
        "answer_s": percentiles(col("answer_s")),
        "connected_s": percentiles(col("connected_s")),
        "first_rtp_s": percentiles(col("first_rtp_s")),
        "first_frame_s": percentiles(col("first_frame_s")),
        # Live pictures only (captured after the viewer connected); see viewer._summarize.
        "latency_s": merge_latency(results, "latency_s"),
        # The same, timed when the rig decoded each picture (its starvation and decoder included).
        "latency_decoded_s": merge_latency(results, "latency_decoded_s"),
        # The first picture's age: the cached keyframe, old by design.
        "first_frame_latency_s": percentiles(col("first_frame_latency_s")),
        "catch_up_latency_s": merge_latency(results, "catch_up_latency_s"),
        "catch_up_frames": sum(r.get("catch_up_frames", 0) for r in results),
        "latency_all_s": merge_latency(results, "latency_all_s"),
        "stamps_read": sum(r.get("stamps_read", 0) for r in results),
        "mid_gop": {"viewers": mid_viewers, "gop_s": gop_s,
                    "latency_s": percentiles(mid_latency)},
        "freezes": sum(r.get("freezes", 0) for r in results),
        "freeze_ratio": percentiles(watched),
        "max_gap_s": max(col("max_gap_s"), default=0.0),
        "max_gap_s_raw": max(col("max_gap_s_raw"), default=0.0),
        "freeze_s_raw": sum(r.get("freeze_s_raw", 0.0) for r in results),
        "rig_starved_ratio": max(starved, default=0.0),
        "bitrate_bps": percentiles(col("bitrate_bps")),
        **{k: sum(r.get(k, 0) for r in results)
           for k in ("packets_lost", "packets_unrecovered", "packets_expected", "rtx_packets",
                     "nacks_sent", "plis_sent", "rtp_packets", "rtp_bytes", "nack_retries",
                     "packets_abandoned")},
    }


def merge_latency(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Viewers' ``key`` percentiles merged: p50 is the median of their medians, p95 and max are
    the worst viewer's (a release is judged by its worst-served viewer)."""
    by_viewer = [r[key] for r in results if (r.get(key) or {}).get("n")]
    medians = [v["p50"] for v in by_viewer]
    return {
        "n": sum(v["n"] for v in by_viewer),
        "p50": statistics.median(medians) if medians else None,
        "p95": max((v["p95"] for v in by_viewer), default=None),
        "max": max((v["max"] for v in by_viewer), default=None),
    }


def device_count_figures(samples: list[tuple[float, int | None]], window: tuple[float, float],
                         expected: int) -> dict[str, Any]:
    """The device's viewer count sampled in the steady window against the harness's own."""
    counts = [c for _, c in samples]
    return {"window_s": list(window), "expected": expected, "counts": counts,
            "at_s": [round(t, 2) for t, _ in samples],
            "mismatches": sum(1 for c in counts if c != expected)}


def _device_figures(before: ProcessSample | None, after: ProcessSample | None) -> dict[str, Any]:
    if before is None or after is None:
        return {"rss_before_mb": None, "rss_after_mb": None, "cpu_percent": None}
    return {
        "rss_before_mb": before.rss_bytes / 2**20 if before.rss_bytes is not None else None,
        "rss_after_mb": after.rss_bytes / 2**20 if after.rss_bytes is not None else None,
        "cpu_percent": ProcessSample.cpu_percent(before, after),
    }


def _device_text(device: dict[str, Any]) -> str:
    if device.get("rss_after_mb") is None:
        return "RSS/CPU n/a"
    cpu = device.get("cpu_percent")
    return (f"RSS {device['rss_before_mb']:.0f}→{device['rss_after_mb']:.0f} MiB, CPU "
            + (f"{cpu:.0f}%" if cpu is not None else "n/a"))


def _whep_line(p: FleetProgress, elapsed: float) -> str:
    return p.whep_line(elapsed)


def dumps(report: Report) -> str:
    """The JSON report as text (for ``--report -``)."""
    return json.dumps(report.to_json(), indent=2)
