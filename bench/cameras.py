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

``--baseline DIR`` serves another checkout (with its own ``.venv`` symlink, e.g.
``git -C /work/main archive HEAD | tar -x -C /tmp/rss-before``) in the same run, in turns with
this one, and prints each figure of this tree as a ratio of the baseline's.

``--fresh`` (issue 31, goal 5: fresh RSS) measures one camera only, for each variant: RSS at
each of ``--fresh-at`` seconds after start (default 8 and 25), and with ``--viewer`` once more
after one real viewer (``bench/fanout.py``'s worker: a recvonly aiortc peer over WHEP) has
received video and ``--viewer-s`` seconds have passed: what the first viewer costs.

    .venv/bin/python bench/cameras.py --fresh --viewer --variants no-motion default \
        --runs 3 --baseline /tmp/rss-before
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

from fanout import Viewers, free_port, recorded_stream
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


def compiled_env(trees: list[Path] | None = None) -> dict[str, str]:
    """The environment of a served tree: its bytecode compiled once, in ``.cache/pycache``."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(PYCACHE)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # Each tree runs its own code: nothing on PYTHONPATH may shadow the tree's package.
    env.pop("PYTHONPATH", None)
    site = next(p for p in sys.path if p.endswith("site-packages"))
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0",
                    *(str(tree / "ruseon_appliance") for tree in trees or [ROOT]), site],
                   env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return env


def config_text(cameras: int, extra: dict[str, Any], stream: Path) -> str:
    lines = []
    for i in range(cameras):
        lines += ["[[camera]]", f'name = "cam{i}"', f'source = "file:{stream}"']
        lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def measure(cameras: int, variant: str, at: float, window: float,
            env: dict[str, str], tree: Path = ROOT) -> dict[str, Any]:
    """One ``ruseon serve`` with ``cameras`` file cameras: RSS at ``at`` s, CPU over the
    ``window`` s before."""
    rows = serve_readings(cameras, variant, [at], env, tree, window=window)
    return rows[0]


def serve_readings(cameras: int, variant: str, at: list[float], env: dict[str, str],
                   tree: Path = ROOT, *, window: float = 0.0,
                   viewer_s: float | None = None) -> list[dict[str, Any]]:
    """One ``ruseon serve`` of ``tree`` with ``cameras`` file cameras: a reading (RSS, CPU over
    the ``window`` s before) at each of ``at`` seconds after start, and with ``viewer_s`` one
    more ``viewer_s`` s after one viewer has received video (``at_s`` ``"viewer"``)."""
    state = tempfile.mkdtemp(prefix="bench-cameras-")
    config = Path(state) / "ruseon.toml"
    config.write_text(config_text(cameras, VARIANTS[variant], recorded_stream()))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ruseon_appliance", "serve", "--config", str(config),
         "--http", f"127.0.0.1:{port}", "--rtc", "127.0.0.1:0",
         "--advertise", "127.0.0.1", "--state-dir", state, "--log-level", "warning"],
        cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []

    def reading(at_s: float | str, since: float) -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"ruseon serve exited with {proc.returncode}: "
                               f"{proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(max(0.0, since - time.monotonic()))
        cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
        rows.append({"tree": str(tree), "cameras": cameras, "variant": variant, "at_s": at_s,
                     "rss_kib": rss_of(proc.pid),
                     "cpu_percent": 100 * (cpu1 - cpu0) / max(t1 - t0, 1e-9),
                     "top": smaps_top(proc.pid, 6)})

    try:
        for seconds in at:
            time.sleep(max(0.0, started + seconds - window - time.monotonic()))
            reading(seconds, started + seconds)
        if viewer_s is not None:
            viewers = Viewers(f"http://127.0.0.1:{port}", 1, workers=1)
            try:
                reading("viewer", time.monotonic() + viewer_s)
            finally:
                viewers.close()
        return rows
    finally:
        stop_process(proc, timeout_s=20)
        subprocess.run(["rm", "-rf", state], check=False)


def fresh_main(args: argparse.Namespace, trees: list[Path], env: dict[str, str]) -> None:
    """``--fresh``: one camera per variant, per tree, RSS at each ``--fresh-at`` (and after a
    viewer), ``--runs`` rounds alternating the trees; medians and ratios to the baseline."""
    rows: list[dict[str, Any]] = []
    for round_ in range(args.runs):
        for variant in args.variants:
            # Alternate which tree goes first, so neither always runs right after the other.
            for tree in trees if round_ % 2 == 0 else trees[::-1]:
                for row in serve_readings(1, variant, args.fresh_at, env, tree,
                                          viewer_s=args.viewer_s if args.viewer else None):
                    rows.append(row)
                    top = ", ".join(f"{name} {kib / 1024:.1f}" for name, kib in row["top"])
                    at = row["at_s"] if isinstance(row["at_s"], str) else f"{row['at_s']:.0f} s"
                    print(f"round {round_ + 1} {variant:10} {tree_label(tree, trees):8} "
                          f"at {at:>6}: RSS {row['rss_kib'] / 1024:6.1f} MiB  ({top})",
                          flush=True)
    points: list[float | str] = [*args.fresh_at] + (["viewer"] if args.viewer else [])
    print()
    print(f"{'variant':10} | {'at':>6} | " + " | ".join(f"{tree_label(t, trees):>14}"
                                                        for t in trees)
          + (" | after/before" if len(trees) > 1 else "") + "   (median RSS, MiB; runs)")
    summary: dict[str, Any] = {}
    for variant in args.variants:
        for point in points:
            medians = []
            for tree in trees:
                values = [r["rss_kib"] / 1024 for r in rows if r["variant"] == variant
                          and r["at_s"] == point and r["tree"] == str(tree)]
                medians.append(statistics.median(values))
                summary.setdefault(variant, {}).setdefault(str(point), {})[
                    tree_label(tree, trees)] = {"median_mib": round(medians[-1], 1),
                                                "runs_mib": [round(v, 1) for v in values]}
            label = point if isinstance(point, str) else f"{point:.0f} s"
            ratio = f" | {medians[-1] / medians[0]:12.3f}" if len(trees) > 1 else ""
            print(f"{variant:10} | {label:>6} | "
                  + " | ".join(f"{m:14.1f}" for m in medians) + ratio)
    print(json.dumps({"figure": "fresh_rss", "trees": [str(t) for t in trees],
                      "summary": summary, "rows": rows}))


def tree_label(tree: Path, trees: list[Path]) -> str:
    return "before" if len(trees) > 1 and tree == trees[0] else "after" if len(trees) > 1 \
        else "this"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=6, help="K (measured against 1)")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["default"])
    parser.add_argument("--at", type=float, default=25.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout (with a .venv) measured in the same run")
    parser.add_argument("--fresh", action="store_true",
                        help="fresh RSS of one camera per variant, at each --fresh-at")
    parser.add_argument("--fresh-at", type=float, nargs="+", default=[8.0, 25.0])
    parser.add_argument("--viewer", action="store_true",
                        help="--fresh: one reading more after one viewer")
    parser.add_argument("--viewer-s", type=float, default=5.0,
                        help="--viewer: seconds after the viewer has video")
    args = parser.parse_args()
    if args.cameras < 2:
        parser.error("--cameras must be at least 2")
    trees = [ROOT] if args.baseline is None else [args.baseline.resolve(), ROOT]
    env = compiled_env(trees)
    recorded_stream()
    if args.fresh:
        fresh_main(args, trees, env)
        return
    rows: list[dict[str, Any]] = []
    for _ in range(args.runs):
        for variant in args.variants:
            for tree in trees:
                for n in (1, args.cameras):
                    row = measure(n, variant, args.at, args.window, env, tree)
                    rows.append(row)
                    top = ", ".join(f"{name} {kib / 1024:.1f}" for name, kib in row["top"])
                    print(f"{variant:10} {tree_label(tree, trees):6} {n:3} cameras: RSS "
                          f"{row['rss_kib'] / 1024:6.1f} MiB, CPU {row['cpu_percent']:5.2f} % "
                          f"of a core  ({top})", flush=True)
    print()
    print(f"{'variant':10} | RSS 1 cam | RSS {args.cameras} cams | per extra camera | "
          f"CPU 1 cam | CPU {args.cameras} cams | per extra camera")
    summary: dict[str, Any] = {}
    for variant in args.variants:
        figures = []
        for tree in trees:
            def med(n: int, key: str, variant: str = variant, tree: Path = tree) -> float:
                return statistics.median(r[key] for r in rows if r["variant"] == variant
                                         and r["cameras"] == n and r["tree"] == str(tree))
            rss1, rssk = med(1, "rss_kib") / 1024, med(args.cameras, "rss_kib") / 1024
            cpu1, cpuk = med(1, "cpu_percent"), med(args.cameras, "cpu_percent")
            per_rss = (rssk - rss1) / (args.cameras - 1)
            per_cpu = (cpuk - cpu1) / (args.cameras - 1)
            figure = {"rss_1_mib": round(rss1, 1), "rss_k_mib": round(rssk, 1),
                      "mib_per_camera": round(per_rss, 2), "cpu_1": round(cpu1, 2),
                      "cpu_k": round(cpuk, 2), "cpu_per_camera": round(per_cpu, 3)}
            figures.append(figure)
            key = variant if len(trees) == 1 else f"{variant} {tree_label(tree, trees)}"
            summary[key] = figure
            print(f"{key:10} | {rss1:6.1f} MiB | {rssk:7.1f} MiB  | {per_rss:6.2f} MiB       | "
                  f"{cpu1:5.2f} %   | {cpuk:6.2f} %    | {per_cpu:5.3f} % of a core")
        if len(figures) == 2:
            ratios = {k: round(figures[1][k] / figures[0][k], 3) if figures[0][k] else None
                      for k in ("rss_1_mib", "rss_k_mib", "cpu_1", "cpu_k")}
            summary[f"{variant} after/before"] = ratios
            print(f"{variant:10}   after/before: RSS 1 cam {ratios['rss_1_mib']}, "
                  f"RSS {args.cameras} cams {ratios['rss_k_mib']}, CPU 1 cam {ratios['cpu_1']}, "
                  f"CPU {args.cameras} cams {ratios['cpu_k']}")
    print(json.dumps({"figure": "cameras", "k": args.cameras, "at_s": args.at,
                      "summary": summary, "rows": rows}))


if __name__ == "__main__":
    main()
