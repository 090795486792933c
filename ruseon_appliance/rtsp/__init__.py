"""RTSP server output: every camera at ``rtsp://HOST:8554/<camera>`` for NVRs (Frigate/go2rtc,
Blue Iris, Synology Surveillance Station) and players (VLC, FFmpeg, GStreamer).

An RTSP client that plays is one more consumer of the fan-out
(``stream.fanout.FanoutConsumer``), like a relay: frames are packetized once for every viewer,
relay and RTSP client. The server knows nothing of HTTP; ``app.py`` builds one
:class:`RtspServer` when ``[rtsp] enable = true``.
"""

from ruseon_appliance.rtsp.server import RtspServer, RtspSource
from ruseon_appliance.rtsp.session import RtspSession

__all__ = ["RtspServer", "RtspSession", "RtspSource"]
