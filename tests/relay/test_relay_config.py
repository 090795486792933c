"""``[[relay]]`` tables and ``--relay``: parsed, validated, one-line errors, exit status 2."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from ruseon_appliance.cli import main
from ruseon_appliance.config import ConfigError, HostPort, load_config

KEY = base64.b64encode(bytes(range(30))).decode()


def test_relay_tables_and_the_cli_shortcut(tmp_path: Path) -> None:
    path = tmp_path / "ruseon.toml"
    path.write_text(f"""
[[relay]]
name = "janus-a"
url = "rtp://192.0.2.10:5004"
rtcp_port = 5005
srtp_key = "{KEY}"

[[relay]]
name = "janus-b"
url = "rtp://[2001:db8::1]:6004"
bind = "0.0.0.0:40000"
""")
    config = load_config(path, env={})
    a, b = config.relay
    assert (a.name, a.target, a.rtcp_port, a.srtp_master()) == (
        "janus-a", HostPort("192.0.2.10", 5004), 5005, bytes(range(30)))
    assert (b.target, b.bind, b.srtp_master()) == (HostPort("2001:db8::1", 6004),
                                                   HostPort("0.0.0.0", 40000), None)
    # RTCP: the configured port; left out, RTP's convention (the RTP port + 1); 0, none.
    assert (a.rtcp_target_port, b.rtcp_target_port) == (5005, 6005)
    off = tmp_path / "off.toml"
    off.write_text('[[relay]]\nurl = "rtp://192.0.2.10:5004"\nrtcp_port = 0\n')
    assert load_config(off, env={}).relay[0].rtcp_target_port == 0
    # Sound: off unless audio_port; its RTCP follows the video's convention.
    assert (a.audio_port, a.audio_rtcp_target_port, a.audio_payload_type) == (0, 0, 111)
    sound = tmp_path / "sound.toml"
    sound.write_text('[[relay]]\nurl = "rtp://192.0.2.10:5004"\naudio_port = 5006\n'
                     '[[relay]]\nname = "b"\nurl = "rtp://192.0.2.10:6004"\naudio_port = 6006\n'
                     'audio_rtcp_port = 0\naudio_payload_type = 100\n'
                     '[[relay]]\nname = "c"\nurl = "rtp://192.0.2.10:7004"\naudio_port = 7006\n'
                     'audio_rtcp_port = 7010\n')
    one, two, three = load_config(sound, env={}).relay
    assert (one.audio_port, one.audio_rtcp_target_port, one.audio_payload_type) == (
        5006, 5007, 111)
    assert (two.audio_rtcp_target_port, two.audio_payload_type) == (0, 100)
    assert three.audio_rtcp_target_port == 7010
    # --relay adds one named default next to the file's.
    config = load_config(path, env={}, overrides={"relay": {"url": "rtp://127.0.0.1:5004"}})
    assert [r.name for r in config.relay] == ["janus-a", "janus-b", "default"]


@pytest.mark.parametrize(("table", "message"), [
    ('url = "udp://192.0.2.1:5004"', "expected rtp://HOST:PORT"),
    ('url = "rtp://192.0.2.1"', "expected rtp://HOST:PORT"),
    ('url = "rtp://192.0.2.1:0"', "a port from 1 to 65535"),
    ('url = "rtp://192.0.2.1:5004"\nsrtp_key = "c2hvcnQ="', "base64 of 30 bytes"),
    ('url = "rtp://192.0.2.1:5004"\nrtcp_port = 5004', "other than the RTP port"),
    ('url = "rtp://192.0.2.1:5004"\nrtcp_port = -2', "other than the RTP port"),
    ('url = "rtp://192.0.2.1:65535"', "set rtcp_port (or 0 for none)"),
    ('url = "rtp://192.0.2.1:5004"\nname = "a/b"', "letters, digits"),
    ('url = "rtp://192.0.2.1:5004"\npayload_type = 8', "dynamic payload type"),
    ('url = "rtp://192.0.2.1:5004"\ncolour = 1', "not a known key"),
    ('url = "rtp://192.0.2.1:5004"\naudio_port = 5004', "not the video's RTP or RTCP port"),
    ('url = "rtp://192.0.2.1:5004"\naudio_port = 5005', "not the video's RTP or RTCP port"),
    ('url = "rtp://192.0.2.1:5004"\naudio_port = 5003', "(left out it is audio_port + 1)"),
    ('url = "rtp://192.0.2.1:5004"\naudio_port = 70000', "0 (no audio) or a port"),
    ('url = "rtp://192.0.2.1:5004"\naudio_port = -1', "0 (no audio) or a port"),
    ('url = "rtp://192.0.2.1:5004"\naudio_port = 5006\naudio_rtcp_port = 5006',
     "other than audio_port"),
    ('url = "rtp://192.0.2.1:5004"\naudio_port = 65535', "set audio_rtcp_port (or 0"),
    ('url = "rtp://192.0.2.1:5004"\naudio_rtcp_port = 5007', "only with audio_port"),
    ('url = "rtp://192.0.2.1:5004"\naudio_port = 5006\naudio_payload_type = 0',
     "dynamic payload type"),
    ('url = "rtp://192.0.2.1:5004"\naudio_port = "5006"', "audio_port"),
])
def test_bad_relay_tables_are_one_line_errors(tmp_path: Path, table: str, message: str) -> None:
    path = tmp_path / "ruseon.toml"
    path.write_text(f"[[relay]]\n{table}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_duplicate_names_and_cli_errors_exit_2(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ruseon.toml"
    path.write_text('[[relay]]\nurl = "rtp://192.0.2.1:5004"\n'
                    '[[relay]]\nurl = "rtp://192.0.2.2:5004"\n')
    assert main(["config", "--config", str(path)]) == 2
    assert "each relay needs its own name" in capsys.readouterr().err
    assert main(["config", "--config", "/dev/null", "--relay", "192.0.2.1:5004"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ruseon: error: relay 'default': url") and err.count("\n") == 1
    assert main(["config", "--config", "/dev/null", "--relay", "rtp://192.0.2.1:5004"]) == 0
    out = capsys.readouterr().out
    assert '[[relay]]\nname = "default"\nurl = "rtp://192.0.2.1:5004"' in out
