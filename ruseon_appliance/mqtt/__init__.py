"""MQTT with Home Assistant discovery: one HA device per appliance, its camera, sensors, binary
sensors and buttons, availability through a Last Will. Built on ``aiomqtt``."""

from .discovery import Discovery, Entity, Topics
from .identity import load_device_id
from .publisher import HomeAssistantMqtt

__all__ = ["Discovery", "Entity", "HomeAssistantMqtt", "Topics", "load_device_id"]
