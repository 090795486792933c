"""RUSEON Appliance: a LAN camera served over WHEP from one engine and one UDP port."""

__version__ = "0.1.0"
