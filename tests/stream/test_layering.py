"""stream/ is below engine/, rtsp/, relay/ and web/: it must import none of them (nor the app)."""

from __future__ import annotations

import ast
from pathlib import Path

import ruseon_appliance.stream

STREAM = Path(ruseon_appliance.stream.__file__).resolve().parent
PACKAGE = ["ruseon_appliance", "stream"]
FORBIDDEN = ("engine", "rtsp", "relay", "web", "app", "cameras", "hls", "recording", "mqtt")


def imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, relative imports resolved against the package."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = PACKAGE[:len(PACKAGE) - node.level + 1]  # 1: stream, 2: its parent
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.append(module)
            names += [f"{module}.{alias.name}" for alias in node.names]
    return names


def offending(path: Path) -> list[str]:
    bad = []
    for name in imported_modules(path):
        parts = name.split(".")
        if parts[0] == "ruseon_appliance" and len(parts) > 1 and parts[1] in FORBIDDEN:
            bad.append(name)
    return bad


def test_stream_imports_nothing_that_builds_on_it() -> None:
    files = sorted(STREAM.glob("*.py"))
    assert len(files) >= 10  # the walk sees the package (not an empty glob)
    found = {path.name: offending(path) for path in files}
    assert {name: bad for name, bad in found.items() if bad} == {}


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The walk finds the forms an upward import takes (a test that cannot fail is a defect)."""
    sample = tmp_path / "sample.py"
    sample.write_text("import ruseon_appliance.engine.engine\n"
                      "from ruseon_appliance.rtsp import session\n"
                      "from ..relay.rtp_relay import RtpRelay\n"
                      "from .. import app\n"
                      "from ruseon_appliance.capture.ring import RingBuffer\n"
                      "from . import rtcp\n")
    bad = offending(sample)
    assert "ruseon_appliance.engine.engine" in bad
    assert "ruseon_appliance.rtsp" in bad
    assert "ruseon_appliance.relay.rtp_relay" in bad
    assert "ruseon_appliance.app" in bad
    assert not [name for name in bad if "capture" in name or "stream" in name]
