"""mqtts:// against Debian's mosquitto with a TLS listener whose certificate comes from a home CA
(as Home Assistant's Mosquitto add-on is usually set up): the CA named by ``mqtt.ca_file`` is
trusted, a broker requiring client certificates gets ``mqtt.cert_file``/``key_file``, and
everything else (the system's CAs, another CA, a host name the certificate does not name, no
client certificate) is refused without ever connecting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from ruseon_appliance.config import MqttConfig
from ruseon_appliance.mqtt import publisher
from ruseon_appliance.mqtt.discovery import Topics
from ruseon_appliance.mqtt.publisher import HomeAssistantMqtt
from tests.mqtt.broker import Mosquitto, Recorder
from tests.pki import CertificateAuthority, Issued
from tests.tooling import free_port

DEVICE = "ruseontls1"


async def no_snapshot() -> None:
    return None


@asynccontextmanager
async def tls_broker(tmp_path: Path, server: Issued, ca: Path, *,
                     require_certificate: bool) -> AsyncIterator[tuple[Mosquitto, int]]:
    """A broker with a plain listener (the test's recorder) and a TLS one (the appliance)."""
    tls_port = free_port()
    mosquitto = Mosquitto(tmp_path, free_port(), extra=(
        f"listener {tls_port} 127.0.0.1\ncafile {ca}\ncertfile {server.cert}\n"
        f"keyfile {server.key}\nrequire_certificate {str(require_certificate).lower()}\n"))
    await asyncio.to_thread(mosquitto.start)
    try:
        yield mosquitto, tls_port
    finally:
        await asyncio.to_thread(mosquitto.stop)


async def attempts(config: MqttConfig, at_least: int = 2) -> HomeAssistantMqtt:
    """Run a publisher until it connected or failed ``at_least`` times; return it stopped."""
    mqtt = HomeAssistantMqtt(config, device_id=DEVICE, name="test", state=lambda: {"viewers": 0},
                             snapshot=no_snapshot)
    await mqtt.start()
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while mqtt.connects == 0 and mqtt.disconnects < at_least:
            assert asyncio.get_running_loop().time() < deadline, mqtt.stats()
            await asyncio.sleep(0.02)
    finally:
        await mqtt.stop()
    return mqtt


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher, "BACKOFF_FIRST_S", 0.05)


async def test_own_ca_and_client_certificate(tmp_path: Path, fast_retries: None) -> None:
    ca = CertificateAuthority(tmp_path, "home")
    server = ca.issue("broker", ips=("127.0.0.1",))
    client = ca.issue("camera", client=True)
    topics = Topics("ruseon", DEVICE)
    async with tls_broker(tmp_path, server, ca.cert, require_certificate=True) as (broker, port):
        url = f"mqtts://127.0.0.1:{port}"
        # The broker wants a client certificate: without one the handshake is refused.
        refused = await attempts(MqttConfig(url=url, ca_file=str(ca.cert)))
        assert refused.connects == 0 and refused.last_error, refused.stats()

        async with Recorder(broker.port, (topics.availability,)) as seen:
            config = MqttConfig(url=url, ca_file=str(ca.cert), cert_file=str(client.cert),
                                key_file=str(client.key))
            mqtt = HomeAssistantMqtt(config, device_id=DEVICE, name="test",
                                     state=lambda: {"viewers": 0}, snapshot=no_snapshot)
            await mqtt.start()
            try:
                await seen.wait_for(
                    lambda: topics.availability in seen.last
                    and seen.last[topics.availability].payload == b"online",
                    what="online over mqtts with a client certificate")
                assert mqtt.connected and mqtt.published > 0, mqtt.stats()
            finally:
                await mqtt.stop()
            await seen.wait_for(lambda: seen.last[topics.availability].payload == b"offline",
                                what="offline published on a clean stop")


async def test_the_broker_is_verified(tmp_path: Path, fast_retries: None) -> None:
    ca = CertificateAuthority(tmp_path, "home")
    other = CertificateAuthority(tmp_path, "other")
    server = ca.issue("broker", ips=("127.0.0.1",))
    async with tls_broker(tmp_path, server, ca.cert, require_certificate=False) as (_, port):
        refused = {
            "the system's CAs": MqttConfig(url=f"mqtts://127.0.0.1:{port}"),
            "another CA": MqttConfig(url=f"mqtts://127.0.0.1:{port}", ca_file=str(other.cert)),
            # The certificate names 127.0.0.1 only.
            "a host name not in the certificate": MqttConfig(url=f"mqtts://localhost:{port}",
                                                             ca_file=str(ca.cert)),
        }
        for why, config in refused.items():
            mqtt = await attempts(config)
            assert mqtt.connects == 0, (why, mqtt.stats())
            reason = mqtt.stats()["last_error"]  # what /api/status shows the admin
            assert "certificate verify failed" in reason.lower(), (why, reason)
        # The control: the same broker, its own CA, its own name.
        trusted = await attempts(MqttConfig(url=f"mqtts://127.0.0.1:{port}",
                                            ca_file=str(ca.cert)))
        assert trusted.connects == 1, trusted.stats()
