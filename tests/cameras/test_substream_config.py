"""``[[camera]] substream`` and ``substream_url``: parsing, validation with clear errors, the
round trip through ``ruseon config``, and where a sub-stream is on by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from ruseon_appliance.capture.substream import plan_substream
from ruseon_appliance.config import (
    CameraConfig,
    ConfigError,
    SubstreamConfig,
    load_config,
    to_toml,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ruseon.toml"
    path.write_text(text)
    return path


def test_table_false_true_and_the_url_round_trip(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """
[[camera]]
name = "front"
source = "synthetic"
substream = { width = 320, height = 180, framerate = 15, bitrate = 250000 }
[[camera]]
name = "gate"
source = "rtsp://admin:hunter2@192.0.2.30:554/main"
substream_url = "rtsp://admin:hunter2@192.0.2.30:554/sub"
[[camera]]
name = "back"
source = "rpicam:1"
substream = false
[[camera]]
name = "yard"
source = "picamera:1"
substream = true
"""), env={}, required=True)
    front, gate, back, yard = config.cameras
    assert front.substream == SubstreamConfig("on", 320, 180, 15, 250_000)
    assert gate.substream == SubstreamConfig() and gate.substream_url.endswith("/sub")
    assert back.substream.mode == "off"
    assert yard.substream == SubstreamConfig(mode="on")
    again = load_config(write(tmp_path, to_toml(config)), env={}, required=True)
    assert again == config
    hidden = to_toml(config, hide_secrets=True)
    assert "hunter2" not in hidden and 'substream_url = "rtsp://admin:***@192.0.2.30' in hidden


def test_environment_takes_a_size_or_a_switch(tmp_path: Path) -> None:
    env = {"RUSEON_CAMERA_SOURCE": "synthetic", "RUSEON_CAMERA_SUBSTREAM": "426x240"}
    cam = load_config(None, env=env).cameras[0]
    assert (cam.substream.mode, cam.substream.width, cam.substream.height) == ("on", 426, 240)
    env["RUSEON_CAMERA_SUBSTREAM"] = "off"
    assert load_config(None, env=env).cameras[0].substream.mode == "off"


@pytest.mark.parametrize(("source", "value", "message"), [
    ("synthetic", "{ width = 1920 }", "camera.substream.width = 1920 is not valid: an even "
     "number from 16 to the camera's width (1280)"),
    ("synthetic", "{ height = 361 }", "camera.substream.height = 361 is not valid"),
    ("synthetic", "{ width = 8 }", "camera.substream.width = 8 is not valid"),
    ("synthetic", "{ framerate = 60 }", "camera.substream.framerate = 60 is not valid: 0 (the "
     "camera's) or 1 to the camera's frame rate (30)"),
    ("synthetic", "{ bitrate = 1000 }", "camera.substream.bitrate = 1000 is not valid"),
    ("synthetic", "{ size = 3 }", "camera.substream.size is not a known key: a substream "
     "table allows width, height, framerate, bitrate"),
    ("synthetic", "{ width = \"640\" }", "camera.substream.width = '640' is not valid"),
    ("synthetic", "3", "camera.substream = 3 is not valid: expected true, false"),
    ("picamera", "{ framerate = 15 }", "picamera2 encodes every frame of its lores stream"),
    ("rpicam", "true", "camera.substream is not valid for source 'rpicam': rpicam-vid runs "
     "one encoder; set substream = false"),
    ("file:/tmp/x.h264", "true", "source 'file': a file holds one stream"),
    ("rtsp://192.0.2.1/main", "true", "camera.substream needs camera.substream_url"),
])
def test_bad_values_are_refused_with_a_reason(tmp_path: Path, source: str, value: str,
                                               message: str) -> None:
    path = write(tmp_path, f'[camera]\nsource = "{source}"\nsubstream = {value}\n')
    with pytest.raises(ConfigError) as error:
        load_config(path, env={}, required=True)
    assert message in str(error.value)


def test_a_substream_url_needs_an_rtsp_camera_and_a_host(tmp_path: Path) -> None:
    path = write(tmp_path, '[camera]\nsource = "synthetic"\n'
                           'substream_url = "rtsp://u:secret@192.0.2.1/sub"\n')
    with pytest.raises(ConfigError, match="only for an rtsp:// camera") as error:
        load_config(path, env={}, required=True)
    assert "secret" not in str(error.value)
    path = write(tmp_path, '[camera]\nsource = "rtsp://192.0.2.1/main"\n'
                           'substream_url = "http://192.0.2.1/sub"\n')
    with pytest.raises(ConfigError, match=r"camera.substream_url = .* rtsp://HOST"):
        load_config(path, env={}, required=True)


def hardware() -> bool:
    return False


def software() -> bool:
    return True


@pytest.mark.parametrize(("source", "extra", "board", "expected"), [
    ("synthetic", {}, hardware, (640, 360, 30, 500_000)),
    ("picamera", {}, hardware, (640, 360, 30, 500_000)),
    ("auto", {}, hardware, (640, 360, 30, 500_000)),
    ("picamera", {}, software, "encodes H.264 in software (BCM2712); set substream = true"),
    ("auto", {}, software, "encodes H.264 in software"),
    ("picamera", {"substream": SubstreamConfig(mode="on")}, software, (640, 360, 30, 500_000)),
    ("rpicam", {}, hardware, "the rpicam source has none (rpicam-vid runs one encoder)"),
    ("file:/x.h264", {}, hardware, "the file source has none (a file holds one stream)"),
    ("rtsp://192.0.2.1/main", {}, hardware, "no substream_url for this rtsp:// camera"),
    ("rtsp://192.0.2.1/main", {"substream_url": "rtsp://192.0.2.1/sub"}, hardware,
     (640, 360, 30, 500_000)),
    ("synthetic", {"substream": SubstreamConfig(mode="off")}, hardware, "substream = false"),
    ("synthetic", {"width": 640, "height": 360}, hardware,
     "the main stream (640x360) is no larger than a sub-stream (640x360)"),
    ("synthetic", {"substream": SubstreamConfig("on", 320, 180, 10, 200_000)}, hardware,
     (320, 180, 10, 200_000)),
])
def test_where_a_substream_is_on_by_default(source: str, extra: dict[str, object],
                                            board: object, expected: object) -> None:
    cam = CameraConfig(source=source, **extra)  # type: ignore[arg-type]
    plan = plan_substream(cam, software_encoder=board)  # type: ignore[arg-type]
    if isinstance(expected, str):
        assert plan.camera is None and expected in plan.reason
        return
    assert plan.camera is not None and plan.reason == ""
    sub = plan.camera
    assert (sub.width, sub.height, sub.framerate, sub.bitrate) == expected
    assert sub.name == cam.name and not sub.motion and sub.substream.mode == "off"
    assert sub.source == (cam.substream_url or cam.source)
    # Keyframes as often in time as the main stream's.
    assert sub.keyframe_interval == cam.keyframe_interval * sub.framerate // cam.framerate
