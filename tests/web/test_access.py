"""Access control from a stranger's side: every route of a fully configured appliance, asked
with no credential, a wrong one, the viewer token, the admin secret and a foreign Host, over real
HTTP; the page's login cookie; brute-force throttling; CORS; the admin secret's file and CLI."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from ruseon_appliance.access import secret as secret_file
from ruseon_appliance.access.hosts import HostAllowList
from ruseon_appliance.access.policy import HTTP_ROUTES, Access, classify
from ruseon_appliance.access.sessions import COOKIE_NAME
from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    OnvifConfig,
    RecordingConfig,
    RelayConfig,
    StateConfig,
    SubstreamConfig,
    WebRtcConfig,
)
from ruseon_appliance.engine.engine import Engine
from ruseon_appliance.web.app import make_app
from tests.web.conftest import ADMIN_SECRET, Viewer, new_offer, running_engine, serving, web_config
from tests.web.test_whep import SDP, assert_problem

Device = tuple[Any, Engine, TestClient[Any, Any]]
VIEWER_TOKEN = "viewer-token-shared-0123"
EXTRA_ORIGIN = "https://console.example.test"
FOREIGN_HOST = "rebind.example"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def full_appliance(tmp_path: Path, viewing: str, *, token: str = ADMIN_SECRET
                         ) -> AsyncIterator[tuple[Appliance, str]]:
    """An in-process appliance with every room that adds routes: two cameras (with motion
    detection, the default; the first with a sub-stream), HLS, continuous recording, a relay
    (to a local UDP socket nobody reads) and the ONVIF device (no discovery: no multicast
    here)."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    common: dict[str, Any] = {"source": "synthetic", "width": 160, "height": 96,
                              "framerate": 15, "keyframe_interval": 15, "bitrate": 200_000}
    port = free_port()
    config = Config(
        cameras=(CameraConfig(name="front", substream=SubstreamConfig("on", 80, 48), **common),
                 CameraConfig(name="side", **common)),
        http=HttpConfig(listen=HostPort("127.0.0.1", port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        auth=AuthConfig(token=token, viewing=viewing, viewer_token=VIEWER_TOKEN),
        hls=HlsConfig(part_duration_s=0.5, window_s=6.0),
        recording=RecordingConfig(continuous=True, segment_s=2),
        relay=(RelayConfig(name="janus", url=f"rtp://127.0.0.1:{sink.getsockname()[1]}",
                           srtp_key="A" * 40),),
        onvif=OnvifConfig(enable=True, discovery=False),
    )
    app = Appliance(config)
    await app.start()
    try:
        yield app, f"http://127.0.0.1:{port}"
    finally:
        await app.stop()
        sink.close()


def concrete(method: str, pattern: str) -> tuple[str, str]:
    """A request that reaches the route (method, canonical path pattern)."""
    if pattern == "/static":
        return "GET", "/static/device.js"
    path = (pattern.replace("{camera}", "front").replace("{id}", "no-such-session")
            .replace("{stream}", "sub")
            .replace("{name}", "janus" if pattern.startswith("/relay/") else "index.m3u8")
            .replace("{tail:.*}", "index.m3u8"))
    return ("PUT" if method == "*" else method), path


CREDENTIALS = {
    "none": {},
    "wrong": {"Authorization": "Bearer not-the-secret-at-all"},
    "viewer": {"Authorization": f"Bearer {VIEWER_TOKEN}"},
    "admin": {"Authorization": f"Bearer {ADMIN_SECRET}"},
}


def expected_denial(access: Access, who: str, viewing: str, method: str = "GET",
                    path: str = "") -> int | None:
    """The status a request must get, or None when it must pass access control."""
    if access == Access.OPEN:
        # Who-am-I judges a presented Bearer like every route does (no guessing oracle).
        wrong_whoami = who == "wrong" and path == "/api/session" and method in ("GET", "HEAD")
        return 401 if wrong_whoami else None
    if who == "wrong":
        return 401
    if access == Access.ADMIN:
        return {"none": 401, "viewer": 403}.get(who)
    if who == "none" and viewing == "credential":
        return 401
    return None


@pytest.mark.parametrize("viewing", ["open", "credential"])
async def test_every_route_by_credential_and_host(tmp_path: Path, viewing: str) -> None:
    async with full_appliance(tmp_path, viewing) as (app, base):
        assert app._runner is not None
        routes = sorted({(r.method, r.resource.canonical)
                         for r in app._runner.app.router.routes() if r.resource is not None})
        # Every room that adds routes is there, and every route has a level.
        patterns = {p for _, p in routes}
        for needed in ("/api/camera/front/controls", "/relay/{name}.sdp", "/recordings",
                       "/hls/side/index.m3u8", "/hls/side/multivariant.m3u8", "/whep/{camera}",
                       "/whep/{camera}/{stream}",
                       "/api/session", "/metrics",
                       "/onvif/device_service", "/api/events", "/api/camera/side/motion",
                       "/api/camera/side/audio", "/api/camera/audio",
                       "/api/events/stream"):
            assert needed in patterns, needed
        assert all(classify(m, p) is not None for m, p in routes)
        checked = 0
        # Not following redirects, not sending cookies: each request stands alone.
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            for route_method, pattern in routes:
                access = classify(route_method, pattern)
                assert access is not None
                method, path = concrete(route_method, pattern)
                if method == "OPTIONS":
                    continue  # never authenticated (preflights): tested below
                for who, headers in CREDENTIALS.items():
                    async with http.request(method, base + path, headers=headers,
                                            allow_redirects=False) as response:
                        denial = expected_denial(access, who, viewing, method, path)
                        where = f"{method} {path} as {who} ({access.name}, viewing {viewing})"
                        if denial is None:
                            assert response.status not in (401, 403, 421, 429), where
                        else:
                            assert response.status == denial, where
                            if denial == 401:
                                assert response.headers["WWW-Authenticate"].startswith(
                                    "Bearer"), where
                    checked += 1
                # A foreign Host (DNS rebinding) is refused before anything, even with the
                # admin secret.
                async with http.request(method, base + path, allow_redirects=False, headers={
                        **CREDENTIALS["admin"], "Host": FOREIGN_HOST}) as response:
                    assert response.status == 421, f"{method} {path} with a foreign Host"
                    if method != "HEAD":
                        assert "DNS rebinding" in (await response.json())["detail"]
        assert checked >= 4 * 25
        # The wrong-credential requests above counted, and show in the metrics.
        async with http_admin() as admin, admin.get(base + "/metrics") as response:
            text = await response.text()
        assert re.search(r'ruseon_auth_failures_total\{protocol="http"\} [1-9]', text)


def http_admin() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(headers=CREDENTIALS["admin"])


async def test_status_shows_a_stranger_counts_and_the_admin_everything(tmp_path: Path) -> None:
    async with full_appliance(tmp_path, "open") as (_app, base):
        viewer = Viewer()
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(base + "/whep", data=await viewer.offer(),
                                     headers=SDP) as response:
                    assert response.status == 201
                    session_url = response.headers["Location"]
                async with http.get(base + "/api/status") as response:
                    stranger = await response.json()
                async with http.get(base + "/api/status", headers=CREDENTIALS["admin"]) as r:
                    admin = await r.json()
                # And the relay's SDP, with its SRTP key, only for admin.
                async with http.get(base + "/relay/janus.sdp") as response:
                    assert response.status == 401
                    assert "inline:" not in await response.text()
                async with http.get(base + "/relay/janus.sdp",
                                    headers=CREDENTIALS["admin"]) as response:
                    assert "a=crypto" in await response.text()
        finally:
            await viewer.close()
        session_id = session_url.rsplit("/", 1)[1]
        text = repr(stranger)
        assert session_id not in text and "127.0.0.1" not in text
        # Counts only (tests/web/test_audience.py: each way of watching).
        assert stranger["viewers"] == {"count": 1, "by_transport": {
            "webrtc": 1, "hls": 0, "rtsp": 0, "relays": 1}}
        assert stranger["access"] == {"viewing": "open", "role": "none"}
        for admin_only in ("relays", "errors", "integrations", "rtsp"):
            assert admin_only not in stranger, admin_only
        assert set(stranger["webrtc"]) == {"fingerprint", "udp_port", "max_viewers"}
        # What the page shows a viewer is still there.
        assert stranger["device"]["hostname"] and stranger["cameras"]
        assert "recording" in stranger and "source" in stranger
        assert session_id in repr(admin)
        assert admin["access"]["role"] == "admin" and "relays" in admin


@pytest.mark.parametrize("device", [{"auth": {"token": ADMIN_SECRET, "viewing": "credential",
                                              "viewer_token": VIEWER_TOKEN}}], indirect=True)
async def test_whep_needs_a_credential_when_viewing_does(
    device: Device, viewers: list[Viewer]
) -> None:
    _, engine, client = device
    for headers in ({}, {"Authorization": "Bearer wrong"},
                    {"Authorization": f"Basic {VIEWER_TOKEN}"}, {"Authorization": "Bearer"}):
        _, offer = await new_offer(viewers)
        response = await client.post("/whep", data=offer, headers={**SDP, **headers})
        await assert_problem(response, 401)
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert not engine.sessions
    for token in (VIEWER_TOKEN, ADMIN_SECRET):
        _, offer = await new_offer(viewers)
        response = await client.post("/whep", data=offer, headers={
            **SDP, "Authorization": f"bearer {token}"})  # the scheme is case-blind
        assert response.status == 201, await response.text()
        location = response.headers["Location"]
        await assert_problem(await client.delete(location), 401)
        assert (await client.delete(location, headers={
            "Authorization": f"Bearer {token}"})).status == 200
    assert not engine.sessions


async def test_a_stranger_gets_no_sub_stream_either(tmp_path: Path) -> None:
    """The sub-stream is the picture too: by path, by query, as a snapshot, it needs the
    credential viewing asks for, and the viewer token is enough."""
    async with full_appliance(tmp_path, "credential") as (app, base):
        front = app.cameras.get("front")
        assert front is not None and front.sub is not None
        assert await front.sub.wait_first_frame(30)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            for who in ("none", "wrong", "viewer"):
                for url in ("/whep/front/sub", "/whep/front?stream=sub", "/whep?stream=sub"):
                    viewer = Viewer()
                    try:
                        async with http.post(base + url, data=await viewer.offer(), headers={
                                **SDP, **CREDENTIALS[who]}) as response:
                            expected = 201 if who == "viewer" else 401
                            assert response.status == expected, (who, url)
                            location = response.headers.get("Location")
                        if location:
                            async with http.delete(base + location,
                                                   headers=CREDENTIALS[who]) as response:
                                assert response.status == 200
                    finally:
                        await viewer.close()
                for url in ("/snapshot/front.jpg?stream=sub", "/snapshot.jpg?stream=sub"):
                    async with http.get(base + url, headers=CREDENTIALS[who]) as response:
                        if who == "viewer":
                            assert response.status in (200, 503), url  # 503: no keyframe yet
                        else:
                            assert response.status == 401, (who, url)
                            assert response.content_type != "image/jpeg"


async def test_page_login_cookie_origin_check_and_logout(tmp_path: Path) -> None:
    async with full_appliance(tmp_path, "open") as (_, base), aiohttp.ClientSession(
            base_url=base, cookie_jar=aiohttp.CookieJar(unsafe=True)) as client:
        async with client.get("/api/session") as response:
            assert await response.json() == {"role": "none", "viewing": "open", "https": False}
        # A wrong secret says so, and sets nothing.
        response = await client.post("/api/session", json={"secret": "wrong"})
        await assert_problem(response, 401)
        assert (await response.json())["detail"] == "that secret is not valid"
        assert COOKIE_NAME not in response.cookies
        await assert_problem(await client.post("/api/session", data="not json"), 400)
        # The viewer token logs in as a viewer: it cannot administer.
        response = await client.post("/api/session", json={"secret": VIEWER_TOKEN})
        assert (await response.json())["role"] == "viewer"
        await assert_problem(await client.get("/api/camera/controls"), 403)
        # The admin secret: an HttpOnly, SameSite=Strict cookie for the whole site.
        response = await client.post("/api/session", json={"secret": ADMIN_SECRET})
        assert response.status == 200 and (await response.json())["role"] == "admin"
        header = response.headers["Set-Cookie"]
        assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/" in header
        assert "Secure" not in header  # plain HTTP here; Secure under HTTPS
        assert (await client.get("/api/camera/controls")).status == 200
        assert (await (await client.get("/api/session")).json())["role"] == "admin"
        # A change made with the cookie must come from the page's own origin.
        change = {"brightness": 0.25}
        await assert_problem(await client.patch("/api/camera/controls", json=change), 403)
        await assert_problem(await client.patch("/api/camera/controls", json=change,
                                                headers={"Origin": EXTRA_ORIGIN}), 403)
        await assert_problem(await client.post("/api/recording/stop",
                                               headers={"Origin": f"http://{FOREIGN_HOST}"}),
                             403)
        response = await client.patch("/api/camera/controls", json=change,
                                      headers={"Origin": base})
        assert response.status == 200, await response.text()
        # Logout ends it.
        assert (await client.delete("/api/session", headers={"Origin": base})).status == 204
        await assert_problem(await client.get("/api/camera/controls"), 401)
        # A made-up cookie is no credential.
        client.cookie_jar.update_cookies({COOKIE_NAME: "guessed"})
        await assert_problem(await client.get("/api/camera/controls"), 401)


async def test_the_eleventh_wrong_secret_waits_and_others_are_served(tmp_path: Path) -> None:
    async with running_engine(web_config(), tmp_path) as (capture, engine):
        app = make_app(web_config(), engine, capture, started=0.0)
        async with serving(app) as client:
            base = str(client.make_url("")).rstrip("/")
            wrong = {"Authorization": "Bearer guess"}
            for _ in range(10):
                await assert_problem(await client.get("/metrics", headers=wrong), 401)
            # The 11th try waits, whatever it presents, and says how long.
            for headers in (wrong, CREDENTIALS["admin"]):
                response = await client.get("/metrics", headers=headers)
                await assert_problem(response, 429)
                assert int(response.headers["Retry-After"]) >= 1
            response = await client.post("/api/session", json={"secret": ADMIN_SECRET})
            await assert_problem(response, 429)
            # Asking who one is with a guess is no way around it.
            await assert_problem(await client.get("/api/session", headers=wrong), 429)
            # Viewing (open) is not held up for that address.
            assert (await client.get("/snapshot.jpg")).status in (200, 503)
            # Another address is served at once.
            other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
            async with aiohttp.ClientSession(connector=other) as http, http.get(
                    base + "/metrics", headers=CREDENTIALS["admin"]) as response:
                assert response.status == 200
                text = await response.text()
            assert 'ruseon_auth_failures_total{protocol="http"} 10.0' in text
            assert 'ruseon_auth_throttled_total{protocol="http"} 4.0' in text
            assert "ruseon_auth_addresses_waiting 1.0" in text


async def test_a_route_without_an_access_level_stops_start_up(tmp_path: Path) -> None:
    async with running_engine(web_config(), tmp_path) as (capture, engine):
        app = make_app(web_config(), engine, capture, started=0.0)

        async def secret_thing(request: web.Request) -> web.Response:
            return web.Response(text="nobody classified me")

        app.router.add_post("/api/brand-new", secret_thing)
        runner = web.AppRunner(app)
        with pytest.raises(RuntimeError, match="POST /api/brand-new"):
            await runner.setup()
        await runner.cleanup()


def test_the_route_table_has_no_dead_rules_and_admin_covers_every_change() -> None:
    # Every state-changing method outside the picture (WHEP sessions) and the login is admin;
    # ONVIF's SOAP POSTs authenticate inside the envelope, each operation classified in
    # onvif/operations.py (tests/onvif/test_onvif_soap.py holds that table to the same rule).
    for methods, pattern, access in HTTP_ROUTES:
        if methods & {"POST", "PATCH", "DELETE", "PUT"} and access != Access.ADMIN:
            assert pattern.startswith(("/whep", "/onvif/")) or pattern == "/api/session", \
                pattern


def test_host_allow_list() -> None:
    hosts = HostAllowList(["cam.example.org"], hostname="garden-cam")
    for ok in ("192.168.1.20:8080", "[fe80::1]:8080", "[::1]", "localhost:8080",
               "garden-cam", "GARDEN-CAM.local:8080", "cam.example.org", "app.localhost",
               "garden-cam.local.", None):
        assert hosts.allows(ok), ok
    for bad in ("rebind.example", "garden-cam.evil.example", "192.168.1.20.nip.io", "",
                "cam.example.org.evil"):
        assert not hosts.allows(bad), bad


async def test_preflight_and_options_need_no_credential(tmp_path: Path) -> None:
    config = web_config(auth={"token": ADMIN_SECRET, "viewing": "credential"})
    async with running_engine(config, tmp_path) as (capture, engine), serving(
            make_app(config, engine, capture, started=0.0)) as client:
        origin = str(client.make_url("")).rstrip("/")
        response = await client.options("/whep", headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        })
        assert response.status == 204
        assert response.headers["Access-Control-Allow-Origin"] == origin
        allowed = response.headers["Access-Control-Allow-Headers"].lower()
        assert "authorization" in allowed and "content-type" in allowed
        assert response.headers["Accept-Post"] == "application/sdp"
        assert (await client.options("/whep")).status == 204


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
    # The page's origin is no longer whatever Host the client names (DNS rebinding).
    _, offer = await new_offer(viewers)
    response = await client.post("/whep", data=offer, headers={
        **SDP, "Host": FOREIGN_HOST, "Origin": f"http://{FOREIGN_HOST}"})
    await assert_problem(response, 421)
    assert len(engine.sessions) == live


async def test_cors_headers_are_on_errors_too(device: Device) -> None:
    _, _, client = device
    own = str(client.make_url("")).rstrip("/")
    response = await client.post("/whep", data="x", headers={"Origin": own})
    await assert_problem(response, 415)
    assert response.headers["Access-Control-Allow-Origin"] == own


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruseon_appliance", *args], text=True,
                          capture_output=True, timeout=60, check=False,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("RUSEON_")})


async def test_first_start_makes_the_secret_0600_and_rotation_ends_admin_logins(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with full_appliance(tmp_path, "open", token="") as (_app, base):
        path = state / secret_file.FILE_NAME
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        made = path.read_text().strip()
        assert len(made) >= 22 and re.fullmatch(r"[A-Za-z0-9_-]+", made)
        printed = await asyncio.to_thread(run_cli, "admin-secret", "--state-dir", str(state))
        assert printed.returncode == 0 and printed.stdout.strip() == made
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.post(base + "/api/session", json={"secret": made}) as response:
                assert response.status == 200
            async with http.get(base + "/api/camera/controls") as response:
                assert response.status == 200  # by the cookie
            rotated = await asyncio.to_thread(run_cli, "admin-secret", "--rotate",
                                              "--state-dir", str(state))
            assert rotated.returncode == 0, rotated.stderr
            new = rotated.stdout.strip()
            assert new != made and path.read_text().strip() == new
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            for _ in range(100):  # the service looks every 2 s
                async with http.get(base + "/api/camera/controls") as response:
                    if response.status == 401:
                        break
                await asyncio.sleep(0.1)
            assert response.status == 401, "the old admin login still works after rotation"
            async with http.get(base + "/metrics",
                                headers={"Authorization": f"Bearer {made}"}) as response:
                assert response.status == 401
            async with http.get(base + "/metrics",
                                headers={"Authorization": f"Bearer {new}"}) as response:
                assert response.status == 200
    # A second start keeps the (rotated) secret.
    async with full_appliance(tmp_path, "open", token=""):
        assert (state / secret_file.FILE_NAME).read_text().strip() == new


def test_cli_refuses_to_rotate_a_configured_token(tmp_path: Path) -> None:
    result = run_cli("admin-secret", "--rotate", "--state-dir", str(tmp_path),
                     "--token", "configured-token-0123456")
    assert result.returncode == 2 and "auth.token" in result.stderr
    assert not (tmp_path / secret_file.FILE_NAME).exists()
    shown = run_cli("admin-secret", "--state-dir", str(tmp_path),
                    "--token", "configured-token-0123456")
    assert shown.stdout.strip() == "configured-token-0123456"


def test_a_short_or_empty_secret_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / secret_file.FILE_NAME
    path.write_text("abc\n")
    value, made = secret_file.ensure_secret(path)
    assert made and len(value) >= 22 and path.read_text().strip() == value
    assert secret_file.ensure_secret(path) == (value, False)


def test_the_shared_viewer_token_does_not_reset_guesses_at_the_admin_secret() -> None:
    from ruseon_appliance.access.policy import Role
    from ruseon_appliance.access.throttle import FailureThrottle

    now = [0.0]
    throttle = FailureThrottle(clock=lambda: now[0])
    for _ in range(9):
        throttle.failed("192.0.2.7")
    throttle.succeeded("192.0.2.7", Role.VIEWER)  # a viewer-token holder guessing
    throttle.failed("192.0.2.7")
    assert throttle.retry_after("192.0.2.7") == 1
    # The admin secret itself starts the count again; quiet addresses are forgotten.
    throttle.succeeded("192.0.2.7", Role.ADMIN)
    assert throttle.retry_after("192.0.2.7") is None
    for _ in range(10):
        throttle.failed("2001:db8::1")
    assert throttle.retry_after("2001:db8::ffff") == 1  # the same /64
    now[0] += 10_000
    assert throttle.retry_after("2001:db8::1") is None
