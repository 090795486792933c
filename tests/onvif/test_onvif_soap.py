"""The ONVIF SOAP endpoint against what a client should never get through: entity tricks,
oversized or malformed bodies, unknown operations, replayed or stale UsernameTokens. Raw HTTP
on a running Appliance, and the verifier alone for the clock rules."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import hashlib
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from ruseon_appliance.access.policy import Access, Role
from ruseon_appliance.app import Appliance
from ruseon_appliance.config import ConfigError, OnvifConfig, load_config
from ruseon_appliance.onvif.operations import (
    DEVICE,
    EVENTS,
    MEDIA,
    NOTIFICATION,
    OPERATIONS,
    answered,
)
from ruseon_appliance.onvif.security import CLOCK_SKEW_S, Account, UsernameTokenVerifier
from ruseon_appliance.onvif.soap import MAX_BODY_BYTES, NAMESPACES, SOAP_ENV
from tests.onvif.conftest import SECRET, appliance_config

ENV = (f'<s:Envelope xmlns:s="{SOAP_ENV}" xmlns:tds="{DEVICE}" xmlns:trt="{MEDIA}">'
       "{header}<s:Body>{body}</s:Body></s:Envelope>")


def token(password: str, *, created: dt.datetime | None = None, nonce: bytes | None = None,
          user: str = "admin") -> str:
    nonce = nonce or os.urandom(16)
    stamp = (created or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    digest = base64.b64encode(hashlib.sha1(nonce + stamp.encode() + password.encode())
                              .digest()).decode()
    return (f'<s:Header><wsse:Security xmlns:wsse="{NAMESPACES["wsse"]}" '
            f'xmlns:wsu="{NAMESPACES["wsu"]}"><wsse:UsernameToken>'
            f"<wsse:Username>{user}</wsse:Username><wsse:Password Type=\"http://docs.oasis-open"
            ".org/wss/2004/01/oasis-200401-wss-username-token-profile-1.0#PasswordDigest\">"
            f"{digest}</wsse:Password><wsse:Nonce>{base64.b64encode(nonce).decode()}"
            f"</wsse:Nonce><wsu:Created>{stamp}</wsu:Created></wsse:UsernameToken>"
            "</wsse:Security></s:Header>")


async def post(app: Appliance, data: bytes | str, path: str = "/onvif/device_service"
               ) -> tuple[int, str, ET.Element | None]:
    url = f"http://127.0.0.1:{app.config.http.listen.port}{path}"
    async with aiohttp.ClientSession() as http, http.post(
            url, data=data, headers={"Content-Type": "application/soap+xml"}) as response:
        text = await response.text()
        assert response.content_type == "application/soap+xml"
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        root = None
    return response.status, text, root


def subcode(root: ET.Element | None) -> str:
    assert root is not None
    values = [v.text or "" for v in root.iter(f"{{{SOAP_ENV}}}Value")]
    return values[1].rpartition(":")[2] if len(values) > 1 else ""


XXE = ('<?xml version="1.0"?><!DOCTYPE s [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
       + ENV.format(header="", body="<tds:GetHostname>&x;</tds:GetHostname>"))
LAUGHS = ('<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
          + "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">'
                    for i in range(8))
          + "]>" + ENV.format(header="", body="<tds:GetHostname>&i;</tds:GetHostname>"))


@pytest.mark.parametrize("body, expected", [
    (XXE, "InvalidArgs"),
    (LAUGHS, "InvalidArgs"),
    ("<s:Envelope", "WellFormed"),
    (b"\xff\xfe<\x00", "InvalidArgs"),
    ("<Envelope/>", "InvalidArgs"),
    (ENV.format(header="", body=""), "InvalidArgs"),
    (ENV.format(header="", body="<tds:FormatTheDisk/>"), "ActionNotSupported"),
    (ENV.format(header="", body="<tt:GetHostname xmlns:tt='urn:other'/>"),
     "ActionNotSupported"),
    ("x" * (MAX_BODY_BYTES + 1), "InvalidArgs"),
])
async def test_bad_requests_get_a_soap_fault_with_400(appliance: Appliance, body: str | bytes,
                                                      expected: str) -> None:
    status, text, root = await post(appliance, body)
    assert status == 400, text
    assert subcode(root) == expected, text
    assert "root:" not in text  # nothing of /etc/passwd


async def test_a_digest_token_is_good_once(appliance: Appliance) -> None:
    header = token(SECRET)
    request = ENV.format(header=header, body="<tds:GetDeviceInformation/>")
    status, text, _ = await post(appliance, request)
    assert status == 200 and "<tds:SerialNumber>" in text
    status, text, root = await post(appliance, request)  # the same nonce again: a replay
    assert status == 400 and subcode(root) == "NotAuthorized" and "already used" in text
    # Either path serves either service; the media service's operations need a token too.
    status, text, root = await post(appliance, ENV.format(header="", body="<trt:GetProfiles/>"),
                                    "/onvif/media_service")
    assert status == 400 and subcode(root) == "NotAuthorized"
    status, text, _ = await post(appliance, ENV.format(header=token(SECRET),
                                                       body="<trt:GetProfiles/>"))
    assert status == 200 and text.count("<trt:Profiles ") == 2


def test_every_operation_is_classified_and_nothing_that_changes_state_is_open() -> None:
    # A PullPoint's own creation and re-sync change nothing of the device (bounded, expiring).
    subscription = {(EVENTS, "CreatePullPointSubscription"), (EVENTS, "SetSynchronizationPoint")}
    for (service, name), access in OPERATIONS.items():
        assert service in (DEVICE, MEDIA, EVENTS, NOTIFICATION)
        changes = name.startswith(("Set", "Create", "Delete", "Add", "Remove", "System",
                                   "Upgrade", "Start", "Stop", "Restore", "Load", "Send",
                                   "Subscribe", "Seek")) and (service, name) not in subscription
        if changes:
            assert access == Access.ADMIN and not answered(service, name), name
        if access == Access.OPEN:
            assert name == "GetSystemDateAndTime"
    assert OPERATIONS[DEVICE, "GetUsers"] == Access.ADMIN


def _verifier(now: float, synchronized: bool) -> UsernameTokenVerifier:
    return UsernameTokenVerifier(lambda: [Account("admin", SECRET, Role.ADMIN)],
                                 clock=lambda: now, synchronized=lambda: synchronized)


def _header(text: str) -> ET.Element:
    root = ET.fromstring(ENV.format(header=text, body="<tds:GetHostname/>"))
    header = root.find(f"{{{SOAP_ENV}}}Header")
    assert header is not None
    return header


def test_the_clock_window_holds_while_the_device_clock_is_synchronized() -> None:
    now = dt.datetime.now(dt.UTC)
    far = now - dt.timedelta(hours=7)
    near = now - dt.timedelta(seconds=CLOCK_SKEW_S - 10)
    synced = _verifier(now.timestamp(), True)
    assert synced.role_of(_header(token(SECRET, created=near))) == (Role.ADMIN, "admin")
    with pytest.raises(Exception, match="too far from this device's clock"):
        synced.role_of(_header(token(SECRET, created=far)))
    # A Pi that booted without a time source: Home Assistant's own clock is let through.
    unsynced = _verifier(now.timestamp(), False)
    assert unsynced.role_of(_header(token(SECRET, created=far))) == (Role.ADMIN, "admin")
    replay = token(SECRET, created=far, nonce=b"0123456789abcdef")
    unsynced.role_of(_header(replay))
    with pytest.raises(Exception, match="already used"):
        unsynced.role_of(_header(replay))
    with pytest.raises(Exception, match="wrong user name or password"):
        unsynced.role_of(_header(token("not-it")))
    assert unsynced.role_of(_header("<s:Header/>")) == (None, "")


def test_onvif_is_off_by_default_and_read_from_toml(tmp_path: Path) -> None:
    assert load_config(tmp_path / "absent.toml", env={}).onvif == OnvifConfig()
    assert OnvifConfig().enable is False
    secret = tmp_path / "onvif-password"
    secret.write_text("from-a-file\n")
    path = tmp_path / "ruseon.toml"
    path.write_text(f'[onvif]\nenable = true\nusername = "nvr"\npassword_file = "{secret}"\n')
    config = load_config(path, env={})
    assert config.onvif.enable and config.onvif.username == "nvr"
    assert config.onvif.resolve_password() == "from-a-file"
    path.write_text("[onvif]\nport = 80\n")
    with pytest.raises(ConfigError, match=r"onvif\.port"):
        load_config(path, env={})


async def test_onvif_routes_exist_only_when_enabled(tmp_path: Path) -> None:
    config = appliance_config(tmp_path, rtsp=False)
    app = Appliance(dataclasses.replace(config, onvif=OnvifConfig()))
    await app.start()
    try:
        assert app.onvif is None
        url = f"http://127.0.0.1:{config.http.listen.port}/onvif/device_service"
        async with aiohttp.ClientSession() as http, http.post(url, data=b"<x/>") as response:
            assert response.status in (404, 405)
    finally:
        await app.stop()


def test_the_onvif_room_imports_nothing_of_the_engine() -> None:
    code = ("import sys, ruseon_appliance.onvif; print(sorted(m for m in sys.modules "
            "if m.startswith(('ruseon_appliance.engine', 'ruseon_appliance.capture', "
            "'ruseon_appliance.cameras'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=Path(__file__).parents[2])
    assert result.stdout.strip() == "[]"


async def test_a_request_in_small_chunks_is_read_whole_and_a_long_one_refused(
        appliance: Appliance) -> None:
    request = ENV.format(header="", body="<tds:GetSystemDateAndTime/>").encode()
    padded = request.replace(b"<s:Body>", b"<s:Body>" + b" " * 3000)

    async def chunks(data: bytes, size: int = 100) -> AsyncIterator[bytes]:
        for start in range(0, len(data), size):
            await asyncio.sleep(0.001)
            yield data[start:start + size]

    url = f"http://127.0.0.1:{appliance.config.http.listen.port}/onvif/device_service"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=chunks(padded)) as response:  # chunked, no length
            assert response.status == 200, await response.text()
            assert "<tt:UTCDateTime>" in await response.text()
        huge = padded.replace(b"<s:Body>", b"<s:Body>" + b" " * MAX_BODY_BYTES)
        async with http.post(url, data=chunks(huge, 8192)) as response:
            assert response.status == 400 and "larger than" in await response.text()
