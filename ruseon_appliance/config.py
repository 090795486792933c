"""The appliance's one typed configuration.

Precedence, lowest first: built-in defaults, the TOML file (default ``/etc/ruseon/ruseon.toml``),
``RUSEON_<SECTION>_<KEY>`` environment variables, then CLI flags. Every value is validated once,
here; a bad value raises :class:`ConfigError` whose message is one line naming the key, the value
and what is allowed.
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruseon_appliance import tls

DEFAULT_CONFIG_PATH = Path("/etc/ruseon/ruseon.toml")

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
# camera.ring_bytes = 0: the arena holds this many seconds of the configured bitrate (the GOP
# catch-up needs up to 2.5 s, a recording's pre-roll 5 s plus a GOP), within these bounds.
RING_SECONDS = 16
RING_AUTO_MIN_BYTES = 2 * 1024 * 1024
RING_AUTO_MAX_BYTES = 8 * 1024 * 1024
# SRTP protection profiles webrtc.srtp_profiles may name (OpenSSL's names), in aiortc's order.
SRTP_PROFILE_NAMES = ("SRTP_AEAD_AES_256_GCM", "SRTP_AEAD_AES_128_GCM", "SRTP_AES128_CM_SHA1_80")
# List keys that also take one string ("auto") from a file.
STRING_OR_LIST_KEYS = frozenset({"webrtc.srtp_profiles"})
# A camera grid's tiles (the page, a Home Assistant dashboard, an NVR): the default share of
# webrtc.max_viewers one client address may hold is at least this, where max_viewers allows.
GRID_PLACES = 16
AWB_MODES = ("auto", "incandescent", "tungsten", "fluorescent", "indoor", "daylight", "cloudy",
             "custom")


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

    # URL-safe and unique: /whep/<name>, /snapshot/<name>.jpg, /hls/<name>/, metrics labels.
    name: str = DEFAULT_CAMERA_NAME
    # auto | synthetic | picamera[:N] | rpicam[:N] | file:PATH | rtsp://... (N: sensor index)
    source: str = "auto"
    width: int = 1280
    height: int = 720
    framerate: int = 30
    bitrate: int = 2_000_000
    # Frames between forced IDRs (the GOP length).
    keyframe_interval: int = 60
    profile: str = "baseline"
    # Shortest time between two keyframes forced on viewers' request (coalescing window).
    keyframe_request_interval_ms: int = 500
    hflip: bool = False
    vflip: bool = False
    # Manual exposure in µs and analogue gain; 0 means automatic.
    exposure_us: int = 0
    gain: float = 0.0
    # Auto white balance mode name as picamera2 knows it (auto, daylight, cloudy, ...).
    awb: str = "auto"
    # Ring buffer arena (0: sized from the bitrate, see ring_arena_bytes) and slot table.
    ring_bytes: int = 0
    ring_slots: int = 1024
    # Largest access unit the muxer can assemble.
    max_frame_bytes: int = 1024 * 1024
    # rpicam-vid executable (for source = rpicam).
    rpicam_command: str = "rpicam-vid"
    # Motion detection (ruseon_appliance/motion/), on by default: sensitivity 0 to 100; motion
    # must last min_duration_s to start an event, which ends off_delay_s after the last motion;
    # the next starts min_gap_s after it at the soonest. Zones are polygons "x,y x,y x,y ..."
    # in picture coordinates from 0 to 1 (y down): include (look only there), exclude (masks).
    motion: bool = True
    motion_sensitivity: int = 50
    motion_min_duration_s: float = 0.3
    motion_off_delay_s: float = 10.0
    motion_min_gap_s: float = 5.0
    motion_include: tuple[str, ...] = ()
    motion_exclude: tuple[str, ...] = ()
    # The sub-stream (SubstreamConfig); an rtsp:// camera's comes from substream_url (a second
    # URL of the same camera, e.g. its 640x360 profile; may carry a password, like source).
    substream: SubstreamConfig = SubstreamConfig()
    substream_url: str = ""

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


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """``[http]``: the device page, WHEP and the API."""

    listen: HostPort = HostPort("0.0.0.0", 8080)
    # "self-signed": HTTPS with a certificate made once and kept in state.dir
    # (web/https_certificate.py); "" (default): plain HTTP, or HTTPS with tls_cert and tls_key.
    tls: str = ""
    # Optional HTTPS: both paths set means TLS.
    tls_cert: str = ""
    tls_key: str = ""
    # Extra origins allowed by CORS besides the device page's own.
    cors_origins: tuple[str, ...] = ()
    # Host names the board answers to besides its IP addresses, localhost, its hostname and
    # <hostname>.local (DNS rebinding defence): a reverse proxy's name, a DNS name of the board.
    hosts: tuple[str, ...] = ()
    max_offer_bytes: int = 64 * 1024
    # The camera the unnamed routes serve (/whep, /snapshot.jpg, /hls/, /api/camera/controls,
    # rtsp://…/stream, a relay without camera): a camera's name; empty = the first listed.
    default_camera: str = ""
    # Reverse proxies (addresses or CIDR networks) whose Forwarded / X-Forwarded-For name the
    # client; requests from anywhere else count against their own address.
    trusted_proxies: tuple[str, ...] = ()

    @property
    def https(self) -> bool:
        """Whether the device page, WHEP and the API are served over TLS."""
        return self.tls == "self-signed" or bool(self.tls_cert)

    def trusted_proxy_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """:attr:`trusted_proxies` as networks (a bare address is a /32 or /128)."""
        return tuple(ipaddress.ip_network(entry) for entry in self.trusted_proxies)


@dataclass(frozen=True, slots=True)
class WebRtcConfig:
    """``[webrtc]``: the single UDP port and what the answers advertise."""

    listen: HostPort = HostPort("0.0.0.0", 8189)
    # Addresses put in answers as host candidates; empty means the board's own interface addresses.
    advertise: tuple[str, ...] = ()
    # STUN/TURN URLs; none by default, so nothing is contacted unless configured.
    ice_servers: tuple[str, ...] = ()
    max_viewers: int = 50
    # Places one client address (an IPv6 /64) may hold, connected and pending together;
    # 0: the default rule (places_per_address).
    max_viewers_per_address: int = 0
    # Seconds a session may stay pending (answered, not connected) before it is reaped; a
    # browser on a LAN connects in well under one.
    connect_timeout_s: float = 10.0
    # Deprecated (0: not set): it capped pending sessions per address, refusing a camera grid's
    # burst. A value above the default share widens the share (a reverse proxy's advice was to
    # raise it); a smaller one is ignored. The engine warns at start.
    pending_per_address: int = 0
    # fanout: packetize once, send per viewer; aiortc: stock RTCRtpSender (comparison/fallback).
    send_path: str = "fanout"
    # SRTP profiles offered in the DTLS handshake, most preferred first; "auto": AES-GCM first
    # (aiortc's order) on CPUs with AES instructions, only AES128_CM_SHA1_80 without (Pi 4).
    srtp_profiles: tuple[str, ...] = ("auto",)

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


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """``[auth]``: who may view and who may administer (ruseon_appliance/access/).

    Admin always needs a credential: ``token`` (or ``token_file``) when set, otherwise the
    per-device secret generated on first start in ``<state.dir>/admin-secret``. Viewing is open
    on the LAN unless ``viewing = "credential"``; then it takes ``viewer_token`` (shareable,
    view only) or the admin secret.
    """

    token: str = ""
    token_file: str = ""
    # "open": anyone on the LAN may watch; "credential": viewing needs the viewer token or admin.
    viewing: str = "open"
    viewer_token: str = ""
    viewer_token_file: str = ""

    def resolve_token(self) -> str:
        """Return the configured admin token, reading ``token_file`` if set (stripped); "" when
        neither is set (the generated secret is used then: access/credentials.py)."""
        return _read_secret("auth.token_file", self.token, self.token_file)

    def resolve_viewer_token(self) -> str:
        """The viewer token, reading ``viewer_token_file`` if set; "" when none."""
        return _read_secret("auth.viewer_token_file", self.viewer_token, self.viewer_token_file)


def _read_secret(key: str, value: str, path: str) -> str:
    if value:
        return value
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"{key} = {path!r} cannot be read: {exc.strerror}") from exc
    return ""


@dataclass(frozen=True, slots=True)
class StateConfig:
    """``[state]``: where the certificate and other persistent state live."""

    dir: str = "/var/lib/ruseon"


@dataclass(frozen=True, slots=True)
class HlsConfig:
    """``[hls]``: HLS and Low-Latency HLS under ``/hls/`` (the page's fallback, Safari, caches)."""

    enable: bool = True
    # PART-TARGET: every partial segment is at most this long (LL-HLS wants ~0.2-0.33 s).
    part_duration_s: float = 0.25
    # Seconds of complete segments kept in memory (never fewer than three target durations).
    window_s: float = 12.0
    # Blocking playlist reloads and hinted part requests held at once; more get 503.
    max_waiting_requests: int = 1000


@dataclass(frozen=True, slots=True)
class RtspConfig:
    """``[rtsp]``: an RTSP server (RFC 2326) for NVRs and players: ``rtsp://HOST:8554/<camera>``."""

    enable: bool = False
    listen: HostPort = HostPort("0.0.0.0", 8554)
    # RTSP connections at once (each playing one camera); more are answered 503.
    max_clients: int = 20


@dataclass(frozen=True, slots=True)
class LogConfig:
    """``[log]``: verbosity."""

    level: str = "info"


RELAY_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
# AES_CM_128_HMAC_SHA1_80: a 16-byte master key and a 14-byte master salt, base64 as Janus's
# srtpcrypto (and SDES's inline:) spell them.
SRTP_MASTER_LENGTH = 30


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """One ``[[relay]]`` table: the camera's RTP to a media server (e.g. a Janus mountpoint)."""

    name: str = "default"
    # rtp://HOST:PORT, the server's RTP port (HOST an IP literal or a name resolved at start).
    url: str = ""
    # Base64 of 30 bytes (key + salt) for SRTP AES_CM_128_HMAC_SHA1_80; empty = plain RTP.
    srtp_key: str = ""
    # The server's RTCP port (sender reports go there; its PLI/FIR come back); 0 = none.
    rtcp_port: int = 0
    # Local address of the relay's UDP socket; port 0 = any free port.
    bind: HostPort = HostPort("0.0.0.0", 0)
    payload_type: int = 96
    # Which camera's stream (a [[camera]] name); empty = the default camera (http.default_camera).
    camera: str = ""

    @property
    def target(self) -> HostPort:
        """``HOST:PORT`` of :attr:`url` (validated by :func:`validate`)."""
        return parse_host_port(f"relay {self.name}: url", self.url.removeprefix("rtp://"))

    def srtp_master(self) -> bytes | None:
        """The decoded SRTP master key + salt, or None for plain RTP."""
        return base64.b64decode(self.srtp_key, validate=True) if self.srtp_key else None


MQTT_SCHEMES = ("mqtt", "mqtts")
# What a [[webhook]] may subscribe to (the event bus's names, ruseon_appliance/events).
WEBHOOK_EVENTS = ("viewer_joined", "viewer_left", "camera_stalled", "camera_recovered",
                  "recording_started", "recording_stopped", "controls_changed",
                  "motion_started", "motion_ended")


@dataclass(frozen=True, slots=True)
class MqttConfig:
    """``[mqtt]``: Home Assistant discovery and state over MQTT; off while ``url`` is empty."""

    # mqtt://HOST[:PORT] (1883) or mqtts://HOST[:PORT] (8883, TLS with the system's CAs).
    url: str = ""
    # mqtts:// only: trust the CA(s) in this PEM file instead of the system's (a broker with a
    # certificate from its own CA, e.g. Home Assistant's Mosquitto add-on). Verification and the
    # host-name check always stay on: the URL's host must be in the broker's certificate.
    ca_file: str = ""
    # mqtts:// only: a client certificate (PEM) and its key, for brokers that require one
    # (mosquitto's require_certificate). key_file may stay empty when cert_file holds the key.
    cert_file: str = ""
    key_file: str = ""
    username: str = ""
    password: str = ""
    # Or read the password from this file (keep it 0600).
    password_file: str = ""
    # State, availability and commands live under <topic_prefix>/<device id>/...
    topic_prefix: str = "ruseon"
    discovery_prefix: str = "homeassistant"
    # Empty: a random id kept in the state dir, so Home Assistant's unique_ids survive restarts.
    device_id: str = ""
    # Shortest time between two state messages (throttle), and the snapshot image's period.
    state_interval_s: float = 5.0
    snapshot_interval_s: float = 30.0
    # Any client the broker lets publish under <topic_prefix>/ can press the buttons and set
    # camera controls; false = state only (no buttons, no control entities, nothing subscribed
    # but Home Assistant's status). Otherwise restrict those topics with the broker's ACL.
    commands: bool = True

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
        if self.password or not self.password_file:
            return self.password
        try:
            return Path(self.password_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"mqtt.password_file = {self.password_file!r} cannot be read: {exc.strerror}"
            ) from exc


@dataclass(frozen=True, slots=True)
class OnvifConfig:
    """``[onvif]``: an ONVIF Profile S device (SOAP on the HTTP port, WS-Discovery on UDP 3702)
    that NVRs and Home Assistant find and adopt; off by default."""

    enable: bool = False
    # The ONVIF account; an empty password means the admin secret.
    username: str = "admin"
    password: str = ""
    # Or read the password from this file (keep it 0600).
    password_file: str = ""
    # Answer WS-Discovery probes (and announce Hello/Bye) on the HTTP listen address.
    discovery: bool = True

    def resolve_password(self) -> str:
        """The configured password, reading ``password_file`` if set (stripped)."""
        if self.password or not self.password_file:
            return self.password
        try:
            return Path(self.password_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"onvif.password_file = {self.password_file!r} cannot be read: {exc.strerror}"
            ) from exc


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """One ``[[webhook]]`` table: JSON POSTs of appliance events to a URL."""

    url: str = ""
    # https:// only: trust the CA(s) in this PEM file instead of the system's (a receiver with a
    # certificate from a home CA). Verification and the host-name check always stay on.
    ca_file: str = ""
    # Event names to send; empty = all of WEBHOOK_EVENTS.
    events: tuple[str, ...] = ()
    # HMAC-SHA256 key; when set every POST carries X-Ruseon-Timestamp and X-Ruseon-Signature:
    # sha256=<hex HMAC of "<timestamp>.<body>"> (see docs/home-assistant.md).
    secret: str = ""
    timeout_s: float = 5.0
    # Attempts after the first one, with doubling back-off from retry_delay_s.
    retries: int = 3
    retry_delay_s: float = 1.0
    # Events waiting to be sent; when full the oldest is dropped (and counted).
    queue_size: int = 100

    def tls_context(self) -> ssl.SSLContext | None:
        """A context trusting :attr:`ca_file` for an https:// URL, or None (aiohttp's default:
        the system's CAs)."""
        return _tls_context("webhook", self.ca_file) if self.ca_file else None


@dataclass(frozen=True, slots=True)
class RecordingConfig:
    """``[recording]``: the fMP4 archive on the board and its playback API."""

    # Record from start-up on (otherwise only between POST /api/recording/start and stop).
    continuous: bool = False
    # Where segments go; empty means <state.dir>/recordings.
    dir: str = ""
    # Segment length in seconds (a segment is cut at the first IDR after it).
    segment_s: float = 60.0
    # Seconds of the ring's past an on-demand recording begins with (bounded by the ring).
    preroll_s: float = 5.0
    # The open segment's whole fragments are made durable (fdatasync) this often, so a power cut
    # loses about this much; 0: only when a segment closes (up to segment_s lost).
    sync_interval_s: float = 5.0
    # "continuous" (from start-up on), "motion" (each camera records from preroll_s before
    # its motion events to postroll_s after them; overlapping events make one recording),
    # "off" (only on request); empty: as `continuous` says.
    mode: str = ""
    postroll_s: float = 5.0
    # Retention: oldest segments are deleted once the archive exceeds either limit (0: none).
    max_bytes: int = 2 * 1024 * 1024 * 1024
    max_age_hours: float = 168.0
    # Clip downloads (/recordings/get) at once, in total and from one client address; beyond
    # them 503 with Retry-After.
    max_downloads: int = 4
    max_downloads_per_address: int = 2
    # The clock counts as synchronized while this file exists; empty: the kernel's NTP state
    # (adjtimex) or systemd-timesyncd's /run/systemd/timesync/synchronized.
    clock_sync_file: str = ""

    def directory(self, state_dir: str) -> Path:
        """The archive directory, resolved against the state directory."""
        return Path(self.dir) if self.dir else Path(state_dir) / "recordings"

    @property
    def records_continuously(self) -> bool:
        """``mode = "continuous"``, or no mode and ``continuous = true``."""
        return self.mode == "continuous" if self.mode else self.continuous


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


# ---------------------------------------------------------------------------------------------
# Loading


def _type_name(tp: Any) -> str:
    if tp is HostPort:
        return "HOST:PORT"
    if typing.get_origin(tp) is tuple:
        return "list of strings"
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, tp: Any, value: Any, from_text: bool) -> Any:
    """Turn ``value`` (TOML-typed, or text from env/CLI when ``from_text``) into ``tp``."""
    bad = ConfigError(f"{key} = {value!r} is not valid: expected {_type_name(tp)}")
    if tp is SubstreamConfig:
        return parse_substream(key, value, from_text)
    if tp is HostPort:
        if isinstance(value, HostPort):
            return value
        if not isinstance(value, str):
            raise bad
        return parse_host_port(key, value)
    if typing.get_origin(tp) is tuple:
        if key in STRING_OR_LIST_KEYS and isinstance(value, str) and "," not in value:
            value = [value.strip()]
        if from_text and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise bad
        return tuple(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if from_text and isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if from_text and isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise bad
    if tp is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if from_text and isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                raise bad from None
        raise bad
    if tp is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int | float):
            return float(value)
        if from_text and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad
    raise bad  # pragma: no cover - every field type is handled above


def _section_types(section_cls: type) -> dict[str, Any]:
    return typing.get_type_hints(section_cls)


def _relay(index: int, values: Any, origin: str, from_text: bool) -> RelayConfig:
    """One ``[[relay]]`` table (or a ``--relay`` flag's ``{"url": ...}``)."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"relay in {origin} must be [[relay]] tables, got {values!r}")
    hints = _section_types(RelayConfig)
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(
                f"relay.{key} in {origin} is not a known key: [[relay]] allows {', '.join(hints)}"
            )
        changes[key] = _coerce(f"relay[{index}].{key}", hints[key], value, from_text)
    return RelayConfig(**changes)


def _apply_relays(config: Config, values: Any, origin: str, from_text: bool) -> Config:
    """``[[relay]]`` tables from a file (replacing any before), or the command line's
    ``{"url": ...}``: one relay named ``default``, added to the file's (or replacing its own
    ``default``)."""
    if isinstance(values, Mapping):
        added = _relay(len(config.relay), values, origin, from_text)
        kept = tuple(r for r in config.relay if r.name != added.name)
        return dataclasses.replace(config, relay=(*kept, added))
    if not isinstance(values, list | tuple):
        raise ConfigError(f"relay in {origin} must be [[relay]] tables, got {values!r}")
    relays = tuple(_relay(i, table, origin, from_text) for i, table in enumerate(values))
    return dataclasses.replace(config, relay=relays)


def _apply_webhooks(config: Config, values: Any, origin: str, from_text: bool) -> Config:
    """``[[webhook]]`` tables (a file's replace any before)."""
    if isinstance(values, Mapping):
        values = [values]
    if not isinstance(values, list | tuple) or not all(isinstance(v, Mapping) for v in values):
        raise ConfigError(f"webhook in {origin} must be [[webhook]] tables, got {values!r}")
    hints = _section_types(WebhookConfig)
    hooks: list[WebhookConfig] = []
    for index, table in enumerate(values):
        changes: dict[str, Any] = {}
        for key, value in table.items():
            if key not in hints:
                raise ConfigError(f"webhook.{key} in {origin} is not a known key: [[webhook]] "
                                  f"allows {', '.join(hints)}")
            changes[key] = _coerce(f"webhook[{index}].{key}", hints[key], value, from_text)
        hooks.append(WebhookConfig(**changes))
    return dataclasses.replace(config, webhook=tuple(hooks))


def _camera(index: int, values: Any, origin: str, from_text: bool) -> CameraConfig:
    """One ``[[camera]]`` table."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"camera in {origin} must be a [camera] table or [[camera]] tables, "
                          f"got {values!r}")
    hints = _section_types(CameraConfig)
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"camera.{key} in {origin} is not a known key: [[camera]] allows "
                              f"{', '.join(hints)}")
        changes[key] = _coerce(f"camera[{index}].{key}", hints[key], value, from_text)
    if "name" not in changes:
        raise ConfigError(f"camera[{index}] in {origin} has no name: every [[camera]] table "
                          "needs name = \"...\" (letters, digits, - or _)")
    return CameraConfig(**changes)


def _apply_cameras(config: Config, values: Any, origin: str, from_text: bool) -> Config:
    """``[[camera]]`` tables from a file: the camera list (the first is the default camera)."""
    if not isinstance(values, list | tuple) or not values:
        raise ConfigError(f"camera in {origin} must be a [camera] table or [[camera]] tables, "
                          f"got {values!r}")
    cameras = tuple(_camera(i, table, origin, from_text) for i, table in enumerate(values))
    return dataclasses.replace(config, cameras=cameras)


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


def _apply(
    config: Config, section: str, values: Mapping[str, Any], origin: str, from_text: bool
) -> Config:
    if section == "camera":
        return _apply_to_every_camera(config, values, origin, from_text)
    if section == "cameras" and origin == "the command line":
        return _apply_camera_flags(config, values.get("flags", ()), origin)
    if section == "relay":
        return _apply_relays(config, values, origin, from_text)
    if section == "webhook":
        return _apply_webhooks(config, values, origin, from_text)
    section_field = {f.name: f for f in dataclasses.fields(Config)}.get(section)
    if section_field is None or section == "cameras":
        known = ", ".join(SECTIONS)
        raise ConfigError(f"[{section}] in {origin} is not a known section: allowed are {known}")
    current = getattr(config, section)
    hints = _section_types(type(current))
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in hints:
            known = ", ".join(hints)
            raise ConfigError(
                f"{section}.{key} in {origin} is not a known key: [{section}] allows {known}"
            )
        changes[key] = _coerce(f"{section}.{key}", hints[key], value, from_text)
    return dataclasses.replace(config, **{section: dataclasses.replace(current, **changes)})


def _apply_to_every_camera(
    config: Config, values: Mapping[str, Any], origin: str, from_text: bool
) -> Config:
    """``[camera]`` from a file, or ``camera.*`` from the environment or a flag: it applies to
    every camera; a name or source only when there is one (with several, that is what
    ``--camera`` and ``[[camera]]`` tables are for)."""
    hints = _section_types(CameraConfig)
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"camera.{key} in {origin} is not a known key: [camera] allows "
                              f"{', '.join(hints)}")
        if key in ("name", "source") and len(config.cameras) > 1:
            raise ConfigError(f"camera.{key} in {origin} cannot apply to "
                              f"{len(config.cameras)} cameras: use --camera NAME=SOURCE")
        changes[key] = _coerce(f"camera.{key}", hints[key], value, from_text)
    cameras = tuple(dataclasses.replace(cam, **changes) for cam in config.cameras)
    return dataclasses.replace(config, cameras=cameras)


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
) -> Config:
    """Build the effective configuration.

    ``path`` defaults to ``$RUSEON_CONFIG`` or :data:`DEFAULT_CONFIG_PATH`; a missing default file
    is fine (defaults apply) unless ``required``. ``overrides`` are CLI values already typed or as
    text, ``{section: {key: value}}``.
    """
    environ = os.environ if env is None else env
    config = Config()
    if path is None and environ.get("RUSEON_CONFIG"):
        path, required = Path(environ["RUSEON_CONFIG"]), True
    if path is None:
        path = DEFAULT_CONFIG_PATH
    if path.exists() or required:
        data = load_toml(path)
        for section, values in data.items():
            if section == "relay":
                config = _apply_relays(config, values, str(path), from_text=False)
                continue
            if section == "webhook":
                config = _apply_webhooks(config, values, str(path), from_text=False)
                continue
            if section == "camera" and isinstance(values, list):
                config = _apply_cameras(config, values, str(path), from_text=False)
                continue
            if not isinstance(values, dict):
                raise ConfigError(f"{section} in {path} must be a [section] table, got {values!r}")
            config = _apply(config, section, values, str(path), from_text=False)
    for section, values in _env_overrides(environ).items():
        config = _apply(config, section, values, "the environment", from_text=True)
    for section, values in (overrides or {}).items():
        config = _apply(config, section, values, "the command line", from_text=True)
    validate(config)
    return config


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {value!r} is not valid: {allowed}")


def _validate_srtp_profiles(profiles: tuple[str, ...]) -> None:
    allowed = f'"auto" or a list of {", ".join(SRTP_PROFILE_NAMES)} (no repeats)'
    if profiles == ("auto",):
        return
    _check(bool(profiles) and all(p in SRTP_PROFILE_NAMES for p in profiles)
           and len(set(profiles)) == len(profiles),
           "webrtc.srtp_profiles", list(profiles), allowed)


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


def validate(config: Config) -> None:
    """Range checks that types alone do not express."""
    validate_cameras(config.cameras)
    _check(
        bool(config.http.tls_cert) == bool(config.http.tls_key),
        "http.tls_cert",
        config.http.tls_cert,
        "set together with http.tls_key (both or neither)",
    )
    _check(config.http.tls in ("", "self-signed"), "http.tls", config.http.tls,
           '"self-signed" (a certificate made once and kept in state.dir) or "" (plain HTTP, '
           "or HTTPS with http.tls_cert and http.tls_key)")
    _check(not (config.http.tls and config.http.tls_cert), "http.tls", config.http.tls,
           "not together with http.tls_cert/tls_key: use one or the other")
    for entry in config.http.trusted_proxies:
        try:
            ipaddress.ip_network(entry)
        except ValueError as exc:
            raise ConfigError(f"http.trusted_proxies = {entry!r} is not valid: an IPv4 or IPv6 "
                              f"address or CIDR network, e.g. 192.0.2.10 or 10.0.0.0/8 ({exc})"
                              ) from None
    _check(config.auth.viewing in ("open", "credential"), "auth.viewing", config.auth.viewing,
           '"open" (anyone on the LAN may watch) or "credential" (viewer token or admin)')
    for name in config.http.hosts:
        _check(bool(name.strip()) and "/" not in name and " " not in name.strip(),
               "http.hosts", name, "host names (no scheme, path or spaces)")
    _check(
        config.http.max_offer_bytes >= 1024,
        "http.max_offer_bytes",
        config.http.max_offer_bytes,
        "at least 1024",
    )
    for addr in config.webrtc.advertise:
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            raise ConfigError(
                f"webrtc.advertise = {addr!r} is not valid: an IPv4 or IPv6 address"
            ) from None
    for url in config.webrtc.ice_servers:
        _check(
            url.split(":", 1)[0] in ("stun", "stuns", "turn", "turns"),
            "webrtc.ice_servers",
            url,
            "stun:, stuns:, turn: or turns: URLs",
        )
    _check(
        1 <= config.webrtc.max_viewers <= 10_000,
        "webrtc.max_viewers",
        config.webrtc.max_viewers,
        "1 to 10000",
    )
    _check(
        config.webrtc.connect_timeout_s > 0,
        "webrtc.connect_timeout_s",
        config.webrtc.connect_timeout_s,
        "more than 0 seconds",
    )
    _check(
        0 <= config.webrtc.max_viewers_per_address <= config.webrtc.max_viewers,
        "webrtc.max_viewers_per_address",
        config.webrtc.max_viewers_per_address,
        f"0 (half of webrtc.max_viewers, at least {GRID_PLACES} while one place stays for "
        f"others) or 1 to webrtc.max_viewers ({config.webrtc.max_viewers})",
    )
    _check(
        0 <= config.webrtc.pending_per_address <= 10_000,
        "webrtc.pending_per_address",
        config.webrtc.pending_per_address,
        "0 to 10000 (deprecated: set webrtc.max_viewers_per_address instead)",
    )
    _check(
        config.webrtc.send_path in ("fanout", "aiortc"),
        "webrtc.send_path",
        config.webrtc.send_path,
        "allowed are fanout, aiortc",
    )
    _validate_srtp_profiles(config.webrtc.srtp_profiles)
    _check(
        config.log.level.lower() in ("debug", "info", "warning", "error"),
        "log.level",
        config.log.level,
        "allowed are debug, info, warning, error",
    )
    _check(bool(config.state.dir), "state.dir", config.state.dir, "a directory path")
    hls = config.hls
    _check(0.1 <= hls.part_duration_s <= 2.0, "hls.part_duration_s", hls.part_duration_s,
           "0.1 to 2.0 seconds (LL-HLS parts are usually 0.2-0.33 s)")
    _check(4.0 <= hls.window_s <= 120.0, "hls.window_s", hls.window_s, "4 to 120 seconds")
    _check(1 <= hls.max_waiting_requests <= 100_000, "hls.max_waiting_requests",
           hls.max_waiting_requests, "1 to 100000")
    _check(1 <= config.rtsp.max_clients <= 10_000, "rtsp.max_clients", config.rtsp.max_clients,
           "1 to 10000")
    rec = config.recording
    _check(2 <= rec.segment_s <= 3600, "recording.segment_s", rec.segment_s, "2 to 3600 seconds")
    _check(0 <= rec.preroll_s <= 60, "recording.preroll_s", rec.preroll_s, "0 to 60 seconds")
    _check(rec.sync_interval_s == 0 or 1 <= rec.sync_interval_s <= 600,
           "recording.sync_interval_s", rec.sync_interval_s, "0 (off) or 1 to 600 seconds")
    _check(rec.mode in ("", "continuous", "motion", "off"), "recording.mode", rec.mode,
           "allowed are continuous, motion, off")
    _check(0 <= rec.postroll_s <= 600, "recording.postroll_s", rec.postroll_s,
           "0 to 600 seconds")
    _check(rec.max_bytes == 0 or rec.max_bytes >= 1024 * 1024, "recording.max_bytes",
           rec.max_bytes, "0 (no limit) or at least 1048576 bytes")
    _check(rec.max_age_hours >= 0, "recording.max_age_hours", rec.max_age_hours,
           "0 (no limit) or more hours")
    _check(1 <= rec.max_downloads <= 1000, "recording.max_downloads", rec.max_downloads,
           "1 to 1000")
    _check(1 <= rec.max_downloads_per_address <= rec.max_downloads,
           "recording.max_downloads_per_address", rec.max_downloads_per_address,
           "1 to recording.max_downloads")
    validate_relays(config.relay)
    names = [cam.name for cam in config.cameras]
    for relay in config.relay:
        _check(not relay.camera or relay.camera in names, f"relay {relay.name!r}: camera",
               relay.camera, "the name of a camera: " + ", ".join(names))
    _check(not config.http.default_camera or config.http.default_camera in names,
           "http.default_camera", config.http.default_camera,
           "the name of a camera: " + ", ".join(names))
    validate_mqtt(config.mqtt)
    validate_webhooks(config.webhook)


def validate_camera(cam: CameraConfig, key: str = "camera") -> None:
    """One camera's values; ``key`` names it in messages (``camera`` or ``camera 'back'``)."""
    source = cam.source
    kind, _, index = source.partition(":")
    _check(
        source in SOURCE_KINDS
        or (kind in INDEXED_SOURCE_KINDS and index.isdigit() and int(index) <= 15)
        or (source.startswith("file:") and len(source) > 5)
        or (source.startswith(NETWORK_SOURCE_SCHEMES) and _network_host(source) != ""),
        f"{key}.source",
        source,
        "allowed are auto, synthetic, picamera, rpicam, file:PATH, picamera:N, rpicam:N "
        "(N: the sensor index), rtsp://HOST[:PORT]/PATH",
    )
    _check(
        16 <= cam.width <= 4096 and cam.width % 2 == 0,
        f"{key}.width",
        cam.width,
        "an even number from 16 to 4096",
    )
    _check(
        16 <= cam.height <= 4096 and cam.height % 2 == 0,
        f"{key}.height",
        cam.height,
        "an even number from 16 to 4096",
    )
    _check(1 <= cam.framerate <= 120, f"{key}.framerate", cam.framerate, "1 to 120")
    _check(
        50_000 <= cam.bitrate <= 50_000_000,
        f"{key}.bitrate",
        cam.bitrate,
        "50000 to 50000000 bits/s",
    )
    _check(
        1 <= cam.keyframe_interval <= 600,
        f"{key}.keyframe_interval",
        cam.keyframe_interval,
        "1 to 600 frames",
    )
    _check(
        cam.profile in PROFILES, f"{key}.profile", cam.profile, "allowed are " + ", ".join(PROFILES)
    )
    _check(
        0 <= cam.keyframe_request_interval_ms <= 60_000,
        f"{key}.keyframe_request_interval_ms",
        cam.keyframe_request_interval_ms,
        "0 to 60000 ms",
    )
    _check(cam.exposure_us >= 0, f"{key}.exposure_us", cam.exposure_us, "0 (auto) or more µs")
    _check(cam.gain >= 0, f"{key}.gain", cam.gain, "0 (auto) or more")
    _check(cam.awb in AWB_MODES, f"{key}.awb", cam.awb, "allowed are " + ", ".join(AWB_MODES))
    _check(
        cam.ring_bytes == 0 or 64 * 1024 <= cam.ring_bytes <= 512 * 1024 * 1024,
        f"{key}.ring_bytes",
        cam.ring_bytes,
        "0 (sized from the bitrate) or 64 KiB to 512 MiB",
    )
    _check(16 <= cam.ring_slots <= 65536, f"{key}.ring_slots", cam.ring_slots, "16 to 65536")
    _check(
        16 * 1024 <= cam.max_frame_bytes <= cam.ring_arena_bytes,
        f"{key}.max_frame_bytes",
        cam.max_frame_bytes,
        f"16 KiB up to the ring arena ({cam.ring_arena_bytes} bytes, camera.ring_bytes)",
    )
    validate_motion(cam, key)
    validate_substream(cam, key)


# Sources that cannot encode a second stream: rpicam-vid runs one encoder, a file has one.
SUBSTREAM_REFUSED = {"rpicam": "rpicam-vid runs one encoder", "file": "a file holds one stream"}


def validate_substream(cam: CameraConfig, key: str = "camera") -> None:
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


def validate_motion(cam: CameraConfig, key: str = "camera") -> None:
    """One camera's ``motion_*`` values (zones parsed as the detector will)."""
    from .motion.zones import parse_polygon

    _check(0 <= cam.motion_sensitivity <= 100, f"{key}.motion_sensitivity",
           cam.motion_sensitivity, "0 to 100")
    _check(0 <= cam.motion_min_duration_s <= 60, f"{key}.motion_min_duration_s",
           cam.motion_min_duration_s, "0 to 60 seconds")
    _check(0 <= cam.motion_off_delay_s <= 3600, f"{key}.motion_off_delay_s",
           cam.motion_off_delay_s, "0 to 3600 seconds")
    _check(0 <= cam.motion_min_gap_s <= 3600, f"{key}.motion_min_gap_s",
           cam.motion_min_gap_s, "0 to 3600 seconds")
    for name in ("motion_include", "motion_exclude"):
        for text in getattr(cam, name):
            try:
                parse_polygon(text)
            except ValueError as exc:
                raise ConfigError(f"{key}.{name} = {text!r} is not valid: {exc} (a zone is "
                                  "\"x,y x,y x,y ...\", coordinates 0 to 1)") from None


def _network_host(url: str) -> str:
    try:
        return urllib.parse.urlsplit(url).hostname or ""
    except ValueError:
        return ""


def validate_cameras(cameras: tuple[CameraConfig, ...]) -> None:
    """Every camera's values; names URL-safe, unique and not a reserved path segment."""
    seen: set[str] = set()
    for cam in cameras:
        key = "camera" if len(cameras) == 1 else f"camera {cam.name!r}"
        _check(bool(cam.name) and len(cam.name) <= 64 and set(cam.name) <= RELAY_NAME_CHARS
               and cam.name not in RESERVED_CAMERA_NAMES, f"{key}.name", cam.name,
               "1-64 letters, digits, - or _ (and not " + ", ".join(sorted(RESERVED_CAMERA_NAMES))
               + ")")
        _check(cam.name not in seen, f"{key}.name", cam.name, "each camera needs its own name")
        seen.add(cam.name)
        validate_camera(cam, key)


def validate_mqtt(mqtt: MqttConfig) -> None:
    """``[mqtt]``: a mqtt:// or mqtts:// URL with a host (and a valid port), sane intervals."""
    if mqtt.url:
        try:
            mqtt.endpoint()
        except ValueError:
            raise ConfigError(f"mqtt.url = {mqtt.url!r} is not valid: expected mqtt://HOST[:PORT] "
                              "or mqtts://HOST[:PORT]") from None
        # Credentials in the URL were ignored (the appliance connected without them); and a
        # URL is what logs, `ps` and status show. They go in username/password(_file).
        _check("@" not in mqtt.url, "mqtt.url", "(credentials hidden)",
               "mqtt://HOST[:PORT] without user:password@ (use mqtt.username and "
               "mqtt.password or mqtt.password_file)")
    tls_keys = [key for key in ("ca_file", "cert_file", "key_file") if getattr(mqtt, key)]
    if tls_keys:
        _check(mqtt.url.startswith("mqtts://"), f"mqtt.{tls_keys[0]}",
               getattr(mqtt, tls_keys[0]), "only with an mqtts:// url")
    _check(not mqtt.key_file or bool(mqtt.cert_file), "mqtt.key_file", mqtt.key_file,
           "needs mqtt.cert_file (the certificate it belongs to)")
    if mqtt.url:
        mqtt.tls_context()  # a CA, certificate or key that cannot be used fails now, not later
    topic_chars = RELAY_NAME_CHARS | frozenset("/")
    for key in ("topic_prefix", "discovery_prefix"):
        value = getattr(mqtt, key)
        _check(bool(value) and set(value) <= topic_chars and not value.startswith("/")
               and not value.endswith("/"), f"mqtt.{key}", value,
               "letters, digits, -, _ and inner /, no MQTT wildcards")
    _check(not mqtt.device_id or set(mqtt.device_id) <= RELAY_NAME_CHARS, "mqtt.device_id",
           mqtt.device_id, "letters, digits, - or _ (empty: generated and kept in the state dir)")
    _check(0.5 <= mqtt.state_interval_s <= 3600, "mqtt.state_interval_s", mqtt.state_interval_s,
           "0.5 to 3600 seconds")
    _check(1 <= mqtt.snapshot_interval_s <= 86400, "mqtt.snapshot_interval_s",
           mqtt.snapshot_interval_s, "1 to 86400 seconds")


def validate_webhooks(hooks: tuple[WebhookConfig, ...]) -> None:
    """``[[webhook]]``: http(s) URLs, known event names, sane retry and queue bounds."""
    for index, hook in enumerate(hooks):
        key = f"webhook[{index}]"
        scheme, sep, rest = hook.url.partition("://")
        _check(scheme in ("http", "https") and bool(sep) and bool(rest.split("/")[0]),
               f"{key}.url", hook.url, "expected http://HOST[:PORT]/PATH or https://...")
        for event in hook.events:
            _check(event in WEBHOOK_EVENTS, f"{key}.events", event,
                   "allowed are " + ", ".join(WEBHOOK_EVENTS))
        _check(0 < hook.timeout_s <= 300, f"{key}.timeout_s", hook.timeout_s,
               "more than 0, at most 300 seconds")
        _check(0 <= hook.retries <= 20, f"{key}.retries", hook.retries, "0 to 20")
        _check(0 < hook.retry_delay_s <= 600, f"{key}.retry_delay_s", hook.retry_delay_s,
               "more than 0, at most 600 seconds")
        _check(1 <= hook.queue_size <= 10_000, f"{key}.queue_size", hook.queue_size,
               "1 to 10000 events")
        if hook.ca_file:
            _check(scheme == "https", f"{key}.ca_file", hook.ca_file, "only with an https:// url")
            _tls_context(key, hook.ca_file)


def validate_relays(relays: tuple[RelayConfig, ...]) -> None:
    """``[[relay]]``: names unique and URL-safe, ``rtp://HOST:PORT``, a well-formed SRTP key."""
    seen: set[str] = set()
    for relay in relays:
        key = f"relay {relay.name!r}"
        _check(bool(relay.name) and len(relay.name) <= 64 and set(relay.name) <= RELAY_NAME_CHARS,
               f"{key}: name", relay.name, "1-64 letters, digits, - or _")
        _check(relay.name not in seen, f"{key}: name", relay.name, "each relay needs its own name")
        seen.add(relay.name)
        _check(relay.url.startswith("rtp://"), f"{key}: url", relay.url,
               "expected rtp://HOST:PORT, e.g. rtp://192.0.2.10:5004")
        try:
            target = relay.target
        except ConfigError:
            target = HostPort("", 0)
        _check(bool(target.host), f"{key}: url", relay.url,
               "expected rtp://HOST:PORT, e.g. rtp://192.0.2.10:5004")
        _check(1 <= target.port <= 65535, f"{key}: url", relay.url, "a port from 1 to 65535")
        _check(relay.rtcp_port == 0 or (1 <= relay.rtcp_port <= 65535
                                        and relay.rtcp_port != target.port),
               f"{key}: rtcp_port", relay.rtcp_port,
               "0 (none) or a port from 1 to 65535 other than the RTP port")
        _check(96 <= relay.payload_type <= 127, f"{key}: payload_type", relay.payload_type,
               "a dynamic payload type, 96 to 127")
        if relay.srtp_key:
            try:
                master = base64.b64decode(relay.srtp_key, validate=True)
            except (binascii.Error, ValueError):
                master = b""
            _check(len(master) == SRTP_MASTER_LENGTH, f"{key}: srtp_key", "(hidden)",
                   f"base64 of {SRTP_MASTER_LENGTH} bytes (AES_CM_128_HMAC_SHA1_80 key + salt, "
                   "as Janus's srtpcrypto), e.g. from: head -c 30 /dev/urandom | base64")


# Fields ``ruseon config`` hides unless asked (--show-secrets): the API token, the broker's
# password, webhook HMAC keys, relay SRTP keys. URLs keep their user but lose any password.
SECRET_FIELDS = frozenset({"token", "viewer_token", "password", "secret", "srtp_key"})
HIDDEN = "(hidden: ruseon config --show-secrets)"


def _hide_url_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}{slash}{path}"


def to_toml(config: Config, *, hide_secrets: bool = False) -> str:
    """Render the effective configuration as TOML (for ``ruseon config``); ``hide_secrets``
    replaces every secret (:data:`SECRET_FIELDS`, passwords in URLs) that is set."""

    def field_value(owner: Any, name: str) -> str:
        value = getattr(owner, name)
        if hide_secrets and isinstance(value, str) and value:
            if name in SECRET_FIELDS:
                return f'"{HIDDEN}"'
            value = _hide_url_password(value)
        return render(value)

    def render(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, HostPort):
            return f'"{value}"'
        if isinstance(value, SubstreamConfig):
            return value.to_toml()
        if isinstance(value, str):
            return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(value, tuple):
            return "[" + ", ".join(render(v) for v in value) + "]"
        return repr(value)

    lines: list[str] = []
    for section in dataclasses.fields(config):
        if section.name in ("relay", "webhook"):
            continue
        if section.name == "cameras":
            # One camera as the [camera] section it is usually written as; several as tables.
            for camera in config.cameras:
                lines.append("[camera]" if len(config.cameras) == 1 else "[[camera]]")
                for f in dataclasses.fields(camera):
                    lines.append(f"{f.name} = {field_value(camera, f.name)}")
                lines.append("")
            continue
        lines.append(f"[{section.name}]")
        values = getattr(config, section.name)
        for f in dataclasses.fields(values):
            lines.append(f"{f.name} = {field_value(values, f.name)}")
        lines.append("")
    for relay in config.relay:
        lines.append("[[relay]]")
        for f in dataclasses.fields(relay):
            lines.append(f"{f.name} = {field_value(relay, f.name)}")
        lines.append("")
    for hook in config.webhook:
        lines.append("[[webhook]]")
        for f in dataclasses.fields(hook):
            lines.append(f"{f.name} = {field_value(hook, f.name)}")
        lines.append("")
    return "\n".join(lines)
