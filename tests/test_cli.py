"""The ``ruseon`` command as a user runs it: a real subprocess, exit status and stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def ruseon(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruseon_appliance", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["serve", "--rtc", "127.0.0.1:notaport"], "webrtc.listen = '127.0.0.1:notaport'"),
        (["serve", "--http", "127.0.0.1:70000"], "http.listen"),
        (["serve", "--max-viewers", "many"], "webrtc.max_viewers = 'many'"),
        (["serve", "--advertise", "not-an-ip"], "webrtc.advertise = 'not-an-ip'"),
        (["serve", "--source", "webcam"], "camera.source = 'webcam'"),
        (["config", "--log-level", "loud"], "log.level = 'loud'"),
    ],
)
def test_bad_flag_exits_nonzero_with_one_clear_line(args: list[str], names: str) -> None:
    result = ruseon(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ruseon: error: ") and names in lines[0]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("[camera]\nframerat = 30\n", "camera.framerat"),
        ("[http]\nlisten = 8080\n", "http.listen"),
        # rpicam-vid would exit "Invalid AWB mode" on every restart, forever.
        ('[camera]\nawb = "sunny"\n', "camera.awb = 'sunny' is not valid: allowed are auto, "),
    ],
)
def test_bad_config_file_exits_nonzero_with_one_clear_line(
    tmp_path: Path, text: str, names: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = ruseon("serve", "--config", str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], result.stderr


def test_config_prints_effective_toml_with_flags_applied(tmp_path: Path) -> None:
    result = ruseon(
        "config",
        "--config",
        "/dev/null",
        "--rtc",
        "127.0.0.1:9999",
        "--advertise",
        "127.0.0.1",
        "--advertise",
        "::1",
    )
    assert result.returncode == 0, result.stderr
    assert 'listen = "127.0.0.1:9999"' in result.stdout
    assert 'advertise = ["127.0.0.1", "::1"]' in result.stdout


def check(state_dir: Path, rtc: str = "127.0.0.1:0") -> subprocess.CompletedProcess[str]:
    """``ruseon check`` with the synthetic source and loopback ports."""
    return ruseon("check", "--config", "/dev/null", "--source", "synthetic",
                  "--http", "127.0.0.1:0", "--rtc", rtc, "--state-dir", str(state_dir))


def test_check_reports_each_item_and_fails_on_a_busy_port(tmp_path: Path) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        result = check(tmp_path / "state", rtc=f"127.0.0.1:{busy.getsockname()[1]}")
    assert result.returncode == 1
    assert "FAIL webrtc port" in result.stdout and "in use" in result.stdout
    assert "ok   encoder" in result.stdout
    healthy = check(tmp_path / "state")
    assert healthy.returncode == 0, healthy.stdout
    assert healthy.stdout.strip().endswith("healthy")
    assert (tmp_path / "state").is_dir()


def test_check_fails_when_state_dir_is_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = check(blocker / "state")
    assert result.returncode == 1
    assert "FAIL state dir" in result.stdout


def test_serve_with_an_unavailable_camera_stays_up_and_says_what_to_install(
        tmp_path: Path) -> None:
    """Issue 24: a camera source that cannot run here used to end ``serve`` with status 1,
    which under systemd is a failed start; five of them and StartLimitBurst gave up on the
    board for good. Now the service stays up, /healthz is 503 with the install hint, and
    SIGTERM still ends it cleanly."""
    import importlib.util
    import json
    import signal
    import time
    import urllib.error
    import urllib.request

    from tests.tooling import free_port

    if importlib.util.find_spec("picamera2") is not None:
        pytest.skip("this machine has picamera2: the source is available")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ruseon_appliance", "serve", "--config", "/dev/null",
         "--source", "picamera", "--http", f"127.0.0.1:{port}", "--rtc", "127.0.0.1:0",
         "--state-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    detail = ""
    try:
        deadline = time.monotonic() + 60
        while "python3-picamera2" not in detail:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, detail
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
            except urllib.error.HTTPError as exc:
                assert exc.code == 503
                detail = json.loads(exc.read())["detail"]
            except OSError:
                pass  # not listening yet
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output
    assert "python3-picamera2" in output and "Traceback" not in output


def test_config_hides_secrets_unless_asked(tmp_path: Path) -> None:
    """``ruseon config`` output lands in bug reports and forum posts: no token, password or
    key in it unless --show-secrets asks."""
    srtp = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNk"  # base64 of 30 bytes
    secrets = ("tok3n-SECRET", "mqttPASS", "hookKEY", srtp, "camPASS")
    path = tmp_path / "ruseon.toml"
    path.write_text(
        f'[auth]\ntoken = "{secrets[0]}"\n'
        f'[mqtt]\nurl = "mqtt://broker:1883"\nusername = "cam"\npassword = "{secrets[1]}"\n'
        f'[[webhook]]\nurl = "http://127.0.0.1:9/hook"\nsecret = "{secrets[2]}"\n'
        f'[[relay]]\nurl = "rtp://127.0.0.1:5004"\nsrtp_key = "{secrets[3]}"\n'
        f'[[camera]]\nname = "gate"\nsource = "rtsp://admin:{secrets[4]}@192.0.2.30/s1"\n')
    hidden = ruseon("config", "--config", str(path))
    assert hidden.returncode == 0, hidden.stderr
    assert not [s for s in secrets if s in hidden.stdout], hidden.stdout
    assert hidden.stdout.count("(hidden") == 4
    assert 'source = "rtsp://admin:***@192.0.2.30/s1"' in hidden.stdout
    assert 'username = "cam"' in hidden.stdout  # not a secret
    shown = ruseon("config", "--config", str(path), "--show-secrets")
    assert shown.returncode == 0, shown.stderr
    assert all(s in shown.stdout for s in secrets), shown.stdout
