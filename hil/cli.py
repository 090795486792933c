"""``python -m hil``: ``run`` (the release battery), ``load`` (load test) and ``glass``.

``run --simulate`` builds a simulated rig (see :mod:`hil.simulated_rig`) and re-runs itself inside
the rig's network namespace against the simulated device; the report is the same either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path

from hil.battery import CHECKS, Battery, Expectation, RigOptions
from hil.browser import SAFARI
from hil.fleet import default_workers
from hil.report import Progress, Report


def _add_device_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", metavar="URL",
                   help="device base URL, e.g. http://192.168.1.50:8080 (not with --simulate)")
    p.add_argument("--token", default=os.environ.get("RUSEON_HIL_TOKEN", ""),
                   help="Bearer token (default $RUSEON_HIL_TOKEN)")
    p.add_argument("--viewers", type=int, default=5, metavar="N", help="concurrent viewers")
    p.add_argument("--duration", type=float, default=20.0, metavar="S",
                   help="seconds the viewers watch (steady state)")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="viewer worker processes (default: one per core)")
    p.add_argument("--report", type=Path, metavar="FILE", help="write the JSON report here")
    p.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML here")
    p.add_argument("--quiet", action="store_true", help="no progress lines, summary only")
    exp = p.add_argument_group("what the device is configured to send")
    exp.add_argument("--device-config", type=Path, metavar="TOML",
                     help="the device's ruseon.toml: [camera] width/height/framerate/bitrate/"
                          "keyframe_interval become the expectations")
    exp.add_argument("--expect-width", type=int)
    exp.add_argument("--expect-height", type=int)
    exp.add_argument("--expect-fps", type=float)
    exp.add_argument("--expect-bitrate", type=int)
    exp.add_argument("--expect-gop", type=int, metavar="FRAMES", help="keyframe interval")
    sim = p.add_argument_group("simulated rig")
    sim.add_argument("--simulate", action="store_true",
                     help="start the appliance with the synthetic source in network namespaces "
                          "this harness creates, and run against it (needs root)")
    sim.add_argument("--loss", type=float, default=0.0, metavar="PCT",
                     help="random packet loss in percent, both directions (nftables numgen)")
    sim.add_argument("--delay-ms", type=float, default=0.0, metavar="MS",
                     help="added one-way delay (NFQUEUE helper; needs NetfilterQueue)")
    sim.add_argument("--fault", choices=("none", "stop-source", "freeze-device"), default="none",
                     help="break the simulated device on purpose (to test the harness)")
    sim.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                     help="extra argument for the simulated `ruseon serve` (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for ``python -m hil``."""
    parser = argparse.ArgumentParser(prog="hil", description="RUSEON hardware-in-the-loop harness")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run the release battery; exit 1 if any check fails")
    _add_device_flags(run)
    run.add_argument("--ssh", metavar="USER@HOST",
                     help="enables restart and watchdog checks (passwordless sudo systemctl): "
                          "the defaults of --restart-cmd and --stop-cmd")
    run.add_argument("--restart-cmd", metavar="CMD",
                     help="rig-side command restarting the service (default with --ssh: ssh "
                          "USER@HOST sudo systemctl restart ruseon)")
    run.add_argument("--stop-cmd", metavar="CMD",
                     help="rig-side command freezing the service for the watchdog check "
                          "(default with --ssh: ssh USER@HOST sudo systemctl kill "
                          "--signal=SIGSTOP ruseon)")
    run.add_argument("--power-cmd", metavar="CMD",
                     help="power switch command; '{on|off}' is replaced by on or off")
    run.add_argument("--power-off-s", type=float, default=3.0, metavar="S",
                     help="how long the power check leaves the device off")
    # Set by the simulated rig for its inner run: there is no systemd for the watchdog check.
    run.add_argument("--simulated-device", action="store_true", help=argparse.SUPPRESS)
    run.add_argument("--skip", nargs="+", default=[], choices=CHECKS, metavar="CHECK",
                     help="checks to skip: " + ", ".join(CHECKS))
    run.add_argument("--glass", action="store_true",
                     help="the camera films `python -m hil glass` on a display: the stamp is the "
                          "rig's clock, so the latency check measures glass-to-glass")
    run.add_argument("--clock-synced", action="store_true",
                     help="device and rig clocks agree (PTP/NTP): judge capture-to-decode latency")
    run.add_argument("--max-latency-ms", type=float, default=400.0,
                     help="latency: the worst viewer's live p95 may be at most this (ms)")
    run.add_argument("--max-freeze-ratio", type=float, default=0.05, metavar="SHARE",
                     help="steady-state: the share of its watch a viewer may spend frozen "
                          "(gaps > 200 ms; default 0.05)")
    run.add_argument("--max-gap", type=float, default=1.0, metavar="S",
                     help="steady-state: the longest gap between pictures (default 1 s)")
    browser = run.add_argument_group("a real browser in the rig (the browser check)")
    browser.add_argument("--webdriver", metavar="URL",
                         help="a W3C WebDriver endpoint, e.g. http://127.0.0.1:4444 tunnelled "
                              "to `safaridriver -p 4444` on a Mac (enables the browser check)")
    browser.add_argument("--webdriver-capabilities", type=json.loads, metavar="JSON",
                         default=dict(SAFARI),
                         help='the session\'s capabilities (default {"browserName": "safari"})')
    browser.add_argument("--browser-url", metavar="URL",
                         help="the device page as that browser reaches it (default --device)")
    browser.add_argument("--browser-expect", nargs="*", choices=("webrtc", "native-hls"),
                         metavar="WHAT",
                         help="what must have played: webrtc (as a visitor opens the page), "
                              "native-hls (HLS chosen by hand, the browser's own player); "
                              "default both for Safari, none otherwise")
    browser.add_argument("--browser-watch", type=float, default=5.0, metavar="S",
                         help="seconds each transport is watched")
    run.add_argument("--churn", type=float, default=10.0, metavar="S", help="churn duration")
    load = commands.add_parser("load", help="load test: N viewers for S seconds, live progress")
    _add_device_flags(load)
    load.add_argument("--decode", choices=("first", "all"), default="first",
                      help="decode only up to each viewer's first picture (default) or all")
    load.add_argument("--ramp", type=float, default=0.0, metavar="S",
                      help="spread the joins over S seconds (default: all at once)")
    switch = commands.add_parser(
        "sim-switch", help="the simulated rig's power switch / service control (internal)")
    switch.add_argument("--socket", type=Path, required=True)
    switch.add_argument("action", choices=("on", "off", "restart", "stop"))
    glass = commands.add_parser(
        "glass", help="render the rig's clock as glass patterns (y4m) for a display to film")
    glass.add_argument("--width", type=int, default=1280)
    glass.add_argument("--height", type=int, default=720)
    glass.add_argument("--fps", type=int, default=60)
    glass.add_argument("--seconds", type=float, default=0.0, help="0 = until interrupted")
    glass.add_argument("--output", type=Path, default=Path("-"),
                       help="y4m file, or - for stdout (pipe into `ffplay -fs -`)")
    return parser


def expectation_from(args: argparse.Namespace) -> Expectation:
    """Expectations from ``--device-config`` then the ``--expect-*`` flags."""
    exp = Expectation()
    if args.device_config:
        camera = tomllib.loads(args.device_config.read_text(encoding="utf-8")).get("camera", {})
        exp = Expectation(width=camera.get("width"), height=camera.get("height"),
                          fps=camera.get("framerate"), bitrate=camera.get("bitrate"),
                          keyframe_interval=camera.get("keyframe_interval"))
    for field_name, flag in (("width", "expect_width"), ("height", "expect_height"),
                             ("fps", "expect_fps"), ("bitrate", "expect_bitrate"),
                             ("keyframe_interval", "expect_gop")):
        value = getattr(args, flag)
        if value is not None:
            setattr(exp, field_name, value)
    return exp


def browser_expect(args: argparse.Namespace) -> frozenset[str]:
    """``--browser-expect``; by default Safari must play WebRTC and native HLS (what only it,
    of the engines the project tests, can confirm), any other browser nothing in particular."""
    if args.browser_expect is not None:
        return frozenset(args.browser_expect)
    if args.webdriver_capabilities.get("browserName") == "safari":
        return frozenset({"webrtc", "native-hls"})
    return frozenset()


def _finish(report: Report, args: argparse.Namespace) -> int:
    print()
    print(report.summary_table())
    if args.report:
        report.write_json(args.report)
        print(f"JSON report: {args.report}")
    if args.junit:
        report.write_junit(args.junit)
        print(f"JUnit XML: {args.junit}")
    return 0 if report.passed else 1


def ssh_command(ssh: str, remote: str) -> str:
    """A rig-side command running ``remote`` on ``ssh`` (key login, no prompts)."""
    return shlex.join(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", ssh, remote])


def rig_options(args: argparse.Namespace) -> RigOptions:
    """The battery's options from ``hil run``'s arguments."""
    restart_cmd, stop_cmd = args.restart_cmd, args.stop_cmd
    if args.ssh:
        restart_cmd = restart_cmd or ssh_command(args.ssh, "sudo systemctl restart ruseon")
        stop_cmd = stop_cmd or ssh_command(args.ssh,
                                           "sudo systemctl kill --signal=SIGSTOP ruseon")
    return RigOptions(
        device=args.device, token=args.token, ssh=args.ssh, power_cmd=args.power_cmd,
        restart_cmd=restart_cmd, stop_cmd=stop_cmd, power_off_s=args.power_off_s,
        simulated=args.simulated_device,
        viewers=args.viewers, duration_s=args.duration,
        workers=args.workers or default_workers(args.viewers), skip=set(args.skip),
        expect=expectation_from(args), clock_shared=args.clock_synced or args.glass,
        glass=args.glass, max_latency_ms=args.max_latency_ms,
        max_freeze_ratio=args.max_freeze_ratio, max_gap_s=args.max_gap, churn_s=args.churn,
        webdriver=args.webdriver, browser_capabilities=args.webdriver_capabilities,
        browser_url=args.browser_url, browser_expect=browser_expect(args),
        browser_watch_s=args.browser_watch,
    )


def command_run(args: argparse.Namespace) -> int:
    """``hil run`` against ``--device``."""
    options = rig_options(args)
    progress = Progress(quiet=args.quiet)
    report = asyncio.run(Battery(options, progress).run())
    return _finish(report, args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 all passed, 1 a check failed, 2 usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "glass":
        from hil.glass import render

        return render(args.output, args.width, args.height, args.fps, args.seconds)
    if args.command == "sim-switch":
        from hil.simulated_rig import switch

        return switch(args.socket, args.action)
    if args.simulate:
        from hil.simulated_rig import run_simulated

        return run_simulated(args, list(argv if argv is not None else sys.argv[1:]))
    if not args.device:
        parser.error("--device URL is required (or --simulate)")
    if args.command == "load":
        from hil.load_test import run_load

        return run_load(args)
    return command_run(args)


def elapsed_since(t0: float) -> float:
    """Seconds since ``t0`` (monotonic)."""
    return time.monotonic() - t0
