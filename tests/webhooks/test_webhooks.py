"""Webhooks from the real appliance (the composition root in-process: synthetic camera, engine,
HTTP) to a local aiohttp receiver: events arrive from the real producers, the HMAC signature
verifies, failures are retried, a dead receiver neither slows the stream nor grows a queue."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import aioice.ice
import pytest
from aiohttp import web

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    CameraConfig,
    Config,
    HostPort,
    HttpConfig,
    StateConfig,
    WebhookConfig,
    WebRtcConfig,
)
from ruseon_appliance.events import Event
from ruseon_appliance.webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookSender
from tests.pki import CertificateAuthority
from tests.tooling import free_port
from tests.web.conftest import Viewer

SECRET = "s3cret"


def verified(secret: str, headers: Mapping[str, str], body: bytes) -> bool:
    """The check docs/home-assistant.md gives receivers, written from the docs."""
    message = headers.get(TIMESTAMP_HEADER, "").encode() + b"." + body
    expected = "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers.get(SIGNATURE_HEADER, ""), expected)


class Receiver:
    """A webhook receiver that fails the first ``fail_first`` attempts of each delivery."""

    def __init__(self, fail_first: int = 1) -> None:
        self.fail_first = fail_first
        self.attempts: dict[str, int] = {}
        self.accepted: list[tuple[dict[str, Any], bool]] = []
        self.changed = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        delivery = request.headers["X-Ruseon-Delivery"]
        self.attempts[delivery] = self.attempts.get(delivery, 0) + 1
        if self.attempts[delivery] <= self.fail_first:
            return web.Response(status=503)
        signed = verified(SECRET, request.headers, body)
        # The timestamp is signed: the same request with another time does not verify (a
        # receiver refusing old timestamps therefore refuses a captured request replayed).
        replayed = {**request.headers, TIMESTAMP_HEADER: str(int(time.time()) + 3600)}
        document = json.loads(body)
        signed = (signed and not verified(SECRET, replayed, body)
                  and abs(time.time() - int(request.headers[TIMESTAMP_HEADER])) < 300
                  and document["delivery"] == delivery)
        self.accepted.append((document, signed))
        self.changed.set()
        return web.Response(status=204)

    def names(self) -> list[str]:
        return [event["event"] for event, _ in self.accepted]

    async def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
        async def loop() -> None:
            while not condition():
                self.changed.clear()
                await self.changed.wait()
        try:
            await asyncio.wait_for(loop(), timeout)
        except TimeoutError:
            raise AssertionError(f"no {what}; received {self.names()}") from None


@contextlib.asynccontextmanager
async def serve(handler: Any, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/hook", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls).start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}/hook"
    finally:
        await runner.cleanup()


def appliance_config(tmp_path: Path, *hooks: WebhookConfig) -> Config:
    return dataclasses.replace(
        Config(),
        cameras=(CameraConfig(source="synthetic", width=320, height=240, keyframe_interval=30),),
        http=HttpConfig(listen=HostPort("127.0.0.1", free_port())),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        webhook=hooks,
    )


@contextlib.asynccontextmanager
async def running(config: Config) -> AsyncIterator[Appliance]:
    appliance = Appliance(config)
    try:
        await appliance.start()
        yield appliance
    finally:
        await appliance.stop()


async def test_events_arrive_signed_after_retries(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])
    receiver = Receiver(fail_first=1)
    async with serve(receiver.handle) as url:
        hook = WebhookConfig(url=url, secret=SECRET, retries=3, retry_delay_s=0.05)
        config = appliance_config(tmp_path, hook)
        async with running(config) as appliance, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{config.http.listen.port}"
            # A real WHEP viewer joins and leaves.
            viewer = Viewer()
            try:
                async with http.post(f"{base}/whep", data=await viewer.offer(),
                                     headers={"Content-Type": "application/sdp"}) as resp:
                    assert resp.status == 201, await resp.text()
                    location = resp.headers["Location"]
                    await viewer.accept(await resp.text())
                await receiver.wait_for(lambda: "viewer_joined" in receiver.names(), "join")
                async with http.delete(base + location) as resp:
                    assert resp.status == 200
                await receiver.wait_for(lambda: "viewer_left" in receiver.names(), "leave")
            finally:
                await viewer.close()
            # The camera stops and comes back.
            await appliance.capture.stop()
            await receiver.wait_for(lambda: "camera_stalled" in receiver.names(), "stall")
            await appliance.capture.start()
            await receiver.wait_for(lambda: "camera_recovered" in receiver.names(), "recovery")
            # A recording starts (as the API or the MQTT button would start it).
            recorder = appliance.cameras.default.recorder
            assert recorder is not None
            recorder.begin()
            await receiver.wait_for(lambda: "recording_started" in receiver.names(), "record")

            by_name = {event["event"]: event for event, _ in receiver.accepted}
            assert by_name["viewer_joined"]["viewers"] == 1
            assert by_name["viewer_left"]["viewers"] == 0
            assert by_name["viewer_left"]["reason"] == "delete"
            assert len(by_name["viewer_joined"]["session"]) == 8  # never the full session id
            assert by_name["camera_stalled"]["source"] == "synthetic"
            # Every camera's events name it, the one camera's too.
            assert by_name["camera_stalled"]["camera"] == appliance.cameras.default.name
            assert by_name["recording_started"]["camera"] == appliance.cameras.default.name
            assert all(signed for _, signed in receiver.accepted)
            # Every delivery failed once and was retried once.
            assert all(n == 2 for n in receiver.attempts.values()), receiver.attempts
            stats = appliance.webhooks[0].stats()
            assert stats["retries"] >= len(receiver.accepted) and stats["dropped"] == 0
            assert stats["sent"] == len(receiver.accepted)


async def test_dead_receiver_neither_slows_the_stream_nor_grows_the_queue(
        tmp_path: Path) -> None:
    # A receiver that accepts TCP connections (the kernel's backlog) and never answers.
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        dead.listen(128)
        url = f"http://127.0.0.1:{dead.getsockname()[1]}/hook"
        hook = WebhookConfig(url=url, queue_size=10, timeout_s=30, retries=5)
        async with running(appliance_config(tmp_path, hook)) as appliance:
            reader = appliance.capture.ring.reader("next")
            sender = appliance.webhooks[0]
            published = 5000
            for i in range(published):
                appliance.events.publish("viewer_joined", session=f"{i:08d}", viewers=1)
            # The stream goes on: consecutive frames, none skipped, reader never lapped.
            views = [await asyncio.wait_for(reader.next(), 10) for _ in range(30)]
            seqs = [v.seq for v in views]
            assert seqs == list(range(seqs[0], seqs[0] + 30)) and reader.overruns == 0
            stats = sender.stats()
            # The queue held ten at the end of the burst, everything older was dropped and
            # counted; since then the worker took one and is stuck on it.
            assert stats["dropped"] == published - 10
            assert stats["queued"] == 9
            assert stats["sent"] == 0
            reader.close()


async def test_redirects_are_not_followed(tmp_path: Path) -> None:
    """A receiver answering 307 elsewhere gets a final failure; the signed event is never
    re-POSTed to where it points."""
    elsewhere = Receiver(fail_first=0)

    async def bounce(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(target)

    async with serve(elsewhere.handle) as target, serve(bounce) as url:
        sender = WebhookSender(WebhookConfig(url=url, secret=SECRET, retries=1,
                                             retry_delay_s=0.05))
        await sender.start()
        try:
            sender.offer(Event("viewer_joined", time.time(), {"viewers": 1}))
            deadline = time.monotonic() + 60
            while sender.failed + sender.sent == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert (sender.failed, sender.sent, sender.last_status) == (1, 0, 307)
            assert elsewhere.attempts == {}
        finally:
            await sender.stop()


async def wait_settled(sender: WebhookSender) -> None:
    deadline = time.monotonic() + 60
    while sender.failed + sender.sent == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def test_https_receiver_with_a_home_ca(tmp_path: Path) -> None:
    """webhook.ca_file trusts a receiver whose certificate comes from a home CA; without it
    (the system's CAs) the same receiver is refused: verification is never switched off."""
    ca = CertificateAuthority(tmp_path, "home")
    server = ca.issue("receiver", ips=("127.0.0.1",))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(server.cert, server.key)
    receiver = Receiver(fail_first=0)
    async with serve(receiver.handle, tls) as url:
        for ca_file, delivered in (("", False), (str(ca.cert), True)):
            sender = WebhookSender(WebhookConfig(url=url, secret=SECRET, retries=0,
                                                 ca_file=ca_file))
            await sender.start()
            try:
                sender.offer(Event("viewer_joined", time.time(), {"viewers": 1}))
                await wait_settled(sender)
                assert (sender.sent, sender.failed) == ((1, 0) if delivered else (0, 1)), (
                    ca_file, sender.stats())
                if not delivered:
                    assert "certificate verify failed" in sender.last_error.lower(), (
                        sender.last_error)
            finally:
                await sender.stop()
    assert [signed for _, signed in receiver.accepted] == [True]
