"""Motion through a running appliance: a file camera replaying a clip with an object crossing
for 3 s (libx264 from generated pictures), the event in ``/api/events`` with its peak JPEG,
Home Assistant's motion binary_sensor ON then OFF through Debian's mosquitto, the
``motion_*`` events on the bus, the figures in /api/status and /metrics, and the event still
listed after a restart."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import av
import numpy as np
import pytest

from ruseon_appliance.access.policy import Access, classify
from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    MqttConfig,
    StateConfig,
    WebhookConfig,
    WebRtcConfig,
)
from tests.motion.scenes import Scene, encode
from tests.mqtt.broker import Mosquitto, Recorder
from tests.mqtt.test_home_assistant import REQUIRED, discovery
from tests.tooling import free_port
from tests.webhooks.test_webhooks import SECRET, Receiver, serve

pytestmark = pytest.mark.slow

TOKEN = "motion-test-admin-secret-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
W, H = 320, 180
OFF_DELAY_S = 2.0


def write_clip(path: Path) -> None:
    """3 s still, an object crossing for 3 s, 14 s still (longer than the test looks)."""
    units = encode(Scene(W, H).crossing(3.0, 3.0), 20, width=W, height=H)
    path.write_bytes(b"".join(u.data for u in units))


def config_for(tmp_path: Path, clip: Path, broker_port: int, hook: str) -> Config:
    return Config(
        cameras=(CameraConfig(name="porch", source=f"file:{clip}", width=W, height=H,
                              framerate=30, keyframe_interval=30,
                              motion_off_delay_s=OFF_DELAY_S),),
        http=HttpConfig(listen=HostPort("127.0.0.1", free_port())),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        auth=AuthConfig(token=TOKEN),
        state=StateConfig(dir=str(tmp_path / "state")),
        hls=HlsConfig(enable=False),
        mqtt=MqttConfig(url=f"mqtt://127.0.0.1:{broker_port}", state_interval_s=30,
                        device_id="dev1"),
        webhook=(WebhookConfig(url=hook, secret=SECRET,
                               events=("motion_started", "motion_ended")),),
    )


async def get_json(http: aiohttp.ClientSession, url: str, status: int = 200) -> Any:
    async with http.get(url, headers=AUTH) as resp:
        body = await resp.json(content_type=None)
        assert resp.status == status, body
        return body


async def test_an_event_through_the_appliance_api_mqtt_and_a_restart(tmp_path: Path) -> None:
    receiver = Receiver(fail_first=0)
    async with serve(receiver.handle) as hook:
        await scenario(tmp_path, receiver, hook)


async def scenario(tmp_path: Path, receiver: Receiver, hook: str) -> None:
    """The file camera, the broker and the webhook receiver at ``hook``."""
    clip = tmp_path / "crossing.h264"
    write_clip(clip)
    broker = Mosquitto(tmp_path, free_port())
    broker.start()
    try:
        await run(config_for(tmp_path, clip, broker.port, hook), broker, receiver)
    finally:
        broker.stop()


async def run(config: Config, broker: Mosquitto, receiver: Receiver) -> None:
    """First run: the event as it happens; second run: the event kept."""
    base = f"http://127.0.0.1:{config.http.listen.port}"
    app = Appliance(config)
    bus: list[Any] = []
    try:
        await app.start()
        app.events.subscribe(bus.append)
        async with (Recorder(broker.port, ("homeassistant/#", "ruseon/#")) as seen,
                    aiohttp.ClientSession() as http):
            def motion_states() -> list[bool]:
                return [json.loads(m.payload)["motion"] for m in seen.log  # type: ignore[arg-type]
                        if str(m.topic) == "ruseon/dev1/state"]

            await seen.wait_for(lambda: True in motion_states(), timeout=40, what="motion ON")
            await seen.wait_for(lambda: motion_states()[-1] is False, timeout=30,
                                what="motion OFF after the off-delay")
            configs = discovery(seen)
            sensor = configs["homeassistant/binary_sensor/dev1/motion/config"]
            assert sensor["device_class"] == "motion"
            assert sensor["state_topic"] == "ruseon/dev1/state"
            document = json.loads(seen.last["ruseon/dev1/state"].payload)  # type: ignore[arg-type]
            # What Home Assistant requires of a binary_sensor, and its template's key is there
            # (the file camera has no controls, so not every component of the full check).
            assert REQUIRED["binary_sensor"] <= set(sensor) and sensor["unique_id"]
            assert sensor["payload_on"] == "ON" and "value_json.motion" in sensor[
                "value_template"] and "motion" in document
            assert sensor["availability_topic"] == "ruseon/dev1/availability"

            events = (await get_json(http, f"{base}/api/events?camera=porch"))["events"]
            assert len(events) == 1, events
            event = events[0]
            assert event["camera"] == "porch" and event["kind"] == "motion"
            assert event["end"] is not None and 2.4 <= event["end"] - event["start"] <= 3.6
            assert event["start_time"].endswith("Z")
            # The bus said the same, in order (webhooks and MQTT subscribe to it).
            names = [(e.name, e.data["event_id"]) for e in bus if e.name.startswith("motion_")]
            assert names == [("motion_started", event["id"]), ("motion_ended", event["id"])]
            ended = bus[[e.name for e in bus].index("motion_ended")]
            assert ended.data["snapshot"] == event["snapshot"]
            # Webhooks got both, signed, with the event id and the snapshot URL.
            await receiver.wait_for(lambda: len(receiver.accepted) >= 2, "two motion webhooks")
            assert [(d["event"], d["event_id"], signed) for d, signed in receiver.accepted] == [
                ("motion_started", event["id"], True), ("motion_ended", event["id"], True)]
            assert receiver.accepted[1][0]["snapshot"] == event["snapshot"]

            async with http.get(base + event["snapshot"], headers=AUTH) as resp:
                assert resp.status == 200 and resp.content_type == "image/jpeg"
                jpeg = await resp.read()
            with av.open(io.BytesIO(jpeg)) as container:
                picture = next(container.decode(video=0)).to_ndarray(format="gray")
            assert picture.shape == (H, W)
            assert int(np.min(picture)) < 50  # the dark object is in the peak frame
            # Home Assistant's image entity shows the event's picture: the peak frame, retained
            # on its image topic once the event ended.
            image = configs["homeassistant/image/dev1/motion_snapshot/config"]
            assert image["content_type"] == "image/jpeg" and image["unique_id"]
            assert image["image_topic"] == "ruseon/dev1/motion_snapshot"
            await seen.wait_for(
                lambda: getattr(seen.last.get(image["image_topic"]), "payload", b"") == jpeg,
                timeout=10, what="the event's picture on the image topic")
            async with Recorder(broker.port, (image["image_topic"],)) as late:  # retained
                await late.wait_for(lambda: late.last.get(image["image_topic"]), timeout=10,
                                    what="the retained picture, for a subscriber that comes later")
                assert late.last[image["image_topic"]].retain
                assert late.last[image["image_topic"]].payload == jpeg

            # Filters and refusals.
            assert (await get_json(http, f"{base}/api/events?until={event['start'] - 10}")
                    )["events"] == []
            assert len((await get_json(
                http, f"{base}/api/events?since={event['start_time']}&kind=motion"))["events"]) == 1
            await get_json(http, f"{base}/api/events?kind=person", 400)
            await get_json(http, f"{base}/api/events?since=yesterday", 400)
            await get_json(http, f"{base}/api/events?limit=0", 400)
            await get_json(http, f"{base}/api/events?camera=garage", 404)
            await get_json(http, f"{base}/api/events/0000000000000-porch/snapshot.jpg", 404)
            await get_json(http, f"{base}/api/events/..%2F..%2Fetc/snapshot.jpg", 404)
            # The picture's level: open to viewers (here viewing is open), never unclassified.
            assert classify("GET", "/api/events") is Access.VIEW
            assert classify("GET", "/api/events/{id}/snapshot.jpg") is Access.VIEW

            status = await get_json(http, f"{base}/api/status")
            motion = status["motion"]["porch"]
            assert motion["events"] == 1 and motion["analysed"] > 50 and motion["fps"] > 0
            camera = next(c for c in status["cameras"] if c["name"] == "porch")
            assert camera["motion"]["events"] == 1
            async with http.get(f"{base}/metrics", headers=AUTH) as resp:
                metrics = await resp.text()
            assert 'ruseon_motion_events_total{camera="porch"} 1.0' in metrics
            assert 'ruseon_motion_skipped_frames_total{camera="porch"}' in metrics

            # Home Assistant's switch and number for detection, through the broker.
            switch = configs["homeassistant/switch/dev1/control_motion/config"]
            number = configs["homeassistant/number/dev1/control_motion_sensitivity/config"]
            assert (number["min"], number["max"], number["step"]) == (0, 100, 1)
            async with aiomqtt.Client("127.0.0.1", broker.port) as ha:
                await ha.publish(number["command_topic"], "70", qos=1)
                await seen.wait_for(lambda: json.loads(
                    seen.last["ruseon/dev1/controls"].payload).get(  # type: ignore[arg-type]
                        "motion_sensitivity") == 70, what="sensitivity 70 from HA")
            assert (await get_json(http, f"{base}/api/camera/porch/motion"))["sensitivity"] == 70
            assert json.loads(seen.last["ruseon/dev1/controls"].payload)[  # type: ignore[arg-type]
                "motion"] is True and switch["payload_off"] == "OFF"

            # Live settings (admin): sensitivity, and detection paused.
            url = f"{base}/api/camera/porch/motion"
            async with http.patch(url, json={"sensitivity": 80}) as resp:
                assert resp.status == 401  # not without the admin secret
            async with http.patch(url, json={"sensitivity": 80}, headers=AUTH) as resp:
                assert resp.status == 200 and (await resp.json())["sensitivity"] == 80
            for bad in ({"sensitivity": 101}, {"sensitivity": True}, {"enabled": "no"},
                        {"threshold": 3}, {}):
                async with http.patch(url, json=bad, headers=AUTH) as resp:
                    assert resp.status == 422, bad
            async with http.patch(f"{base}/api/camera/motion", json={"enabled": False},
                                  headers=AUTH) as resp:  # the default camera's, unnamed
                assert resp.status == 200 and (await resp.json())["enabled"] is False
            porch = app.cameras.resolve("porch")
            assert porch is not None and porch.motion is not None
            await asyncio.sleep(0.3)
            analysed = porch.motion.stats()["analysed"]
            await asyncio.sleep(1.0)
            assert porch.motion.stats()["analysed"] == analysed  # paused: nothing looked at
            assert (await get_json(http, url))["enabled"] is False
    finally:
        await app.stop()
    # A restart keeps the event (and its picture).
    again = Appliance(config)
    try:
        await again.start()
        async with aiohttp.ClientSession() as http:
            events = (await get_json(http, f"{base}/api/events"))["events"]
            assert [e["id"] for e in events][:1] == [event["id"]]
            async with http.get(base + event["snapshot"], headers=AUTH) as resp:
                assert resp.status == 200 and await resp.read() == jpeg
    finally:
        await again.stop()
