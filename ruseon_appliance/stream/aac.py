"""What an AAC AudioSpecificConfig says (ISO/IEC 14496-3 1.6.2.1): shared by the audio room
(is a camera's own AAC fit to pass through?) and the outputs that write it into an init segment
or an SDP."""

from __future__ import annotations

from dataclasses import dataclass

AAC_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025,
             8000, 7350)


@dataclass(frozen=True, slots=True)
class AacConfig:
    """What an AudioSpecificConfig says (ISO/IEC 14496-3 1.6.2.1)."""

    object_type: int  # 2: AAC-LC
    sample_rate: int
    channels: int

    @property
    def codec(self) -> str:
        """RFC 6381 (``mp4a.40.2`` for AAC-LC)."""
        return f"mp4a.40.{self.object_type}"


def parse_aac_config(asc: bytes) -> AacConfig:
    """Object type, sample rate and channels of an AudioSpecificConfig; ValueError if short."""
    if len(asc) < 2:
        raise ValueError("an AudioSpecificConfig has at least 2 bytes")
    bits = int.from_bytes(asc[:6].ljust(6, b"\0"), "big")
    total = 48
    object_type = bits >> (total - 5)
    pos = 5
    if object_type == 31:
        object_type = 32 + ((bits >> (total - pos - 6)) & 0x3F)
        pos += 6
    index = (bits >> (total - pos - 4)) & 0xF
    pos += 4
    if index == 15:
        rate = (bits >> (total - pos - 24)) & 0xFFFFFF
        pos += 24
    elif index < len(AAC_RATES):
        rate = AAC_RATES[index]
    else:
        raise ValueError(f"sampling frequency index {index} is reserved")
    channels = (bits >> (total - pos - 4)) & 0xF
    return AacConfig(object_type, rate, channels or 1)
