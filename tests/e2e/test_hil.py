"""The harness judged by its own runs: a healthy simulated device under 2 % loss passes the
battery, and a device whose camera stops must fail exactly the checks that see the video."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.tooling import require_root, require_tool

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _simulate(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    require_root("the simulated rig creates network namespaces")
    require_tool("ip", "apt install iproute2")
    require_tool("nft", "apt install nftables")
    report = tmp_path / "report.json"
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "hil", "run", "--simulate", "--report", str(report),
         "--junit", str(junit), "--skip", "restart", "watchdog", "power", *args],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))},
    )
    output = proc.stdout + proc.stderr
    assert report.exists(), "no report written; output:\n" + output
    assert junit.read_text().startswith("<?xml")
    return proc.returncode, json.loads(report.read_text()), output


def _verdicts(doc: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in doc["checks"]}


def test_healthy_device_under_loss_passes_the_battery(tmp_path: Path) -> None:
    rc, doc, output = _simulate(tmp_path, "--viewers", "5", "--duration", "20", "--loss", "2",
                                "--churn", "6")
    verdicts = _verdicts(doc)
    assert rc == 0, output
    for name in ("page", "healthz", "status", "whep", "viewers", "first-frame", "latency",
                 "steady-state", "churn"):
        assert verdicts[name] == "pass", (name, output)
    checks = {c["name"]: c["figures"] for c in doc["checks"]}
    # The loss was real and seen: packets went missing and were asked for again.
    steady = checks["steady-state"]
    assert steady["packets_lost"] > 0 and steady["nacks_sent"] > 0
    assert steady["rtx_packets"] > 0
    # Every viewer decoded, and their stamps were read.
    assert checks["viewers"]["decoding"] == 5
    assert checks["latency"]["stamps_read"] > 5 * 20 * 30 // 2
    assert "HIL PASSED" in output and "[WHEP] sessions ok" in output


def test_stopped_camera_fails_the_video_checks_and_only_those(tmp_path: Path) -> None:
    require_tool("ffmpeg", "apt install ffmpeg")
    rc, doc, output = _simulate(tmp_path, "--viewers", "2", "--duration", "6", "--churn", "2",
                                "--fault", "stop-source")
    verdicts = _verdicts(doc)
    assert rc == 1, output
    # HTTP still answers: the page and the WHEP exchange are fine ...
    assert verdicts["page"] == "pass" and verdicts["whep"] == "pass", output
    # ... but the device's health, its status figures and what viewers see are not.
    for name in ("healthz", "status", "viewers", "steady-state"):
        assert verdicts[name] == "fail", (name, output)
    assert "HIL FAILED" in output
