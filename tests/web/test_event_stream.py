"""``GET /api/events/stream`` (Server-Sent Events) through a running appliance, over real HTTP:
the bus's motion events arrive as they are published, the meter follows the detector, a
stranger is refused where viewing needs a credential, the limit on open streams holds (503
with the reason), a client that does not read is dropped rather than buffered for, and the
shutdown with a stream open ends it cleanly and at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    StateConfig,
    WebRtcConfig,
)
from ruseon_appliance.web import event_stream
from tests.tooling import free_port

TOKEN = "stream-test-admin-secret-0123456789"
VIEWER = "stream-test-viewer-token-01234"
VIEW = {"Authorization": f"Bearer {VIEWER}"}
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def build(tmp_path: Path) -> tuple[Appliance, str]:
    """Two synthetic cameras with motion detection (the default), viewing by credential."""
    common: dict[str, Any] = {"source": "synthetic", "width": 160, "height": 96,
                              "framerate": 15, "keyframe_interval": 15, "bitrate": 200_000}
    port = free_port()
    config = Config(
        cameras=(CameraConfig(name="front", **common), CameraConfig(name="side", **common)),
        http=HttpConfig(listen=HostPort("127.0.0.1", port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        auth=AuthConfig(token=TOKEN, viewing="credential", viewer_token=VIEWER),
        hls=HlsConfig(enable=False),
    )
    return Appliance(config), f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def appliance(tmp_path: Path) -> AsyncIterator[tuple[Appliance, str]]:
    app, base = build(tmp_path)
    await app.start()
    try:
        yield app, base
    finally:
        await app.stop()


class Stream:
    """The events of one open stream, parsed as a browser's EventSource would."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.comments = 0
        self.retry: int | None = None
        self._name = "message"
        self._data: list[str] = []

    async def next(self, name: str, timeout: float = 20.0) -> dict[str, Any]:
        """The next event called ``name`` (others are kept in :attr:`events`)."""
        async with asyncio.timeout(timeout):
            while True:
                line = await self.response.content.readline()
                if not line:
                    raise EOFError("the stream ended")
                event = self._line(line.decode().rstrip("\n"))
                if event is not None and event[0] == name:
                    return event[1]

    def _line(self, line: str) -> tuple[str, dict[str, Any]] | None:
        if line == "":
            if not self._data:
                return None
            event = (self._name, json.loads("\n".join(self._data)))
            self.events.append(event)
            self._name, self._data = "message", []
            return event
        if line.startswith(":"):
            self.comments += 1
        elif line.startswith("event: "):
            self._name = line[7:]
        elif line.startswith("data: "):
            self._data.append(line[6:])
        elif line.startswith("retry: "):
            self.retry = int(line[7:])
        return None


@contextlib.asynccontextmanager
async def opened(http: aiohttp.ClientSession, url: str, headers: dict[str, str] = VIEW
                 ) -> AsyncIterator[Stream]:
    async with http.get(url, headers=headers) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["Cache-Control"] == "no-store"
        yield Stream(response)


async def test_motion_events_arrive_as_the_bus_publishes_them(tmp_path: Path) -> None:
    async with appliance(tmp_path) as (app, base), aiohttp.ClientSession() as http:
        url = base + "/api/events/stream"
        # A stranger, a wrong credential: refused (viewing needs one); a HEAD says what it is.
        for headers in ({}, {"Authorization": "Bearer wrong-wrong-wrong"}):
            async with http.get(url, headers=headers) as response:
                assert response.status == 401
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
        async with http.head(url, headers=VIEW) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
        async with http.get(url + "?camera=nowhere", headers=VIEW) as response:
            assert response.status == 404
            assert "front, side" in (await response.json())["detail"]

        async with opened(http, url) as everything, opened(http, url + "?camera=side") as side:
            hello = await everything.next("hello")
            assert set(hello["cameras"]) == {"front", "side"}
            front = hello["cameras"]["front"]
            assert front["enabled"] is True and front["active"] is False
            assert 0 < front["threshold"] < 0.05 and 0 <= front["score"] <= 1
            assert everything.retry == event_stream.RETRY_MS
            assert set((await side.next("hello"))["cameras"]) == {"side"}

            app.events.publish("motion_started", camera="front", event_id="1-front",
                               start=1.0, score=0.2, snapshot=None)
            app.events.publish("viewer_joined", viewers=1)  # not the stream's business
            app.events.publish("motion_started", camera="side", event_id="2-side",
                               start=2.0, score=0.1, snapshot=None)
            started = await everything.next("motion_started")
            assert started["camera"] == "front" and started["event_id"] == "1-front"
            assert started["time"] > 0
            assert (await everything.next("motion_started"))["event_id"] == "2-side"
            # The side camera's stream got the side camera's event only.
            assert (await side.next("motion_started"))["event_id"] == "2-side"
            app.events.publish("motion_ended", camera="side", event_id="2-side", start=2.0,
                               end=4.0, score=0.1, snapshot=None)
            ended = await side.next("motion_ended")
            assert ended["end"] == 4.0
            assert [n for n, _ in side.events] == ["hello", "motion_started", "motion_ended"]
            assert not any(n == "viewer_joined" for n, _ in everything.events)

            # The meter follows the detector: a camera paused shows as paused, at once.
            async with http.patch(base + "/api/camera/front/motion", json={"enabled": False},
                                  headers=ADMIN) as response:
                assert response.status == 200
            async with asyncio.timeout(20):
                while True:
                    meter = await everything.next("motion_score")
                    if meter["camera"] == "front" and meter["enabled"] is False:
                        break
            assert meter["score"] == 0.0
            async with http.get(base + "/api/status", headers=ADMIN) as response:
                status = (await response.json())["event_stream"]
            assert status["open"] == 2 and status["max"] == event_stream.MAX_STREAMS


async def test_the_limit_holds_and_a_client_that_does_not_read_is_dropped(
        tmp_path: Path) -> None:
    async with appliance(tmp_path) as (app, base), aiohttp.ClientSession() as http:
        url = base + "/api/events/stream"
        async with contextlib.AsyncExitStack() as streams:
            for _ in range(event_stream.MAX_STREAMS):
                stream = await streams.enter_async_context(opened(http, url))
                await stream.next("hello")
            async with http.get(url, headers=VIEW) as response:
                assert response.status == 503
                assert "event streams are open" in (await response.json())["detail"]
                assert response.headers["Retry-After"]
        # Closed by the clients: the places are free again (noticed within a meter tick).
        async with asyncio.timeout(20):
            while True:
                async with http.get(base + "/api/status", headers=ADMIN) as response:
                    status = (await response.json())["event_stream"]
                if status["open"] == 0:
                    break
                await asyncio.sleep(0.1)
        assert status["refused"] == 1 and status["dropped_slow"] == 0

        # A client that asks and never reads, with a small receive buffer, beside one that
        # reads: a storm of large events fills what the kernel holds for the first; it is
        # dropped (its connection aborted) while the reader gets every event.
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(slow, ("127.0.0.1", int(base.rsplit(":", 1)[1])))
        await loop.sock_sendall(slow, (f"GET /api/events/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                       f"Authorization: Bearer {VIEWER}\r\n\r\n").encode())
        padding = "x" * 4000
        count = 3000
        async with opened(http, url) as reader:
            await reader.next("hello")
            async with asyncio.timeout(20):
                while (await _status(http, base))["open"] < 2:
                    await asyncio.sleep(0.05)

            received = 0

            async def read() -> None:
                nonlocal received
                for n in range(count):
                    # (The synthetic picture moves: the detectors' own events come between.)
                    while "padding" not in (event := await reader.next("motion_started")):
                        pass
                    assert event["event_id"] == f"{n}-front"
                    received += 1

            reading = asyncio.create_task(read())
            for n in range(count):
                app.events.publish("motion_started", camera="front", event_id=f"{n}-front",
                                   start=float(n), score=0.1, padding=padding)
                # The reader keeps up (never more than a few behind, whatever the machine's
                # load); the one that does not read falls further behind with every event.
                async with asyncio.timeout(20):
                    while received < n - 8 and not reading.done():
                        await asyncio.sleep(0.001)
            async with asyncio.timeout(20):
                await reading
            status = await _status(http, base)
        assert status["dropped_slow"] == 1, status
        # What the slow client holds ends in a reset or an end, not more and more data.
        held = 0
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(20):
                while chunk := await loop.sock_recv(slow, 65536):
                    held += len(chunk)
        slow.close()
        assert held < count * len(padding) / 2, held


async def _status(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with http.get(base + "/api/status", headers=ADMIN) as response:
        return dict((await response.json())["event_stream"])


async def test_the_shutdown_ends_an_open_stream_cleanly_and_at_once(tmp_path: Path) -> None:
    app, base = build(tmp_path)
    await app.start()
    stopped = False
    try:
        async with aiohttp.ClientSession() as http, \
                opened(http, base + "/api/events/stream") as stream:
            await stream.next("hello")
            stop = asyncio.create_task(app.stop())
            # The server ends the response (the chunked stream's last chunk): an end, not an
            # error; and the stop does not wait on the stream (aiohttp's own wait for open
            # handlers is 60 s: far beyond this bound).
            with pytest.raises(EOFError):
                await stream.next("never", timeout=30)
            async with asyncio.timeout(30):
                await stop
            stopped = True
    finally:
        if not stopped:
            await app.stop()
