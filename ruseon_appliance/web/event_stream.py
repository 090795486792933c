"""``GET /api/events/stream``: the page's live motion, as Server-Sent Events (text/event-stream).

What a stream carries, each as ``event: <name>`` with a JSON ``data:`` line:

- ``hello`` first: every detecting camera's state now (``{"cameras": {name: meter}}``), so an
  indicator is right from the start;
- ``motion_started`` / ``motion_ended``: the event bus's, as webhooks get them (event id,
  camera, start, end, peak score, snapshot URL);
- ``motion_score``: a camera's meter (``score``, ``threshold``, ``active``, ``enabled``), at
  most every :data:`METER_INTERVAL_S` per camera and only when it changed (the page's tuner);
- a comment every :data:`KEEPALIVE_S` (proxies and NATs keep an idle stream open).

Bounded: at most :data:`MAX_STREAMS` at once (503 with the reason beyond); a client that does
not read is dropped (its connection aborted) once :data:`MAX_QUEUED` messages wait for it or a
write has waited :data:`WRITE_TIMEOUT_S`, never buffered without bound; the app's shutdown
(``on_shutdown``, before the server waits for its handlers) ends every stream at once.
``?camera=<name>`` limits a stream to one camera.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ruseon_appliance.web.problem import Problem

if TYPE_CHECKING:
    from ruseon_appliance.events import Event, EventBus
    from ruseon_appliance.motion.monitor import MotionMonitor

# Streams open at once, at most (each costs a task and a meter read every half second).
MAX_STREAMS = 8
# A comment line this often when nothing else was sent.
KEEPALIVE_S = 15.0
# The meter of each camera, at most this often.
METER_INTERVAL_S = 0.5
# Messages waiting for one client, at most: beyond, the client is too slow and dropped.
MAX_QUEUED = 64
# One write may wait this long for the client to take what was sent before.
WRITE_TIMEOUT_S = 10.0
# What the browser waits before reconnecting a stream that ended (the SSE retry field).
RETRY_MS = 3000
STREAM_EVENTS = ("motion_started", "motion_ended")


def sse(name: str, data: Mapping[str, Any]) -> bytes:
    """One Server-Sent Event (JSON has no newline to split)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class _Client:
    def __init__(self, request: web.Request, camera: str) -> None:
        self.request = request
        self.camera = camera
        self.queue: collections.deque[bytes] = collections.deque()
        self.wake = asyncio.Event()
        self.dropped = False

    def offer(self, message: bytes) -> bool:
        """Queue ``message``; False when the client is behind (then :meth:`drop` it)."""
        if len(self.queue) >= MAX_QUEUED:
            return False
        self.queue.append(message)
        self.wake.set()
        return True

    def drop(self) -> None:
        """Abort the connection of a client that does not keep up."""
        self.dropped = True
        self.queue.clear()
        transport = self.request.transport
        if transport is not None:
            transport.abort()  # what the kernel and aiohttp hold for it goes too
        self.wake.set()

    def gone(self) -> bool:
        transport = self.request.transport
        return transport is None or transport.is_closing()


class EventStreamResource:
    """The event streams of ``monitors`` (camera name -> its detector), fed by ``bus``."""

    def __init__(self, monitors: Mapping[str, MotionMonitor], bus: EventBus | None, *,
                 max_streams: int = MAX_STREAMS) -> None:
        self.monitors = dict(monitors)
        self.max_streams = max_streams
        self.clients: set[_Client] = set()
        self.closing = False
        self.opened = 0
        self.refused = 0
        self.dropped = 0
        self.sent = 0
        if bus is not None:
            bus.subscribe(self.on_event)

    def add_routes(self, app: web.Application) -> None:
        """``GET /api/events/stream``; every stream ends when the app shuts down."""
        app.router.add_get("/api/events/stream", self.stream)
        app.on_shutdown.append(self._on_shutdown)

    def on_event(self, event: Event) -> None:
        """A bus subscriber (on the loop, never blocking): queue motion events for every
        stream that wants the camera; a client that is behind is dropped."""
        if event.name not in STREAM_EVENTS:
            return
        camera = str(event.data.get("camera", ""))
        message = sse(event.name, {"time": round(event.time, 3), **event.data})
        for client in list(self.clients):
            if client.camera and client.camera != camera:
                continue
            if not client.offer(message):
                self._drop(client)

    async def _on_shutdown(self, app: web.Application) -> None:
        self.close()

    def close(self) -> None:
        """End every stream (they finish their response at once) and refuse new ones."""
        self.closing = True
        for client in list(self.clients):
            client.wake.set()

    def _drop(self, client: _Client) -> None:
        if not client.dropped:
            self.dropped += 1
            client.drop()
        self.clients.discard(client)

    def _meters(self, camera: str) -> dict[str, dict[str, Any]]:
        return {name: monitor.meter() for name, monitor in self.monitors.items()
                if not camera or name == camera}

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """The stream (see the module's description)."""
        camera = request.query.get("camera", "")
        if camera and camera not in self.monitors:
            known = ", ".join(self.monitors) or "none"
            raise Problem(404, f"no camera {camera[:64]!r} detects motion; those that do: "
                               f"{known}")
        if self.closing:
            raise Problem(503, "the appliance is shutting down", headers={"Retry-After": "5"})
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                   "X-Accel-Buffering": "no"}  # a reverse proxy must not hold it back
        if request.method == "HEAD":
            return web.Response(headers=headers)
        if len(self.clients) >= self.max_streams:
            self.refused += 1
            raise Problem(503, f"{len(self.clients)} event streams are open, the most this "
                               "appliance serves at once; close one (another tab?) or poll "
                               "/api/events", headers={"Retry-After": "10"})
        client = _Client(request, camera)
        self.clients.add(client)
        self.opened += 1
        response = web.StreamResponse(headers=headers)
        try:
            await response.prepare(request)
            await self._run(client, response)
        except (TimeoutError, ConnectionError):
            pass  # the client went, or did not take what was sent in time (dropped)
        finally:
            self.clients.discard(client)
        if not client.dropped and not client.gone():
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
        return response

    async def _run(self, client: _Client, response: web.StreamResponse) -> None:
        async def write(data: bytes) -> None:
            try:
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await response.write(data)
            except TimeoutError:
                self._drop(client)
                raise
            self.sent += 1

        meters = self._meters(client.camera)
        await write(f"retry: {RETRY_MS}\n".encode() + sse("hello", {"cameras": meters}))
        loop = asyncio.get_running_loop()
        next_meter = loop.time() + METER_INTERVAL_S
        last_write = time.monotonic()
        while not self.closing and not client.dropped and not client.gone():
            timeout = max(0.0, next_meter - loop.time())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await client.wake.wait()
            client.wake.clear()
            if self.closing or client.dropped or client.gone():
                break
            while client.queue:
                await write(client.queue.popleft())
                last_write = time.monotonic()
            if loop.time() >= next_meter:
                next_meter = loop.time() + METER_INTERVAL_S
                for name, meter in self._meters(client.camera).items():
                    if meter != meters.get(name):
                        meters[name] = meter
                        await write(sse("motion_score", {"camera": name, **meter}))
                        last_write = time.monotonic()
            if time.monotonic() - last_write >= KEEPALIVE_S:
                await write(b": keep-alive\n\n")
                last_write = time.monotonic()

    def stats(self) -> dict[str, Any]:
        """``/api/status`` ``motion_stream``: open now, and counters."""
        return {"open": len(self.clients), "max": self.max_streams, "opened": self.opened,
                "refused": self.refused, "dropped_slow": self.dropped,
                "messages_sent": self.sent}
