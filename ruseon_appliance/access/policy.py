"""Every HTTP route and RTSP method, classified in one place: OPEN, VIEW or ADMIN.

*View* is the picture: the device page's video, WHEP, HLS, snapshots, RTSP play, the recordings
list and playback. *Admin* is everything that changes state or reveals what is not the picture:
camera controls, recording start/stop, deleting recordings, relay SDPs (they carry SRTP keys),
metrics, session ids and viewer addresses. *Open* needs nothing, ever: the page's own files, the
health probe and the login itself.

A route that is not in :data:`HTTP_ROUTES` cannot be served: the web app refuses to start
(:func:`unclassified_routes`), so a new route cannot be added without this decision (Home
Assistant's ``requires_auth`` does the same for its views).
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Iterable


class Access(enum.IntEnum):
    """What a request needs; ordered, so ``role >= access`` reads as "may"."""

    OPEN = 0
    VIEW = 1
    ADMIN = 2


class Role(enum.IntEnum):
    """What a request's credential grants (compared with :class:`Access`)."""

    NONE = 0
    VIEWER = 1
    ADMIN = 2


# (methods, path pattern, access). Patterns are fnmatch globs over the route's canonical path as
# aiohttp registered it ("{camera}" placeholders and concrete camera names alike); methods "*"
# matches any (the 405 catch-alls). The first rule that matches wins.
HTTP_ROUTES: tuple[tuple[frozenset[str], str, Access], ...] = tuple(
    (frozenset(methods.split(",")), pattern, access)
    for methods, pattern, access in (
        # The page, its files, the health probe and the login: nothing to protect.
        ("GET,HEAD", "/", Access.OPEN),
        ("GET,HEAD", "/static*", Access.OPEN),
        ("GET,HEAD", "/favicon.ico", Access.OPEN),
        ("GET,HEAD", "/healthz", Access.OPEN),
        ("GET,HEAD,POST,DELETE", "/api/session", Access.OPEN),
        # ONVIF authenticates inside the SOAP envelope: each operation's access is in
        # onvif/operations.py (GetSystemDateAndTime open, the rest view or admin).
        ("POST", "/onvif/device_service", Access.OPEN),
        ("POST", "/onvif/media_service", Access.OPEN),
        ("POST", "/onvif/events_service", Access.OPEN),
        ("POST", "/onvif/pullpoint/{id}", Access.OPEN),  # a subscription's own address
        # The picture.
        ("*", "/whep", Access.VIEW),
        ("*", "/whep/sessions/{id}", Access.VIEW),  # the session URL is the viewer's capability
        ("*", "/whep/*/*", Access.VIEW),  # /whep/<camera>/<stream>: main or sub
        ("*", "/whep/*", Access.VIEW),
        ("GET,HEAD", "/snapshot.jpg", Access.VIEW),
        ("GET,HEAD", "/snapshot/*.jpg", Access.VIEW),  # ?stream=sub: the same level
        ("GET,HEAD", "/hls/*", Access.VIEW),
        ("GET,HEAD", "/api/cameras", Access.VIEW),
        ("GET,HEAD", "/api/status", Access.VIEW),  # details only for admin (web/api.py)
        ("GET,HEAD", "/recordings/list", Access.VIEW),
        ("GET,HEAD", "/recordings/get", Access.VIEW),
        ("GET,HEAD", "/api/recording", Access.VIEW),
        ("GET,HEAD", "/api/events", Access.VIEW),  # motion events: when, how much, a picture
        ("GET,HEAD", "/api/events/stream", Access.VIEW),  # the same, live (SSE), and the meter
        ("GET,HEAD", "/api/events/*/snapshot.jpg", Access.VIEW),
        # Everything that changes state or reveals what is not the picture.
        ("DELETE", "/recordings", Access.ADMIN),
        ("POST", "/api/recording/start", Access.ADMIN),
        ("POST", "/api/recording/stop", Access.ADMIN),
        ("GET,HEAD,PATCH", "/api/camera/controls", Access.ADMIN),
        ("GET,HEAD,PATCH", "/api/camera/*/controls", Access.ADMIN),
        ("GET,HEAD,PATCH", "/api/camera/motion", Access.ADMIN),
        ("GET,HEAD,PATCH", "/api/camera/*/motion", Access.ADMIN),
        ("GET,HEAD,PATCH", "/api/camera/audio", Access.ADMIN),  # mute, gain
        ("GET,HEAD,PATCH", "/api/camera/*/audio", Access.ADMIN),
        ("GET,HEAD", "/metrics", Access.ADMIN),
        ("GET,HEAD", "/relay/*.sdp", Access.ADMIN),
    )
)

# RTSP (RFC 2326) methods. OPTIONS is what clients ask before authenticating; playing is the
# picture and its sound (the audio track is SETUP and played with the same methods, so with
# the same credential; tests/rtsp/test_rtsp_audio.py). GET_/SET_PARAMETER are keep-alives (a
# SET_PARAMETER that would set something is refused, 451); the methods that would change what
# the server holds are admin, and the server refuses them anyway (405: it only plays). A method
# not listed is treated as ADMIN.
RTSP_METHODS: dict[str, Access] = {
    "OPTIONS": Access.OPEN,
    "DESCRIBE": Access.VIEW,
    "SETUP": Access.VIEW,
    "PLAY": Access.VIEW,
    "PAUSE": Access.VIEW,
    "TEARDOWN": Access.VIEW,
    "GET_PARAMETER": Access.VIEW,
    "SET_PARAMETER": Access.VIEW,
    "ANNOUNCE": Access.ADMIN,
    "RECORD": Access.ADMIN,
    "REDIRECT": Access.ADMIN,
}


def classify(method: str, path_pattern: str) -> Access | None:
    """The access an HTTP route needs, or None when no rule covers it."""
    for methods, pattern, access in HTTP_ROUTES:
        if ("*" in methods or method in methods) and fnmatch.fnmatchcase(path_pattern, pattern):
            return access
    return None


def rtsp_access(method: str) -> Access:
    """The access an RTSP method needs (unknown methods: ADMIN)."""
    return RTSP_METHODS.get(method.upper(), Access.ADMIN)


def unclassified_routes(routes: Iterable[tuple[str, str]]) -> list[str]:
    """``"METHOD /path"`` of every (method, canonical path) that :func:`classify` misses."""
    return [f"{method} {path}" for method, path in routes if classify(method, path) is None]
