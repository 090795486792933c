"""The appliance's one typed configuration.

Precedence, lowest first: built-in defaults, the TOML file (default ``/etc/ruseon/ruseon.toml``),
``RUSEON_<SECTION>_<KEY>`` environment variables, then CLI flags. Every value is validated once,
here; a bad value raises :class:`ConfigError` whose message is one line naming the key, the value
and what is allowed.

Each setting is described once, where its dataclass field is declared (:func:`setting`): its
default, bounds or allowed values, the message naming them, whether it is a secret, its CLI flag
and a one-line doc. One builder (:func:`_build`) reads any section from the file, the
environment and flags; one validator (:func:`_validate_section`) enforces what the table says;
rules that tie several fields together are small functions registered with :func:`_rules` right
after the section they check. ``ruseon config`` (:func:`to_toml`), the CLI's flags (cli.py) and
the tests that keep ``ruseon.example.toml`` and README's table in step read the same table.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import ipaddress
import os
import ssl
import tomllib
import typing
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruseon_appliance import tls

DEFAULT_CONFIG_PATH = Path("/etc/ruseon/ruseon.toml")
# The image's own defaults (image/layer/defaults.toml: RTSP and ONVIF on, for NVRs that adopt
# cameras by themselves), read before the config file, whose values win; absent elsewhere.
VENDOR_DEFAULTS_PATH = Path("/usr/lib/ruseon/defaults.toml")

SOURCE_KINDS = ("auto", "synthetic", "picamera", "rpicam")
# Sources that take a sensor index (``picamera:1``, ``rpicam:1``: the second CSI connector).
INDEXED_SOURCE_KINDS = ("picamera", "rpicam")
NETWORK_SOURCE_SCHEMES = ("rtsp://", "rtsps://")
# The name the old single ``[camera]`` section's camera gets (``/whep/cam``, ``/hls/cam/``).
DEFAULT_CAMERA_NAME = "cam"
# Names a camera may not take: they are path segments of other routes under /whep/.
RESERVED_CAMERA_NAMES = frozenset({"sessions"})
PROFILES = ("baseline", "main", "high")
# White balance modes both camera sources accept: libcamera's AwbModeEnum (picamera2) and
# rpicam-apps' --awb table (core/options.cpp), which also has "normal" as a synonym of auto.
AWB_MODES = ("auto", "incandescent", "tungsten", "fluorescent", "indoor", "daylight", "cloudy",
             "custom")
# camera.ring_bytes = 0: the arena holds this many seconds of the configured bitrate (the GOP
# catch-up needs up to 2.5 s, a recording's pre-roll 5 s plus a GOP), within these bounds.
RING_SECONDS = 16
RING_AUTO_MIN_BYTES = 2 * 1024 * 1024
RING_AUTO_MAX_BYTES = 8 * 1024 * 1024
# SRTP protection profiles webrtc.srtp_profiles may name (OpenSSL's names), in aiortc's order.
SRTP_PROFILE_NAMES = ("SRTP_AEAD_AES_256_GCM", "SRTP_AEAD_AES_128_GCM", "SRTP_AES128_CM_SHA1_80")
# A camera grid's tiles (the page, a Home Assistant dashboard, an NVR): the default share of
# webrtc.max_viewers one client address may hold is at least this, where max_viewers allows.
GRID_PLACES = 16
RELAY_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
# AES_CM_128_HMAC_SHA1_80: a 16-byte master key and a 14-byte master salt, base64 as Janus's
# srtpcrypto (and SDES's inline:) spell them.
SRTP_MASTER_LENGTH = 30
MQTT_SCHEMES = ("mqtt", "mqtts")
# What a [[webhook]] may subscribe to (the event bus's names, ruseon_appliance/events).
WEBHOOK_EVENTS = ("viewer_joined", "viewer_left", "camera_stalled", "camera_recovered",
                  "recording_started", "recording_stopped", "controls_changed",
                  "motion_started", "motion_ended")
LOG_LEVELS = ("debug", "info", "warning", "error")
# What ``ruseon config`` prints for a secret that is set (unless --show-secrets).
HIDDEN = "(hidden: ruseon config --show-secrets)"


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range. ``str()`` is one line."""


@dataclass(frozen=True, slots=True)
class HostPort:
    """An address to listen on. ``host`` may be an IPv4/IPv6 literal or a host name."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def bind_hosts(self) -> list[str]:
        """The addresses to bind: ``[::]`` (or no host) means every address of both families,
        IPv4 first (asyncio alone makes a ``::`` socket IPv6-only, which leaves IPv4 clients
        out); anything else is bound as it is."""
        return ["0.0.0.0", "::"] if self.host in ("::", "") else [self.host]


def parse_host_port(key: str, text: str) -> HostPort:
    """Parse ``HOST:PORT`` or ``[V6]:PORT``; raise :class:`ConfigError` naming ``key``."""
    allowed = "HOST:PORT with PORT in 0-65535, e.g. 0.0.0.0:8080 or [::]:8080"
    value = text.strip()
    if value.startswith("["):
        host, sep, port_text = value[1:].partition("]:")
    else:
        host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{key} = {text!r} is not valid: expected {allowed}")
    return HostPort(host, int(port_text))


# ---------------------------------------------------------------------------------------------
# The table: one Setting per field


@dataclass(frozen=True, slots=True)
class Flag:
    """A CLI flag that sets one setting (its help: the setting's doc; ``also``: further
    ``(key, text)`` of the same section it sets, e.g. ``--rtsp`` turns ``rtsp.enable`` on)."""

    name: str
    metavar: str
    repeat: bool = False
    also: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Setting:
    """What one field is: the table's row (see :func:`setting`)."""

    doc: str = ""
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    ok: Callable[[Any], Any] | None = None
    each: bool = True
    allowed: str = ""
    unit: str = ""
    off: Any = None
    secret: bool | str = False
    flag: Flag | None = None
    parse: Callable[[str, Any, bool], Any] | None = None
    render: Callable[[Any], str] | None = None
    one_or_list: bool = False

    def allowed_text(self) -> str:
        """What the error message says is allowed."""
        if self.allowed:
            return self.allowed
        if self.choices:
            return "allowed are " + ", ".join(self.choices)
        text = (f"{_number(self.lo)} to {_number(self.hi)}" if self.hi is not None
                else f"at least {_number(self.lo)}")
        return f"{text} {self.unit}" if self.unit else text


def _number(value: float | None) -> str:
    return str(int(value)) if value is not None and float(value).is_integer() else str(value)


def setting(default: Any, doc: str = "", **row: Any) -> Any:
    """A dataclass field with its row of the table (:class:`Setting`):

    - ``lo``/``hi``: inclusive bounds; ``choices``: the allowed values; ``ok``: a check
      (``False`` or ``ValueError`` = invalid); ``off``: a value allowed besides (0: off/auto).
      For a list they apply to each item, unless ``each=False`` (then to the whole list).
    - ``allowed``: what the message says is allowed (default: from the bounds or choices, with
      ``unit``); ``{error}`` in it is the ``ValueError``'s text.
    - ``secret``: ``True`` (hidden by ``ruseon config``, never in messages) or ``"url"`` (a
      password in it is); ``flag``: its CLI :class:`Flag`.
    - ``parse(key, value, from_text)``/``render(value)``: a type of its own (e.g. a table or a
      bool); ``one_or_list``: a list that also takes one string.

    Its environment variable is ``RUSEON_<SECTION>_<KEY>`` (:func:`env_name`)."""
    return field(default=default, metadata={"setting": Setting(doc=doc, **row)})


def settings(cls: type) -> Iterator[tuple[str, Setting]]:
    """A section class's fields and their rows, in order."""
    for f in dataclasses.fields(cls):
        yield f.name, f.metadata.get("setting", Setting())


def env_name(section: str, key: str) -> str:
    """The environment variable of ``section.key`` (tables have none)."""
    return f"RUSEON_{section.upper()}_{key.upper()}"


_RULES: dict[type, list[Callable[[Any, str], None]]] = {}


def _rules(cls: type) -> Callable[[Callable[[Any, str], None]], Callable[[Any, str], None]]:
    """Register a cross-field rule of ``cls``: ``rule(section, key)`` raises :class:`ConfigError`
    (``key``: how messages name the section, e.g. ``camera 'back'``)."""

    def register(rule: Callable[[Any, str], None]) -> Callable[[Any, str], None]:
        _RULES.setdefault(cls, []).append(rule)
        return rule

    return register


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {value!r} is not valid: {allowed}")


def _hide_url_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}{slash}{path}"


def _shown(row: Setting, value: Any) -> Any:
    """A value as messages may show it: a secret never, a URL without its password."""
    if row.secret is True:
        return "(hidden)"
    if row.secret == "url" and isinstance(value, str):
        return _hide_url_password(value)
    return list(value) if isinstance(value, tuple) else value


def _validate_value(key: str, row: Setting, value: Any) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        _validate_section(value, key)
    for item in value if isinstance(value, tuple) and row.each else (value,):
        if row.off is not None and item == row.off:
            continue
        valid, error = True, ""
        if (row.lo is not None and item < row.lo) or (row.hi is not None and item > row.hi):
            valid = False
        if row.choices and item not in row.choices:
            valid = False
        if valid and row.ok is not None:
            try:
                valid = row.ok(item) is not False
            except ValueError as exc:
                valid, error = False, str(exc)
        if not valid:
            allowed = row.allowed_text().replace("{error}", error)
            raise ConfigError(f"{key} = {_shown(row, item)!r} is not valid: {allowed}")


def _validate_section(section: Any, key: str, sep: str = ".") -> None:
    """Every field of ``section`` against its row, then the section's rules."""
    for name, row in settings(type(section)):
        _validate_value(f"{key}{sep}{name}", row, getattr(section, name))
    for rule in _RULES.get(type(section), ()):
        rule(section, key)


# ---------------------------------------------------------------------------------------------
# The sections


def _is_name(value: str) -> bool:
    return 0 < len(value) <= 64 and set(value) <= RELAY_NAME_CHARS


def _network_host(url: str) -> str:
    try:
        return urllib.parse.urlsplit(url).hostname or ""
    except ValueError:
        return ""


def _is_source(source: str) -> bool:
    kind, _, index = source.partition(":")
    return (source in SOURCE_KINDS
            or (kind in INDEXED_SOURCE_KINDS and index.isdigit() and int(index) <= 15)
            or (source.startswith("file:") and len(source) > 5)
            or (source.startswith(NETWORK_SOURCE_SCHEMES) and _network_host(source) != ""))


AUDIO_KINDS = ("auto", "none", "tone", "source")


def _is_audio(audio: str) -> bool:
    return audio in AUDIO_KINDS or (audio.startswith("alsa:") and len(audio) > 5
                                    and audio[5:].isprintable() and " " not in audio)


def _zone(text: str) -> object:
    from .motion.zones import parse_polygon

    return parse_polygon(text)


_ZONES = "{error} (a zone is \"x,y x,y x,y ...\", coordinates 0 to 1)"
_EVEN = "an even number from 16 to 4096"


SUBSTREAM_MODES = ("auto", "on", "off")
SUBSTREAM_KEYS = ("width", "height", "framerate", "bitrate")


@dataclass(frozen=True, slots=True)
class SubstreamConfig:
    """A camera's ``substream``: a second, smaller H.264 stream encoded by the source itself
    (never by re-encoding the main one). ``mode`` is "auto" (key absent or ``"auto"``: on where it
    costs little, see capture/substream.py), "on" (``true`` or a table: asked for, an error where
    the source cannot) or "off" (``false``)."""

    mode: str = "auto"
    width: int = 640
    height: int = 360
    # 0: the camera's frame rate.
    framerate: int = 0
    bitrate: int = 500_000

    def to_toml(self) -> str:
        """The value as a ``[[camera]]`` key takes it."""
        if self.mode != "on":
            return "false" if self.mode == "off" else '"auto"'
        return (f"{{ width = {self.width}, height = {self.height}, "
                f"framerate = {self.framerate}, bitrate = {self.bitrate} }}")


def parse_substream(key: str, value: Any, from_text: bool) -> SubstreamConfig:
    """``substream``: ``true``/``false``/``"auto"``, a table of :data:`SUBSTREAM_KEYS`, or from
    the environment or a flag ``true``/``false``/``auto``/``WIDTHxHEIGHT``."""
    allowed = ("true, false, \"auto\" or a table { width, height, framerate, bitrate }"
               + (" (or WIDTHxHEIGHT)" if from_text else ""))
    if isinstance(value, SubstreamConfig):
        return value
    if isinstance(value, bool):
        return SubstreamConfig(mode="on" if value else "off")
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return SubstreamConfig()
        if from_text and text in ("1", "true", "yes", "on"):
            return SubstreamConfig(mode="on")
        if from_text and text in ("0", "false", "no", "off"):
            return SubstreamConfig(mode="off")
        width, sep, height = text.partition("x")
        if from_text and sep and width.isdigit() and height.isdigit():
            return SubstreamConfig(mode="on", width=int(width), height=int(height))
    if isinstance(value, Mapping):
        changes: dict[str, int] = {}
        for name, item in value.items():
            if name not in SUBSTREAM_KEYS:
                raise ConfigError(f"{key}.{name} is not a known key: a substream table allows "
                                  + ", ".join(SUBSTREAM_KEYS))
            if isinstance(item, bool) or not isinstance(item, int):
                raise ConfigError(f"{key}.{name} = {item!r} is not valid: expected int")
            changes[name] = item
        return SubstreamConfig(mode="on", **changes)
    raise ConfigError(f"{key} = {value!r} is not valid: expected {allowed}")




@dataclass(frozen=True, slots=True)
class CameraConfig:
    """``[camera]`` (one camera) or one ``[[camera]]`` table: where frames come from and how
    they are encoded."""

    name: str = setting(
        DEFAULT_CAMERA_NAME, "URL-safe, unique: /whep/<name>, /hls/<name>/, metrics labels",
        ok=lambda v: _is_name(v) and v not in RESERVED_CAMERA_NAMES,
        allowed="1-64 letters, digits, - or _ (and not "
        + ", ".join(sorted(RESERVED_CAMERA_NAMES)) + ")")
    source: str = setting(
        "auto", "camera source: auto, synthetic, picamera[:N], rpicam[:N], file:PATH or "
        "rtsp://URL", ok=_is_source, secret="url", flag=Flag("--source", "KIND"),
        allowed="allowed are auto, synthetic, picamera, rpicam, file:PATH, picamera:N, rpicam:N "
        "(N: the sensor index), rtsp://HOST[:PORT]/PATH")
    width: int = setting(1280, lo=16, hi=4096, ok=lambda v: v % 2 == 0, allowed=_EVEN)
    height: int = setting(720, lo=16, hi=4096, ok=lambda v: v % 2 == 0, allowed=_EVEN)
    framerate: int = setting(30, lo=1, hi=120)
    bitrate: int = setting(2_000_000, lo=50_000, hi=50_000_000, unit="bits/s")
    keyframe_interval: int = setting(60, "frames between IDRs (GOP)", lo=1, hi=600, unit="frames")
    profile: str = setting("baseline", choices=PROFILES)
    keyframe_request_interval_ms: int = setting(
        500, "shortest time between two IDRs viewers force", lo=0, hi=60_000, unit="ms")
    hflip: bool = setting(False)
    vflip: bool = setting(False)
    exposure_us: int = setting(0, "0: automatic", lo=0, allowed="0 (auto) or more µs")
    gain: float = setting(0.0, "analogue; 0: automatic", lo=0, allowed="0 (auto) or more")
    awb: str = setting("auto", "white balance mode, as picamera2 names it", choices=AWB_MODES)
    ring_bytes: int = setting(0, "ring arena; 0: sized from the bitrate (ring_arena_bytes)", off=0,
                              lo=64 * 1024, hi=512 * 1024 * 1024,
                              allowed="0 (sized from the bitrate) or 64 KiB to 512 MiB")
    ring_slots: int = setting(1024, lo=16, hi=65536)
    max_frame_bytes: int = setting(1024 * 1024, "largest access unit (bounds: _camera_rules)")
    rpicam_command: str = setting("rpicam-vid", "the rpicam-vid executable")
    # Motion detection (motion/): motion lasting min_duration_s starts an event; it ends
    # off_delay_s after the last motion; the next starts min_gap_s after it at the soonest.
    motion: bool = setting(True, "motion detection")
    motion_sensitivity: int = setting(50, "0 (large changes only) to 100", lo=0, hi=100)
    motion_min_duration_s: float = setting(0.3, lo=0, hi=60, unit="seconds")
    motion_off_delay_s: float = setting(10.0, lo=0, hi=3600, unit="seconds")
    motion_min_gap_s: float = setting(5.0, lo=0, hi=3600, unit="seconds")
    motion_include: tuple[str, ...] = setting((), "zones to look at only", ok=_zone,
                                              allowed=_ZONES)
    motion_exclude: tuple[str, ...] = setting((), "zones never looked at", ok=_zone,
                                              allowed=_ZONES)
    # The sub-stream (SubstreamConfig; rules: _substream_rules); an rtsp:// camera's comes from
    # substream_url (a second URL of the same camera, e.g. its 640x360 profile).
    substream: SubstreamConfig = setting(
        SubstreamConfig(), "a second, smaller stream from the source: \"auto\", false, true or "
        "{ width, height, framerate, bitrate }", parse=parse_substream,
        render=SubstreamConfig.to_toml)
    substream_url: str = setting("", "an rtsp:// camera's second stream", secret="url")
    # Sound (audio/): one Opus and one AAC encode per camera, read by every output.
    audio: str = setting(
        "auto", "sound: auto (the synthetic camera's tone, an rtsp:// camera's own track, a "
        "Pi camera's first ALSA microphone), none, tone, source (the rtsp:// camera's track) "
        "or alsa:DEVICE", ok=_is_audio,
        allowed="allowed are auto, none, tone, source, alsa:DEVICE (e.g. alsa:hw:1,0, "
        "alsa:default)")
    audio_gain_db: float = setting(0.0, "gain before the encoders", lo=-60, hi=30, unit="dB")
    audio_muted: bool = setting(False, "start muted (the page and the API unmute)")
    audio_bitrate: int = setting(32_000, "Opus", lo=6_000, hi=510_000, unit="bits/s")

    @property
    def ring_arena_bytes(self) -> int:
        """The ring arena's size: ``ring_bytes``, or for 0 :data:`RING_SECONDS` of ``bitrate``
        (2 to 8 MiB; a file source's ``bitrate`` is taken as the file's, as the GOP catch-up
        does), 8 MiB for a network camera (its bitrate is not the configured one). The arena is
        resident from the start (``bytearray`` zero-fills it): 8 MiB held 33 s of a 2 Mbit/s
        stream (issue 19)."""
        if self.ring_bytes:
            return self.ring_bytes
        if self.source_kind not in SOURCE_KINDS and not self.source.startswith("file:"):
            return RING_AUTO_MAX_BYTES
        return min(RING_AUTO_MAX_BYTES, max(RING_AUTO_MIN_BYTES, self.bitrate // 8 * RING_SECONDS))

    @property
    def source_kind(self) -> str:
        """``source`` without its sensor index (``picamera:1`` -> ``picamera``)."""
        kind, sep, index = self.source.partition(":")
        return kind if sep and kind in INDEXED_SOURCE_KINDS and index.isdigit() else self.source

    @property
    def catch_up_frames(self) -> int:
        """Frames a joining consumer may be sent to catch up: one keyframe-request window (a
        fresh IDR comes within it), at least 3 (WebRTC viewers, RTSP clients, relays)."""
        return max(3, -(-self.framerate * self.keyframe_request_interval_ms // 1000))

    @property
    def sensor_index(self) -> int:
        """Which CSI camera ``picamera:N`` / ``rpicam:N`` names (0 without an index): picamera2's
        ``Picamera2(camera_num)``, rpicam-vid's ``--camera N``."""
        kind, sep, index = self.source.partition(":")
        return int(index) if sep and kind in INDEXED_SOURCE_KINDS and index.isdigit() else 0


@_rules(CameraConfig)
def _camera_rules(cam: CameraConfig, key: str) -> None:
    _check(16 * 1024 <= cam.max_frame_bytes <= cam.ring_arena_bytes, f"{key}.max_frame_bytes",
           cam.max_frame_bytes,
           f"16 KiB up to the ring arena ({cam.ring_arena_bytes} bytes, camera.ring_bytes)")


# Sources that cannot encode a second stream: rpicam-vid runs one encoder, a file has one.
SUBSTREAM_REFUSED = {"rpicam": "rpicam-vid runs one encoder", "file": "a file holds one stream"}


@_rules(CameraConfig)
def _substream_rules(cam: CameraConfig, key: str) -> None:
    """One camera's ``substream`` and ``substream_url``."""
    sub, url = cam.substream, cam.substream_url
    network = cam.source.startswith(NETWORK_SOURCE_SCHEMES)
    if url:
        _check(url.startswith(NETWORK_SOURCE_SCHEMES) and _network_host(url) != "",
               f"{key}.substream_url", _hide_url_password(url), "rtsp://HOST[:PORT]/PATH")
        _check(network, f"{key}.substream_url", _hide_url_password(url),
               "only for an rtsp:// camera (other sources encode their sub-stream themselves)")
    _check(sub.mode in SUBSTREAM_MODES, f"{key}.substream", sub.mode,
           "true, false, \"auto\" or a table")
    if sub.mode != "on":
        return
    kind = "file" if cam.source.startswith("file:") else cam.source_kind
    if kind in SUBSTREAM_REFUSED:
        raise ConfigError(f"{key}.substream is not valid for source {kind!r}: "
                          f"{SUBSTREAM_REFUSED[kind]}; set substream = false")
    if network and not url:
        raise ConfigError(f"{key}.substream needs {key}.substream_url for an rtsp:// camera "
                          "(the camera's second, smaller stream's URL)")
    _check(16 <= sub.width <= cam.width and sub.width % 2 == 0, f"{key}.substream.width",
           sub.width, f"an even number from 16 to the camera's width ({cam.width})")
    _check(16 <= sub.height <= cam.height and sub.height % 2 == 0, f"{key}.substream.height",
           sub.height, f"an even number from 16 to the camera's height ({cam.height})")
    _check(0 <= sub.framerate <= cam.framerate, f"{key}.substream.framerate", sub.framerate,
           f"0 (the camera's) or 1 to the camera's frame rate ({cam.framerate})")
    if kind in ("picamera", "auto"):
        _check(sub.framerate in (0, cam.framerate), f"{key}.substream.framerate",
               sub.framerate, f"0 or the camera's ({cam.framerate}): picamera2 encodes every "
               "frame of its lores stream")
    _check(50_000 <= sub.bitrate <= 50_000_000, f"{key}.substream.bitrate", sub.bitrate,
           "50000 to 50000000 bits/s")


def validate_camera(cam: CameraConfig, key: str = "camera") -> None:
    """One camera's values; ``key`` names it in messages (``camera`` or ``camera 'back'``)."""
    _validate_section(cam, key)


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """``[http]``: the device page, WHEP and the API."""

    listen: HostPort = setting(HostPort("0.0.0.0", 8080), "HTTP listen address (WHEP, page, API)",
                               flag=Flag("--http", "HOST:PORT"))
    tls: str = setting(
        "", '"self-signed": HTTPS with a certificate made once (web/https_certificate.py)',
        choices=("", "self-signed"), allowed='"self-signed" (a certificate made once and kept '
        'in state.dir) or "" (plain HTTP, or HTTPS with http.tls_cert and http.tls_key)')
    tls_cert: str = setting("", "HTTPS with your own certificate: both paths set")
    tls_key: str = setting("")
    cors_origins: tuple[str, ...] = setting((), "extra origins allowed by CORS")
    hosts: tuple[str, ...] = setting(
        (), "host names besides its addresses, localhost, <hostname>(.local): DNS rebinding",
        ok=lambda v: bool(v.strip()) and "/" not in v and " " not in v.strip(),
        allowed="host names (no scheme, path or spaces)")
    max_offer_bytes: int = setting(64 * 1024, lo=1024)
    default_camera: str = setting("", "the camera the unnamed routes serve; empty: the first")
    trusted_proxies: tuple[str, ...] = setting(
        (), "reverse proxies whose Forwarded / X-Forwarded-For name the client",
        ok=ipaddress.ip_network, allowed="an IPv4 or IPv6 address or CIDR network, e.g. "
        "192.0.2.10 or 10.0.0.0/8 ({error})")

    @property
    def https(self) -> bool:
        """Whether the device page, WHEP and the API are served over TLS."""
        return self.tls == "self-signed" or bool(self.tls_cert)

    def trusted_proxy_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """:attr:`trusted_proxies` as networks (a bare address is a /32 or /128)."""
        return tuple(ipaddress.ip_network(entry) for entry in self.trusted_proxies)


@_rules(HttpConfig)
def _http_rules(http: HttpConfig, key: str) -> None:
    _check(bool(http.tls_cert) == bool(http.tls_key), f"{key}.tls_cert", http.tls_cert,
           "set together with http.tls_key (both or neither)")
    _check(not (http.tls and http.tls_cert), f"{key}.tls", http.tls,
           "not together with http.tls_cert/tls_key: use one or the other")


@dataclass(frozen=True, slots=True)
class WebRtcConfig:
    """``[webrtc]``: the single UDP port and what the answers advertise."""

    listen: HostPort = setting(HostPort("0.0.0.0", 8189), "the single WebRTC UDP listen address",
                               flag=Flag("--rtc", "HOST:PORT"))
    advertise: tuple[str, ...] = setting(
        (), "address to put in answers as a host candidate (repeatable)", ok=ipaddress.ip_address,
        allowed="an IPv4 or IPv6 address", flag=Flag("--advertise", "ADDR", repeat=True))
    ice_servers: tuple[str, ...] = setting(
        (), "STUN/TURN URLs; none: nothing is contacted", allowed="stun:, stuns:, turn: or turns: "
        "URLs", ok=lambda v: v.split(":", 1)[0] in ("stun", "stuns", "turn", "turns"))
    max_viewers: int = setting(50, "maximum concurrent viewers", lo=1, hi=10_000,
                               flag=Flag("--max-viewers", "N"))
    max_viewers_per_address: int = setting(
        0, "places one address (/64) may hold; 0: places_per_address (bounds: _webrtc_rules)")
    connect_timeout_s: float = setting(10.0, "a pending session is reaped after this",
                                       ok=lambda v: v > 0, allowed="more than 0 seconds")
    pending_per_address: int = setting(
        0, "deprecated (0: not set); a value above the default share widens it", lo=0, hi=10_000,
        allowed="0 to 10000 (deprecated: set webrtc.max_viewers_per_address instead)")
    send_path: str = setting("fanout", "fanout: packetize once; aiortc: the stock sender",
                             choices=("fanout", "aiortc"))
    srtp_profiles: tuple[str, ...] = setting(
        ("auto",), "most preferred first; auto: AES-GCM first with AES instructions, else "
        "AES128_CM only", one_or_list=True, each=False,
        ok=lambda v: v == ("auto",) or (bool(v) and len(set(v)) == len(v)
                                        and all(p in SRTP_PROFILE_NAMES for p in v)),
        allowed=f'"auto" or a list of {", ".join(SRTP_PROFILE_NAMES)} (no repeats)')

    def places_per_address(self) -> int:
        """How many viewer places one client address may hold, connected and pending together.

        ``max_viewers_per_address`` when set. By default half of ``max_viewers``, raised to a
        :data:`GRID_PLACES`-tile grid as far as that leaves one place for another address:
        50 -> 25, 20 -> 16, 16 -> 15, 6 -> 5, 2 -> 1, 1 -> 1 (a single place goes to whoever
        comes first). A deprecated ``pending_per_address`` above that widens it."""
        if self.max_viewers_per_address:
            return self.max_viewers_per_address
        share = max(1, self.max_viewers // 2, min(GRID_PLACES, self.max_viewers - 1))
        if self.pending_per_address > share:
            share = min(self.pending_per_address, self.max_viewers)
        return share


@_rules(WebRtcConfig)
def _webrtc_rules(webrtc: WebRtcConfig, key: str) -> None:
    _check(0 <= webrtc.max_viewers_per_address <= webrtc.max_viewers,
           f"{key}.max_viewers_per_address", webrtc.max_viewers_per_address,
           f"0 (half of webrtc.max_viewers, at least {GRID_PLACES} while one place stays for "
           f"others) or 1 to webrtc.max_viewers ({webrtc.max_viewers})")


def _read_secret(key: str, value: str, path: str) -> str:
    if value or not path:
        return value
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{key} = {path!r} cannot be read: {exc.strerror}") from exc


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """``[auth]``: who may view and who may administer (ruseon_appliance/access/).

    Admin always needs a credential: ``token`` (or ``token_file``) when set, otherwise the
    per-device secret generated on first start in ``<state.dir>/admin-secret``. Viewing is open
    on the LAN unless ``viewing = "credential"``; then it takes ``viewer_token`` (shareable,
    view only) or the admin secret.
    """

    token: str = setting("", "the admin secret (default: the one made on first start in the "
                         "state dir)", secret=True, flag=Flag("--token", "TOKEN"))
    token_file: str = setting("", "or read it from this file")
    viewing: str = setting(
        "open", choices=("open", "credential"),
        allowed='"open" (anyone on the LAN may watch) or "credential" (viewer token or admin)')
    viewer_token: str = setting("", "a view-only credential to share", secret=True)
    viewer_token_file: str = setting("", "or read it from this file")

    def resolve_token(self) -> str:
        """Return the configured admin token, reading ``token_file`` if set (stripped); "" when
        neither is set (the generated secret is used then: access/credentials.py)."""
        return _read_secret("auth.token_file", self.token, self.token_file)

    def resolve_viewer_token(self) -> str:
        """The viewer token, reading ``viewer_token_file`` if set; "" when none."""
        return _read_secret("auth.viewer_token_file", self.viewer_token, self.viewer_token_file)


@dataclass(frozen=True, slots=True)
class StateConfig:
    """``[state]``: where the certificate and other persistent state live."""

    dir: str = setting("/var/lib/ruseon", "state directory (certificate, ...)", ok=bool,
                       allowed="a directory path", flag=Flag("--state-dir", "DIR"))


@dataclass(frozen=True, slots=True)
class HlsConfig:
    """``[hls]``: HLS and Low-Latency HLS under ``/hls/`` (the page's fallback, Safari, caches)."""

    enable: bool = setting(True)
    part_duration_s: float = setting(
        0.25, "PART-TARGET, the longest partial segment", lo=0.1, hi=2.0,
        allowed="0.1 to 2.0 seconds (LL-HLS parts are usually 0.2-0.33 s)")
    window_s: float = setting(12.0, "seconds of segments kept in memory (at least 3 targets)",
                              lo=4, hi=120, unit="seconds")
    max_waiting_requests: int = setting(1000, "blocking reloads held at once; more get 503", lo=1,
                                        hi=100_000)


@dataclass(frozen=True, slots=True)
class RtspConfig:
    """``[rtsp]``: an RTSP server (RFC 2326) for NVRs and players: ``rtsp://HOST:8554/<camera>``."""

    enable: bool = setting(False)
    listen: HostPort = setting(HostPort("0.0.0.0", 8554), "serve RTSP for NVRs here (rtsp.enable "
                               "+ rtsp.listen, e.g. 0.0.0.0:8554)",
                               flag=Flag("--rtsp", "HOST:PORT", also=(("enable", "true"),)))
    max_clients: int = setting(20, "connections at once; more are answered 503", lo=1, hi=10_000)


@dataclass(frozen=True, slots=True)
class LogConfig:
    """``[log]``: verbosity."""

    level: str = setting("info", "debug, info, warning or error", ok=lambda v: v.lower() in
                         LOG_LEVELS, allowed="allowed are " + ", ".join(LOG_LEVELS),
                         flag=Flag("--log-level", "LEVEL"))


def _srtp_key_ok(key: str) -> bool:
    try:
        return len(base64.b64decode(key, validate=True)) == SRTP_MASTER_LENGTH
    except (binascii.Error, ValueError):
        return False


# [[relay]] rtcp_port's default: the RTP port + 1.
RTCP_NEXT_PORT = -1


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """One ``[[relay]]`` table: the camera's RTP to a media server (e.g. a Janus mountpoint)."""

    name: str = setting("default", ok=_is_name, allowed="1-64 letters, digits, - or _")
    url: str = setting("", "rtp://HOST:PORT (HOST an IP literal or a name resolved at start)",
                       secret="url")
    srtp_key: str = setting(
        "", "base64 of key + salt for SRTP AES_CM_128_HMAC_SHA1_80; empty: plain RTP",
        secret=True, off="", ok=_srtp_key_ok,
        allowed=f"base64 of {SRTP_MASTER_LENGTH} bytes (AES_CM_128_HMAC_SHA1_80 key + salt, as "
        "Janus's srtpcrypto), e.g. from: head -c 30 /dev/urandom | base64")
    rtcp_port: int = setting(RTCP_NEXT_PORT, "the server's RTCP port (SRs out, PLI/FIR back); "
                             "left out: the RTP port + 1 (RTP's convention); 0: none")
    bind: HostPort = setting(HostPort("0.0.0.0", 0), "the relay's UDP socket; port 0: any")
    payload_type: int = setting(96, lo=96, hi=127, allowed="a dynamic payload type, 96 to 127")
    camera: str = setting("", "which camera's stream; empty: the default camera")
    # The camera's sound (Opus), beside the video: the same host, its own port and SSRC.
    audio_port: int = setting(0, "the server's RTP port for the camera's Opus (the mountpoint's "
                              "audioport); 0: video only", lo=0, hi=65535,
                              allowed="0 (no audio) or a port from 1 to 65535")
    audio_rtcp_port: int = setting(RTCP_NEXT_PORT, "the server's RTCP port for the audio "
                                   "(sender reports); left out: audio_port + 1; 0: none")
    audio_payload_type: int = setting(111, lo=96, hi=127,
                                      allowed="a dynamic payload type, 96 to 127")

    @property
    def target(self) -> HostPort:
        """``HOST:PORT`` of :attr:`url` (validated by :func:`validate`)."""
        return parse_host_port(f"relay {self.name}: url", self.url.removeprefix("rtp://"))

    @property
    def rtcp_target_port(self) -> int:
        """The RTCP port in use: :attr:`rtcp_port`, the RTP port + 1 for its default; 0 =
        none."""
        if self.rtcp_port == RTCP_NEXT_PORT:
            return self.target.port + 1
        return self.rtcp_port

    @property
    def audio_rtcp_target_port(self) -> int:
        """The audio's RTCP port in use: :attr:`audio_rtcp_port`, ``audio_port + 1`` for its
        default; 0 = none (and always 0 without audio)."""
        if not self.audio_port:
            return 0
        if self.audio_rtcp_port == RTCP_NEXT_PORT:
            return self.audio_port + 1
        return self.audio_rtcp_port

    def srtp_master(self) -> bytes | None:
        """The decoded SRTP master key + salt, or None for plain RTP."""
        return base64.b64decode(self.srtp_key, validate=True) if self.srtp_key else None


@_rules(RelayConfig)
def _relay_rules(relay: RelayConfig, key: str) -> None:
    expected = "expected rtp://HOST:PORT, e.g. rtp://192.0.2.10:5004"
    _check(relay.url.startswith("rtp://"), f"{key}: url", relay.url, expected)
    try:
        target = relay.target
    except ConfigError:
        target = HostPort("", 0)
    _check(bool(target.host), f"{key}: url", relay.url, expected)
    _check(1 <= target.port <= 65535, f"{key}: url", relay.url, "a port from 1 to 65535")
    _check(relay.rtcp_port in (0, RTCP_NEXT_PORT) or (1 <= relay.rtcp_port <= 65535
                                                      and relay.rtcp_port != target.port),
           f"{key}: rtcp_port", relay.rtcp_port,
           "0 (none) or a port from 1 to 65535 other than the RTP port (left out: the RTP "
           "port + 1)")
    _check(relay.rtcp_port != RTCP_NEXT_PORT or target.port < 65535, f"{key}: url",
           relay.url, "RTCP goes to the RTP port + 1 unless rtcp_port says otherwise: set "
           "rtcp_port (or 0 for none) with RTP port 65535")
    video_ports = {target.port, relay.rtcp_target_port} - {0}
    if not relay.audio_port:
        _check(relay.audio_rtcp_port in (0, RTCP_NEXT_PORT), f"{key}: audio_rtcp_port",
               relay.audio_rtcp_port, "only with audio_port (set audio_port, or leave this out)")
        return
    _check(relay.audio_port not in video_ports, f"{key}: audio_port", relay.audio_port,
           "a port of its own, not the video's RTP or RTCP port")
    _check(relay.audio_rtcp_port in (0, RTCP_NEXT_PORT) or (
        1 <= relay.audio_rtcp_port <= 65535 and relay.audio_rtcp_port != relay.audio_port),
        f"{key}: audio_rtcp_port", relay.audio_rtcp_port,
        "0 (none) or a port from 1 to 65535 other than audio_port (left out: audio_port + 1)")
    _check(relay.audio_rtcp_port != RTCP_NEXT_PORT or relay.audio_port < 65535,
           f"{key}: audio_port", relay.audio_port, "the audio's RTCP goes to audio_port + 1 "
           "unless audio_rtcp_port says otherwise: set audio_rtcp_port (or 0 for none) with "
           "audio_port 65535")
    _check(relay.audio_rtcp_target_port not in video_ports, f"{key}: audio_rtcp_port",
           relay.audio_rtcp_target_port, "a port of its own, not the video's RTP or RTCP port "
           "(left out it is audio_port + 1)")


def _is_topic(value: str) -> bool:
    return (bool(value) and set(value) <= RELAY_NAME_CHARS | frozenset("/")
            and not value.startswith("/") and not value.endswith("/"))


_TOPIC = "letters, digits, -, _ and inner /, no MQTT wildcards"


@dataclass(frozen=True, slots=True)
class MqttConfig:
    """``[mqtt]``: Home Assistant discovery and state over MQTT; off while ``url`` is empty."""

    url: str = setting("", "MQTT broker for Home Assistant (mqtt://HOST[:PORT] or mqtts://)",
                       secret="url", flag=Flag("--mqtt", "URL"))
    ca_file: str = setting("", "mqtts: trust this PEM CA instead of the system's")
    cert_file: str = setting("", "mqtts: a client certificate (PEM)")
    key_file: str = setting("", "its key; empty when cert_file holds it")
    username: str = setting("")
    password: str = setting("", secret=True)
    password_file: str = setting("", "or read the password from this file")
    topic_prefix: str = setting("ruseon", "<topic_prefix>/<device id>/...", ok=_is_topic,
                                allowed=_TOPIC)
    discovery_prefix: str = setting("homeassistant", ok=_is_topic, allowed=_TOPIC)
    device_id: str = setting(
        "", "empty: generated once, kept in the state dir", ok=lambda v: set(v) <= RELAY_NAME_CHARS,
        allowed="letters, digits, - or _ (empty: generated and kept in the state dir)")
    state_interval_s: float = setting(5.0, "shortest time between two state messages", lo=0.5,
                                      hi=3600, unit="seconds")
    snapshot_interval_s: float = setting(30.0, "the snapshot image's period", lo=1, hi=86400,
                                         unit="seconds")
    commands: bool = setting(True, "buttons and controls from MQTT (restrict with the broker's "
                             "ACL); false: state only")

    def endpoint(self) -> tuple[str, int, bool]:
        """``(host, port, tls)`` of :attr:`url`; ``ValueError`` when it is not a broker URL."""
        parts = urllib.parse.urlsplit(self.url)
        port = parts.port  # raises ValueError when out of range or not a number
        if parts.scheme not in MQTT_SCHEMES or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(self.url)
        tls = parts.scheme == "mqtts"
        return parts.hostname, port or (8883 if tls else 1883), tls

    def tls_context(self) -> ssl.SSLContext | None:
        """The client TLS context for an ``mqtts://`` URL (None for ``mqtt://``); a
        :class:`ConfigError` naming the setting when a CA, certificate or key cannot be used."""
        if not self.endpoint()[2]:
            return None
        return _tls_context("mqtt", self.ca_file, self.cert_file, self.key_file)

    def resolve_password(self) -> str:
        """The configured password, reading ``password_file`` if set (stripped)."""
        return _read_secret("mqtt.password_file", self.password, self.password_file)


@_rules(MqttConfig)
def _mqtt_rules(mqtt: MqttConfig, key: str) -> None:
    """A broker URL with a host, no credentials in it; TLS files only for mqtts:// (and usable)."""
    if mqtt.url:
        try:
            mqtt.endpoint()
        except ValueError:
            raise ConfigError(f"{key}.url = {_hide_url_password(mqtt.url)!r} is not valid: "
                              "expected mqtt://HOST[:PORT] or mqtts://HOST[:PORT]") from None
        # Credentials in the URL were ignored (the appliance connected without them); and a
        # URL is what logs, `ps` and status show. They go in username/password(_file).
        _check("@" not in mqtt.url, f"{key}.url", "(credentials hidden)",
               "mqtt://HOST[:PORT] without user:password@ (use mqtt.username and "
               "mqtt.password or mqtt.password_file)")
    tls_keys = [name for name in ("ca_file", "cert_file", "key_file") if getattr(mqtt, name)]
    if tls_keys:
        _check(mqtt.url.startswith("mqtts://"), f"{key}.{tls_keys[0]}",
               getattr(mqtt, tls_keys[0]), "only with an mqtts:// url")
    _check(not mqtt.key_file or bool(mqtt.cert_file), f"{key}.key_file", mqtt.key_file,
           "needs mqtt.cert_file (the certificate it belongs to)")
    if mqtt.url:
        mqtt.tls_context()  # a CA, certificate or key that cannot be used fails now, not later


@dataclass(frozen=True, slots=True)
class OnvifConfig:
    """``[onvif]``: an ONVIF Profile S device (SOAP on the HTTP port, WS-Discovery on UDP 3702)
    that NVRs and Home Assistant find and adopt; off by default."""

    enable: bool = setting(False)
    username: str = setting("admin", "the ONVIF account")
    password: str = setting("", "empty: the admin secret", secret=True)
    password_file: str = setting("", "or read the password from this file")
    discovery: bool = setting(True, "answer WS-Discovery probes, announce Hello/Bye")

    def resolve_password(self) -> str:
        """The configured password, reading ``password_file`` if set (stripped)."""
        return _read_secret("onvif.password_file", self.password, self.password_file)


def _webhook_scheme(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return scheme if scheme in ("http", "https") and sep and rest.split("/")[0] else ""


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """One ``[[webhook]]`` table: JSON POSTs of appliance events to a URL."""

    url: str = setting("", secret="url", ok=lambda v: _webhook_scheme(v) != "",
                       allowed="expected http://HOST[:PORT]/PATH or https://...")
    ca_file: str = setting("", "https: trust this PEM CA instead of the system's")
    events: tuple[str, ...] = setting((), "event names to send; empty: all", choices=WEBHOOK_EVENTS)
    secret: str = setting("", "HMAC-SHA256 key of X-Ruseon-Signature (docs/home-assistant.md)",
                          secret=True)
    timeout_s: float = setting(5.0, hi=300, ok=lambda v: v > 0,
                               allowed="more than 0, at most 300 seconds")
    retries: int = setting(3, "attempts after the first, back-off doubling", lo=0, hi=20)
    retry_delay_s: float = setting(1.0, hi=600, ok=lambda v: v > 0,
                                   allowed="more than 0, at most 600 seconds")
    queue_size: int = setting(100, "events waiting; full: the oldest is dropped", lo=1,
                              hi=10_000, unit="events")

    def tls_context(self) -> ssl.SSLContext | None:
        """A context trusting :attr:`ca_file` for an https:// URL, or None (aiohttp's default:
        the system's CAs)."""
        return _tls_context("webhook", self.ca_file) if self.ca_file else None


@_rules(WebhookConfig)
def _webhook_rules(hook: WebhookConfig, key: str) -> None:
    if hook.ca_file:
        _check(_webhook_scheme(hook.url) == "https", f"{key}.ca_file", hook.ca_file,
               "only with an https:// url")
        _tls_context(key, hook.ca_file)


@dataclass(frozen=True, slots=True)
class RecordingConfig:
    """``[recording]``: the fMP4 archive on the board and its playback API."""

    continuous: bool = setting(False, "record from start-up on (else only on request)")
    dir: str = setting("", "record continuously into DIR (recording.dir + recording.continuous)",
                       flag=Flag("--record-dir", "DIR", also=(("continuous", "true"),)))
    segment_s: float = setting(60.0, "cut at the first IDR after it", lo=2, hi=3600,
                               unit="seconds")
    preroll_s: float = setting(5.0, "the ring's past an on-demand recording begins with", lo=0,
                               hi=60, unit="seconds")
    sync_interval_s: float = setting(
        5.0, "the open segment made durable this often; 0: when it closes", off=0, lo=1, hi=600,
        allowed="0 (off) or 1 to 600 seconds")
    mode: str = setting(
        "", "continuous, motion (preroll_s before each motion event to postroll_s after), off; "
        "empty: as continuous says", choices=("", "continuous", "motion", "off"),
        allowed="allowed are continuous, motion, off")
    postroll_s: float = setting(5.0, lo=0, hi=600, unit="seconds")
    max_bytes: int = setting(2 * 1024 * 1024 * 1024, "retention; 0: no limit", off=0,
                             lo=1024 * 1024, allowed="0 (no limit) or at least 1048576 bytes")
    max_age_hours: float = setting(168.0, "retention; 0: no limit", lo=0,
                                   allowed="0 (no limit) or more hours")
    # Frigate's tiers: the size limit takes the oldest segments either way.
    event_max_age_hours: float = setting(
        0.0, "segments holding a motion event (pre- to post-roll) kept this long by age, when "
        "longer than max_age_hours; 0: the same", lo=0,
        allowed="0 (as max_age_hours) or more hours")
    max_downloads: int = setting(4, "clip downloads at once; beyond, 503", lo=1, hi=1000)
    max_downloads_per_address: int = setting(2, "...from one address (bounds: _recording_rules)")
    clock_sync_file: str = setting("", "the clock is synchronized while it exists; empty: "
                                   "adjtimex or systemd-timesyncd's flag file")

    def directory(self, state_dir: str) -> Path:
        """The archive directory, resolved against the state directory."""
        return Path(self.dir) if self.dir else Path(state_dir) / "recordings"

    @property
    def records_continuously(self) -> bool:
        """``mode = "continuous"``, or no mode and ``continuous = true``."""
        return self.mode == "continuous" if self.mode else self.continuous


@_rules(RecordingConfig)
def _recording_rules(rec: RecordingConfig, key: str) -> None:
    _check(1 <= rec.max_downloads_per_address <= rec.max_downloads,
           f"{key}.max_downloads_per_address", rec.max_downloads_per_address,
           "1 to recording.max_downloads")


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration, one frozen dataclass per TOML section.

    ``cameras`` is every camera in order, one form for one camera or several: a ``[camera]``
    section is a list of one, ``[[camera]]`` tables the list. Which camera the unnamed routes
    serve is ``http.default_camera`` (:attr:`default_camera`), else the first listed.
    """

    cameras: tuple[CameraConfig, ...] = (CameraConfig(),)
    http: HttpConfig = field(default_factory=HttpConfig)
    webrtc: WebRtcConfig = field(default_factory=WebRtcConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    state: StateConfig = field(default_factory=StateConfig)
    log: LogConfig = field(default_factory=LogConfig)
    hls: HlsConfig = field(default_factory=HlsConfig)
    rtsp: RtspConfig = field(default_factory=RtspConfig)
    # ``[[relay]]`` tables (an array, not a section).
    relay: tuple[RelayConfig, ...] = ()
    recording: RecordingConfig = field(default_factory=RecordingConfig)
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    onvif: OnvifConfig = field(default_factory=OnvifConfig)
    # ``[[webhook]]`` tables (an array, not a section).
    webhook: tuple[WebhookConfig, ...] = ()

    @property
    def default_camera(self) -> CameraConfig:
        """The default camera's settings (``http.default_camera``, else the first listed)."""
        wanted = self.http.default_camera
        return next((cam for cam in self.cameras if cam.name == wanted), self.cameras[0])


# The configuration's sections as the file, the environment and flags name them: ``[camera]``
# (or ``[[camera]]`` tables) fills ``Config.cameras``.
SECTIONS = tuple("camera" if f.name == "cameras" else f.name for f in dataclasses.fields(Config))
# Sections that are arrays of tables (``[[relay]]``), and the class of one table.
TABLES: dict[str, type] = {"camera": CameraConfig, "relay": RelayConfig,
                           "webhook": WebhookConfig}


def _field_of(section: str) -> str:
    return "cameras" if section == "camera" else section


def section_classes() -> Iterator[tuple[str, type]]:
    """Every section as the file names it, with its class (``camera``: one camera's)."""
    for f in dataclasses.fields(Config):
        name = "camera" if f.name == "cameras" else f.name
        yield name, TABLES.get(name) or typing.cast(type, f.default_factory)


def _config_rules(config: Config) -> None:
    """What ties sections and tables together: unique names, names that must name a camera."""
    for what, key, items in (("camera", "camera {!r}.name", config.cameras),
                             ("relay", "relay {!r}: name", config.relay)):
        names = [item.name for item in items]
        for index, name in enumerate(names):
            _check(name not in names[:index], key.format(name), name,
                   f"each {what} needs its own name")
    names = [cam.name for cam in config.cameras]
    for relay in config.relay:
        _check(not relay.camera or relay.camera in names, f"relay {relay.name!r}: camera",
               relay.camera, "the name of a camera: " + ", ".join(names))
    _check(not config.http.default_camera or config.http.default_camera in names,
           "http.default_camera", config.http.default_camera,
           "the name of a camera: " + ", ".join(names))


def validate(config: Config) -> None:
    """Every value against the table, then the rules that tie fields and sections together."""
    for cam in config.cameras:
        validate_camera(cam, "camera" if len(config.cameras) == 1 else f"camera {cam.name!r}")
    for name, _ in section_classes():
        if name not in TABLES:
            _validate_section(getattr(config, name), name)
    for relay in config.relay:
        _validate_section(relay, f"relay {relay.name!r}", ": ")
    for index, hook in enumerate(config.webhook):
        _validate_section(hook, f"webhook[{index}]")
    _config_rules(config)


# ---------------------------------------------------------------------------------------------
# Loading


def _type_name(tp: Any) -> str:
    if tp is HostPort:
        return "HOST:PORT"
    if typing.get_origin(tp) is tuple:
        return "list of strings"
    return getattr(tp, "__name__", str(tp))


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _coerce(key: str, tp: Any, row: Setting, value: Any, from_text: bool) -> Any:
    """Turn ``value`` (TOML-typed, or text from env/CLI when ``from_text``) into ``tp``."""
    if row.parse is not None:
        return row.parse(key, value, from_text)
    bad = ConfigError(f"{key} = {value!r} is not valid: expected {_type_name(tp)}")
    if tp is HostPort:
        if isinstance(value, HostPort):
            return value
        if not isinstance(value, str):
            raise bad
        return parse_host_port(key, value)
    if typing.get_origin(tp) is tuple:
        if row.one_or_list and isinstance(value, str) and "," not in value:
            value = [value.strip()]
        if from_text and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise bad
        return tuple(value)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise bad
        return _build(tp(), value, key, from_text, origin="", table=key)
    if isinstance(value, bool):
        if tp is bool:
            return value
        raise bad
    if tp is bool and from_text and isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    if tp in (int, float) and isinstance(value, int | float) and not (
            tp is int and isinstance(value, float)):
        return tp(value)
    if tp in (int, float) and from_text and isinstance(value, str):
        try:
            return tp(value.replace("_", "") if tp is int else value)
        except ValueError:
            raise bad from None
    if tp is str and isinstance(value, str):
        return value
    raise bad


def _build(base: Any, values: Any, key: str, from_text: bool, *, origin: str,
           table: str, name: str = "") -> Any:
    """The one section builder: ``base`` (a section dataclass) with ``values`` (a file's table,
    the environment's or the flags' ``{key: value}``) applied. ``key`` names a value in type
    errors (``camera[1]``), ``name`` an unknown key (``camera``), ``table`` the section."""
    cls = type(base)
    hints = typing.get_type_hints(cls)
    rows = dict(settings(cls))
    changes: dict[str, Any] = {}
    for field_name, value in values.items():
        if field_name not in rows:
            where = f" in {origin}" if origin else ""
            raise ConfigError(f"{name or key}.{field_name}{where} is not a known key: {table} "
                              f"allows {', '.join(rows)}")
        changes[field_name] = _coerce(f"{key}.{field_name}", hints[field_name], rows[field_name],
                                      value, from_text)
    return dataclasses.replace(base, **changes)


def _tables(section: str, values: Any, origin: str, from_text: bool) -> tuple[Any, ...]:
    """``[[section]]`` tables (a single table counts as a list of one)."""
    cls = TABLES[section]
    forms = "a [camera] table or [[camera]] tables" if section == "camera" else (
        f"[[{section}]] tables")
    if isinstance(values, Mapping):
        values = [values]
    if not isinstance(values, list | tuple) or (not values and section == "camera") or not all(
            isinstance(v, Mapping) for v in values):
        raise ConfigError(f"{section} in {origin} must be {forms}, got {values!r}")
    built = []
    for index, table in enumerate(values):
        if section == "camera" and "name" not in table:
            raise ConfigError(f"camera[{index}] in {origin} has no name: every [[camera]] table "
                              "needs name = \"...\" (letters, digits, - or _)")
        built.append(_build(cls(), table, f"{section}[{index}]", from_text, origin=origin,
                            table=f"[[{section}]]", name=section))
    return tuple(built)


def _apply_camera_flags(config: Config, values: Any, origin: str) -> Config:
    """``--camera NAME=SOURCE`` flags: they make the camera list, in their order. A name the
    file has keeps the file's other settings; a new name takes the first camera's."""
    current = {cam.name: cam for cam in config.cameras}
    template = config.cameras[0]
    cameras: list[CameraConfig] = []
    for flag in values:
        name, sep, source = str(flag).partition("=")
        if not sep or not name or not source:
            raise ConfigError(f"--camera {flag!r} in {origin} is not valid: expected NAME=SOURCE, "
                              "e.g. --camera front=picamera:0")
        base = current.get(name, template)
        cameras.append(dataclasses.replace(base, name=name, source=source))
    return dataclasses.replace(config, cameras=tuple(cameras))


def _apply(config: Config, section: str, values: Any, origin: str, from_text: bool) -> Config:
    """One section's values from the file, the environment or the flags, applied to ``config``.

    ``[camera]`` (or ``camera.*`` from the environment or a flag) applies to every camera, a
    name or source only when there is one; ``[[camera]]`` tables are the camera list. A file's
    ``[[relay]]``/``[[webhook]]`` tables replace any before; the command line's ``--relay``
    (``{"url": ...}``) adds a relay named ``default`` (or replaces the file's)."""
    if section == "cameras" and origin == "the command line":
        return _apply_camera_flags(config, values.get("flags", ()), origin)
    if section == "camera" and isinstance(values, Mapping):
        for key in ("name", "source"):
            if key in values and len(config.cameras) > 1:
                raise ConfigError(f"camera.{key} in {origin} cannot apply to "
                                  f"{len(config.cameras)} cameras: use --camera NAME=SOURCE")
        cameras = tuple(_build(cam, values, "camera", from_text, origin=origin, table="[camera]")
                        for cam in config.cameras)
        return dataclasses.replace(config, cameras=cameras)
    if section == "relay" and isinstance(values, Mapping):
        added = _build(RelayConfig(), values, f"relay[{len(config.relay)}]", from_text,
                       origin=origin, table="[[relay]]", name="relay")
        kept = tuple(r for r in config.relay if r.name != added.name)
        return dataclasses.replace(config, relay=(*kept, added))
    if section in TABLES and (section != "camera" or isinstance(values, list)):
        tables: Any = _tables(section, values, origin, from_text)
        return dataclasses.replace(config, **{_field_of(section): tables})
    if not isinstance(values, Mapping):
        raise ConfigError(f"{section} in {origin} must be a [section] table, got {values!r}")
    if section not in SECTIONS:
        known = ", ".join(SECTIONS)
        raise ConfigError(f"[{section}] in {origin} is not a known section: allowed are {known}")
    built = _build(getattr(config, section), values, section, from_text, origin=origin,
                   table=f"[{section}]")
    return dataclasses.replace(config, **{section: built})


def load_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file, turning I/O and syntax errors into one-line :class:`ConfigError`."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        if _mixes_camera_forms(path):
            raise ConfigError(f"config file {path} has both a [camera] section and [[camera]] "
                              "tables: use one (several cameras: a [[camera]] table each, "
                              "with a name)") from None
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _mixes_camera_forms(path: Path) -> bool:
    """Whether the file has a ``[camera]`` header and a ``[[camera]]`` header (TOML's own
    message for that is only 'Cannot overwrite a value')."""
    try:
        headers = {line.split("#", 1)[0].strip()
                   for line in path.read_text(errors="replace").splitlines()}
    except OSError:
        return False
    return "[camera]" in headers and "[[camera]]" in headers


def _env_overrides(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Collect ``RUSEON_<SECTION>_<KEY>`` variables into ``{section: {key: text}}``."""
    sections = set(SECTIONS) - {"relay", "webhook"}
    out: dict[str, dict[str, str]] = {}
    for name, value in env.items():
        if not name.startswith("RUSEON_") or name == "RUSEON_CONFIG":
            continue
        rest = name[len("RUSEON_") :].lower()
        section, _, key = rest.partition("_")
        if section not in sections or not key:
            raise ConfigError(
                f"environment variable {name} is not a known setting: "
                "expected RUSEON_<SECTION>_<KEY>, e.g. RUSEON_HTTP_LISTEN"
            )
        out.setdefault(section, {})[key] = value
    return out


def load_config(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    required: bool = False,
    vendor_defaults: Path | None = VENDOR_DEFAULTS_PATH,
) -> Config:
    """Build the effective configuration.

    ``path`` defaults to ``$RUSEON_CONFIG`` or :data:`DEFAULT_CONFIG_PATH`; a missing default file
    is fine (defaults apply) unless ``required``. ``overrides`` are CLI values already typed or as
    text, ``{section: {key: value}}``. Lowest of all, ``vendor_defaults`` (the image's file,
    :data:`VENDOR_DEFAULTS_PATH`) when it exists: what it sets stands in for the built-in
    defaults, and the config file, the environment and flags override it.
    """
    environ = os.environ if env is None else env
    config = Config()
    if vendor_defaults is not None and vendor_defaults.exists():
        for section, values in load_toml(vendor_defaults).items():
            config = _apply(config, section, values, str(vendor_defaults), from_text=False)
    if path is None and environ.get("RUSEON_CONFIG"):
        path, required = Path(environ["RUSEON_CONFIG"]), True
    if path is None:
        path = DEFAULT_CONFIG_PATH
    if path.exists() or required:
        for section, values in load_toml(path).items():
            config = _apply(config, section, values, str(path), from_text=False)
    for section, values in _env_overrides(environ).items():
        config = _apply(config, section, values, "the environment", from_text=True)
    for section, values in (overrides or {}).items():
        config = _apply(config, section, values, "the command line", from_text=True)
    validate(config)
    return config


def flags() -> Iterator[tuple[str, str, Setting]]:
    """Every setting with a CLI flag (``row.flag``) as ``(section, key, row)``, in order."""
    for section, cls in section_classes():
        if section not in TABLES or section == "camera":
            yield from ((section, key, row) for key, row in settings(cls) if row.flag)


def _tls_context(section: str, ca_file: str, cert_file: str = "",
                 key_file: str = "") -> ssl.SSLContext:
    """:func:`tls.client_context`, with a one-line :class:`ConfigError` naming the setting (the
    CA file first: it is what a failed load most often is)."""
    for key, value in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
        if value:
            try:
                with open(value, "rb"):
                    pass
            except OSError as exc:
                raise ConfigError(f"{section}.{key} = {value!r} cannot be read: "
                                  f"{tls.describe_error(exc)}") from None
    try:
        ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{section}.ca_file = {ca_file!r} is not a PEM CA bundle: "
                          f"{tls.describe_error(exc)}") from None
    try:
        return tls.client_context(ca_file, cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{section}.cert_file = {cert_file!r} / key_file = {key_file!r} "
                          f"cannot be used as a client certificate: "
                          f"{tls.describe_error(exc)}") from None


# ---------------------------------------------------------------------------------------------
# ``ruseon config``


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, HostPort):
        return f'"{value}"'
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "{ " + ", ".join(_lines(value, False)) + " }"
    return repr(value)


def _lines(section: Any, hide_secrets: bool) -> list[str]:
    lines = []
    for name, row in settings(type(section)):
        value = getattr(section, name)
        if hide_secrets and row.secret and isinstance(value, str) and value:
            value = HIDDEN if row.secret is True else _hide_url_password(value)
        lines.append(f"{name} = {row.render(value) if row.render else _render(value)}")
    return lines


def to_toml(config: Config, *, hide_secrets: bool = False) -> str:
    """Render the effective configuration as TOML (for ``ruseon config``); ``hide_secrets``
    replaces every secret that is set (``secret=True``) and the password in a URL
    (``secret="url"``)."""
    # One camera as the [camera] section it is usually written as; several as tables.
    out = [("[camera]" if len(config.cameras) == 1 else "[[camera]]", cam)
           for cam in config.cameras]
    out += [(f"[{name}]", getattr(config, name)) for name, _ in section_classes()
            if name not in TABLES]
    out += [(f"[[{name}]]", table) for name in ("relay", "webhook")
            for table in getattr(config, name)]
    return "\n".join(line for header, section in out
                     for line in (header, *_lines(section, hide_secrets), ""))
