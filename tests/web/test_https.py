"""HTTPS by one setting (issue 23 item 8): ``[http] tls = "self-signed"``.

The whole appliance starts with it on a fresh state directory and serves the page, WHEP and the
API over real TLS on loopback; a client that trusts only the generated certificate verifies it
(as ``localhost`` and as 127.0.0.1), the fingerprint on ``/api/status`` is the one the server
presents, the key is 0600, and a second start keeps the same certificate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import hashlib
import logging
import ssl
import stat
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HostPort,
    HttpConfig,
    StateConfig,
    WebRtcConfig,
)
from ruseon_appliance.web import https_certificate
from tests.tooling import free_port

TOKEN = "https-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def config_at(state: Path) -> Config:
    return Config(
        cameras=(CameraConfig(source="synthetic", width=160, height=96, framerate=30,
                            keyframe_interval=30, bitrate=200_000),),
        http=HttpConfig(listen=HostPort("127.0.0.1", free_port()), tls="self-signed"),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        auth=AuthConfig(token=TOKEN),
        state=StateConfig(dir=str(state)))


async def fetch_status(config: Config, cafile: Path, *, server_hostname: str | None
                       ) -> tuple[dict[str, object], str]:
    """``/api/status`` over HTTPS trusting only ``cafile``, and the SHA-256 of the DER
    certificate the server presented."""
    context = ssl.create_default_context(cafile=str(cafile))
    # What Python 3.13 sets by default (RFC 5280 checks: key identifiers, basic constraints).
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    port = config.http.listen.port
    async with (aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http,
                http.get(f"https://127.0.0.1:{port}/api/status", headers=AUTH,
                         server_hostname=server_hostname) as response):
        assert response.status == 200, await response.text()
        status = await response.json()
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                              server_hostname=server_hostname or "127.0.0.1")
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    return status, hashlib.sha256(der).hexdigest()


async def test_self_signed_https_is_made_once_served_verified_and_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    config = config_at(state)
    cert_file, key_file = state / https_certificate.CERT_FILE, state / https_certificate.KEY_FILE
    caplog.set_level(logging.INFO, logger="ruseon")
    app = Appliance(config)
    await app.start()
    try:
        assert app.urls()[0].startswith("https://")
        for server_hostname in ("localhost", None):  # by name and by the 127.0.0.1 address
            status, presented = await fetch_status(config, cert_file,
                                                   server_hostname=server_hostname)
        https = status["https"]
        assert isinstance(https, dict)
        assert https["mode"] == "self-signed"
        assert str(https["fingerprint_sha256"]).replace(":", "").lower() == presented
        assert {"localhost", "127.0.0.1", "::1"} <= {*https["names"], *https["addresses"]}
        # Admin only: a viewer's status has no https section.
        context = ssl.create_default_context(cafile=str(cert_file))
        async with (aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http,
                    http.get(f"https://127.0.0.1:{config.http.listen.port}/api/status"
                             ) as response):
            assert response.status == 200
            assert "https" not in await response.json()
        # Plain HTTP is not served on that port.
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                await http.get(f"http://127.0.0.1:{config.http.listen.port}/healthz")
    finally:
        await app.stop()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    lines = [r.getMessage() for r in caplog.records if "HTTPS certificate" in r.getMessage()]
    assert len(lines) == 1 and https["fingerprint_sha256"] in lines[0] and "made now" in lines[0]
    first_pem = cert_file.read_bytes()

    # A second start keeps the certificate (the browser's exception keeps working).
    caplog.clear()
    config = dataclasses.replace(config, http=dataclasses.replace(
        config.http, listen=HostPort("127.0.0.1", free_port())))
    app = Appliance(config)
    await app.start()
    try:
        status, presented = await fetch_status(config, cert_file, server_hostname="localhost")
    finally:
        await app.stop()
    assert cert_file.read_bytes() == first_pem
    assert status["https"] == https
    lines = [r.getMessage() for r in caplog.records if "HTTPS certificate" in r.getMessage()]
    assert len(lines) == 1 and "made now" not in lines[0]


def test_made_again_only_for_a_new_hostname_expiry_or_damage(tmp_path: Path) -> None:
    now = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    first = https_certificate.load_or_create(tmp_path, "cam1", ["192.0.2.5", "fe80::1%eth0",
                                                                "0.0.0.0", "pi.lan"], now=now)
    assert first.generated
    assert first.names == ("cam1", "cam1.local", "localhost")
    assert first.addresses == ("192.0.2.5", "fe80::1", "127.0.0.1", "::1")
    cert = x509.load_pem_x509_certificate((tmp_path / https_certificate.CERT_FILE).read_bytes())
    assert cert.not_valid_after_utc - now == https_certificate.VALIDITY
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # The board's address changed (DHCP): kept.
    same = https_certificate.load_or_create(tmp_path, "cam1", ["192.0.2.99"], now=now)
    assert (same.fingerprint, same.generated) == (first.fingerprint, False)
    # Renamed: made again for the new name.
    renamed = https_certificate.load_or_create(tmp_path, "cam2", [], now=now)
    assert renamed.generated and renamed.fingerprint != first.fingerprint
    assert "cam2.local" in renamed.names
    # Near its end: made again.
    later = now + https_certificate.VALIDITY - datetime.timedelta(days=10)
    assert https_certificate.load_or_create(tmp_path, "cam2", [], now=later).generated
    # Damaged: made again.
    (tmp_path / https_certificate.KEY_FILE).write_text("not a key")
    assert https_certificate.load_or_create(tmp_path, "cam2", [], now=later).generated
    assert stat.S_IMODE((tmp_path / https_certificate.KEY_FILE).stat().st_mode) == 0o600
    # A fully qualified hostname: it, its short name and <short>.local.
    assert https_certificate.certificate_names("Cam3.Example.Org.") == (
        "cam3.example.org", "cam3", "cam3.local", "localhost")
