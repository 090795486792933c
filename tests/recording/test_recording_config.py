"""``[recording]`` settings and ``ruseon serve --record-dir`` (through ``ruseon config``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ruseon_appliance.config import ConfigError, load_config


def test_record_dir_flag_turns_continuous_recording_on(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruseon_appliance", "config", "--config", "/dev/null",
         "--record-dir", str(tmp_path / "rec")],
        capture_output=True, text=True, timeout=60, check=True, env={"PATH": "/usr/bin:/bin"})
    section = result.stdout.split("[recording]", 1)[1]
    assert "continuous = true" in section and f'dir = "{tmp_path / "rec"}"' in section


def test_recording_defaults_and_bad_values(tmp_path: Path) -> None:
    config = load_config(Path("/dev/null"), env={}, required=True)
    assert not config.recording.continuous and config.recording.segment_s == 60
    assert config.recording.sync_interval_s == 5
    for ok in ("0", "1", "600"):
        load_config(Path("/dev/null"), env={"RUSEON_RECORDING_SYNC_INTERVAL_S": ok}, required=True)
    assert config.recording.directory("/var/lib/ruseon") == Path("/var/lib/ruseon/recordings")
    for key, value, words in (("SEGMENT_S", "1", "recording.segment_s"),
                              ("PRELOAD", "1", "recording.preload"),
                              ("PREROLL_S", "61", "recording.preroll_s"),
                              ("SYNC_INTERVAL_S", "0.5", "recording.sync_interval_s"),
                              ("SYNC_INTERVAL_S", "601", "recording.sync_interval_s"),
                              ("SYNC_INTERVAL_S", "-1", "recording.sync_interval_s"),
                              ("MAX_BYTES", "10", "recording.max_bytes"),
                              ("MAX_AGE_HOURS", "-1", "recording.max_age_hours")):
        with pytest.raises(ConfigError) as error:
            load_config(Path("/dev/null"), env={f"RUSEON_RECORDING_{key}": value}, required=True)
        assert words in str(error.value)
