"""The harness judged by its own runs: a healthy simulated device under 2 % loss passes the
battery (including a restart and a power cycle through the simulated rig's switch), and a device
whose camera stops must fail exactly the checks that see the video."""

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
    """Run ``hil run --simulate`` with ``args``; its exit status, JSON report and output."""
    require_root("the simulated rig creates network namespaces")
    require_tool("ip", "apt install iproute2")
    require_tool("nft", "apt install nftables")
    report = tmp_path / "report.json"
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "hil", "run", "--simulate", "--report", str(report),
         "--junit", str(junit), *args],
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


# The latency and freeze limits this run is judged by. The defaults (p95 400 ms, 5 % frozen)
# are a release gate's on a rig of its own; here the simulated device and the rig share this
# machine's two cores with whatever else runs (CI: the other pytest shard and the emulated
# machines), and a burst of CPU starvation holds every picture in flight, the device's and the
# rig's side alike. hil/starvation.py leaves out the rig's starvation only where its event loop
# woke > 0.1 s late (at that load the rig's threads waited for a CPU most of the time, mostly in
# shorter waits), and the simulated device's not at all (on a real board it would be the
# device's fault). Measured here
# with 8 busy loops and two of these runs at once (load average ~15): the worst viewer's live
# p95 reached 1.49 s (p50 at most 75 ms), a viewer was frozen up to 14.6 % of its watch, the
# longest gap 0.83 s. A live stream still passes well within 2 s and 25 %; a device whose
# pictures run seconds behind, or whose loss recovery fails (each of 2 % lost packets then
# freezes a viewer until the 1 s give-up and a keyframe: most of the watch), still fails.
SHARED_MACHINE_LIMITS = ("--max-latency-ms", "2000", "--max-freeze-ratio", "0.25")


def test_healthy_device_under_loss_passes_the_battery(tmp_path: Path) -> None:
    rc, doc, output = _simulate(tmp_path, "--viewers", "5", "--duration", "20", "--loss", "2",
                                "--churn", "6", "--token", "hil-test-token", "--power-off-s", "1",
                                *SHARED_MACHINE_LIMITS)
    verdicts = _verdicts(doc)
    assert rc == 0, output
    # The limits reached the battery and the report says what it was judged by.
    assert doc["settings"]["max_latency_ms"] == 2000 and doc["settings"]["max_freeze_ratio"] == 0.25
    for name in ("page", "healthz", "status", "whep", "viewers", "first-frame", "latency",
                 "steady-state", "churn", "restart", "power"):
        assert verdicts[name] == "pass", (name, output)
    reasons = {c["name"]: c["reason"] for c in doc["checks"]}
    assert verdicts["watchdog"] == "skip" and "test_systemd.py" in reasons["watchdog"]
    checks = {c["name"]: c["figures"] for c in doc["checks"]}
    # The WHEP cases that need a token, a live session and a full device were all tried.
    cases = {c["case"]: c for c in checks["whep"]["cases"]}
    for case in ("POST without token -> 401", "401 has WWW-Authenticate: Bearer",
                 "POST with a wrong token -> 401",
                 "401 (wrong token) has WWW-Authenticate: Bearer",
                 "PATCH application/trickle-ice-sdpfrag -> 204", "PATCH text/plain -> 415",
                 "viewer count back after DELETEs"):
        assert cases[case]["ok"] and not cases[case]["skipped"], (case, cases.get(case))
    # Never-connecting offers could not lock viewers out: the device's pending cap for this
    # address answered 429 (+ Retry-After), or, full of pending sessions, it still took one more.
    lockout = [cases.get(c) for c in ("pending offers from one address beyond its cap -> 429",
                                      "POST beyond max viewers takes the oldest pending place "
                                      "-> 201")]
    assert any(c and c["ok"] and not c["skipped"] for c in lockout), lockout
    if lockout[0]:
        assert cases["429 has Retry-After"]["ok"], cases["429 has Retry-After"]
    # The restart and the power cycle really happened (the device's uptime began after the
    # disruption did) and the device came back with the same certificate.
    for name in ("restart", "power"):
        figures = checks[name]
        assert figures["video_back_s"] is not None and figures["outage_s"] is not None
        assert figures["uptime_after_s"] is not None
        assert figures["uptime_after_s"] < figures["outage_s"] + 1.0
        assert figures["fingerprint_before"] == figures["fingerprint_after"] is not None
        assert figures["answer_fingerprint_after"] is not None
    # The device counted exactly the harness's viewers while they all watched.
    count = checks["viewers"]["device_count"]
    assert count["counts"] and count["mismatches"] == 0 and count["expected"] == 5
    # Live latency and the first picture's age are reported apart: every viewer's first picture
    # is a cached one, captured before it connected.
    latency = checks["latency"]
    assert latency["catch_up_frames"] >= 5
    assert latency["first_frame_latency_s"]["n"] == 5
    assert latency["latency_all_s"]["n"] == latency["latency_s"]["n"] + latency["catch_up_frames"]
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
                                "--fault", "stop-source", "--skip", "restart", "power")
    verdicts = _verdicts(doc)
    assert rc == 1, output
    # HTTP still answers: the page and the WHEP exchange are fine ...
    assert verdicts["page"] == "pass" and verdicts["whep"] == "pass", output
    # ... but the device's health, its status figures and what viewers see are not.
    for name in ("healthz", "status", "viewers", "steady-state"):
        assert verdicts[name] == "fail", (name, output)
    assert "HIL FAILED" in output
