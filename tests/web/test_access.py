"""Bearer authentication and CORS, on WHEP and the API."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from ruseon_appliance.engine.engine import Engine
from ruseon_appliance.web.auth import token_matches
from tests.web.conftest import Viewer, new_offer
from tests.web.test_whep import SDP, assert_problem

Device = tuple[Any, Engine, TestClient[Any, Any]]
TOKEN = "s3cret-token-value"
WITH_TOKEN = [{"auth": {"token": TOKEN}}]
GOOD = {"Authorization": f"Bearer {TOKEN}"}
EXTRA_ORIGIN = "https://console.example.test"


@pytest.mark.parametrize("device", WITH_TOKEN, indirect=True)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
     {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": "Bearer"}],
)
async def test_whep_without_the_right_token_is_401_with_www_authenticate(
    device: Device, viewers: list[Viewer], headers: dict[str, str]
) -> None:
    _, engine, client = device
    _, offer = await new_offer(viewers)
    response = await client.post("/whep", data=offer, headers={**SDP, **headers})
    await assert_problem(response, 401)
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert not engine.sessions


@pytest.mark.parametrize("device", WITH_TOKEN, indirect=True)
async def test_whep_with_the_token_is_201_and_the_scheme_is_case_blind(
    device: Device, viewers: list[Viewer]
) -> None:
    _, engine, client = device
    for scheme in ("Bearer", "bearer"):
        _, offer = await new_offer(viewers)
        headers = {**SDP, "Authorization": f"{scheme} {TOKEN}"}
        response = await client.post("/whep", data=offer, headers=headers)
        assert response.status == 201, await response.text()
        location = response.headers["Location"]
        # The session URL is protected too.
        await assert_problem(await client.delete(location), 401)
        assert (await client.delete(location, headers=GOOD)).status == 200
    assert not engine.sessions


@pytest.mark.parametrize("device", WITH_TOKEN, indirect=True)
@pytest.mark.parametrize("path", ["/api/status", "/snapshot.jpg", "/metrics"])
async def test_api_honours_the_token(device: Device, path: str) -> None:
    _, _, client = device
    await assert_problem(await client.get(path), 401)
    assert (await client.get(path, headers=GOOD)).status == 200


@pytest.mark.parametrize("device", WITH_TOKEN, indirect=True)
@pytest.mark.parametrize("path", ["/", "/healthz", "/static/device.js", "/static/whep.js"])
async def test_page_and_health_need_no_token(device: Device, path: str) -> None:
    _, _, client = device
    assert (await client.get(path)).status == 200


@pytest.mark.parametrize("device", WITH_TOKEN, indirect=True)
async def test_preflight_needs_no_token(device: Device) -> None:
    _, _, client = device
    origin = str(client.make_url("")).rstrip("/")
    response = await client.options("/whep", headers={
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    })
    assert response.status == 204
    assert response.headers["Access-Control-Allow-Origin"] == origin
    assert "POST" in response.headers["Access-Control-Allow-Methods"]
    allowed = response.headers["Access-Control-Allow-Headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed
    assert response.headers["Accept-Post"] == "application/sdp"
    # Plain OPTIONS (WHEP discovery) needs no token either.
    assert (await client.options("/whep")).status == 204


def test_token_comparison_is_exact() -> None:
    assert token_matches("abc", "abc")
    assert not token_matches("abd", "abc")
    assert not token_matches("ab", "abc")
    assert not token_matches("abcd", "abc")
    assert not token_matches("ÄBC", "abc")


@pytest.mark.parametrize("device", [{"http": {"cors_origins": (EXTRA_ORIGIN,)}}], indirect=True)
async def test_cors_allows_own_and_configured_origins_and_refuses_others(
    device: Device, viewers: list[Viewer]
) -> None:
    _, engine, client = device
    own = str(client.make_url("")).rstrip("/")
    for origin in (own, EXTRA_ORIGIN):
        _, offer = await new_offer(viewers)
        response = await client.post("/whep", data=offer, headers={**SDP, "Origin": origin})
        assert response.status == 201
        assert response.headers["Access-Control-Allow-Origin"] == origin
        exposed = response.headers["Access-Control-Expose-Headers"]
        assert "Location" in exposed and "ETag" in exposed and "Link" in exposed
        assert "Origin" in response.headers["Vary"]
    live = len(engine.sessions)

    _, offer = await new_offer(viewers)
    response = await client.post(
        "/whep", data=offer, headers={**SDP, "Origin": "https://evil.example.test"}
    )
    await assert_problem(response, 403)
    assert "Access-Control-Allow-Origin" not in response.headers
    assert len(engine.sessions) == live


async def test_cors_headers_are_on_errors_too(device: Device) -> None:
    _, _, client = device
    own = str(client.make_url("")).rstrip("/")
    response = await client.post("/whep", data="x", headers={"Origin": own})
    await assert_problem(response, 415)
    assert response.headers["Access-Control-Allow-Origin"] == own
