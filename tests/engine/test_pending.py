"""Offers that never connect cannot lock viewers out (issue 12).

A pending session (answered, not yet connected) is cheap and cannot crowd out real viewers:
each source address may hold only its share of the places (``max_viewers_per_address``,
connected and pending together; tests/engine/test_places.py), they time out after
``connect_timeout_s``, and when every place is taken and some are only pending, a new offer
replaces the oldest pending one of the address holding the most. Connected viewers are never
displaced. The lock-out test is
the attack as found: offers POSTed over real HTTP from other loopback addresses (127.0.0.2...,
aiohttp's ``local_addr``) by clients that never start ICE, while a real aiortc viewer from yet
another address gets in, connects and decodes.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiortc import RTCSessionDescription

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.engine import Engine
from ruseon_appliance.engine.engine import address_key
from ruseon_appliance.engine.errors import TooManyFromAddress, TooManyViewers
from tests.engine.conftest import Viewer, connect_viewer, make_offer, wait_for, webrtc_config
from tests.web.conftest import ADMIN, running_device, web_config


def parse_metrics(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def watch(viewer: Viewer) -> None:
    """Decode the viewer's video as it arrives (counting frames)."""

    def on_track(track: Any) -> None:
        if track.kind == "video":
            viewer.task = asyncio.ensure_future(viewer.consume(track))

    viewer.pc.on("track", on_track)


def test_address_key_groups_an_ipv6_slash_64_and_unwraps_mapped_ipv4() -> None:
    assert address_key("fd00:1:2:3::1") == address_key("fd00:1:2:3:ffff::9") == "fd00:1:2:3::/64"
    assert address_key("fd00:1:2:4::1") != address_key("fd00:1:2:3::1")
    assert address_key("::ffff:192.0.2.7") == address_key("192.0.2.7") == "192.0.2.7"
    assert address_key(None) is None and address_key("not-an-ip") is None


async def test_per_address_cap_and_the_oldest_pending_gives_way(
        feed: CapturePipeline, tmp_path: Path) -> None:
    engine = Engine(webrtc_config(max_viewers=3, max_viewers_per_address=2), tmp_path / "s",
                    feed)
    await engine.start()
    try:
        _, offer = await make_offer()
        first, _ = await engine.offer(offer, remote="127.0.0.2")
        await engine.offer(offer, remote="127.0.0.2")
        with pytest.raises(TooManyFromAddress):
            await engine.offer(offer, remote="127.0.0.2")
        assert engine.stats()["places_refused"] == {"address-share": 1}
        third, _ = await engine.offer(offer, remote="127.0.0.3")
        assert engine.stats()["sessions_pending"] == 3
        # Full, all pending: the newcomer takes the oldest pending place.
        fourth, _ = await engine.offer(offer, remote="127.0.0.4")
        await wait_for(lambda: first.id not in engine.sessions)
        assert first.end_reason == "reclaimed"
        assert engine.stats()["places_reclaimed"] == {"oldest-pending": 1}
        assert engine.stats()["sessions_ended"] == {"reclaimed": 1}
        assert {third.id, fourth.id} <= set(engine.sessions)
    finally:
        await engine.stop()


async def test_connected_viewers_are_never_displaced(
        feed: CapturePipeline, tmp_path: Path) -> None:
    engine = Engine(webrtc_config(max_viewers=2), tmp_path / "s", feed)
    await engine.start()
    viewers: list[Viewer] = []
    try:
        viewers = [await connect_viewer(engine) for _ in range(2)]
        await wait_for(lambda: all(v.frames >= 3 for v in viewers), timeout=40)
        _, offer = await make_offer()
        with pytest.raises(TooManyViewers):
            await engine.offer(offer, remote="127.0.0.9")
        assert engine.stats()["places_refused"] == {"all-connected": 1}
        assert engine.stats()["places_reclaimed"] == {}
        assert all(s.state == "connected" for s in engine.sessions.values())
    finally:
        await asyncio.gather(*(v.close() for v in viewers))
        await engine.stop()


async def test_a_slow_client_starting_ice_after_two_seconds_connects(engine: Engine) -> None:
    assert engine.config.connect_timeout_s == 10.0  # the default pending timeout
    pc, offer = await make_offer()
    viewer = Viewer(pc)
    watch(viewer)
    session, answer = await engine.offer(offer, remote="127.0.0.1")
    try:
        await asyncio.sleep(2.0)  # the client sits on the answer before starting ICE
        assert session.state == "connecting"
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await wait_for(lambda: viewer.frames >= 5, timeout=40)
        assert session.state == "connected"
    finally:
        await viewer.close()


async def _post(http: aiohttp.ClientSession, url: str, offer: str) -> tuple[int, str, str]:
    async with http.post(url + "/whep", data=offer,
                         headers={"Content-Type": "application/sdp"}) as response:
        return response.status, await response.text(), response.headers.get("Location", "")


async def test_never_connecting_offers_cannot_lock_a_real_viewer_out(tmp_path: Path) -> None:
    config = web_config(webrtc={"max_viewers": 3})
    async with running_device(config, tmp_path) as (_capture, engine, client):
        url = str(client.make_url("")).rstrip("/")
        _, junk_offer = await make_offer()  # its answers are never applied: no ICE, ever
        statuses: list[int] = []
        stop = asyncio.Event()

        def from_address(host: str) -> aiohttp.ClientSession:
            return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(host, 0)))

        # The lock-out as found: three never-connecting offers fill max_viewers = 3 ...
        squatters = [from_address(f"127.0.0.{i}") for i in (2, 3, 4)]
        for http in squatters:
            status, _, _ = await _post(http, url, junk_offer)
            assert status == 201
        assert engine.stats()["sessions_pending"] == 3

        # ... and one address keeps re-posting, several at a time.
        async def flood(http: aiohttp.ClientSession) -> None:
            while not stop.is_set():
                status, _, _ = await _post(http, url, junk_offer)
                statuses.append(status)
                await asyncio.sleep(0.02)

        flooder = from_address("127.0.0.2")
        flooding = [asyncio.ensure_future(flood(flooder)) for _ in range(3)]
        real = from_address("127.0.0.10")
        pc, offer = await make_offer()
        viewer = Viewer(pc)
        watch(viewer)
        try:
            await wait_for(lambda: len(statuses) >= 6, timeout=40)
            status, answer, location = await _post(real, url, offer)
            assert status == 201, answer
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            await wait_for(lambda: viewer.frames >= 10, timeout=40)
            # The flood goes on; the connected viewer keeps its place and its picture.
            mark = len(statuses)
            await wait_for(lambda: len(statuses) >= mark + 10, timeout=40)
            frames = viewer.frames
            await wait_for(lambda: viewer.frames >= frames + 10, timeout=40)
            session = engine.sessions[location.rsplit("/", 1)[1]]
            assert session.state == "connected"
            assert 429 in statuses  # the flooding address hit its share of places

            status_doc = await (await client.get("/api/status", headers=ADMIN)).json()
            stats = status_doc["webrtc"]["stats"]
            assert stats["sessions_pending"] >= 1
            assert stats["places_refused"]["address-share"] >= 1
            assert stats["places_reclaimed"]["oldest-pending"] >= 1
            samples = parse_metrics(await (await client.get("/metrics", headers=ADMIN)).text())
            assert samples["ruseon_engine_sessions_pending"] >= 1
            assert samples['ruseon_engine_places_refused{key="address-share"}'] >= 1
            assert samples['ruseon_engine_places_reclaimed{key="oldest-pending"}'] >= 1
            # The mux's drop reasons are there as well (one of them: a zero-length datagram,
            # which a plain socket, unlike asyncio, does send).
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.sendto(b"", ("127.0.0.1", engine.udp_port))
            await wait_for(lambda: engine.mux.dropped["empty"] >= 1)
            samples = parse_metrics(await (await client.get("/metrics", headers=ADMIN)).text())
            assert samples['ruseon_udp_packets_dropped_total{reason="empty"}'] >= 1
        finally:
            stop.set()
            await asyncio.gather(*flooding, return_exceptions=True)
            for http in (*squatters, flooder, real):
                await http.close()
            await viewer.close()
