"""Home Assistant MQTT discovery documents for one appliance.

One retained config per entity at ``<discovery_prefix>/<component>/<device_id>/<object>/config``,
all sharing one ``device`` block (so HA shows one device with its entities) and one availability
topic that the Last Will turns ``offline``. Sensors read one JSON state topic through
``value_template``s, so a state update is one message however many sensors there are.
See https://www.home-assistant.io/integrations/mqtt/#mqtt-discovery
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import __version__

ONLINE = "online"
OFFLINE = "offline"
PRESS = "PRESS"


@dataclass(frozen=True, slots=True)
class Topics:
    """Where this appliance publishes and listens: ``<prefix>/<device_id>/...``."""

    prefix: str
    device_id: str

    @property
    def base(self) -> str:
        """The appliance's own subtree."""
        return f"{self.prefix}/{self.device_id}"

    @property
    def availability(self) -> str:
        """``online`` (retained) while connected; the Last Will sets ``offline``."""
        return f"{self.base}/availability"

    @property
    def state(self) -> str:
        """One JSON document with every sensor's value."""
        return f"{self.base}/state"

    @property
    def snapshot(self) -> str:
        """The camera entity's JPEG."""
        return f"{self.base}/snapshot"

    def camera_snapshot(self, camera: str) -> str:
        """A named camera's JPEG (the default camera's is :attr:`snapshot`)."""
        return f"{self.base}/snapshot/{camera}"

    def event_snapshot(self, camera: str = "") -> str:
        """The picture of a camera's latest motion event (retained; the default camera's at
        ``motion_snapshot``, a named one's at ``motion_snapshot/<camera>``)."""
        return f"{self.base}/motion_snapshot" + (f"/{camera}" if camera else "")

    def command(self, name: str, camera: str = "") -> str:
        """A button's command topic (a named camera's: ``command/<name>/<camera>``)."""
        return f"{self.base}/command/{name}" + (f"/{camera}" if camera else "")

    @property
    def controls(self) -> str:
        """The default camera's controls' current values, one JSON document."""
        return f"{self.base}/controls"

    def camera_controls(self, camera: str) -> str:
        """A named camera's controls' current values."""
        return f"{self.base}/controls/{camera}"

    def control_set(self, name: str, camera: str = "") -> str:
        """Where Home Assistant sends a new value for camera control ``name`` (of the
        default camera, or of ``camera``: ``control/<camera>/<name>/set``)."""
        return f"{self.base}/control/" + (f"{camera}/" if camera else "") + f"{name}/set"

    @property
    def control_sets(self) -> list[str]:
        """The wildcards for every control's command topic (default and named cameras)."""
        return [f"{self.base}/control/+/set", f"{self.base}/control/+/+/set"]

    @property
    def commands(self) -> list[str]:
        """The wildcards of the buttons' command topics."""
        return [f"{self.base}/command/+", f"{self.base}/command/+/+"]


@dataclass(frozen=True, slots=True)
class Entity:
    """One HA entity: its component (``sensor``, ``camera``...), object id and config keys."""

    component: str
    object_id: str
    config: dict[str, Any] = field(default_factory=dict)


def _sensor(key: str, name: str, **extra: Any) -> Entity:
    return Entity("sensor", key, {"name": name, "value_template": f"{{{{ value_json.{key} }}}}",
                                  **extra})


def _binary(key: str, name: str, device_class: str) -> Entity:
    return Entity("binary_sensor", key, {
        "name": name, "device_class": device_class, "payload_on": "ON", "payload_off": "OFF",
        "value_template": f"{{{{ 'ON' if value_json.{key} else 'OFF' }}}}",
    })


class Discovery:
    """The discovery documents; ``recording`` adds the recording entities."""

    def __init__(self, discovery_prefix: str, topics: Topics, *, name: str,
                 configuration_url: str = "", recording: bool = False,
                 controls: Mapping[str, Mapping[str, Any]] | None = None,
                 cameras: Sequence[str] = (), commands: bool = True,
                 camera_controls: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
                 motion_images: Sequence[str] = ()) -> None:
        self.discovery_prefix = discovery_prefix
        self.topics = topics
        self.name = name
        self.configuration_url = configuration_url
        self.recording = recording
        # GET /api/camera/controls's "controls": each becomes a number, switch or select.
        self.controls = dict(controls or {})
        # The cameras other than the default one (whose entities keep the ids one camera
        # always had, as the unnamed routes serve it): each gets the same entities, named
        # after it, reading the state's "cameras" and its own controls document.
        self.cameras = list(cameras)
        self.camera_controls = {name: dict(specs) for name, specs
                                in (camera_controls or {}).items()}
        # False: no entity that sends commands (buttons, camera controls).
        self.commands = commands
        # The cameras that detect motion ("" for the default one): each gets an image entity
        # showing its latest event's picture.
        self.motion_images = list(motion_images)

    def device(self) -> dict[str, Any]:
        """The shared ``device`` block (``identifiers`` ties every entity to one device)."""
        block: dict[str, Any] = {
            "identifiers": [self.topics.device_id],
            "name": self.name,
            "manufacturer": "RUSEON",
            "model": "RUSEON Appliance",
            "sw_version": __version__,
        }
        if self.configuration_url:
            block["configuration_url"] = self.configuration_url
        return block

    def entities(self) -> list[Entity]:
        """Every entity, before the shared keys are added."""
        topics = self.topics
        entities = [
            Entity("camera", "camera", {"name": "Camera", "topic": topics.snapshot}),
            _sensor("viewers", "Viewers", state_class="measurement", icon="mdi:eye"),
            _sensor("fps", "Frame rate", unit_of_measurement="fps", state_class="measurement",
                    suggested_display_precision=1),
            _sensor("bitrate", "Bitrate", unit_of_measurement="bit/s", device_class="data_rate",
                    state_class="measurement"),
            _sensor("keyframe_age_s", "Keyframe age", unit_of_measurement="s",
                    device_class="duration", state_class="measurement",
                    entity_category="diagnostic"),
            _binary("stalled", "Camera stalled", "problem"),
            # ON from the first motion of an event, OFF when it ends (its off-delay after).
            _binary("motion", "Motion", "motion"),
            Entity("button", "snapshot", {"name": "Snapshot", "icon": "mdi:camera",
                                          "command_topic": topics.command("snapshot"),
                                          "payload_press": PRESS}),
        ]
        if self.recording:
            entities += [
                _sensor("recording_state", "Recording state", icon="mdi:record-rec"),
                _binary("recording", "Recording", "running"),
                # The recordings' times depend on it (a Pi has no real-time clock).
                Entity("binary_sensor", "clock_unsynchronized", {
                    **_binary("clock_unsynchronized", "Clock not synchronized", "problem").config,
                    "entity_category": "diagnostic"}),
                Entity("button", "record", {"name": "Record", "icon": "mdi:record",
                                            "command_topic": topics.command("record"),
                                            "payload_press": PRESS}),
            ]
        entities += [self._control(name, spec) for name, spec in self.controls.items()]
        entities += [self._motion_image(camera) for camera in self.motion_images]
        for camera in self.cameras:
            entities += self._camera_entities(camera)
            entities += [self._control(name, spec, camera) for name, spec
                         in self.camera_controls.get(camera, {}).items()]
        if not self.commands:
            return [e for e in entities if "command_topic" not in e.config]
        return entities

    def _camera_entities(self, camera: str) -> list[Entity]:
        """A named camera: its picture, frame rate, bitrate, viewers, problem sensors and,
        with recording, its recording sensors and button."""
        def value(key: str) -> str:
            return f"{{{{ value_json.cameras['{camera}'].{key} }}}}"

        def flag(key: str) -> str:
            return f"{{{{ 'ON' if value_json.cameras['{camera}'].{key} else 'OFF' }}}}"

        recording = [
            Entity("sensor", f"{camera}_recording_state", {
                "name": f"{camera} recording state", "value_template": value("recording_state"),
                "icon": "mdi:record-rec"}),
            Entity("binary_sensor", f"{camera}_recording", {
                "name": f"{camera} recording", "device_class": "running", "payload_on": "ON",
                "payload_off": "OFF", "value_template": flag("recording")}),
            Entity("button", f"{camera}_record", {
                "name": f"{camera} record", "icon": "mdi:record",
                "command_topic": self.topics.command("record", camera), "payload_press": PRESS}),
        ] if self.recording else []
        return [*recording,
            Entity("camera", f"camera_{camera}", {"name": f"Camera {camera}",
                                                  "topic": self.topics.camera_snapshot(camera)}),
            Entity("sensor", f"{camera}_fps", {
                "name": f"{camera} frame rate", "value_template": value("fps"),
                "unit_of_measurement": "fps", "state_class": "measurement",
                "suggested_display_precision": 1}),
            Entity("sensor", f"{camera}_bitrate", {
                "name": f"{camera} bitrate", "value_template": value("bitrate"),
                "unit_of_measurement": "bit/s", "device_class": "data_rate",
                "state_class": "measurement"}),
            Entity("sensor", f"{camera}_viewers", {
                "name": f"{camera} viewers", "value_template": value("viewers"),
                "state_class": "measurement", "icon": "mdi:eye"}),
            Entity("binary_sensor", f"{camera}_down", {
                "name": f"{camera} down", "device_class": "problem", "payload_on": "ON",
                "payload_off": "OFF", "value_template":
                f"{{{{ 'OFF' if value_json.cameras['{camera}'].up else 'ON' }}}}"}),
            Entity("binary_sensor", f"{camera}_motion", {
                "name": f"{camera} motion", "device_class": "motion", "payload_on": "ON",
                "payload_off": "OFF", "value_template": flag("motion")}),
            Entity("binary_sensor", f"{camera}_stalled", {
                "name": f"{camera} stalled", "device_class": "problem", "payload_on": "ON",
                "payload_off": "OFF", "value_template": flag("stalled")}),
            Entity("sensor", f"{camera}_keyframe_age_s", {
                "name": f"{camera} keyframe age", "value_template": value("keyframe_age_s"),
                "unit_of_measurement": "s", "device_class": "duration",
                "state_class": "measurement", "entity_category": "diagnostic"}),
        ]

    def _motion_image(self, camera: str) -> Entity:
        """HA's MQTT image entity: the picture of the camera's latest motion event (its first
        motion, then its peak), as the binary_sensor turns ON and OFF."""
        return Entity("image", f"{camera}_motion_snapshot" if camera else "motion_snapshot", {
            "name": f"{camera} motion snapshot" if camera else "Motion snapshot",
            "image_topic": self.topics.event_snapshot(camera), "content_type": "image/jpeg",
            "icon": "mdi:motion-sensor"})

    def _control(self, name: str, spec: Mapping[str, Any], camera: str = "") -> Entity:
        """A camera control as a ``config`` entity that reads the controls document and writes
        its own command topic (the appliance validates, as PATCH /api/camera/controls does);
        ``camera`` names a camera other than the default one."""
        label = name.replace("_", " ").capitalize()
        if not spec.get("live", True):
            label += " (restarts camera)"
        if camera:
            label = f"{camera} {label[0].lower()}{label[1:]}"
        config: dict[str, Any] = {
            "name": label, "entity_category": "config",
            "state_topic": (self.topics.camera_controls(camera) if camera
                            else self.topics.controls),
            "command_topic": self.topics.control_set(name, camera),
        }
        object_id = f"{camera}_control_{name}" if camera else f"control_{name}"
        kind = spec.get("type")
        if kind == "bool":
            config.update(payload_on="ON", payload_off="OFF", state_on="ON", state_off="OFF",
                          value_template=f"{{{{ 'ON' if value_json.{name} else 'OFF' }}}}")
            return Entity("switch", object_id, config)
        config["value_template"] = f"{{{{ value_json.{name} }}}}"
        if kind == "enum":
            config["options"] = list(spec.get("choices", []))
            return Entity("select", object_id, config)
        low, high = spec.get("min", 0), spec.get("max", 1)
        config.update(min=low, max=high,
                      # HA refuses a step under 0.001 (and the whole config with it).
                      step=1 if kind == "int" else max(round((high - low) / 100, 6), 0.001),
                      mode="box" if high - low > 1000 else "slider")
        if spec.get("unit"):
            config["unit_of_measurement"] = spec["unit"]
        return Entity("number", object_id, config)

    def config_topics(self) -> str:
        """The wildcard matching every discovery topic of this device (ours and stale ones)."""
        return f"{self.discovery_prefix}/+/{self.topics.device_id}/+/config"

    def configs(self) -> dict[str, str]:
        """``{discovery topic: JSON config}`` for every entity."""
        out: dict[str, str] = {}
        device = self.device()
        for entity in self.entities():
            config = dict(entity.config)
            if entity.component in ("sensor", "binary_sensor"):
                config["state_topic"] = self.topics.state
            config.update({
                "unique_id": f"{self.topics.device_id}_{entity.object_id}",
                # HA 2025.10 replaced object_id (gone in 2026.4) with default_entity_id,
                # which names the domain too.
                "default_entity_id": (f"{entity.component}.{self.topics.device_id}_"
                                      f"{entity.object_id}"),
                "availability_topic": self.topics.availability,
                "payload_available": ONLINE,
                "payload_not_available": OFFLINE,
                "device": device,
            })
            topic = (f"{self.discovery_prefix}/{entity.component}/{self.topics.device_id}/"
                     f"{entity.object_id}/config")
            out[topic] = json.dumps(config, sort_keys=True)
        return out
