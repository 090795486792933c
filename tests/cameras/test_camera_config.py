"""Cameras as a list in the configuration: ``[[camera]]``, the old ``[camera]``, ``--camera``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ruseon_appliance.config import DEFAULT_CAMERA_NAME, load_config, to_toml


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ruseon.toml"
    path.write_text(text)
    return path


def test_camera_tables_are_the_camera_list_and_round_trip(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """
[[camera]]
name = "front"
source = "picamera:0"
width = 1920
height = 1080
[[camera]]
name = "gate"
source = "rtsp://192.0.2.30:554/stream1"
framerate = 15
"""), env={"RUSEON_CAMERA_BITRATE": "1000000"}, required=True)
    front, gate = config.cameras
    assert config.default_camera is front and config.cameras == (front, gate)
    assert (front.name, front.sensor_index, front.source_kind, front.width) == (
        "front", 0, "picamera", 1920)
    assert (gate.name, gate.framerate, gate.width) == ("gate", 15, 1280)
    # A shared setting from the environment applies to every camera.
    assert front.bitrate == gate.bitrate == 1_000_000
    again = load_config(write(tmp_path, to_toml(config)), env={}, required=True)
    assert again == config


def test_the_old_camera_section_is_one_camera_with_the_default_name(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[camera]\nsource = "synthetic"\n'), env={},
                         required=True)
    assert DEFAULT_CAMERA_NAME == "cam"
    assert [c.name for c in config.cameras] == ["cam"]  # a list of one
    assert "[[camera]]" not in to_toml(config)


def test_camera_flags_make_the_list_keeping_the_files_settings(tmp_path: Path) -> None:
    path = write(tmp_path, '[[camera]]\nname = "a"\nwidth = 640\nheight = 480\n'
                           '[[camera]]\nname = "b"\nwidth = 320\nheight = 240\n')
    config = load_config(path, env={}, required=True, overrides={
        "cameras": {"flags": ["b=synthetic", "c=rpicam:1"]}})
    assert [(c.name, c.source, c.width) for c in config.cameras] == [
        ("b", "synthetic", 320), ("c", "rpicam:1", 640)]  # a new name takes the first's settings


def ruseon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruseon_appliance", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("text", "args", "names"), [
    ('[[camera]]\nname = "a b"\n', (), "camera.name = 'a b' is not valid: 1-64 letters"),
    ('[[camera]]\nname = "x"\n[[camera]]\nname = "x"\n', (),
     "camera 'x'.name = 'x' is not valid: each camera needs its own name"),
    ('[[camera]]\nname = "sessions"\n', (), "camera.name = 'sessions' is not valid"),
    ('[[camera]]\nsource = "synthetic"\n', (), "has no name"),
    ('[[camera]]\nname = "a"\nsource = "picamera:x"\n', (), "camera.source = 'picamera:x'"),
    ("", ("--camera", "a=synthetic", "--camera", "a=synthetic"), "each camera needs its own"),
    ("", ("--camera", "a/b=synthetic"), "camera.name = 'a/b' is not valid"),
    ("", ("--camera", "synthetic"), "expected NAME=SOURCE"),
    ("", ("--camera", "a=synthetic", "--camera", "b=synthetic", "--source", "rpicam"),
     "--source and --camera cannot be used together"),
    # One --camera and --source: the source is not silently swapped under the named camera.
    ("", ("--camera", "a=synthetic", "--source", "rpicam"),
     "--source and --camera cannot be used together"),
    ('[camera]\nsource = "synthetic"\n[[camera]]\nname = "a"\n', (),
     "has both a [camera] section and [[camera]] tables: use one"),
    ('[[camera]]\nname = "a"\n[camera]\nwidth = 640\n', (),
     "has both a [camera] section and [[camera]] tables: use one"),
])
def test_bad_camera_names_exit_2_with_one_line(tmp_path: Path, text: str,
                                               args: tuple[str, ...], names: str) -> None:
    result = ruseon("serve", "--config", str(write(tmp_path, text)), *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], result.stderr
