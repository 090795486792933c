"""Relays: the camera's stream, encoded and packetized once, handed as RTP (optionally SRTP) to
media servers that scale out (Janus's Streaming plugin, FFmpeg, GStreamer, mediamtx).

A relay is one more consumer of the fan-out (``stream.fanout.FanoutConsumer``); it knows
nothing of HTTP. ``app.py`` builds one :class:`RtpRelay` per ``[[relay]]`` table.
"""

from ruseon_appliance.relay.rtp_relay import RtpRelay
from ruseon_appliance.relay.sdp import parameter_sets, relay_sdp

__all__ = ["RtpRelay", "parameter_sets", "relay_sdp"]
