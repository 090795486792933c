"""Places, fair and usable (issue 23 item 6): one address may hold its share of max_viewers.

The share counts connected and pending sessions together (``webrtc.max_viewers_per_address``;
by default half of max_viewers, at least a 16-tile grid while one place stays for others). A
burst within the share is answered 201 on the first try, however many offers arrive at once (a
camera grid, a Home Assistant dashboard); beyond it the address gets 429 with Retry-After and a
reason, while another address still gets in. Offers go over real HTTP from other loopback
addresses (aiohttp's ``local_addr``), by real aiortc viewers that connect and decode (PyAV).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import pytest
from aiortc import RTCSessionDescription

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.engine import Engine
from tests.engine.conftest import RecordingDecoder, Viewer, make_offer, wait_for, webrtc_config
from tests.engine.test_pending import parse_metrics, watch
from tests.web.conftest import running_device, web_config

TOKEN = "places-test-token"
# Works before and after the access change: WHEP with it, and the admin routes need it.
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def from_address(host: str) -> aiohttp.ClientSession:
    """An HTTP client whose connections come from ``host`` (a loopback address)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(host, 0)),
                                 headers=AUTH)


async def post_offer(http: aiohttp.ClientSession, url: str, offer: str
                     ) -> tuple[int, str, dict[str, str]]:
    async with http.post(url + "/whep", data=offer,
                         headers={"Content-Type": "application/sdp"}) as response:
        return response.status, await response.text(), dict(response.headers)


async def new_viewer() -> tuple[Viewer, str]:
    """A real aiortc viewer counting the frames it decodes, and its offer."""
    pc, offer = await make_offer()
    viewer = Viewer(pc)
    watch(viewer)
    return viewer, offer


async def test_sixteen_offers_at_once_from_one_address_all_get_201_and_decode(
        tmp_path: Path) -> None:
    # Defaults (max_viewers 50: 25 places per address): a 16-tile grid opened from one host.
    config = web_config(auth={"token": TOKEN})
    async with running_device(config, tmp_path) as (_capture, engine, client):
        assert engine.config.places_per_address() == 25
        url = str(client.make_url("")).rstrip("/")
        made = [await new_viewer() for _ in range(16)]
        viewers = [viewer for viewer, _ in made]
        http = from_address("127.0.0.2")
        try:
            answers = await asyncio.gather(*(post_offer(http, url, offer) for _, offer in made))
            assert [status for status, _, _ in answers] == [201] * 16, answers
            for viewer, (_, answer, _) in zip(viewers, answers, strict=True):
                await viewer.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            await wait_for(lambda: all(v.frames >= 5 for v in viewers), timeout=60)
            await wait_for(lambda: all(s.state == "connected" for s in engine.sessions.values()),
                           timeout=30)
            assert len(RecordingDecoder.instances) == 16
            assert all(d.decoded >= 5 for d in RecordingDecoder.instances)
            stats = engine.stats()
            assert stats["sessions_connected"] == 16
            assert (stats["addresses"], stats["address_places_max"]) == (1, 16)
            assert stats["places_refused"] == {} and stats["offers_rejected"] == {}
        finally:
            await http.close()
            await asyncio.gather(*(v.close() for v in viewers))


async def test_one_address_cannot_take_more_than_its_share_while_another_gets_in(
        tmp_path: Path) -> None:
    # max_viewers 6: 5 places per address (half, raised towards a grid, one left for others).
    config = web_config(auth={"token": TOKEN}, webrtc={"max_viewers": 6})
    async with running_device(config, tmp_path) as (_capture, engine, client):
        assert engine.config.places_per_address() == 5
        url = str(client.make_url("")).rstrip("/")
        greedy, other, third = (from_address(f"127.0.0.{i}") for i in (2, 3, 4))
        viewers: list[Viewer] = []
        try:
            made = [await new_viewer() for _ in range(7)]
            answers = await asyncio.gather(*(post_offer(greedy, url, offer)
                                             for _, offer in made))
            statuses = [status for status, _, _ in answers]
            assert sorted(statuses) == [201] * 5 + [429] * 2, statuses
            for status, body, headers in answers:
                if status == 429:
                    assert int(headers["Retry-After"]) >= 1
                    assert headers["Content-Type"].startswith("application/problem+json")
                    assert "already holds 5 viewer places" in body, body
            for (viewer, _), (status, answer, _) in zip(made, answers, strict=True):
                if status == 201:
                    viewers.append(viewer)
                    await viewer.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
                else:
                    await viewer.close()
            await wait_for(lambda: all(v.frames >= 5 for v in viewers), timeout=60)
            await wait_for(lambda: all(s.state == "connected" for s in engine.sessions.values()),
                           timeout=30)

            # Connected, the share still holds: refused, and told to come back later.
            late, offer = await new_viewer()
            status, body, headers = await post_offer(greedy, url, offer)
            await late.close()
            assert status == 429, body
            assert "(0 of them not connected yet)" in body
            assert headers["Retry-After"] == "10"

            # Another address gets the place that is left, and a picture.
            newcomer, offer = await new_viewer()
            viewers.append(newcomer)
            status, answer, _ = await post_offer(other, url, offer)
            assert status == 201, answer
            await newcomer.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            await wait_for(lambda: newcomer.frames >= 5, timeout=40)
            await wait_for(lambda: all(s.state == "connected" for s in engine.sessions.values()),
                           timeout=30)

            # All six connected: a third address is told the device is full (503), not 429.
            full, offer = await new_viewer()
            status, body, _ = await post_offer(third, url, offer)
            await full.close()
            assert status == 503, body

            async with client.get("/api/status", headers=AUTH) as response:
                stats = (await response.json())["webrtc"]["stats"]
            assert stats["max_viewers_per_address"] == 5
            assert (stats["addresses"], stats["address_places_max"]) == (2, 5)
            assert stats["places_refused"] == {"address-share": 3, "all-connected": 1}
            assert stats["sessions_connected"] == 6
            async with client.get("/metrics", headers=AUTH) as response:
                samples = parse_metrics(await response.text())
            assert samples['ruseon_engine_places_refused{key="address-share"}'] == 3
            assert samples['ruseon_whep_offers_refused_total{error="TooManyFromAddress"}'] == 3
            assert samples["ruseon_engine_max_viewers_per_address"] == 5
            assert samples["ruseon_engine_address_places_max"] == 5
        finally:
            for http in (greedy, other, third):
                await http.close()
            await asyncio.gather(*(v.close() for v in viewers))


async def test_when_full_the_address_with_most_pending_gives_way_first(
        feed: CapturePipeline, tmp_path: Path) -> None:
    # 4 places, 3 per address. Another address's offer came first (it is the oldest pending),
    # then one address took the rest: the newcomer's place comes from the latter.
    engine = Engine(webrtc_config(max_viewers=4), tmp_path / "s", feed)
    await engine.start()
    try:
        assert engine.config.places_per_address() == 3
        _, offer = await make_offer()
        early, _ = await engine.offer(offer, remote="127.0.0.3")
        flood = [(await engine.offer(offer, remote="127.0.0.2"))[0] for _ in range(3)]
        newcomer, _ = await engine.offer(offer, remote="127.0.0.5")
        await wait_for(lambda: flood[0].id not in engine.sessions)
        assert flood[0].end_reason == "reclaimed"
        assert {early.id, flood[1].id, flood[2].id, newcomer.id} == set(engine.sessions)
        assert engine.stats()["places_reclaimed"] == {"oldest-pending": 1}
    finally:
        await engine.stop()


def test_deprecated_pending_per_address_only_widens_the_share() -> None:
    from ruseon_appliance.engine.engine import deprecated_settings

    assert deprecated_settings(webrtc_config()) is None
    old_default = webrtc_config(pending_per_address=2)  # what old example configs carry
    assert old_default.places_per_address() == 25
    assert "deprecated and ignored" in str(deprecated_settings(old_default))
    proxy = webrtc_config(pending_per_address=40)  # raised behind a reverse proxy
    assert proxy.places_per_address() == 40
    assert "taken as webrtc.max_viewers_per_address = 40" in str(deprecated_settings(proxy))
    both = webrtc_config(pending_per_address=40, max_viewers_per_address=4)
    assert both.places_per_address() == 4
    assert "deprecated and ignored" in str(deprecated_settings(both))
    assert webrtc_config(pending_per_address=400).places_per_address() == 50



async def test_an_old_configs_pending_per_address_is_warned_about_once_at_start(
        feed: CapturePipeline, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(webrtc_config(pending_per_address=2), tmp_path / "s", feed)
    with caplog.at_level(logging.WARNING, logger="ruseon_appliance.engine.engine"):
        await engine.start()
        try:
            _, offer = await make_offer()
            for _ in range(3):  # the old cap of 2 no longer applies
                await engine.offer(offer, remote="127.0.0.2")
        finally:
            await engine.stop()
    warnings = [r.getMessage() for r in caplog.records if "pending_per_address" in r.getMessage()]
    assert len(warnings) == 1 and "deprecated and ignored" in warnings[0], warnings
