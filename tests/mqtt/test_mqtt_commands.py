"""The MQTT side against Debian's mosquitto, in process: what another client on the broker can
make the appliance do with its command topics, and what Home Assistant keeps of entities that
no longer exist."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from ruseon_appliance.config import MqttConfig
from ruseon_appliance.mqtt import publisher
from ruseon_appliance.mqtt.discovery import Discovery, Topics
from ruseon_appliance.mqtt.publisher import HomeAssistantMqtt
from tests.mqtt.broker import Mosquitto, Recorder
from tests.tooling import free_port

DEVICE = "ruseontest1"


@asynccontextmanager
async def broker(tmp_path: Path) -> AsyncIterator[Mosquitto]:
    mosquitto = Mosquitto(tmp_path, free_port())
    await asyncio.to_thread(mosquitto.start)
    try:
        yield mosquitto
    finally:
        await asyncio.to_thread(mosquitto.stop)


async def no_snapshot() -> None:
    return None


@asynccontextmanager
async def appliance(port: int, record: Callable[[], Awaitable[Any]] | None
                    ) -> AsyncIterator[HomeAssistantMqtt]:
    mqtt = HomeAssistantMqtt(MqttConfig(url=f"mqtt://127.0.0.1:{port}"), device_id=DEVICE,
                             name="test", state=lambda: {"viewers": 0}, snapshot=no_snapshot,
                             record=record)
    await mqtt.start()
    try:
        yield mqtt
    finally:
        await mqtt.stop()


async def publish(port: int, topic: str, payload: str, *, retain: bool = False,
                  times: int = 1) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as client:
        for _ in range(times):
            await client.publish(topic, payload, qos=1, retain=retain)


def configs(recorder: Recorder) -> Mapping[str, Any]:
    return {t: m.payload for t, m in recorder.last.items() if t.endswith("/config")}


async def test_retained_and_flooded_record_presses(tmp_path: Path) -> None:
    """A retained press is not re-run on (re)connect; a flood of presses runs one at a time."""
    topics = Topics("ruseon", DEVICE)
    running = 0
    most = 0
    presses = 0

    async def record() -> None:
        nonlocal running, most, presses
        presses += 1
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.3)
        running -= 1

    async with broker(tmp_path) as mosquitto:
        # Someone left a retained press on the record topic before the appliance connected.
        await publish(mosquitto.port, topics.command("record"), "PRESS", retain=True)
        async with (Recorder(mosquitto.port, (topics.availability,)) as seen,
                    appliance(mosquitto.port, record) as mqtt):
            await seen.wait_for(lambda: topics.availability in seen.last
                                and seen.last[topics.availability].payload == b"online",
                                what="online")
            await publish(mosquitto.port, topics.command("snapshot"), "PRESS")
            await seen.wait_for(lambda: mqtt.commands >= 1, what="the snapshot command")
            assert presses == 0, "a retained press ran on connect"
            await publish(mosquitto.port, topics.command("record"), "PRESS", times=20)
            await seen.wait_for(lambda: mqtt.commands >= 21, what="20 presses")
            await seen.wait_for(lambda: running == 0, what="the record task")
            assert presses >= 1
            assert most == 1, f"{most} record() calls ran at once"


async def test_stale_discovery_configs_are_removed(tmp_path: Path) -> None:
    """Entities announced by an earlier run and gone now (recording turned off) are deleted
    from the broker, so Home Assistant removes them; the current ones stay."""
    async def record() -> None:
        return None

    topics = Topics("ruseon", DEVICE)
    async with broker(tmp_path) as mosquitto:
        async with (Recorder(mosquitto.port, ("homeassistant/#",)) as seen,
                    appliance(mosquitto.port, record)):
            with_recording = Discovery("homeassistant", topics, name="test", recording=True)
            await seen.wait_for(lambda: set(with_recording.configs()) <= set(configs(seen)),
                                what="the first run's configs")
        now = Discovery("homeassistant", topics, name="test")
        gone = set(with_recording.configs()) - set(now.configs())
        assert gone  # the record button, recording sensors
        async with (Recorder(mosquitto.port, ("homeassistant/#",)) as seen,
                    appliance(mosquitto.port, None)):
            await seen.wait_for(lambda: all(configs(seen).get(t) == b"" for t in gone),
                                what="the stale configs emptied")
        # A late subscriber (Home Assistant starting) gets exactly today's entities.
        async with Recorder(mosquitto.port, ("homeassistant/#",)) as late:
            await late.wait_for(lambda: set(configs(late)) == set(now.configs()),
                                what="today's retained configs only")
            assert all(json.loads(p) for p in configs(late).values())


def test_discovery_keys_home_assistant_still_accepts() -> None:
    """object_id was removed from MQTT discovery in HA 2026.4 (default_entity_id replaces it);
    a number's step must be at least 0.001."""
    controls = {"tiny": {"type": "float", "min": 0.0, "max": 0.01, "value": 0.0, "live": True}}
    discovery = Discovery("homeassistant", Topics("ruseon", DEVICE), name="test",
                          controls=controls)
    for topic, text in discovery.configs().items():
        config = json.loads(text)
        component = topic.split("/")[1]
        assert "object_id" not in config
        assert config["default_entity_id"] == f"{component}.{config['unique_id']}"
        if component == "number":
            assert config["step"] >= 0.001


async def test_commands_off_and_presses_that_are_not_presses(tmp_path: Path) -> None:
    """A button acts on its PRESS payload only; with ``commands = false`` there are no command
    entities and nothing a broker client publishes under the prefix does anything."""
    presses = 0

    async def record() -> None:
        nonlocal presses
        presses += 1

    topics = Topics("ruseon", DEVICE)
    async with broker(tmp_path) as mosquitto:
        async with (Recorder(mosquitto.port, ("homeassistant/#",)) as seen,
                    appliance(mosquitto.port, record) as mqtt):
            await seen.wait_for(lambda: len(configs(seen)) >= 10, what="discovery")
            await publish(mosquitto.port, topics.command("record"), "garbage")
            await publish(mosquitto.port, topics.command("snapshot"), "PRESS")
            await seen.wait_for(lambda: mqtt.commands >= 2, what="both commands")
            assert presses == 0
        config = MqttConfig(url=f"mqtt://127.0.0.1:{mosquitto.port}", commands=False)
        off = HomeAssistantMqtt(config, device_id=DEVICE, name="test", state=lambda: {},
                                snapshot=no_snapshot, record=record)
        await off.start()
        try:
            async with Recorder(mosquitto.port, ("homeassistant/#",)) as late:
                await late.wait_for(
                    lambda: set(configs(late)) == set(off.discovery.configs()), what="configs")
                assert not [t for t in configs(late) if "/button/" in t]
            await publish(mosquitto.port, topics.command("record"), "PRESS")
            await publish(mosquitto.port, f"{topics.base}/status-probe", "x")
            async with Recorder(mosquitto.port, (f"{topics.base}/#",)) as probe:
                await probe.wait_for(lambda: f"{topics.base}/availability" in probe.last,
                                     what="availability")
            assert off.commands == 0 and presses == 0
        finally:
            await off.stop()


async def test_a_broker_that_drops_every_connection_gets_backed_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that answers CONNACK and hangs up at once: each short-lived connection still
    doubles the wait (it used to start again from the first delay on every connect, so such
    a broker was reconnected to, and sent every discovery config, once a second for ever)."""
    monkeypatch.setattr(publisher, "BACKOFF_FIRST_S", 0.01)

    async def connack_then_close(reader: asyncio.StreamReader,
                                 writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)  # CONNECT
        writer.write(b"\x20\x02\x00\x00")  # CONNACK, accepted
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(connack_then_close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with appliance(port, None) as mqtt:
            deadline = asyncio.get_running_loop().time() + 60
            while mqtt.connects < 6:
                assert asyncio.get_running_loop().time() < deadline, mqtt.stats()
                await asyncio.sleep(0.01)
            assert mqtt.retry_delay_s >= 0.01 * 2 ** 4, mqtt.retry_delay_s
    finally:
        server.close()


async def test_unreadable_password_file_is_one_line_not_a_traceback_per_attempt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(publisher, "BACKOFF_FIRST_S", 0.01)
    config = MqttConfig(url="mqtt://127.0.0.1:1", username="cam",
                        password_file=str(tmp_path / "missing"))
    mqtt = HomeAssistantMqtt(config, device_id=DEVICE, name="test", state=lambda: {},
                             snapshot=no_snapshot)
    with caplog.at_level(logging.INFO, logger="ruseon_appliance.mqtt"):
        await mqtt.start()
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while mqtt.disconnects < 3:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
        finally:
            await mqtt.stop()
    records = [r for r in caplog.records if r.name.startswith("ruseon_appliance.mqtt")]
    assert len(records) == 1 and "mqtt.password_file" in records[0].getMessage(), records
    assert records[0].exc_info is None


async def test_reconnects_reuse_the_password_and_tls_context(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: a broker that refuses every connection made the publisher read the password
    file and build a TLS context (a CA bundle parsed) on the event loop for every attempt. They
    are read once, in a worker thread; while the password file is missing they are not kept, so
    the file is picked up when it appears."""
    import threading

    from ruseon_appliance import config as config_module

    monkeypatch.setattr(publisher, "BACKOFF_FIRST_S", 0.01)
    monkeypatch.setattr(publisher, "BACKOFF_MAX_S", 0.02)
    built: list[str] = []
    real_tls = config_module._tls_context

    def counting_tls(*args: object) -> object:
        built.append(threading.current_thread().name)
        return real_tls(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(config_module, "_tls_context", counting_tls)
    secret = tmp_path / "password"
    config = MqttConfig(url="mqtts://127.0.0.1:1", username="cam", password_file=str(secret))
    mqtt = HomeAssistantMqtt(config, device_id=DEVICE, name="test", state=lambda: {},
                             snapshot=no_snapshot)
    await mqtt.start()
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while mqtt.disconnects < 3:  # the file is missing: nothing kept, retried
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        assert "password_file" in mqtt.last_error and not built
        secret.write_text("s3cret\n")
        seen = mqtt.disconnects
        while mqtt.disconnects < seen + 6:  # now the broker refuses: 6 reconnects
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
    finally:
        await mqtt.stop()
    assert len(built) == 1, built
    assert built[0] != threading.main_thread().name
    assert "password_file" not in mqtt.last_error


async def test_a_flood_of_home_assistant_online_does_not_republish_everything(
        tmp_path: Path) -> None:
    topics = Topics("ruseon", DEVICE)
    async with (broker(tmp_path) as mosquitto,
                Recorder(mosquitto.port, (topics.availability,)) as seen,
                appliance(mosquitto.port, None) as mqtt):
        await seen.wait_for(lambda: topics.availability in seen.last, what="online")
        configs_count = len(mqtt.discovery.configs())
        before = mqtt.published
        await publish(mosquitto.port, "homeassistant/status", "online", times=50)
        await publish(mosquitto.port, topics.command("snapshot"), "PRESS")
        await seen.wait_for(lambda: mqtt.commands >= 1, what="the command after them")
        # At most one re-announcement (plus state updates), not fifty.
        assert mqtt.published - before < 3 * configs_count, mqtt.published - before


class FailingCamera:
    """Camera controls whose camera fails to apply a change (a sensor that will not
    reconfigure): the hardware stand-in."""

    def __init__(self) -> None:
        self.updates = 0

    def describe(self) -> dict[str, Any]:
        return {"controls": {"brightness": {"type": "float", "min": -1.0, "max": 1.0,
                                            "value": 0.0, "live": True}}}

    async def update(self, changes: Mapping[str, Any]) -> bool:
        self.updates += 1
        raise RuntimeError("the camera did not come back")


async def test_a_control_the_camera_fails_to_apply_keeps_the_connection(tmp_path: Path) -> None:
    topics = Topics("ruseon", DEVICE)
    camera = FailingCamera()
    async with broker(tmp_path) as mosquitto:
        mqtt = HomeAssistantMqtt(MqttConfig(url=f"mqtt://127.0.0.1:{mosquitto.port}"),
                                 device_id=DEVICE, name="test", state=lambda: {},
                                 snapshot=no_snapshot, controls=camera)
        await mqtt.start()
        try:
            async with Recorder(mosquitto.port, (topics.availability,)) as seen:
                await seen.wait_for(lambda: topics.availability in seen.last, what="online")
                for _ in range(2):
                    await publish(mosquitto.port, topics.control_set("brightness"), "0.5")
                await seen.wait_for(lambda: mqtt.control_errors >= 2, what="both refused")
            assert camera.updates == 2
            assert (mqtt.connects, mqtt.disconnects, mqtt.connected) == (1, 0, True)
        finally:
            await mqtt.stop()
