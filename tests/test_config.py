"""The typed configuration: precedence, validation and one-line errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ruseon_appliance.config import (
    CameraConfig,
    Config,
    ConfigError,
    HostPort,
    WebRtcConfig,
    load_config,
    parse_host_port,
    to_toml,
    validate_camera,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "ruseon_appliance" / "ruseon.example.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ruseon.toml"
    path.write_text(text)
    return path


def test_defaults_when_default_file_is_absent(tmp_path: Path) -> None:
    config = load_config(tmp_path / "absent.toml", env={})
    assert config == Config()
    assert config.http.listen == HostPort("0.0.0.0", 8080)
    assert config.webrtc.listen.port == 8189
    assert config.webrtc.ice_servers == ()
    assert config.auth.token == ""
    assert config.state.dir == "/var/lib/ruseon"


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml", env={}, required=True)


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path, '[camera]\nframerate = 25\nwidth = 640\n[http]\nlisten = "127.0.0.1:9000"\n'
    )
    env = {"RUSEON_CAMERA_FRAMERATE": "20", "RUSEON_WEBRTC_ADVERTISE": "127.0.0.1, ::1"}
    config = load_config(path, env=env, overrides={"camera": {"framerate": "15"}})
    assert config.default_camera.framerate == 15  # flag beats env beats file
    assert config.default_camera.width == 640  # file beats default
    assert config.http.listen == HostPort("127.0.0.1", 9000)
    assert config.webrtc.advertise == ("127.0.0.1", "::1")


def test_config_env_var_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[webrtc]\nmax_viewers = 3\n")
    assert load_config(env={"RUSEON_CONFIG": str(path)}).webrtc.max_viewers == 3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[camera]\nwidht = 640\n", "camera.widht in .* is not a known key"),
        ('[camera]\nwidth = "big"\n', r"camera.width = 'big' is not valid: expected int"),
        ("[camera]\nwidth = 641\n", "camera.width = 641 is not valid: an even number"),
        ('[camera]\nprofile = "extended"\n', "allowed are baseline, main, high"),
        ('[camera]\nsource = "webcam"\n', "camera.source = 'webcam'"),
        ('[camera]\nawb = "sunny"\n', "camera.awb = 'sunny' is not valid: allowed are auto, "),
        ("[cameras]\nwidth = 640\n", r"\[cameras\] .* is not a known section"),
        ('[http]\nlisten = "localhost"\n', "http.listen = 'localhost' is not valid"),
        ('[webrtc]\nadvertise = "127.0.0.1"\n', "expected list of strings"),
        ('[webrtc]\nadvertise = ["pi.local"]\n', "an IPv4 or IPv6 address"),
        ('[webrtc]\nice_servers = ["http://x"]\n', "stun:, stuns:, turn: or turns:"),
        ("[webrtc]\nmax_viewers = true\n", "expected int"),
        ('[webrtc]\nsrtp_profiles = "fast"\n', "webrtc.srtp_profiles = \\['fast'\\] is not valid: "
         '"auto" or a list of SRTP_AEAD_AES_256_GCM'),
        ('[webrtc]\nsrtp_profiles = []\n', "webrtc.srtp_profiles = \\[\\] is not valid"),
        ('[webrtc]\nsrtp_profiles = ["auto", "SRTP_AES128_CM_SHA1_80"]\n', "srtp_profiles"),
        ('[webrtc]\nsrtp_profiles = ["SRTP_AES128_CM_SHA1_80", "SRTP_AES128_CM_SHA1_80"]\n',
         "no repeats"),
        ("[webrtc]\nsrtp_profiles = 1\n", "expected list of strings"),
        ('[http]\ntls_cert = "/c.pem"\n', "both or neither"),
        ("[webrtc]\nmax_viewers_per_address = 51\n",
         r"webrtc.max_viewers_per_address = 51 is not valid: 0 \(half of webrtc.max_viewers, "
         r"at least 16 while one place stays for others\) or 1 to webrtc.max_viewers \(50\)"),
        ("[webrtc]\nmax_viewers_per_address = -1\n", "webrtc.max_viewers_per_address = -1"),
        ("[webrtc]\npending_per_address = -1\n", "deprecated: set webrtc.max_viewers_per"),
        ('[http]\ntrusted_proxies = ["proxy.lan"]\n',
         "http.trusted_proxies = 'proxy.lan' is not valid: an IPv4 or IPv6 address or CIDR"),
        ('[http]\ntrusted_proxies = ["10.0.0.1/8"]\n', "has host bits set"),
        ('[http]\ntrusted_proxies = "10.0.0.1"\n', "expected list of strings"),
        ('[http]\ntls = "on"\n', 'http.tls = .on. is not valid: "self-signed"'),
        ('[http]\ntls = "self-signed"\ntls_cert = "/c"\ntls_key = "/k"\n',
         "not together with http.tls_cert"),
        ("camera = 3\n", "must be a \\[section\\] table"),
        ("[camera\n", "is not valid TOML"),
    ],
)
def test_bad_file_values_give_one_line_naming_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(write(tmp_path, text), env={})
    assert "\n" not in str(info.value)


def test_srtp_profiles_auto_or_a_list(tmp_path: Path) -> None:
    assert load_config(tmp_path / "x.toml", env={}).webrtc.srtp_profiles == ("auto",)
    text = '[webrtc]\nsrtp_profiles = ["SRTP_AES128_CM_SHA1_80", "SRTP_AEAD_AES_128_GCM"]\n'
    assert load_config(write(tmp_path, text), env={}).webrtc.srtp_profiles == (
        "SRTP_AES128_CM_SHA1_80", "SRTP_AEAD_AES_128_GCM")
    text = '[webrtc]\nsrtp_profiles = "SRTP_AES128_CM_SHA1_80"\n'
    assert load_config(write(tmp_path, text), env={}).webrtc.srtp_profiles == (
        "SRTP_AES128_CM_SHA1_80",)
    env = {"RUSEON_WEBRTC_SRTP_PROFILES": "SRTP_AES128_CM_SHA1_80,SRTP_AEAD_AES_256_GCM"}
    assert load_config(tmp_path / "x.toml", env=env).webrtc.srtp_profiles == (
        "SRTP_AES128_CM_SHA1_80", "SRTP_AEAD_AES_256_GCM")


def test_ring_arena_from_the_bitrate_unless_set() -> None:
    """Issue 19: the arena holds 16 s of the configured bitrate (2-8 MiB); a network camera's
    bitrate is not the configured one, so it keeps 8 MiB."""
    assert CameraConfig().ring_arena_bytes == 4_000_000  # 2 Mbit/s
    assert CameraConfig(source="rpicam:1", bitrate=300_000).ring_arena_bytes == 2 * 1024 * 1024
    assert CameraConfig(source="picamera", bitrate=8_000_000).ring_arena_bytes == 8 * 1024 * 1024
    assert CameraConfig(source="file:/x.h264").ring_arena_bytes == 4_000_000
    rtsp = CameraConfig(source="rtsp://127.0.0.1/cam", bitrate=300_000)
    assert rtsp.ring_arena_bytes == 8 * 1024 * 1024
    assert CameraConfig(ring_bytes=1024 * 1024).ring_arena_bytes == 1024 * 1024
    with pytest.raises(ConfigError, match=r"max_frame_bytes .* up to the ring arena \(2097152"):
        validate_camera(CameraConfig(bitrate=300_000, max_frame_bytes=3 * 1024 * 1024))


def test_bad_environment_variable_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="RUSEON_CAMERA"):
        load_config(tmp_path / "x.toml", env={"RUSEON_CAMERA": "1"})
    with pytest.raises(ConfigError, match=r"camera\.framerate = .fast."):
        load_config(tmp_path / "x.toml", env={"RUSEON_CAMERA_FRAMERATE": "fast"})


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [("0.0.0.0:8080", "0.0.0.0", 8080), ("[::]:80", "::", 80), ("pi.local:0", "pi.local", 0)],
)
def test_host_port_parses(text: str, host: str, port: int) -> None:
    assert parse_host_port("k", text) == HostPort(host, port)


@given(st.text(max_size=40))
def test_host_port_never_raises_anything_but_config_error(text: str) -> None:
    try:
        parsed = parse_host_port("k", text)
    except ConfigError as exc:
        assert str(exc).startswith("k = ")
    else:
        assert 0 <= parsed.port <= 65535 and parsed.host


def test_example_config_loads_and_round_trips(tmp_path: Path) -> None:
    example = load_config(EXAMPLE, env={}, required=True)
    assert example.default_camera.profile == "baseline"
    rendered = write(tmp_path, to_toml(example))
    assert load_config(rendered, env={}, required=True) == example


def test_token_file_is_read_and_stripped(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    config = load_config(write(tmp_path, f'[auth]\ntoken_file = "{token_file}"\n'), env={})
    assert config.auth.resolve_token() == "s3cret"
    missing = load_config(write(tmp_path, '[auth]\ntoken_file = "/nonexistent/t"\n'), env={})
    with pytest.raises(ConfigError, match=r"auth\.token_file"):
        missing.auth.resolve_token()


@pytest.mark.parametrize(
    ("max_viewers", "places"),
    # Half, raised to a 16-tile grid as long as one place stays for another address.
    [(50, 25), (100, 50), (33, 16), (32, 16), (20, 16), (17, 16), (16, 15), (6, 5), (3, 2),
     (2, 1), (1, 1)],
)
def test_places_per_address_by_default(max_viewers: int, places: int) -> None:
    assert WebRtcConfig(max_viewers=max_viewers).places_per_address() == places


def test_places_per_address_when_set_and_from_the_environment(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[webrtc]\nmax_viewers = 10\n"
                               "max_viewers_per_address = 10\n"), env={})
    assert config.webrtc.places_per_address() == 10
    env = {"RUSEON_WEBRTC_MAX_VIEWERS_PER_ADDRESS": "3"}
    assert load_config(tmp_path / "x.toml", env=env).webrtc.places_per_address() == 3
    # An old config's pending_per_address still loads (the engine warns about it at start).
    old = load_config(write(tmp_path, "[webrtc]\npending_per_address = 2\n"), env={})
    assert old.webrtc.places_per_address() == 25


def test_trusted_proxies_are_networks(tmp_path: Path) -> None:
    text = '[http]\ntrusted_proxies = ["192.0.2.10", "10.0.0.0/8", "fd00::/8"]\n'
    http = load_config(write(tmp_path, text), env={}).http
    assert [str(n) for n in http.trusted_proxy_networks()] == [
        "192.0.2.10/32", "10.0.0.0/8", "fd00::/8"]
    env = {"RUSEON_HTTP_TRUSTED_PROXIES": "127.0.0.2,::1"}
    assert load_config(tmp_path / "x.toml", env=env).http.trusted_proxies == ("127.0.0.2", "::1")


def test_motion_is_on_by_default_and_its_zones_are_checked(tmp_path: Path) -> None:
    from ruseon_appliance.config import ConfigError, load_config

    path = tmp_path / "ruseon.toml"
    path.write_text('[[camera]]\nname = "a"\n\n[[camera]]\nname = "b"\nmotion = false\n'
                    'motion_sensitivity = 80\nmotion_exclude = ["0,0 0.5,0 0.5,1"]\n')
    a, b = load_config(path, env={}).cameras
    assert a.motion and a.motion_sensitivity == 50
    assert not b.motion and b.motion_sensitivity == 80
    assert b.motion_exclude == ("0,0 0.5,0 0.5,1",)
    path.write_text('[camera]\nmotion_include = ["0,0 1,0"]\n')
    with pytest.raises(ConfigError, match=r"camera\.motion_include.*at least 3"):
        load_config(path, env={})
    path.write_text('[camera]\nmotion_sensitivity = 101\n')
    with pytest.raises(ConfigError, match=r"camera\.motion_sensitivity"):
        load_config(path, env={})


def test_the_images_defaults_sit_under_the_config_file(tmp_path: Path) -> None:
    """/usr/lib/ruseon/defaults.toml (the image's: RTSP and ONVIF on) stands in for the built-in
    defaults; the config file, the environment and flags still win over it."""
    from ruseon_appliance.config import VENDOR_DEFAULTS_PATH

    vendor = tmp_path / "defaults.toml"
    shutil.copy(Path(__file__).parents[1] / "image/layer/defaults.toml", vendor)
    config = load_config(tmp_path / "absent.toml", env={}, vendor_defaults=vendor)
    assert config.rtsp.enable and config.onvif.enable
    user = tmp_path / "ruseon.toml"
    user.write_text("[onvif]\nenable = false\n")
    config = load_config(user, env={}, vendor_defaults=vendor)
    assert config.rtsp.enable and not config.onvif.enable
    config = load_config(user, env={"RUSEON_RTSP_ENABLE": "false"}, vendor_defaults=vendor)
    assert not config.rtsp.enable
    # Elsewhere (no such file) the built-in defaults: both off.
    assert not VENDOR_DEFAULTS_PATH.exists()
    config = load_config(tmp_path / "absent.toml", env={})
    assert not config.rtsp.enable and not config.onvif.enable
    # A broken file is an error naming it, not a silent default.
    vendor.write_text("[onvif\n")
    with pytest.raises(ConfigError, match=r"defaults\.toml"):
        load_config(user, env={}, vendor_defaults=vendor)
