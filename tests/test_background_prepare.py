"""tests/background_prepare.py: what a test that needs a background preparation sees."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests import background_prepare


@pytest.fixture
def steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(background_prepare.ENV, str(tmp_path))
    return tmp_path


def test_not_started_by_scripts_test_means_nothing_to_wait_for(
    steps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines: list[str] = []
    background_prepare.wait("image-arm64", lines.append, limit=5)
    assert lines == [] and background_prepare.failure("image-arm64") is None
    monkeypatch.delenv(background_prepare.ENV)
    (steps / "image-arm64.started").touch()
    assert background_prepare.failure("image-arm64") is None


def test_a_test_waits_for_the_step_and_fails_with_its_log(steps: Path) -> None:
    (steps / "image-arm64.started").touch()
    (steps / "image-arm64.log").write_text("".join(f"line {i}\n" for i in range(200))
                                           + "E: mmdebstrap failed\n")

    def finish() -> None:
        (steps / "image-arm64.rc").write_text("3\n")

    timer = threading.Timer(1.5, finish)
    timer.start()
    lines: list[str] = []
    try:
        background_prepare.wait("image-arm64", lines.append, limit=60)
    finally:
        timer.join()
    assert "waiting for the background preparation image-arm64" in lines[0]
    assert "exit 3" in lines[-1]
    message = background_prepare.failure("image-arm64")
    assert message is not None
    assert "exited with status 3" in message and "E: mmdebstrap failed" in message
    assert "line 199" in message and "line 100\n" not in message  # only the tail


def test_a_succeeded_step_is_no_failure_and_a_hung_one_is(steps: Path) -> None:
    (steps / "image-arm64.started").touch()
    lines: list[str] = []
    background_prepare.wait("image-arm64", lines.append, limit=1)
    assert "still running" in lines[-1]
    message = background_prepare.failure("image-arm64")
    assert message is not None and "still running" in message
    (steps / "image-arm64.rc").write_text("0\n")
    assert background_prepare.failure("image-arm64") is None
