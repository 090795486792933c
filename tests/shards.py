"""The suite split into shards that run at once (``scripts/test``), each in its own process and
network namespace: most tests wait on real time (streams, browsers, boots), not on the CPU.

``--shard K/N`` (or ``RUSEON_TEST_SHARD=K/N``) keeps the tests of shard K (1-based) of N and
deselects the rest. Whole modules go to one shard (module-scoped fixtures such as the booted VM
are built once), by longest-first greedy balancing on ``tests/durations.json``: seconds per
module from a whole-suite run (``python -m tests.shards artifacts/junit-*.xml`` rewrites it). A
module not listed there counts a second per test. Every test is in exactly one shard, whatever
the file says: a stale file only balances worse.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_TEST_S = 1.0


def parse(spec: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N), 1 <= K <= N."""
    try:
        k, n = (int(part) for part in spec.split("/"))
    except ValueError:
        raise ValueError(f"shard {spec!r}: expected K/N, e.g. 1/2") from None
    if not 1 <= k <= n:
        raise ValueError(f"shard {spec!r}: K must be between 1 and N")
    return k, n


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def assign(counts: dict[str, int], n: int, known: dict[str, float]) -> dict[str, int]:
    """Module -> shard (1-based): the heaviest module first, each to the lightest shard so far;
    ties by name, so every shard process computes the same split."""
    weight = {m: known.get(m, UNKNOWN_TEST_S * c) for m, c in counts.items()}
    loads = [0.0] * n
    shard_of: dict[str, int] = {}
    for module in sorted(weight, key=lambda m: (-weight[m], m)):
        lightest = min(range(n), key=lambda i: (loads[i], i))
        shard_of[module] = lightest + 1
        loads[lightest] += weight[module]
    return shard_of


def known_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def durations_from_junit(paths: list[Path]) -> dict[str, float]:
    """Seconds per test module (setup, call and teardown) from pytest's junit XML files."""
    totals: dict[str, float] = defaultdict(float)
    for path in paths:
        for case in ET.parse(path).iter("testcase"):
            # classname is "tests.e2e.test_x" or "tests.e2e.test_x.TestClass": the longest
            # prefix that names a file of the repository (run from its root).
            parts = case.get("classname", "").split(".")
            while len(parts) > 1 and not Path(*parts).with_suffix(".py").is_file():
                parts = parts[:-1]
            module = str(Path(*parts).with_suffix(".py"))
            totals[module] += float(case.get("time") or 0)
    return {m: round(s, 1) for m, s in sorted(totals.items())}


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.shards JUNIT.xml... (rewrites tests/durations.json)",
              file=sys.stderr)
        return 2
    durations = durations_from_junit([Path(p) for p in argv])
    DURATIONS.write_text(json.dumps(durations, indent=1, sort_keys=True) + "\n")
    print(f"{DURATIONS}: {len(durations)} modules, {sum(durations.values()):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
