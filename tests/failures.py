"""The suite's failures in short, from the JUnit files (``python -m tests.failures FILE...``).

Printed last by scripts/test when a run failed: a CI log is often kept only in part, and a
failure's reason is then lost in the middle of a shard's output. Each failed or erroring test
gets its id, its message and the traceback's ``E`` lines and last frame, a few lines each.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

LINES_PER_TEST = 14
CHARS_PER_LINE = 300


def summary(paths: list[Path]) -> list[str]:
    out: list[str] = []
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:
            out.append(f"{path}: unreadable ({exc})")
            continue
        for case in root.iter("testcase"):
            for kind in ("failure", "error"):
                for problem in case.findall(kind):
                    name = f"{case.get('classname', '')}::{case.get('name', '')}"
                    out.append(f"-- {kind}: {name} ({case.get('time', '?')} s)")
                    text = (problem.text or "").splitlines()
                    errors = [t for t in text if t.startswith("E ")]
                    # The first E lines (the assertion) and the last (where a long message,
                    # a tool's output, usually says what went wrong), then where it was.
                    if len(errors) > LINES_PER_TEST:
                        half = LINES_PER_TEST // 2
                        errors = [*errors[:half], "E   [...]", *errors[-half:]]
                    lines = errors or (problem.get("message") or "").splitlines()[:LINES_PER_TEST]
                    lines += [t for t in text if t.startswith(("tests/", "hil/", "ruseon_"))][-2:]
                    out += ["   " + t[:CHARS_PER_LINE] for t in lines if t]
    return out


def main(argv: list[str]) -> int:
    lines = summary([Path(a) for a in argv])
    if lines:
        print("== the failures in short (from " + ", ".join(argv) + "):")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
