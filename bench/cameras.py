"""Camera benchmark: what one more camera costs the real ``ruseon serve``, with no viewers.

Issue 31, goal 4 ("cheap cameras": at most 4 MiB of RSS and 0.3 % of a core per extra camera
at 2 Mbit/s). ``ruseon serve`` runs with 1 and with ``--cameras`` K file cameras (each replaying
the fan-out bench's 720p30 2 Mbit/s recording, ``bench/fanout.py``; the default config
otherwise: HLS on, motion detection on, no recording), in turns, ``--runs`` times. For each
server, after ``--at`` seconds (default 25: the rings have wrapped and the HLS windows are
full) its RSS, and its CPU (every thread, ``/proc/PID/stat``) over the ``--window`` seconds
before that. The figure is the slope:

    per extra camera = (figure at K cameras - figure at 1 camera) / (K - 1)

``--variants`` adds configurations measured the same way in the same run, e.g. ``no-motion``
(``motion = false`` on every camera), to show what each room costs per camera. The largest
mappings of each server (``/proc/PID/smaps``) are printed beside its RSS.

Python runs the tree from compiled bytecode (``PYTHONPYCACHEPREFIX`` in ``.cache/pycache``,
compiled before the first run), as the image does (it ships ``.pyc`` files): a checkout run with
``PYTHONDONTWRITEBYTECODE=1`` compiles every module at each start, and the compiler's garbage
stays in the heap (12 MiB more RSS at import here).

    .venv/bin/python bench/cameras.py                       # 1 and 6 cameras, default config
    .venv/bin/python bench/cameras.py --cameras 11 --variants default no-motion --runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from fanout import free_port, recorded_stream
from memory import rss_of, smaps_top
from relay import cpu_seconds

from tests.tooling import stop_process

ROOT = Path(__file__).resolve().parent.parent
PYCACHE = ROOT / ".cache" / "pycache"

# Each variant: extra keys for every [[camera]] table.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "no-motion": {"motion": False},
}


def compiled_env() -> dict[str, str]:
    """The environment of a served tree: its bytecode compiled once, in ``.cache/pycache``."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(PYCACHE)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    site = next(p for p in sys.path if p.endswith("site-packages"))
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0",
                    str(ROOT / "ruseon_appliance"), site], env=env, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return env


def config_text(cameras: int, extra: dict[str, Any], stream: Path) -> str:
    lines = []
    for i in range(cameras):
        lines += ["[[camera]]", f'name = "cam{i}"', f'source = "file:{stream}"']
        lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def measure(cameras: int, variant: str, at: float, window: float,
            env: dict[str, str]) -> dict[str, Any]:
    """One ``ruseon serve`` with ``cameras`` file cameras: RSS at ``at`` s, CPU over the
    ``window`` s before."""
    state = tempfile.mkdtemp(prefix="bench-cameras-")
    config = Path(state) / "ruseon.toml"
    config.write_text(config_text(cameras, VARIANTS[variant], recorded_stream()))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ruseon_appliance", "serve", "--config", str(config),
         "--http", f"127.0.0.1:{free_port()}", "--rtc", "127.0.0.1:0",
         "--advertise", "127.0.0.1", "--state-dir", state, "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started = time.monotonic()
    try:
        time.sleep(max(0.0, started + at - window - time.monotonic()))
        if proc.poll() is not None:
            raise RuntimeError(f"ruseon serve exited with {proc.returncode}: "
                               f"{proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(max(0.0, started + at - time.monotonic()))
        cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
        return {"cameras": cameras, "variant": variant, "rss_kib": rss_of(proc.pid),
                "cpu_percent": 100 * (cpu1 - cpu0) / (t1 - t0), "top": smaps_top(proc.pid, 6)}
    finally:
        stop_process(proc, timeout_s=20)
        subprocess.run(["rm", "-rf", state], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=6, help="K (measured against 1)")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["default"])
    parser.add_argument("--at", type=float, default=25.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    if args.cameras < 2:
        parser.error("--cameras must be at least 2")
    env = compiled_env()
    rows: list[dict[str, Any]] = []
    for _ in range(args.runs):
        for variant in args.variants:
            for n in (1, args.cameras):
                row = measure(n, variant, args.at, args.window, env)
                rows.append(row)
                top = ", ".join(f"{name} {kib / 1024:.1f}" for name, kib in row["top"])
                print(f"{variant:10} {n:3} cameras: RSS {row['rss_kib'] / 1024:6.1f} MiB, "
                      f"CPU {row['cpu_percent']:5.2f} % of a core  ({top})", flush=True)
    print()
    print(f"{'variant':10} | RSS 1 cam | RSS {args.cameras} cams | per extra camera | "
          f"CPU 1 cam | CPU {args.cameras} cams | per extra camera")
    summary = {}
    for variant in args.variants:
        def med(n: int, key: str, variant: str = variant) -> float:
            return statistics.median(r[key] for r in rows
                                     if r["variant"] == variant and r["cameras"] == n)
        rss1, rssk = med(1, "rss_kib") / 1024, med(args.cameras, "rss_kib") / 1024
        cpu1, cpuk = med(1, "cpu_percent"), med(args.cameras, "cpu_percent")
        per_rss, per_cpu = (rssk - rss1) / (args.cameras - 1), (cpuk - cpu1) / (args.cameras - 1)
        summary[variant] = {"rss_1_mib": round(rss1, 1), "rss_k_mib": round(rssk, 1),
                            "mib_per_camera": round(per_rss, 2), "cpu_1": round(cpu1, 2),
                            "cpu_k": round(cpuk, 2), "cpu_per_camera": round(per_cpu, 3)}
        print(f"{variant:10} | {rss1:6.1f} MiB | {rssk:7.1f} MiB  | {per_rss:6.2f} MiB       | "
              f"{cpu1:5.2f} %   | {cpuk:6.2f} %    | {per_cpu:5.3f} % of a core")
    print(json.dumps({"figure": "cameras", "k": args.cameras, "at_s": args.at,
                      "summary": summary, "rows": rows}))


if __name__ == "__main__":
    main()
