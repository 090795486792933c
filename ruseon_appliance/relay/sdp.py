"""The SDP a generic RTP receiver (FFmpeg, GStreamer, mediamtx) needs for a relay's stream."""

from __future__ import annotations

import base64
import ipaddress

from ruseon_appliance.capture.h264 import nal_spans, nal_type
from ruseon_appliance.capture.ring import RingBuffer

NAL_SPS, NAL_PPS = 7, 8


def parameter_sets(ring: RingBuffer) -> tuple[bytes, bytes] | None:
    """SPS and PPS from the newest cached keyframe (the muxer puts them in front of every IDR),
    or None before the first one."""
    seq = ring.newest_keyframe_seq
    view = ring.frame(seq) if seq is not None else None
    if view is None:
        return None
    data = bytes(view.data)
    sps = pps = b""
    for start, end in nal_spans(data):
        kind = nal_type(data[start])
        if kind == NAL_SPS and not sps:
            sps = data[start:end]
        elif kind == NAL_PPS and not pps:
            pps = data[start:end]
    return (sps, pps) if sps and pps else None


def relay_sdp(
    *,
    name: str,
    host: str,
    port: int,
    rtcp_port: int,
    payload_type: int,
    ssrc: int,
    cname: str,
    profile_level_id: str,
    sps: bytes,
    pps: bytes,
    srtp_key: str = "",
    audio_port: int = 0,
    audio_rtcp_port: int = 0,
    audio_payload_type: int = 111,
    audio_ssrc: int = 0,
) -> str:
    """A session description of the relay's stream as its receiver at ``host:port`` sees it.

    ``profile-level-id`` is the real SPS's, ``sprop-parameter-sets`` lets a receiver start
    decoding before the next in-band SPS; with SRTP the key is given as SDES ``a=crypto``
    (RFC 4568), so the SDP is a secret exactly when the key is. With ``audio_port`` an
    ``m=audio`` (Opus, 48 kHz, RFC 7587) follows the video, keyed the same, its SSRC under the
    same CNAME (what a receiver lines the two up by).
    """
    version = 6 if ipaddress.ip_address(host).version == 6 else 4
    sprop = ",".join(base64.b64encode(nal).decode() for nal in (sps, pps))
    profile = f"RTP/{'SAVP' if srtp_key else 'AVP'}"
    crypto = f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{srtp_key}"
    lines = [
        "v=0",
        f"o=- {ssrc} 1 IN IP{version} {host}",
        f"s=RUSEON relay {name}",
        f"c=IN IP{version} {host}",
        "t=0 0",
        f"m=video {port} {profile} {payload_type}",
    ]
    if rtcp_port:
        lines.append(f"a=rtcp:{rtcp_port}")
    lines += [
        f"a=rtpmap:{payload_type} H264/90000",
        f"a=fmtp:{payload_type} packetization-mode=1;profile-level-id={profile_level_id};"
        f"sprop-parameter-sets={sprop}",
    ]
    if srtp_key:
        lines.append(crypto)
    lines += [f"a=ssrc:{ssrc} cname:{cname}", "a=recvonly"]
    if audio_port:
        lines.append(f"m=audio {audio_port} {profile} {audio_payload_type}")
        if audio_rtcp_port:
            lines.append(f"a=rtcp:{audio_rtcp_port}")
        lines += [f"a=rtpmap:{audio_payload_type} opus/48000/2",
                  f"a=fmtp:{audio_payload_type} minptime=20;useinbandfec=0",
                  "a=ptime:20"]
        if srtp_key:
            lines.append(crypto)
        lines += [f"a=ssrc:{audio_ssrc} cname:{cname}", "a=recvonly"]
    return "\r\n".join(lines) + "\r\n"
