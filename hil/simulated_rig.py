"""The simulated rig: a device and a rig in two network namespaces this harness creates itself.

::

    ┌ ruseon-dev-<pid> ───────────────┐   veth    ┌ ruseon-rig-<pid> ─────────────────┐
    │ ruseon serve --source synthetic │◄─────────►│ python -m hil run --device ...    │
    │ 198.18.100.1 (HTTP 8080, UDP    │  (loss,   │ 198.18.100.2 (viewer workers)     │
    │ 8189)                           │   delay)  │                                   │
    └─────────────────────────────────┘           └───────────────────────────────────┘

The addresses are from 198.18.0.0/15 (RFC 2544, benchmarking) and exist only inside the two
namespaces, so nothing reaches any other network. Impairment is applied on the device's side of
the veth: random loss with an nftables ``numgen`` rule on UDP (WebRTC) in both directions, and
added delay with an NFQUEUE helper (:mod:`hil.impairment`). The rig side is this same program
re-run with ``ip netns exec``, so the battery that judges a real board judges the simulated one.

Faults (``--fault``) break the simulated device on purpose, to prove the harness catches it:

- ``stop-source``: the camera is a stand-in ``rpicam`` command streaming libx264 from ffmpeg;
  once the device is up its encoder is stopped (SIGSTOP). HTTP keeps answering; video stops.
- ``drop-media``: every UDP packet the device sends is dropped (an nftables rule).
- ``freeze-device``: the whole device process is stopped (SIGSTOP).

The rig also plays the device's power switch and service manager, so the ``power`` and
``restart`` checks run here too: the inner run gets ``--power-cmd`` and ``--restart-cmd`` that
call ``python -m hil sim-switch`` (:func:`switch`), which asks this outer process over a Unix
socket in the work directory to SIGKILL the device ("off": the power is cut), start it again in
the device namespace with the same state directory ("on": it boots and must present the same
certificate), or stop it gracefully and start it again ("restart", as ``systemctl restart``
does). There is no systemd here to restart a frozen service, so the ``watchdog`` check is left
to ``tests/e2e/test_systemd.py``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

DEVICE_ADDR = "198.18.100.1"
RIG_ADDR = "198.18.100.2"
PREFIX = 24
HTTP_PORT = 8080
RTC_PORT = 8189
# Small pictures keep N decoding viewers affordable on a 2-core CI machine.
DEFAULT_CAMERA: dict[str, object] = {
    "width": 320, "height": 240, "framerate": 30, "bitrate": 500_000, "keyframe_interval": 30,
}
START_TIMEOUT_S = 60.0
# The device's viewer limit unless --serve-arg says otherwise: small, so the whep check can
# fill it for the 503 case, yet above the battery's viewers (see _max_viewers).
SIM_MAX_VIEWERS = 8
# How long a graceful stop (SIGTERM) may take before the simulated restart kills the device.
STOP_TIMEOUT_S = 10.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@dataclass
class SimulatedRig:
    """Two namespaces, a veth pair between them, the device process and its impairment."""

    loss_pct: float = 0.0
    delay_ms: float = 0.0
    tag: str = field(default_factory=lambda: str(os.getpid()))
    work_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ruseon-hil-")))
    device_proc: subprocess.Popen[bytes] | None = None
    delay_proc: subprocess.Popen[bytes] | None = None
    _made: list[str] = field(default_factory=list)
    _device_argv: list[str] = field(default_factory=list)
    # The device process is replaced by the control thread (power, restart): one at a time.
    _device_lock: threading.Lock = field(default_factory=threading.Lock)
    _control: socket.socket | None = None
    _control_thread: threading.Thread | None = None

    @property
    def dev_ns(self) -> str:
        """Name of the device's namespace."""
        return f"ruseon-dev-{self.tag}"

    @property
    def rig_ns(self) -> str:
        """Name of the rig's namespace."""
        return f"ruseon-rig-{self.tag}"

    @property
    def device_url(self) -> str:
        """The simulated device's base URL (reachable from the rig namespace only)."""
        return f"http://{DEVICE_ADDR}:{HTTP_PORT}"

    def build(self) -> None:
        """Create the namespaces and the veth pair; apply loss."""
        atexit.register(self.teardown)
        for ns in (self.dev_ns, self.rig_ns):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        # Interface names are limited to 15 characters.
        dev_if, rig_if = f"hd{self.tag[-8:]}", f"hr{self.tag[-8:]}"
        _ip("link", "add", dev_if, "type", "veth", "peer", "name", rig_if)
        _ip("link", "set", dev_if, "netns", self.dev_ns)
        _ip("link", "set", rig_if, "netns", self.rig_ns)
        for ns, ifname, addr in ((self.dev_ns, dev_if, DEVICE_ADDR),
                                 (self.rig_ns, rig_if, RIG_ADDR)):
            _ip("-n", ns, "addr", "add", f"{addr}/{PREFIX}", "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
        if self.loss_pct > 0:
            self.nft(loss_ruleset(self.loss_pct))
        if self.delay_ms > 0:
            from hil.impairment import start_delay

            self.delay_proc = start_delay(self.dev_ns, self.delay_ms, self.work_dir)

    def nft(self, ruleset: str) -> None:
        """Load an nftables ruleset into the device namespace."""
        subprocess.run(["ip", "netns", "exec", self.dev_ns, "nft", "-f", "-"], input=ruleset,
                       text=True, check=True, capture_output=True)

    def start_device(self, config: Path, extra: list[str], *, source: str = "synthetic",
                     token: str = "") -> None:
        """Start ``ruseon serve`` in the device namespace, bound to and advertising its veth."""
        argv = ["ip", "netns", "exec", self.dev_ns, sys.executable, "-m", "ruseon_appliance",
                "serve", "--config", str(config), "--source", source,
                "--http", f"{DEVICE_ADDR}:{HTTP_PORT}", "--rtc", f"{DEVICE_ADDR}:{RTC_PORT}",
                "--advertise", DEVICE_ADDR, "--state-dir", str(self.work_dir / "state"), *extra]
        if token:
            # The token is the admin secret; the simulated board also requires it for viewing
            # (auth.viewing = "credential"), so the battery's WHEP 401 cases have something to
            # check. A real board's viewing is open by default.
            argv = ["env", "RUSEON_AUTH_VIEWING=credential", *argv]
            argv += ["--token", token]
        self._device_argv = argv
        self._spawn_device()

    def _spawn_device(self) -> None:
        # Appending: a power cycle or restart keeps the earlier lives' log.
        with (self.work_dir / "device.log").open("ab") as log:
            self.device_proc = subprocess.Popen(self._device_argv, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def _end_device(self, sig: signal.Signals, timeout_s: float) -> None:
        """Send ``sig`` to the device's process group and wait for it (SIGKILL after
        ``timeout_s``)."""
        proc = self.device_proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def control(self, action: str) -> str:
        """Do one switch ``action`` (on, off, restart, stop) to the device; "ok" or why not."""
        with self._device_lock:
            running = self.device_proc is not None and self.device_proc.poll() is None
            if action == "off":
                self._end_device(signal.SIGKILL, 5.0)  # the power is cut: no goodbye
            elif action == "on":
                if running:
                    return "error: the device is already on"
                self._spawn_device()
            elif action == "restart":
                self._end_device(signal.SIGTERM, STOP_TIMEOUT_S)
                self._spawn_device()
            elif action == "stop":
                if not running:
                    return "error: the device is not running"
                self.signal_device(signal.SIGSTOP)
            else:
                return f"error: unknown action {action!r}"
        return "ok"

    @property
    def camera_broken_flag(self) -> Path:
        """Exists once the stop-source fault is applied; the stand-in camera then stays silent."""
        return self.work_dir / "camera-broken"

    @property
    def control_path(self) -> Path:
        """The Unix socket :func:`switch` talks to (a path, so it works across namespaces)."""
        return self.work_dir / "switch.sock"

    def serve_control(self) -> None:
        """Answer :func:`switch` requests on :attr:`control_path` in a thread until teardown."""
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.control_path))
        server.listen(4)
        server.settimeout(0.5)
        self._control = server

        def loop() -> None:
            while self._control is not None:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return  # closed by teardown
                with conn:
                    conn.settimeout(None)
                    action = conn.makefile("r").readline().strip()
                    conn.sendall((self.control(action) + "\n").encode())

        self._control_thread = threading.Thread(target=loop, name="sim-switch", daemon=True)
        self._control_thread.start()

    def switch_commands(self) -> dict[str, str]:
        """``--power-cmd`` and ``--restart-cmd`` for the inner run."""
        base = [sys.executable, "-m", "hil", "sim-switch", "--socket", str(self.control_path)]
        return {"--power-cmd": shlex.join(base) + " {on|off}",
                "--restart-cmd": shlex.join([*base, "restart"])}

    def wait_device(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """True once ``/healthz`` answers 200 (probed from the rig namespace)."""
        deadline = time.monotonic() + timeout_s
        probe = ["ip", "netns", "exec", self.rig_ns, sys.executable, "-c",
                 "import sys, urllib.request as u\n"
                 "try:\n"
                 f"    sys.exit(0 if u.urlopen('{self.device_url}/healthz', timeout=2).status == "
                 "200 else 1)\n"
                 "except Exception:\n    sys.exit(1)\n"]
        while time.monotonic() < deadline:
            if self.device_proc is not None and self.device_proc.poll() is not None:
                return False
            if subprocess.run(probe, capture_output=True).returncode == 0:
                return True
            time.sleep(0.5)
        return False

    def device_log(self, lines: int = 30) -> str:
        """The last lines the device wrote."""
        path = self.work_dir / "device.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def signal_device(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the device process (the Python process under ``ip netns exec``)."""
        if self.device_proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.device_proc.pid, sig)

    def teardown(self) -> None:
        """Stop the device and the helpers, delete the namespaces (idempotent)."""
        server, self._control = self._control, None
        if server is not None:
            server.close()
        if self._control_thread is not None:
            self._control_thread.join(timeout=STOP_TIMEOUT_S + 10)
            self._control_thread = None
        for proc in (self.device_proc, self.delay_proc):
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.device_proc = self.delay_proc = None
        while self._made:
            ns = self._made.pop()
            # Deleting the namespace also deletes the veth end inside it (and so its peer).
            _ip("netns", "del", ns, check=False)


def loss_ruleset(loss_pct: float) -> str:
    """nftables rules dropping ``loss_pct`` % of UDP in each direction (per mille resolution)."""
    per_mille = round(loss_pct * 10)
    return f"""
table inet ruseon_hil_loss {{
    chain ingress_udp {{
        type filter hook input priority 0; policy accept;
        meta l4proto udp numgen random mod 1000 < {per_mille} counter drop
    }}
    chain egress_udp {{
        type filter hook output priority 0; policy accept;
        meta l4proto udp numgen random mod 1000 < {per_mille} counter drop
    }}
}}
"""


DROP_MEDIA_RULESET = """
table inet ruseon_hil_fault {
    chain egress_udp {
        type filter hook output priority 0; policy accept;
        meta l4proto udp counter drop
    }
}
"""

# A stand-in camera for the stop-source fault: ffmpeg streams H.264 in real time on stdout until
# the harness stops it. It ignores the rpicam-vid arguments the device appends. Once the rig has
# broken it (the flag file exists), a camera the device restarts stays silent, like a dead sensor:
# otherwise the device's restart-for-a-keyframe would heal the fault and the run would flake.
FAKE_CAMERA = """#!/bin/sh
if [ -e {broken} ]; then exec sleep 3600; fi
exec ffmpeg -hide_banner -loglevel error -re -f lavfi -i testsrc2=size={w}x{h}:rate={fps} \\
    -c:v libx264 -preset ultrafast -tune zerolatency -profile:v baseline -bf 0 -g {gop} \\
    -x264-params repeat-headers=1 -f h264 -
"""


def _camera_toml(camera: dict[str, object], rpicam_command: str = "") -> str:
    lines = ["[camera]"] + [f"{k} = {v}" for k, v in camera.items()]
    if rpicam_command:
        lines.append(f'rpicam_command = "{rpicam_command}"')
    return "\n".join(lines) + "\n"


def _read_camera(path: Path | None) -> dict[str, object]:
    if path is None:
        return dict(DEFAULT_CAMERA)
    import tomllib

    camera = dict(DEFAULT_CAMERA)
    camera.update(tomllib.loads(path.read_text(encoding="utf-8")).get("camera", {}))
    return camera


def switch(path: Path, action: str) -> int:
    """``hil sim-switch``: ask the simulated rig to do ``action``; 0 when it did."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(STOP_TIMEOUT_S + 20)
            conn.connect(str(path))
            conn.sendall(action.encode() + b"\n")
            answer = conn.makefile("r").readline().strip()
    except OSError as exc:
        print(f"hil sim-switch: {path}: {exc}", file=sys.stderr)
        return 1
    if answer != "ok":
        print(f"hil sim-switch {action}: {answer or 'no answer'}", file=sys.stderr)
        return 1
    return 0


def _max_viewers(serve_args: list[str], viewers: int) -> list[str]:
    """``--max-viewers`` for the simulated device unless ``--serve-arg`` sets it: small enough
    for the 503 case, with room for the battery's viewers and a probe beside them."""
    if any(a.split("=", 1)[0] == "--max-viewers" for a in serve_args):
        return []
    return ["--max-viewers", str(max(SIM_MAX_VIEWERS, viewers + 3))]


def _strip_sim_flags(argv: list[str]) -> list[str]:
    """``argv`` without the flags only the outer (namespace-building) process understands."""
    with_value = {"--loss", "--delay-ms", "--fault", "--serve-arg", "--device", "--device-config",
                  "--report", "--junit", "--power-cmd", "--restart-cmd", "--stop-cmd"}
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if arg == "--simulate":
            continue
        if name in with_value:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def _pids_of_children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def run_simulated(args: argparse.Namespace, argv: list[str]) -> int:
    """Build the rig, start the device, run ``hil`` inside the rig namespace, tear down."""
    if os.geteuid() != 0:
        print("hil: --simulate needs root (it creates network namespaces)", file=sys.stderr)
        return 2
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            print(f"hil: --simulate needs `{tool}` (apt install iproute2 nftables)",
                  file=sys.stderr)
            return 2
    fault = getattr(args, "fault", "none")
    rig = SimulatedRig(loss_pct=args.loss, delay_ms=args.delay_ms)
    camera = _read_camera(args.device_config)
    config = rig.work_dir / "device.toml"
    source = "synthetic"
    if fault == "stop-source":
        script = rig.work_dir / "fake-camera.sh"
        script.write_text(FAKE_CAMERA.format(w=camera["width"], h=camera["height"],
                                             fps=camera["framerate"],
                                             gop=camera["keyframe_interval"],
                                             broken=shlex.quote(str(rig.camera_broken_flag))))
        script.chmod(0o755)
        config.write_text(_camera_toml(camera, str(script)))
        source = "rpicam"
    else:
        config.write_text(_camera_toml(camera))
    stopped_signals = [signal.SIGINT, signal.SIGTERM]
    returncode = 1
    previous = {s: signal.getsignal(s) for s in stopped_signals}

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    for s in stopped_signals:
        signal.signal(s, interrupted)
    try:
        print(f"[sim] namespaces {rig.dev_ns} / {rig.rig_ns}, device {rig.device_url}, "
              f"loss {args.loss:g}%, delay {args.delay_ms:g} ms, fault {fault}, "
              f"work dir {rig.work_dir}", flush=True)
        rig.build()
        serve_args = list(args.serve_arg)
        rig.start_device(config, serve_args + _max_viewers(serve_args, args.viewers),
                         source=source, token=args.token)
        if not rig.wait_device():
            print("[sim] the simulated device did not become healthy; its log:\n"
                  + rig.device_log(), file=sys.stderr)
            return 1
        print("[sim] device healthy", flush=True)
        _apply_fault(rig, fault)
        inner = [sys.executable, "-m", "hil", *_strip_sim_flags(argv),
                 "--device", rig.device_url, "--device-config", str(config)]
        if args.command == "run":
            inner += ["--clock-synced", "--simulated-device"]  # same machine, same clock
            rig.serve_control()
            for flag, command in rig.switch_commands().items():
                inner += [flag, command]
        for flag, value in (("--report", args.report), ("--junit", args.junit)):
            if value is not None:
                inner += [flag, str(Path(value).resolve())]
        cmd = ["ip", "netns", "exec", rig.rig_ns, *inner]
        print("[sim] " + shlex.join(cmd), flush=True)
        returncode = subprocess.run(cmd, cwd=os.getcwd()).returncode
        return returncode
    except KeyboardInterrupt:
        return 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        rig.teardown()
        if returncode == 0:
            # A passing run leaves nothing behind; a failing one keeps the device log to read.
            shutil.rmtree(rig.work_dir, ignore_errors=True)
            print("[sim] torn down", flush=True)
        else:
            print(f"[sim] torn down; device log in {rig.work_dir / 'device.log'}", flush=True)


def _apply_fault(rig: SimulatedRig, fault: str) -> None:
    if fault == "drop-media":
        rig.nft(DROP_MEDIA_RULESET)
    elif fault == "freeze-device":
        rig.signal_device(signal.SIGSTOP)
    elif fault == "stop-source":
        assert rig.device_proc is not None
        rig.camera_broken_flag.touch()
        cameras = [p for p in _pids_of_children(rig.device_proc.pid)
                   if _comm(p) == "ffmpeg"]
        for pid in cameras:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        # Wait until the device itself notices (its /healthz turns 503) so the run is decisive.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _healthz(rig) == 200:
            time.sleep(0.5)
    if fault != "none":
        print(f"[sim] fault applied: {fault}", flush=True)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _healthz(rig: SimulatedRig) -> int | None:
    probe = ["ip", "netns", "exec", rig.rig_ns, sys.executable, "-c",
             "import urllib.request as u, urllib.error as e\n"
             "try:\n"
             f"    print(u.urlopen('{rig.device_url}/healthz', timeout=2).status)\n"
             "except e.HTTPError as x:\n    print(x.code)\n"]
    out = subprocess.run(probe, capture_output=True, text=True).stdout.strip()
    return int(out) if out.isdigit() else None

