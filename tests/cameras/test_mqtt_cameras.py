"""Home Assistant sees every camera: the further cameras' camera entities, sensors and pictures
in the same device, through Debian's mosquitto; the first camera keeps the ids it always had."""

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
            # One camera's entities as always, and five for each further camera.
            await seen.wait_for(lambda: len(discovery(seen)) == ENTITIES + 2 * 5,
                                what="every discovery config")
            configs = discovery(seen)
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
            await seen.wait_for(lambda: seen.last.get(f"{base}/controls"), what="controls")
            check_home_assistant_schema(configs, {
                f"{base}/state": document,
                f"{base}/controls": json.loads(seen.last[f"{base}/controls"].payload),  # type: ignore[arg-type]
            })
            down = configs["homeassistant/binary_sensor/dev1/gate_down/config"]
            assert "value_json.cameras['gate'].up" in down["value_template"]
            await seen.wait_for(lambda: seen.last.get(f"{base}/snapshot/yard"), what="yard JPEG")
            assert bytes(seen.last[f"{base}/snapshot/yard"].payload)[:2] == b"\xff\xd8"  # type: ignore[arg-type]
    finally:
        await app.stop()
        broker.stop()
