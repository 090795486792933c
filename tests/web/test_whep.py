"""WHEP conformance: every status code and header the endpoint promises, with aiohttp's test
client and real aiortc viewers completing the exchange against the real engine."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from ruseon_appliance.engine.engine import Engine
from tests.web.conftest import SOURCE_HEIGHT, SOURCE_WIDTH, Viewer, new_offer

Device = tuple[Any, Engine, TestClient[Any, Any]]
SDP = {"Content-Type": "application/sdp"}
SDPFRAG = {"Content-Type": "application/trickle-ice-sdpfrag"}
SESSION_URL = re.compile(r"^/whep/sessions/([A-Za-z0-9_-]{22,})$")


async def assert_problem(response: Any, status: int) -> dict[str, Any]:
    """The response is ``status`` with an application/problem+json body naming that status."""
    assert response.status == status, await response.text()
    assert response.content_type == "application/problem+json"
    body: dict[str, Any] = await response.json()
    assert body["status"] == status
    assert body["detail"]
    return body


async def create_session(client: TestClient[Any, Any], offer: str) -> tuple[str, Any]:
    response = await client.post("/whep", data=offer, headers=SDP)
    assert response.status == 201, await response.text()
    return response.headers["Location"], response


# -- POST ------------------------------------------------------------------------------------------


async def test_offer_is_answered_and_the_viewer_receives_the_source_video(
    device: Device, viewers: list[Viewer]
) -> None:
    _, engine, client = device
    viewer, offer = await new_offer(viewers)
    location, response = await create_session(client, offer)

    assert response.content_type == "application/sdp"
    match = SESSION_URL.match(location)
    assert match, location
    assert match.group(1) in engine.sessions
    answer = await response.text()
    assert answer.startswith("v=0")
    assert "a=sendonly" in answer
    assert "a=rtcp-mux" in answer
    assert "H264/90000" in answer
    assert response.headers["Accept-Patch"] == "application/trickle-ice-sdpfrag"
    if "ETag" in response.headers:
        assert response.headers["ETag"] == engine.sessions[match.group(1)].etag

    await viewer.accept(answer)
    track = await asyncio.wait_for(viewer.track, 10)
    frames = [await asyncio.wait_for(track.recv(), 10) for _ in range(10)]
    assert {(f.width, f.height) for f in frames} == {(SOURCE_WIDTH, SOURCE_HEIGHT)}
    assert viewer.pc.connectionState == "connected"


async def test_session_ids_are_unguessable_and_distinct(
    device: Device, viewers: list[Viewer]
) -> None:
    _, _, client = device
    ids = set()
    for _ in range(3):
        _, offer = await new_offer(viewers)
        location, _ = await create_session(client, offer)
        match = SESSION_URL.match(location)
        assert match
        ids.add(match.group(1))
    assert len(ids) == 3


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/json", "application/sdp-x", None]
)
async def test_offer_with_the_wrong_content_type_is_415(
    device: Device, viewers: list[Viewer], content_type: str | None
) -> None:
    _, engine, client = device
    _, offer = await new_offer(viewers)
    headers = {"Content-Type": content_type} if content_type else {}
    response = await client.post("/whep", data=offer.encode(), headers=headers)
    await assert_problem(response, 415)
    assert response.headers["Accept-Post"] == "application/sdp"
    assert not engine.sessions


@pytest.mark.parametrize(
    "body",
    [b"", b"hello", b"\xff\xfe not utf-8", b"v=0\r\nthis is not sdp\r\nm=video\r\n"],
)
async def test_malformed_offer_is_400_with_a_reason(
    device: Device, body: bytes
) -> None:
    _, engine, client = device
    response = await client.post("/whep", data=body, headers=SDP)
    problem = await assert_problem(response, 400)
    assert len(problem["detail"]) > 5
    assert not engine.sessions


async def test_offer_without_h264_is_refused_naming_what_the_device_sends(
    device: Device, viewers: list[Viewer]
) -> None:
    _, engine, client = device
    _, offer = await new_offer(viewers, codecs=["video/VP8"])
    assert "H264" not in offer
    response = await client.post("/whep", data=offer, headers=SDP)
    assert response.status in (406, 422)
    problem = await assert_problem(response, response.status)
    assert "H.264" in problem["detail"] or "H264" in problem["detail"]
    assert not engine.sessions


async def test_oversize_offer_is_413(device: Device) -> None:
    _, engine, client = device
    body = b"v=0\r\n" + b"a=x-padding:" + b"x" * (64 * 1024) + b"\r\n"
    response = await client.post("/whep", data=body, headers=SDP)
    await assert_problem(response, 413)

    async def chunked() -> Any:  # no Content-Length: the limit holds while reading
        for _ in range(80):
            yield b"a=x-padding:" + b"y" * 1000 + b"\r\n"

    response = await client.post("/whep", data=chunked(), headers=SDP)
    await assert_problem(response, 413)
    assert not engine.sessions


@pytest.mark.parametrize("device", [{"webrtc": {"max_viewers": 1}}], indirect=True)
async def test_viewer_limit_is_503_with_retry_after(
    device: Device, viewers: list[Viewer]
) -> None:
    _, engine, client = device
    viewer, first = await new_offer(viewers)
    _, response = await create_session(client, first)
    await viewer.accept(await response.text())
    await asyncio.wait_for(viewer.track, 20)
    for _ in range(200):  # every place connected: only then is a newcomer refused
        if all(s.state == "connected" for s in engine.sessions.values()):
            break
        await asyncio.sleep(0.05)
    _, second = await new_offer(viewers)
    response = await client.post("/whep", data=second, headers=SDP)
    await assert_problem(response, 503)
    assert int(response.headers["Retry-After"]) >= 1
    assert len(engine.sessions) == 1


@pytest.mark.parametrize("device", [{"webrtc": {"max_viewers": 1}}], indirect=True)
async def test_a_pending_place_goes_to_the_newcomer(
    device: Device, viewers: list[Viewer]
) -> None:
    _, engine, client = device
    _, first = await new_offer(viewers)
    first_location, _ = await create_session(client, first)  # never connects
    _, second = await new_offer(viewers)
    second_location, _ = await create_session(client, second)
    for _ in range(200):
        if len(engine.sessions) == 1:
            break
        await asyncio.sleep(0.05)
    assert (await client.delete(first_location)).status == 404
    assert list(engine.sessions) == [SESSION_URL.match(second_location).group(1)]  # type: ignore[union-attr]
    assert engine.stats()["places_reclaimed"] == {"oldest-pending": 1}


@pytest.mark.parametrize("device", [{"webrtc": {"max_viewers_per_address": 1}}], indirect=True)
async def test_an_address_beyond_its_share_is_429_with_retry_after_and_a_reason(
    device: Device, viewers: list[Viewer]
) -> None:
    _, engine, client = device
    _, first = await new_offer(viewers)
    await create_session(client, first)
    _, second = await new_offer(viewers)
    response = await client.post("/whep", data=second, headers=SDP)
    problem = await assert_problem(response, 429)
    assert "already holds 1 viewer places (1 of them not connected yet)" in problem["detail"]
    assert int(response.headers["Retry-After"]) >= 1
    assert engine.stats()["places_refused"] == {"address-share": 1}


@pytest.mark.parametrize(
    "device",
    [{"webrtc": {"ice_servers": ("stun:127.0.0.1:3478", "turn:127.0.0.1:3478?transport=udp")}}],
    indirect=True,
)
async def test_configured_ice_servers_are_announced_in_link_headers(
    device: Device, viewers: list[Viewer]
) -> None:
    _, _, client = device
    _, offer = await new_offer(viewers)
    _, response = await create_session(client, offer)
    links = response.headers.getall("Link")
    assert links == [
        '<stun:127.0.0.1:3478>; rel="ice-server"',
        '<turn:127.0.0.1:3478?transport=udp>; rel="ice-server"',
    ]


async def test_no_link_header_without_ice_servers(device: Device, viewers: list[Viewer]) -> None:
    _, _, client = device
    _, offer = await new_offer(viewers)
    _, response = await create_session(client, offer)
    assert "Link" not in response.headers


# -- DELETE ----------------------------------------------------------------------------------------


async def test_delete_ends_the_session_at_once(device: Device, viewers: list[Viewer]) -> None:
    _, engine, client = device
    viewer, offer = await new_offer(viewers)
    location, response = await create_session(client, offer)
    await viewer.accept(await response.text())
    await asyncio.wait_for(viewer.track, 10)
    session_id = location.rsplit("/", 1)[1]

    response = await client.delete(location)
    assert response.status == 200
    assert session_id not in engine.sessions

    await assert_problem(await client.delete(location), 404)


async def test_unknown_session_is_404(device: Device) -> None:
    _, _, client = device
    url = "/whep/sessions/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    await assert_problem(await client.delete(url), 404)
    patched = await client.patch(url, data="a=end-of-candidates\r\n", headers=SDPFRAG)
    await assert_problem(patched, 404)


# -- PATCH -----------------------------------------------------------------------------------------

TRICKLE = (
    "a=ice-ufrag:{ufrag}\r\na=ice-pwd:{pwd}\r\nm=video 9 UDP/TLS/RTP/SAVPF 0\r\na=mid:0\r\n"
    "a=candidate:1 1 udp 2130706431 198.18.0.1 50000 typ host\r\na=end-of-candidates\r\n"
)


def ice_credentials(offer: str) -> tuple[str, str]:
    ufrag = re.search(r"a=ice-ufrag:(\S+)", offer)
    pwd = re.search(r"a=ice-pwd:(\S+)", offer)
    assert ufrag and pwd
    return ufrag.group(1), pwd.group(1)


async def test_trickle_patch_is_204(device: Device, viewers: list[Viewer]) -> None:
    _, _, client = device
    _, offer = await new_offer(viewers)
    location, response = await create_session(client, offer)
    ufrag, pwd = ice_credentials(offer)
    body = TRICKLE.format(ufrag=ufrag, pwd=pwd)
    patched = await client.patch(location, data=body, headers=SDPFRAG)
    assert patched.status == 204
    if "ETag" in response.headers:
        headers = {**SDPFRAG, "If-Match": response.headers["ETag"]}
        assert (await client.patch(location, data=body, headers=headers)).status == 204


async def test_patch_with_the_wrong_content_type_is_415(
    device: Device, viewers: list[Viewer]
) -> None:
    _, _, client = device
    _, offer = await new_offer(viewers)
    location, _ = await create_session(client, offer)
    response = await client.patch(location, data=offer, headers=SDP)
    await assert_problem(response, 415)
    assert response.headers["Accept-Patch"] == "application/trickle-ice-sdpfrag"


async def test_patch_with_a_stale_if_match_is_412(device: Device, viewers: list[Viewer]) -> None:
    _, _, client = device
    _, offer = await new_offer(viewers)
    location, _ = await create_session(client, offer)
    ufrag, pwd = ice_credentials(offer)
    headers = {**SDPFRAG, "If-Match": '"not-this-one"'}
    response = await client.patch(location, data=TRICKLE.format(ufrag=ufrag, pwd=pwd),
                                  headers=headers)
    await assert_problem(response, 412)


async def test_ice_restart_is_422_when_the_engine_cannot_restart(
    device: Device, viewers: list[Viewer]
) -> None:
    _, engine, client = device
    if hasattr(engine, "restart_ice"):
        pytest.fail("the engine supports ICE restart: this test must check 200 + new ETag instead")
    _, offer = await new_offer(viewers)
    location, _ = await create_session(client, offer)
    body = TRICKLE.format(ufrag="newfrag1", pwd="a-brand-new-ice-password-1234")
    response = await client.patch(location, data=body, headers={**SDPFRAG, "If-Match": "*"})
    problem = await assert_problem(response, 422)
    assert "ICE restart is not supported" in problem["detail"]
    assert "POST a new offer" in problem["detail"]
    assert response.headers["Accept-Patch"] == "application/trickle-ice-sdpfrag"
    assert location.rsplit("/", 1)[1] in engine.sessions  # refused, not ended


async def test_options_on_a_session_advertises_only_trickle_patches(
    device: Device, viewers: list[Viewer]
) -> None:
    _, _, client = device
    _, offer = await new_offer(viewers)
    location, _ = await create_session(client, offer)
    response = await client.options(location)
    assert response.status in (200, 204)
    assert response.headers["Accept-Patch"] == "application/trickle-ice-sdpfrag"


# -- other methods ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "PATCH", "DELETE"])
async def test_other_methods_on_the_endpoint_are_405_with_allow(
    device: Device, method: str
) -> None:
    _, _, client = device
    response = await client.request(method, "/whep")
    assert response.status == 405
    assert set(response.headers["Allow"].replace(" ", "").split(",")) == {"OPTIONS", "POST"}


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "POST"])
async def test_other_methods_on_a_session_are_405_with_allow(
    device: Device, viewers: list[Viewer], method: str
) -> None:
    _, _, client = device
    _, offer = await new_offer(viewers)
    location, _ = await create_session(client, offer)
    response = await client.request(method, location)
    assert response.status == 405
    assert set(response.headers["Allow"].replace(" ", "").split(",")) == {
        "OPTIONS", "PATCH", "DELETE"
    }


async def test_options_advertises_accept_post(device: Device) -> None:
    _, _, client = device
    response = await client.options("/whep")
    assert response.status in (200, 204)
    assert response.headers["Accept-Post"] == "application/sdp"


async def test_unknown_path_is_a_404_problem(device: Device) -> None:
    _, _, client = device
    await assert_problem(await client.get("/no/such/thing"), 404)
