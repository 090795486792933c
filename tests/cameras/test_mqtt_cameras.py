"""Home Assistant sees every camera alike: each camera's picture, sensors, recording button and
controls in the same device, through Debian's mosquitto; the default camera keeps the ids and
unnamed topics it always had (as its unnamed routes do), the others are named after them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    CameraConfig,
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    MqttConfig,
    StateConfig,
    WebRtcConfig,
)
from tests.mqtt.broker import Mosquitto, Recorder
from tests.mqtt.test_home_assistant import ENTITIES, check_home_assistant_schema, discovery
from tests.mqtt.test_mqtt_commands import publish
from tests.tooling import free_port

pytestmark = pytest.mark.slow


async def test_every_camera_is_an_entity_of_the_one_device(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path, free_port())
    broker.start()
    small: dict[str, Any] = {"source": "synthetic", "width": 160, "height": 96,
                             "keyframe_interval": 30}
    config = Config(
        cameras=(CameraConfig(name="front", **small), CameraConfig(name="yard", **small),
                 CameraConfig(name="gate", source=f"rtsp://127.0.0.1:{free_port()}/none")),
        http=HttpConfig(listen=HostPort("127.0.0.1", free_port())),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        hls=HlsConfig(enable=False),
        mqtt=MqttConfig(url=f"mqtt://127.0.0.1:{broker.port}", state_interval_s=1,
                        device_id="dev1"),
    )
    app = Appliance(config)
    await app.start()
    base = "ruseon/dev1"
    try:
        async with Recorder(broker.port, ("homeassistant/#", "ruseon/#")) as seen:
            # The default camera's entities as always; the same for the others, named.
            await seen.wait_for(
                lambda: len(discovery(seen)) >= ENTITIES
                and "homeassistant/number/dev1/yard_control_brightness/config" in discovery(seen)
                # the last config announced (they are published in order)
                and "homeassistant/sensor/dev1/gate_keyframe_age_s/config" in discovery(seen),
                what="every discovery config")
            configs = discovery(seen)
            objects = {t.split("/")[3] for t in configs}
            device_wide = {"viewers", "clock_unsynchronized", "snapshot", "camera"}
            default_objects = {o for o in objects if not o.startswith(("yard_", "gate_",
                                                                       "camera_"))}
            assert len(default_objects) == ENTITIES, sorted(default_objects)
            for name in ("yard", "gate"):
                assert f"camera_{name}" in objects
                # Every per-camera entity of the default camera, for this camera too (the
                # RTSP camera has no controls: its source has none).
                wanted = {f"{name}_{o}" for o in default_objects - device_wide
                          if name == "yard" or not o.startswith("control_")}
                assert wanted <= objects, sorted(wanted - objects)
            assert not any(o.startswith("gate_control_") for o in objects)
            cameras = {c["topic"] for t, c in configs.items() if "/camera/" in t}
            assert cameras == {f"{base}/snapshot", f"{base}/snapshot/yard",
                               f"{base}/snapshot/gate"}
            assert "homeassistant/camera/dev1/camera/config" in configs  # the first's, as before

            def state() -> dict[str, Any]:
                message = seen.last.get(f"{base}/state")
                return json.loads(message.payload) if message else {}  # type: ignore[arg-type]

            await seen.wait_for(lambda: (state().get("cameras", {}).get("yard", {})
                                         .get("fps") or 0) > 0, what="the yard camera's fps")
            document = state()
            assert document["cameras"]["yard"]["up"] is True
            assert document["cameras"]["gate"]["up"] is False  # nobody answers its RTSP
            await seen.wait_for(lambda: seen.last.get(f"{base}/controls")
                                and seen.last.get(f"{base}/controls/yard"), what="controls")
            check_home_assistant_schema(configs, {
                f"{base}/state": document,
                f"{base}/controls": json.loads(seen.last[f"{base}/controls"].payload),  # type: ignore[arg-type]
                f"{base}/controls/yard": json.loads(
                    seen.last[f"{base}/controls/yard"].payload),  # type: ignore[arg-type]
            })
            down = configs["homeassistant/binary_sensor/dev1/gate_down/config"]
            assert "value_json.cameras['gate'].up" in down["value_template"]
            await seen.wait_for(lambda: seen.last.get(f"{base}/snapshot/yard"), what="yard JPEG")
            assert bytes(seen.last[f"{base}/snapshot/yard"].payload)[:2] == b"\xff\xd8"  # type: ignore[arg-type]

            # The yard camera's own controls and record button, from Home Assistant's side.
            yard = app.cameras.resolve("yard")
            front = app.cameras.resolve("front")
            assert yard is not None and front is not None
            assert yard.controls is not None and front.controls is not None
            brightness = configs["homeassistant/number/dev1/yard_control_brightness/config"]
            await publish(broker.port, brightness["command_topic"], "0.25")
            await seen.wait_for(
                lambda: json.loads(seen.last[f"{base}/controls/yard"].payload).get(  # type: ignore[arg-type]
                    "brightness") == 0.25 if f"{base}/controls/yard" in seen.last else False,
                what="the yard camera's brightness")
            assert yard.controls.values["brightness"] == 0.25
            assert front.controls.values["brightness"] == 0.0  # the other camera untouched
            record = configs["homeassistant/button/dev1/yard_record/config"]
            assert yard.recorder is not None and not yard.recorder.active
            await publish(broker.port, record["command_topic"], "PRESS")
            await seen.wait_for(lambda: state().get("cameras", {}).get("yard", {})
                                .get("recording") is True, what="the yard camera recording")
            assert front.recorder is not None and not front.recorder.active
    finally:
        await app.stop()
        broker.stop()
