"""What a run produces: one :class:`CheckResult` per check, gathered into a :class:`Report`.

A check has a name, a verdict, the figures it measured and a one-line reason. The report renders
three ways: JSON with every figure (for machines and for comparing releases), JUnit XML (for CI
dashboards: a failed check is a ``<failure>``, a skipped one ``<skipped>``), and a fixed-width table
on stdout for the person at the rig. :class:`Progress` prints the live lines while checks run.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO


class Verdict(StrEnum):
    """How a check ended. Only ``FAIL`` and ``ERROR`` make the run fail."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"
    # The check could not measure (the harness or the rig broke, not necessarily the device).
    ERROR = "error"

    @property
    def failed(self) -> bool:
        """True for the verdicts that make the run exit non-zero."""
        return self in (Verdict.FAIL, Verdict.ERROR)


Figure = float | int | str | bool | None


@dataclass
class CheckResult:
    """One check's outcome: verdict, measured figures and a short reason."""

    name: str
    verdict: Verdict
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (figures as measured, floats rounded to µs precision)."""
        return {
            "name": self.name,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 3),
            "figures": _jsonable(self.figures),
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else round(value, 6)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def percentiles(values: Iterable[float]) -> dict[str, float | int | None]:
    """``{"n", "p50", "p95", "max"}`` of ``values`` (nearest-rank); None entries when empty."""
    data = sorted(values)
    if not data:
        return {"n": 0, "p50": None, "p95": None, "max": None}

    def rank(q: float) -> float:
        return data[max(0, math.ceil(q * len(data)) - 1)]

    return {"n": len(data), "p50": rank(0.50), "p95": rank(0.95), "max": data[-1]}


def format_ms(summary: Mapping[str, Any]) -> str:
    """``p50/p95/max`` of a :func:`percentiles` dict in seconds, rendered in milliseconds."""
    if not summary.get("n"):
        return "n/a"
    return "/".join(f"{summary[k] * 1000:.0f}" for k in ("p50", "p95", "max")) + " ms"


@dataclass
class Report:
    """Every check of one run against one device."""

    device: str
    started: float = field(default_factory=time.time)
    results: list[CheckResult] = field(default_factory=list)
    # The rig's settings (viewers, duration, impairment ...) so a report explains itself.
    settings: dict[str, Any] = field(default_factory=dict)

    def add(self, result: CheckResult) -> None:
        """Append one check's result."""
        self.results.append(result)

    @property
    def passed(self) -> bool:
        """True when no check failed or errored (skips do not fail a run)."""
        return not any(r.verdict.failed for r in self.results)

    def counts(self) -> dict[str, int]:
        """How many checks ended with each verdict."""
        out = {v.value: 0 for v in Verdict}
        for r in self.results:
            out[r.verdict.value] += 1
        return out

    def result(self, name: str) -> CheckResult | None:
        """The result of check ``name``, if it ran."""
        return next((r for r in self.results if r.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """The whole report as JSON data."""
        return {
            "device": self.device,
            "started": self.started,
            "finished": time.time(),
            "passed": self.passed,
            "counts": self.counts(),
            "settings": _jsonable(self.settings),
            "rig": {"host": platform.node(), "python": platform.python_version()},
            "checks": [r.to_json() for r in self.results],
        }

    def write_json(self, path: Path) -> None:
        """Write :meth:`to_json` to ``path``."""
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")

    def junit_xml(self) -> str:
        """JUnit XML: one ``<testcase>`` per check, figures as ``<properties>``."""
        counts = self.counts()
        suite = ET.Element(
            "testsuite",
            name="hil",
            tests=str(len(self.results)),
            failures=str(counts["fail"]),
            errors=str(counts["error"]),
            skipped=str(counts["skip"]),
            time=f"{sum(r.duration_s for r in self.results):.3f}",
            hostname=platform.node(),
        )
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="device", value=self.device)
        for key, value in sorted(self.settings.items()):
            ET.SubElement(props, "property", name=f"setting.{key}", value=str(value))
        for r in self.results:
            case = ET.SubElement(
                suite, "testcase", classname="hil", name=r.name, time=f"{r.duration_s:.3f}"
            )
            case_props = ET.SubElement(case, "properties")
            for key, value in _flatten(r.figures):
                ET.SubElement(case_props, "property", name=key, value=str(_jsonable(value)))
            if r.verdict is Verdict.FAIL:
                ET.SubElement(case, "failure", message=r.reason).text = r.reason
            elif r.verdict is Verdict.ERROR:
                ET.SubElement(case, "error", message=r.reason).text = r.reason
            elif r.verdict is Verdict.SKIP:
                ET.SubElement(case, "skipped", message=r.reason)
            else:
                ET.SubElement(case, "system-out").text = r.reason
        ET.indent(suite)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, "unicode") + "\n"

    def write_junit(self, path: Path) -> None:
        """Write :meth:`junit_xml` to ``path``."""
        path.write_text(self.junit_xml(), encoding="utf-8")

    def summary_table(self) -> str:
        """The human summary: one row per check, then the overall verdict."""
        rows = [("CHECK", "VERDICT", "TIME", "REASON")]
        for r in self.results:
            rows.append((r.name, r.verdict.value.upper(), f"{r.duration_s:.1f}s", r.reason))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = []
        for row in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True))
                         + "  " + row[3])
        lines.insert(1, "-" * min(120, sum(widths) + 6 + max(len(r[3]) for r in rows)))
        counts = self.counts()
        overall = "PASSED" if self.passed else "FAILED"
        lines.append("")
        lines.append(
            f"HIL {overall}: {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['error']} errors, {counts['skip']} skipped — device {self.device}"
        )
        return "\n".join(lines)


def _flatten(figures: Mapping[str, Any], prefix: str = "") -> Sequence[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.extend(_flatten(value, name + "."))
        elif isinstance(value, list | tuple):
            # Per-viewer lists are in the JSON report; JUnit keeps the summary figures only.
            out.append((name + ".count", len(value)))
        else:
            out.append((name, value))
    return out


class Progress:
    """Live progress lines: ``[elapsed] check: message``, flushed at once."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self.stream = stream or sys.stdout
        self.quiet = quiet
        self.t0 = time.monotonic()

    def line(self, check: str, message: str) -> None:
        """Print one progress line for ``check``."""
        if self.quiet:
            return
        elapsed = time.monotonic() - self.t0
        self.stream.write(f"[{elapsed:7.1f}s] {check}: {message}\n")
        self.stream.flush()

    def verdict(self, result: CheckResult) -> None:
        """Print a check's verdict as it finishes."""
        self.line(result.name, f"{result.verdict.value.upper()} — {result.reason}")
