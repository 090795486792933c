"""The unit files as systemd itself judges them: ``systemd-analyze verify`` and ``security``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.tooling import require_tool

REPO = Path(__file__).resolve().parents[2]
UNITS = ("ruseon.service", "ruseon-http.socket", "ruseon-rtc.socket")
MAX_EXPOSURE = 2.0


def test_security_exposure_is_at_most_2() -> None:
    require_tool("systemd-analyze", "apt-get install systemd")
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager",
         str(REPO / "systemd" / "ruseon.service")],
        capture_output=True, text=True, check=False,
    )
    match = re.search(r"Overall exposure level for ruseon\.service: ([0-9.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_units_verify_cleanly(tmp_path: Path) -> None:
    """verify in a scratch root holding the system's units, ours, and a stand-in ExecStart."""
    require_tool("systemd-analyze", "apt-get install systemd")
    system_units = Path("/usr/lib/systemd/system")
    if not system_units.is_dir():
        system_units = Path("/lib/systemd/system")
    shutil.copytree(system_units, tmp_path / "usr/lib/systemd/system", symlinks=True)
    etc = tmp_path / "etc/systemd/system"
    etc.mkdir(parents=True)
    for unit in UNITS:
        shutil.copy(REPO / "systemd" / unit, etc / unit)
    exe = tmp_path / "opt/ruseon/bin/ruseon"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", f"--root={tmp_path}", *UNITS],
        capture_output=True, text=True, check=False,
    )
    # verify exits 0 on unknown keys; any output at all is a finding.
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )


@pytest.mark.parametrize("unit", UNITS)
def test_socket_units_name_their_descriptors(unit: str) -> None:
    text = (REPO / "systemd" / unit).read_text()
    if unit.endswith(".socket"):
        assert "Service=ruseon.service" in text
        assert re.search(r"^FileDescriptorName=(http|rtc)$", text, re.M)


def test_install_script_is_shellcheck_clean() -> None:
    require_tool("shellcheck", "apt-get install shellcheck")
    subprocess.run(["shellcheck", str(REPO / "systemd" / "install.sh")], check=True)
