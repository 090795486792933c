"""``/api/events`` and ``/api/events/<id>/snapshot.jpg``: the motion events every camera's
detector kept (motion/store.py), and their part of ``/api/status`` and ``/metrics``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ruseon_appliance.motion.store import StoredEvent, is_event_id
from ruseon_appliance.recording import rfc3339
from ruseon_appliance.web.metrics import Families
from ruseon_appliance.web.problem import Problem, json_changes
from ruseon_appliance.web.recordings import MAX_PARAM_CHARS, parse_time

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from ruseon_appliance.motion.monitor import MotionMonitor

KINDS = ("motion",)
# At most this many events in one answer (the newest); ?limit= asks for fewer.
MAX_EVENTS = 1000

# (stats key, metric suffix, kind, help)
MOTION_METRICS = (
    ("fps", "analysed_fps", "gauge", "Frames the motion detector analysed per second."),
    ("decoded", "decoded_frames_total", "counter", "Frames the motion detector decoded."),
    ("analysed", "analysed_frames_total", "counter", "Frames the motion detector analysed."),
    ("skipped", "skipped_frames_total", "counter",
     "Frames the motion detector could not keep up with (skipped to the next keyframe)."),
    ("suppressed", "suppressed_frames_total", "counter",
     "Frames where most of the picture changed at once (a light switch), not motion."),
    ("events", "events_total", "counter", "Motion events started."),
    ("storm_held", "storm_held_total", "counter",
     "Motion that came within motion_min_gap_s of the previous event and started none."),
    ("score", "score", "gauge", "The changed share of the looked-at picture (0 to 1), now."),
    ("active", "active", "gauge", "1 while a motion event lasts."),
    ("cpu_seconds", "cpu_seconds_total", "counter", "CPU time of the detector's thread."),
)


def _parse_when(name: str, text: str | None) -> float | None:
    """``since``/``until``: Unix seconds or an RFC 3339 time; None when absent."""
    if text is None or text == "":
        return None
    if len(text) > MAX_PARAM_CHARS:
        raise Problem(400, f"{name} is too long")
    try:
        return float(text)
    except ValueError:
        return parse_time(name, text) / 1e6


def event_json(event: StoredEvent) -> dict[str, Any]:
    """An event as ``/api/events`` lists it (RFC 3339 times beside the Unix seconds)."""
    out = event.to_json()
    out["start_time"] = rfc3339(round(event.start * 1e6))
    out["end_time"] = rfc3339(round(event.end * 1e6)) if event.end is not None else None
    return out


class EventsResource:
    """The events of ``monitors`` (camera name -> its detector), in camera order."""

    def __init__(self, monitors: Mapping[str, MotionMonitor], cameras: list[str],
                 default: str = "") -> None:
        self.monitors = dict(monitors)
        self.cameras = cameras  # every camera's name (one without motion lists nothing)
        self.default = default or (cameras[0] if cameras else "")

    def add_routes(self, app: web.Application) -> None:
        """``GET /api/events``, ``GET /api/events/{id}/snapshot.jpg``."""
        app.router.add_get("/api/events", self.list_events)
        app.router.add_get("/api/events/{id}/snapshot.jpg", self.snapshot)

    async def list_events(self, request: web.Request) -> web.Response:
        """``?camera=&since=&until=&kind=&limit=``: events overlapping [since, until] (of
        every camera without ``camera``; ``default_camera`` names the unnamed routes' one)."""
        query = request.query
        camera = query.get("camera", "")
        if camera and camera not in self.cameras:
            raise Problem(404, f"no camera {camera!r}; cameras: {', '.join(self.cameras)}")
        kind = query.get("kind", "")
        if kind and kind not in KINDS:
            raise Problem(400, f"kind = {kind!r} is not a kind of event: {', '.join(KINDS)}")
        since = _parse_when("since", query.get("since"))
        until = _parse_when("until", query.get("until"))
        if since is not None and until is not None and until < since:
            raise Problem(400, "until is before since")
        limit_text = query.get("limit", "")
        limit = MAX_EVENTS
        if limit_text:
            if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_EVENTS:
                raise Problem(400, f"limit = {limit_text!r} must be 1 to {MAX_EVENTS}")
            limit = int(limit_text)
        events: list[StoredEvent] = []
        for name, monitor in self.monitors.items():
            if (camera and name != camera) or monitor.store is None:
                continue
            events += monitor.store.query(since=since, until=until)
        events.sort(key=lambda e: e.start)
        return web.json_response({"events": [event_json(e) for e in events[-limit:]],
                                  "default_camera": self.default})

    async def snapshot(self, request: web.Request) -> web.Response:
        """The JPEG of the event's frame of peak motion."""
        event_id = request.match_info["id"]
        if not is_event_id(event_id):
            raise Problem(404, f"{event_id!r} is not an event id")
        for monitor in self.monitors.values():
            store = monitor.store
            event = store.get(event_id) if store is not None else None
            if store is None or event is None:
                continue
            if not event.snapshot:
                break
            try:
                jpeg = await asyncio.to_thread(store.snapshot_path(event_id).read_bytes)
            except OSError:
                break
            return web.Response(body=jpeg, content_type="image/jpeg",
                                headers={"Cache-Control": "no-cache"})
        raise Problem(404, f"no snapshot for event {event_id}")

    def status(self) -> dict[str, Any]:
        """``/api/status`` ``motion``: every detector's figures by camera."""
        return {name: monitor.stats() for name, monitor in self.monitors.items()}

    def metrics(self) -> Iterator[Metric]:
        """``ruseon_motion_*{camera=...}``."""
        out = Families()
        stats = {name: monitor.stats() for name, monitor in self.monitors.items()}
        for key, suffix, kind, help_text in MOTION_METRICS:
            name = f"ruseon_motion_{suffix}"
            family = (out.counter(name, help_text, ["camera"]) if kind == "counter"
                      else out.gauge(name, help_text, ["camera"]))
            for camera, figures in stats.items():
                family.add_metric([camera], float(figures[key]))
        return out.collect()

class MotionControlResource:
    """``GET``/``PATCH /api/camera/<camera>/motion`` (and ``/api/camera/motion`` for the
    default camera): detection on or off, its sensitivity and its zones, live (admin); saved
    under the camera's state folder (motion/saved.py), so a restart keeps them; ``null``
    returns a setting to the configuration's value."""

    def __init__(self, monitor: MotionMonitor, path: str) -> None:
        self.monitor = monitor
        self.path = path

    def add_routes(self, app: web.Application) -> None:
        """Register GET (and HEAD) and PATCH."""
        app.router.add_get(self.path, self.get)
        app.router.add_patch(self.path, self.patch)

    def describe(self) -> dict[str, Any]:
        """What is in force, and the figures."""
        from ruseon_appliance.motion.zones import zone_to_json  # light, but motion's

        monitor = self.monitor
        stats = monitor.stats()
        saved = monitor.saved
        return {"enabled": stats["enabled"], "sensitivity": stats["sensitivity"],
                "zones": [zone_to_json(z) for z in monitor.settings.zones],
                "score": stats["score"], "active": stats["active"],
                "threshold": monitor.meter()["threshold"],
                # Which of them were changed at run time (saved) rather than configured.
                "saved": sorted(k for k in ("enabled", "sensitivity", "zones")
                                if getattr(saved, k) is not None)}

    async def get(self, request: web.Request) -> web.Response:
        """The settings in force and the current score."""
        return web.json_response(self.describe(), headers={"Cache-Control": "no-store"})

    async def patch(self, request: web.Request) -> web.Response:
        """``{"enabled": bool, "sensitivity": 0..100, "zones": [...]}`` (any of them; null:
        the configuration's value), checked whole before anything applies."""
        from ruseon_appliance.motion.zones import zones_from_json

        changes = await json_changes(request, EXPECTED)
        unknown = set(changes) - {"enabled", "sensitivity", "zones"}
        if unknown:
            raise Problem(422, f"unknown setting {', '.join(sorted(unknown))}: "
                               "enabled, sensitivity and zones can be changed")
        enabled, sensitivity = changes.get("enabled"), changes.get("sensitivity")
        if enabled is not None and not isinstance(enabled, bool):
            raise Problem(422, f"enabled = {enabled!r} must be true or false")
        if sensitivity is not None and (isinstance(sensitivity, bool)
                                        or not isinstance(sensitivity, int)
                                        or not 0 <= sensitivity <= 100):
            raise Problem(422, f"sensitivity = {_short(sensitivity)} must be a whole number "
                               "0 to 100")
        zones = None
        if changes.get("zones") is not None:
            try:
                zones = zones_from_json(changes["zones"])
            except ValueError as exc:
                raise Problem(400, f"zones: {exc}") from None
        if "sensitivity" in changes:
            self.monitor.set_sensitivity(sensitivity)
        if "zones" in changes:
            self.monitor.set_zones(zones)
        if "enabled" in changes:
            self.monitor.set_enabled(enabled)
        return web.json_response(self.describe(), headers={"Cache-Control": "no-store"})


EXPECTED = ('{"enabled": true|false, "sensitivity": 0..100, '
            '"zones": [{"points": [[x, y], ...], "include": true|false}]}')


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
