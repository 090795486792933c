"""``GET`` / ``PATCH /api/camera/controls``: the camera's live controls over HTTP.

``GET`` answers each control's value, type, range, default and whether it applies live or
restarts the source; ``PATCH`` takes a JSON object of ``{control: value}`` (``null`` = back to
the config's value) and answers the new state. Every change is checked before any is applied:
an unknown control, one the source lacks or a value out of range is a 422 naming the control and
what is allowed, and nothing changes. A change that restarts the camera is kept only once the
camera delivered a frame with it: one the camera refuses (rpicam-vid exiting, libcamera
refusing the configuration, no frame in 10 s) is a 422 with the camera's reason, the previous
values run again and the values file is not touched. Both need the Bearer token when auth is
on (like all of ``/api``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from ruseon_appliance.capture.controls import CameraControls, ControlError, ControlRejected
from ruseon_appliance.web.problem import Problem

log = logging.getLogger(__name__)

PATH = "/api/camera/controls"


class ControlsResource:
    """The HTTP face of :class:`CameraControls`."""

    def __init__(self, controls: CameraControls, *, path: str = PATH) -> None:
        self.controls = controls
        # PATH is the default camera's; /api/camera/<name>/controls each camera's.
        self.path = path

    def add_routes(self, app: web.Application) -> None:
        """Register GET (and HEAD) and PATCH."""
        app.router.add_get(self.path, self.get)
        app.router.add_patch(self.path, self.patch)

    async def get(self, request: web.Request) -> web.Response:
        """Current values, ranges, and live / restart per control."""
        return web.json_response(self.controls.describe(),
                                 headers={"Cache-Control": "no-store"})

    async def patch(self, request: web.Request) -> web.Response:
        """Apply ``{control: value}``; answers the new state and ``restarted``."""
        if request.content_type not in ("application/json", "application/merge-patch+json"):
            raise Problem(415, "PATCH takes application/json: an object of {control: value}")
        try:
            changes: Any = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as exc:
            raise Problem(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(changes, dict) or not changes:
            raise Problem(422, 'expected a non-empty JSON object of {control: value}, e.g. '
                               '{"brightness": 0.2}')
        try:
            restarted = await self.controls.update(changes)  # one change at a time
        except ControlError as exc:
            raise Problem(422, str(exc)) from None
        except ControlRejected as exc:  # the camera refused them; it runs with the old ones
            raise Problem(422, f"the camera could not run with "
                               f"{', '.join(f'{k}={v!r}' for k, v in changes.items())}: "
                               f"{exc}") from None
        except Exception as exc:  # the camera failed (a sensor that will not reconfigure)
            log.exception("camera controls: %s could not be applied", ", ".join(map(str, changes)))
            raise Problem(503, f"the camera could not apply {', '.join(map(str, changes))}: "
                               f"{exc}; the previous values stay",
                          headers={"Retry-After": "5"}) from None
        return web.json_response({**self.controls.describe(), "restarted": restarted},
                                 headers={"Cache-Control": "no-store"})
