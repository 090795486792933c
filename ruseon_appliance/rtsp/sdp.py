"""The session description a DESCRIBE answers: the H.264 track, parameter sets included, and
for a camera with sound its AAC track (RFC 3640 ``mpeg4-generic``, AAC-hbr)."""

from __future__ import annotations

import base64
import ipaddress

from ruseon_appliance.audio.format import AUDIO_CLOCK_RATE
from ruseon_appliance.rtsp.audio import AAC_PAYLOAD_TYPE
from ruseon_appliance.rtsp.session import PAYLOAD_TYPE
from ruseon_appliance.stream.aac import parse_aac_config

# The tracks' control URLs, relative to the Content-Base (``rtsp://host:8554/<camera>/``).
TRACK_CONTROL = "trackID=0"
AUDIO_TRACK_CONTROL = "trackID=1"


def channels_of(aac_config: bytes) -> int:
    """The channel count an AudioSpecificConfig says (1 for one it cannot read)."""
    try:
        return parse_aac_config(aac_config).channels
    except ValueError:
        return 1


def describe_sdp(*, camera: str, host: str, session_id: int, profile_level_id: str,
                 sps: bytes, pps: bytes, framerate: int = 0,
                 aac_config: bytes | None = None) -> str:
    """The SDP of ``camera``'s stream as served from ``host`` (the address the client reached).

    ``profile-level-id`` is the real SPS's and ``sprop-parameter-sets`` carries SPS and PPS, so
    a client can set up its decoder before the first in-band IDR arrives. ``a=framerate``
    (RFC 4566) tells the camera's frame rate to clients that show or plan by it (FFmpeg takes
    it as the stream's rate instead of guessing from the first timestamps; a hardware
    encoder's SPS may carry no timing).

    ``aac_config`` (the AudioSpecificConfig of the camera's AAC: the encoder's, or an IP
    camera's own passed through, of any rate and 1-2 channels): an ``m=audio`` follows, in
    RFC 3640's AAC-hbr mode (13-bit AU sizes, one frame a packet), as FFmpeg, VLC/live555,
    GStreamer and go2rtc take it. Its RTP clock is 48 kHz whatever the sample rate (the frames'
    pts are in 1/48000 s; RFC 3640 only recommends the sample rate), and ``config=`` tells the
    decoder the rate; the channel count is the config's.
    """
    try:
        version = 6 if ipaddress.ip_address(host).version == 6 else 4
    except ValueError:
        version = 4
    any_address = "::" if version == 6 else "0.0.0.0"
    sprop = ",".join(base64.b64encode(nal).decode() for nal in (sps, pps))
    lines = [
        "v=0",
        f"o=- {session_id} 1 IN IP{version} {host}",
        f"s=RUSEON {camera}",
        f"c=IN IP{version} {any_address}",
        "t=0 0",
        "a=control:*",
        "a=range:npt=0-",
        f"m=video 0 RTP/AVP {PAYLOAD_TYPE}",
        f"a=rtpmap:{PAYLOAD_TYPE} H264/90000",
        f"a=fmtp:{PAYLOAD_TYPE} packetization-mode=1;profile-level-id={profile_level_id};"
        f"sprop-parameter-sets={sprop}",
        f"a=control:{TRACK_CONTROL}",
    ]
    if framerate > 0:
        lines.append(f"a=framerate:{framerate}")
    if aac_config:
        pt = AAC_PAYLOAD_TYPE
        lines += [
            f"m=audio 0 RTP/AVP {pt}",
            f"a=rtpmap:{pt} mpeg4-generic/{AUDIO_CLOCK_RATE}/{channels_of(aac_config)}",
            f"a=fmtp:{pt} streamtype=5;profile-level-id=1;mode=AAC-hbr;sizelength=13;"
            f"indexlength=3;indexdeltalength=3;config={aac_config.hex()}",
            f"a=control:{AUDIO_TRACK_CONTROL}",
        ]
    return "\r\n".join(lines) + "\r\n"
