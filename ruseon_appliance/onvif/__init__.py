"""ONVIF Profile S: the device and media services (:mod:`.device`) and WS-Discovery
(:mod:`.discovery`). A room of its own: it reads the cameras, credentials and config it is
given, and imports nothing of the engine."""

from ruseon_appliance.onvif.device import Identity, OnvifDevice, board_model, hostname
from ruseon_appliance.onvif.discovery import DiscoveryResponder

__all__ = ["DiscoveryResponder", "Identity", "OnvifDevice", "board_model", "hostname"]
