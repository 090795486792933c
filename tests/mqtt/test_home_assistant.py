"""MQTT with Home Assistant discovery against Debian's mosquitto: retained discovery configs that
parse as Home Assistant expects, live state, the Last Will on a kill -9, reconnect and
re-announcement after a broker restart, unique_ids that survive an appliance restart."""

from __future__ import annotations

import json
import re
import signal
import urllib.request
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from ruseon_appliance.mqtt.identity import DEVICE_ID_FILE
from tests.mqtt.appliance import ApplianceProcess
from tests.mqtt.broker import Mosquitto, Recorder
from tests.tooling import free_port

pytestmark = pytest.mark.slow

# What Home Assistant's MQTT discovery schemas require of each component we publish.
REQUIRED = {
    "camera": {"topic"},
    "sensor": {"state_topic"},
    "binary_sensor": {"state_topic"},
    "button": {"command_topic"},
    "number": {"command_topic", "min", "max", "step"},
    "switch": {"command_topic"},
    "select": {"command_topic", "options"},
    "image": {"image_topic"},  # or url_topic; we publish the JPEG itself
}
# Camera, 4 sensors + recording state, 4 binary sensors (stalled, motion, recording, clock not
# synchronized), 2 buttons, the synthetic source's 8 camera controls (5 numbers/switches
# live, bitrate, framerate, resolution), motion detection's 2 (a switch, a number) and its
# image (the latest event's picture), and the sound's 2 (the microphone switch, the gain).
ENTITIES = 12 + 8 + 2 + 1 + 2
DISCOVERY_TOPIC = re.compile(
    r"^homeassistant/(?P<component>[a-z_]+)/(?P<node>[A-Za-z0-9_-]+)/"
    r"(?P<object>[A-Za-z0-9_-]+)/config$")


def discovery(recorder: Recorder) -> dict[str, dict[str, Any]]:
    """Retained discovery configs seen so far, parsed."""
    return {topic: json.loads(m.payload) for topic, m in recorder.last.items()  # type: ignore[arg-type]
            if topic.startswith("homeassistant/") and m.payload}


def check_home_assistant_schema(configs: dict[str, dict[str, Any]],
                                documents: dict[str, dict[str, Any]]) -> None:
    """What HA checks when a config arrives, and what makes its entities work."""
    assert set(REQUIRED) <= {DISCOVERY_TOPIC.match(t)["component"] for t in configs  # type: ignore[index]
                             }, configs.keys()
    unique_ids = [c["unique_id"] for c in configs.values()]
    assert len(set(unique_ids)) == len(unique_ids), "unique_ids must be unique"
    devices = {json.dumps(c["device"], sort_keys=True) for c in configs.values()}
    assert len(devices) == 1, "one device block shared by all entities (one HA device)"
    device = next(iter(configs.values()))["device"]
    assert device["identifiers"] and all(isinstance(i, str) for i in device["identifiers"])
    assert device["name"] and device["sw_version"]
    for topic, config in configs.items():
        match = DISCOVERY_TOPIC.match(topic)
        assert match, topic
        assert REQUIRED[match["component"]] <= set(config), (topic, config)
        assert config["availability_topic"].endswith("/availability")
        assert {config["payload_available"], config["payload_not_available"]} == {
            "online", "offline"}
        # Every template reads a key the document on its state topic really has.
        for key in re.findall(r"value_json\.(\w+)", config.get("value_template", "")):
            document = documents[config["state_topic"]]
            assert key in document, (topic, key, document)
        for key in ("state_topic", "command_topic", "topic"):
            if key in config:
                assert "+" not in config[key] and "#" not in config[key]


async def test_discovery_state_last_will_and_reconnect(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path, free_port())
    broker.start()
    state_dir = tmp_path / "state"
    url = f"mqtt://127.0.0.1:{broker.port}"
    # The clock's sync flag names a file that is not there: "clock not synchronized" is on.
    env = {"RUSEON_MQTT_STATE_INTERVAL_S": "1",
           "RUSEON_RECORDING_CLOCK_SYNC_FILE": str(tmp_path / "no-sync-flag")}
    appliance = ApplianceProcess(state_dir, "--mqtt", url, env=env)
    topics = ("homeassistant/#", "ruseon/#")
    try:
        appliance.start()
        device_id = (state_dir / DEVICE_ID_FILE).read_text().strip()
        base = f"ruseon/{device_id}"
        assert (state_dir / DEVICE_ID_FILE).stat().st_mode & 0o777 == 0o600

        async with Recorder(broker.port, topics) as seen:
            # Discovery configs and availability arrive retained (we subscribed after they went).
            await seen.wait_for(lambda: len(discovery(seen)) == ENTITIES,
                                what="discovery configs")
            # Retained: a subscriber that comes later gets every config from the broker.
            async with Recorder(broker.port, ("homeassistant/#",)) as late:
                await late.wait_for(lambda: len(discovery(late)) == ENTITIES, what="retained")
                assert all(m.retain for m in late.last.values())
            await seen.wait_for(lambda: seen.last.get(f"{base}/availability"), what="online")
            assert seen.last[f"{base}/availability"].payload == b"online"
            first = discovery(seen)

            # State updates: fps from a running camera, and the document keeps changing.
            def states() -> list[dict[str, Any]]:
                return [json.loads(m.payload) for m in seen.log  # type: ignore[arg-type]
                        if str(m.topic) == f"{base}/state"]

            await seen.wait_for(lambda: len({json.dumps(s) for s in states()}) >= 3,
                                what="three different state documents")
            state = states()[-1]
            assert state["viewers"] == 0 and state["fps"] > 0 and state["stalled"] is False
            assert state["clock_unsynchronized"] is True
            clock = first[f"homeassistant/binary_sensor/{device_id}/clock_unsynchronized/config"]
            assert clock["device_class"] == "problem", clock
            await seen.wait_for(lambda: seen.last.get(f"{base}/controls"), what="controls")
            check_home_assistant_schema(first, {
                f"{base}/state": state,
                f"{base}/controls": json.loads(seen.last[f"{base}/controls"].payload),  # type: ignore[arg-type]
            })

            # The camera entity gets a JPEG; the snapshot button publishes one on demand.
            await seen.wait_for(lambda: seen.last.get(f"{base}/snapshot"), what="snapshot")
            assert bytes(seen.last[f"{base}/snapshot"].payload)[:2] == b"\xff\xd8"  # type: ignore[arg-type]
            button = first[f"homeassistant/button/{device_id}/snapshot/config"]
            record = first[f"homeassistant/button/{device_id}/record/config"]
            before = sum(1 for m in seen.log if str(m.topic) == f"{base}/snapshot")
            async with aiomqtt.Client("127.0.0.1", broker.port) as presser:
                await presser.publish(button["command_topic"], button["payload_press"], qos=1)
                await seen.wait_for(
                    lambda: sum(1 for m in seen.log if str(m.topic) == f"{base}/snapshot")
                    > before, what="a snapshot after the button press")
                # The record button starts an on-demand recording; the sensors show it.
                assert state["recording"] is False
                await presser.publish(record["command_topic"], record["payload_press"], qos=1)
                await seen.wait_for(lambda: states()[-1]["recording"] is True,
                                    what="recording after the record button")

                # Camera controls as config entities: a number and a switch change the camera
                # (the HTTP API sees it); a value out of range changes nothing.
                brightness = first[f"homeassistant/number/{device_id}/control_brightness/config"]
                hflip = first[f"homeassistant/switch/{device_id}/control_hflip/config"]
                assert (brightness["min"], brightness["max"]) == (-1.0, 1.0)
                assert brightness["entity_category"] == "config"

                def controls() -> dict[str, Any]:
                    message = seen.last.get(f"{base}/controls")
                    return json.loads(message.payload) if message else {}  # type: ignore[arg-type]

                await seen.wait_for(lambda: controls().get("brightness") == 0.0, what="controls")
                await presser.publish(brightness["command_topic"], "0.4", qos=1)
                await presser.publish(brightness["command_topic"], "7", qos=1)  # out of range
                await presser.publish(hflip["command_topic"], hflip["payload_on"], qos=1)
                await seen.wait_for(lambda: controls().get("brightness") == 0.4
                                    and controls().get("hflip") is True, what="controls set")
                http = f"http://127.0.0.1:{appliance.http}/api/camera/controls"
                # The admin secret the appliance made on its first start (controls are admin).
                secret = (state_dir / "admin-secret").read_text().strip()
                request = urllib.request.Request(http, headers={
                    "Authorization": f"Bearer {secret}"})
                with urllib.request.urlopen(request, timeout=10) as response:
                    over_http = json.load(response)["controls"]
                assert over_http["brightness"]["value"] == 0.4
                assert over_http["hflip"]["value"] is True

                # The microphone switch mutes the camera's sound (the API sees it); the gain
                # out of range changes nothing.
                microphone = first[f"homeassistant/switch/{device_id}/control_microphone/config"]
                gain = first[f"homeassistant/number/{device_id}/control_audio_gain_db/config"]
                assert (gain["min"], gain["max"]) == (-60.0, 30.0)
                await seen.wait_for(lambda: controls().get("microphone") is True,
                                    what="the microphone on")
                await presser.publish(gain["command_topic"], "99", qos=1)  # out of range
                await presser.publish(microphone["command_topic"], microphone["payload_off"],
                                      qos=1)
                await seen.wait_for(lambda: controls().get("microphone") is False,
                                    what="the microphone off")
                request = urllib.request.Request(
                    f"http://127.0.0.1:{appliance.http}/api/camera/audio",
                    headers={"Authorization": f"Bearer {secret}"})
                with urllib.request.urlopen(request, timeout=10) as response:
                    sound = json.load(response)
                assert sound["muted"] is True and sound["gain_db"] == 0.0

        # The broker restarts without persistence: every retained message is gone, and the
        # appliance reconnects and announces everything again.
        broker.restart()
        async with Recorder(broker.port, topics) as seen:
            await seen.wait_for(lambda: discovery(seen) == first, timeout=120,
                                what="the same discovery configs after a broker restart")
            await seen.wait_for(
                lambda: getattr(seen.last.get(f"{base}/availability"), "payload", b"")
                == b"online", what="online after the broker restart")

            # A power cut: the broker publishes the Last Will.
            appliance.kill(signal.SIGKILL)
            await seen.wait_for(
                lambda: getattr(seen.last.get(f"{base}/availability"), "payload", b"")
                == b"offline", what="offline via the Last Will")

        # Restarted with the same state dir: the same device and unique_ids.
        appliance.start()
        async with Recorder(broker.port, topics) as seen:
            await seen.wait_for(
                lambda: getattr(seen.last.get(f"{base}/availability"), "payload", b"")
                == b"online", what="online after the restart")
            await seen.wait_for(lambda: len(discovery(seen)) == ENTITIES)
            assert discovery(seen) == first
            # A clean stop says offline itself.
            appliance.kill(signal.SIGTERM)
            await seen.wait_for(
                lambda: getattr(seen.last.get(f"{base}/availability"), "payload", b"")
                == b"offline", what="offline after SIGTERM")
        assert "Traceback" not in appliance.output(), appliance.output()
    finally:
        appliance.kill()
        broker.stop()
