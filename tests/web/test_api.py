"""/api/status, /healthz, /snapshot.jpg, /metrics and the device page, against the real engine
and the synthetic source."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import re
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import av
from aiohttp import web
from aiohttp.test_utils import TestClient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ruseon_appliance import __version__
from ruseon_appliance.engine.engine import Engine
from ruseon_appliance.web.app import DEVICE_API
from tests.web.conftest import ADMIN, SOURCE_HEIGHT, SOURCE_WIDTH, Viewer, new_offer
from tests.web.test_whep import SDP, assert_problem

Device = tuple[Any, Engine, TestClient[Any, Any]]


async def connected_viewer(client: TestClient[Any, Any], viewers: list[Viewer]) -> str:
    """A viewer that completed the exchange and received a frame; returns its session URL."""
    viewer, offer = await new_offer(viewers)
    response = await client.post("/whep", data=offer, headers=SDP)
    assert response.status == 201
    await viewer.accept(await response.text())
    track = await asyncio.wait_for(viewer.track, 10)
    await asyncio.wait_for(track.recv(), 10)
    return str(response.headers["Location"])


async def test_status_reports_device_source_viewers_and_webrtc(
    device: Device, viewers: list[Viewer]
) -> None:
    _, engine, client = device
    location = await connected_viewer(client, viewers)
    response = await client.get("/api/status", headers=ADMIN)
    assert response.status == 200
    status = await response.json()
    assert status["device"]["version"] == __version__
    assert 0 < status["uptime_s"] < 600
    source = status["source"]
    assert source["kind"] == "synthetic"
    assert (source["width"], source["height"]) == (SOURCE_WIDTH, SOURCE_HEIGHT)
    assert re.fullmatch(r"[0-9a-f]{6}", source["profile_level_id"])
    assert source["fps"] > 0 and source["bitrate"] > 0
    assert source["keyframe_age_s"] is not None
    assert status["webrtc"]["fingerprint"] == engine.fingerprint
    assert status["webrtc"]["fingerprint"].startswith("sha-256 ")
    assert status["webrtc"]["udp_port"] == engine.udp_port > 0
    assert status["viewers"]["count"] == 1
    (session,) = status["viewers"]["sessions"]
    assert location.endswith(session["id"])
    assert session["stats"]["packets_sent"] > 0
    assert "http" in status["errors"]


async def test_status_counts_errors(device: Device) -> None:
    _, _, client = device
    await client.post("/whep", data="x", headers={"Content-Type": "text/plain"})
    status = await (await client.get("/api/status", headers=ADMIN)).json()
    assert status["errors"]["http"]["415"] == 1


async def test_healthz_is_200_while_frames_flow_and_503_with_a_reason_when_they_stop(
    device: Device,
) -> None:
    capture, _, client = device
    response = await client.get("/healthz")
    assert response.status == 200
    await capture.stop()
    # Stopped: no new frame arrives; make the newest one old rather than wait for it.
    capture.last_frame_monotonic -= 60
    problem = await assert_problem(await client.get("/healthz"), 503)
    assert "no frame" in problem["detail"]


async def test_snapshot_is_a_jpeg_of_the_source_cached_per_keyframe(device: Device) -> None:
    capture, _, client = device
    response = await client.get("/snapshot.jpg")
    assert response.status == 200
    assert response.content_type == "image/jpeg"
    body = await response.read()
    decoder = av.CodecContext.create("mjpeg", "r")
    (picture,) = list(decoder.decode(av.Packet(body)))
    assert (picture.width, picture.height) == (SOURCE_WIDTH, SOURCE_HEIGHT)

    snapshot = client.app[DEVICE_API].snapshot
    decodes = snapshot.decodes
    tags = set()
    for _ in range(20):  # far faster than keyframes come and than the rate limit allows
        again = await client.get("/snapshot.jpg")
        tags.add(again.headers["ETag"])
    assert snapshot.decodes - decodes <= 1
    assert len(tags) <= 2
    assert snapshot.cached is not None
    assert capture.ring.newest_keyframe_seq is not None


def parse_metrics(text: str) -> dict[str, float]:
    """``{sample name with labels: value}`` from the Prometheus text format."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        samples[name] = float(value)
    return samples


async def test_metrics_in_prometheus_text_format(device: Device, viewers: list[Viewer]) -> None:
    _, _, client = device
    location = await connected_viewer(client, viewers)
    response = await client.get("/metrics", headers=ADMIN)
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = await response.text()
    for line in text.splitlines():
        assert line.startswith("#") or re.fullmatch(
            r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]\w*="[^"]*",?)*\})? \S+', line
        ), line
    samples = parse_metrics(text)
    assert samples["ruseon_viewers"] == 1
    assert samples["ruseon_sessions_started_total"] == 1
    assert samples["ruseon_sent_packets_total"] > 0
    assert samples["ruseon_sent_bytes_total"] > 0
    assert samples["ruseon_frames_captured_total"] > 0
    assert "ruseon_frames_dropped_total" in samples
    assert "ruseon_ring_overruns_total" in samples
    assert samples["ruseon_handshake_seconds_count"] == 1
    assert samples['ruseon_handshake_seconds_bucket{le="+Inf"}'] == 1
    assert samples["ruseon_whep_answer_seconds_count"] == 1
    assert samples["process_resident_memory_bytes"] > 1e6
    assert samples["process_cpu_seconds_total"] > 0
    assert any(k.startswith("ruseon_udp_packets_dropped_total") for k in samples) or (
        "# TYPE ruseon_udp_packets_dropped_total counter" in text
    )

    assert (await client.delete(location)).status == 200
    samples = parse_metrics(await (await client.get("/metrics", headers=ADMIN)).text())
    assert samples["ruseon_viewers"] == 0
    assert samples['ruseon_sessions_ended_total{reason="delete"}'] == 1
    # Sent totals do not go backwards when the session ends.
    assert samples["ruseon_sent_packets_total"] > 0


async def test_device_page_is_served_with_its_player(device: Device) -> None:
    _, _, client = device
    page = await (await client.get("/")).text()
    assert "<video" in page and "autoplay" in page and "muted" in page and "playsinline" in page
    for asset in ("/static/device.js", "/static/whep.js", "/static/device.css"):
        response = await client.get(asset)
        assert response.status == 200, asset


async def test_https_when_a_certificate_is_configured(
    device: Device, viewers: list[Viewer], tmp_path: Path
) -> None:
    """The same app behind TLS (as app.py serves it when http.tls_cert/tls_key are set)."""
    _, _, plain = device
    cert, key = self_signed_certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    runner = web.AppRunner(plain.app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls)
    await site.start()
    port = runner.addresses[0][1]
    client_tls = ssl.create_default_context(cafile=str(cert))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"https://127.0.0.1:{port}/healthz", ssl=client_tls) as r:
                assert r.status == 200
            _, offer = await new_offer(viewers)
            async with session.post(f"https://127.0.0.1:{port}/whep", data=offer, headers=SDP,
                                    ssl=client_tls) as r:
                assert r.status == 201
                assert r.headers["Location"].startswith("/whep/sessions/")
    finally:
        await runner.cleanup()


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return cert_path, key_path
