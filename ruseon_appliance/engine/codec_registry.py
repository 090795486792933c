"""The codec registry, set up once: what the engine can send, and what each answer claims.

aiortc keeps its codecs in the module-level ``aiortc.codecs.CODECS``. It only knows H.264
``42001f`` and ``42e01f`` and matches an offer's H.264 to the *first* local entry of the same
profile, copying that entry's fmtp into the answer. So the registry puts an entry whose
``profile-level-id`` is exactly the one in the stream's SPS at the front, keeps Constrained
Baseline, Main and High registered, gives every entry ``nack``, ``nack pli`` and ``ccm fir``
feedback plus RTX, and hands each session codec preferences naming that one entry.
"""

from __future__ import annotations

import logging

from aiortc import RTCRtpCodecCapability, RTCRtpSender
from aiortc.codecs import CODECS
from aiortc.rtcrtpparameters import RTCRtcpFeedback, RTCRtpCodecParameters
from aiortc.sdp import H264Profile, parse_h264_profile_level_id

logger = logging.getLogger(__name__)

H264_MIME = "video/H264"
RTX_MIME = "video/rtx"
CLOCK_RATE = 90_000
# Registered up front: Constrained Baseline (every browser), Main (opt-in), High (Safari).
BASE_PROFILE_LEVEL_IDS = ("42e01f", "4d001f", "64001f")
FEEDBACK = (
    RTCRtcpFeedback(type="nack"),
    RTCRtcpFeedback(type="nack", parameter="pli"),
    RTCRtcpFeedback(type="ccm", parameter="fir"),
)


def h264_parameters(profile_level_id: str) -> dict[str, str | int | None]:
    """The fmtp parameters the engine registers and answers for a profile-level-id."""
    return {
        "level-asymmetry-allowed": "1",
        "packetization-mode": "1",
        "profile-level-id": profile_level_id.lower(),
    }


def profile_of(profile_level_id: str) -> H264Profile:
    """The H.264 profile a profile-level-id names (raises ValueError if it is not one)."""
    return parse_h264_profile_level_id(profile_level_id)[0]


def profile_name(profile: H264Profile) -> str:
    """``PROFILE_CONSTRAINED_BASELINE`` -> ``constrained baseline``."""
    name: str = profile.name
    return name.removeprefix("PROFILE_").replace("_", " ").lower()


class CodecRegistry:
    """The process's H.264 codec entries in ``aiortc.codecs.CODECS["video"]``."""

    def __init__(self) -> None:
        self._entries: dict[str, RTCRtpCodecParameters] = {}
        self._front: str | None = None
        # Built once per profile-level-id: (preferences, [entry, rtx]).
        self._selections: dict[
            str, tuple[list[RTCRtpCodecCapability], list[RTCRtpCodecParameters]]] = {}

    def install(self) -> None:
        """Register the base profiles (idempotent; CODECS is process-wide)."""
        for plid in BASE_PROFILE_LEVEL_IDS:
            self._ensure(plid)

    @staticmethod
    def audio_preferences() -> list[RTCRtpCodecCapability]:
        """An audio transceiver's codec preferences: Opus alone (the feed's one encode)."""
        return [c for c in RTCRtpSender.getCapabilities("audio").codecs
                if c.mimeType.lower() == "audio/opus"]

    def _free_payload_types(self) -> list[int]:
        used = {c.payloadType for c in CODECS["video"]} | {c.payloadType for c in CODECS["audio"]}
        # Above aiortc's own (96-102) first, so bundled audio and video never share a type.
        return [pt for pt in [*range(103, 128), *range(96, 103)] if pt not in used]

    def _ensure(self, profile_level_id: str) -> RTCRtpCodecParameters:
        plid = profile_level_id.lower()
        entry = self._entries.get(plid)
        if entry is not None:
            return entry
        # Another registry in this process (a second engine in a test) may have added it.
        for codec in CODECS["video"]:
            if (codec.mimeType.lower() == "video/h264"
                    and codec.parameters == h264_parameters(plid)
                    and any(f.type == "ccm" for f in codec.rtcpFeedback)):
                self._entries[plid] = codec
                return codec
        free = self._free_payload_types()
        if len(free) < 2:
            raise RuntimeError("no free RTP payload types left to register H.264 " + plid)
        entry = RTCRtpCodecParameters(
            mimeType=H264_MIME, clockRate=CLOCK_RATE, payloadType=free[0],
            rtcpFeedback=list(FEEDBACK), parameters=h264_parameters(plid),
        )
        rtx = RTCRtpCodecParameters(
            mimeType=RTX_MIME, clockRate=CLOCK_RATE, payloadType=free[1],
            parameters={"apt": free[0]},
        )
        # Ours go before aiortc's own H.264 entries so an offer's H.264 matches them first.
        CODECS["video"][0:0] = [entry, rtx]
        self._entries[plid] = entry
        logger.debug("registered H.264 %s as payload type %d", plid, free[0])
        return entry

    def select(self, profile_level_id: str) -> list[RTCRtpCodecCapability]:
        """Codec preferences for a session of a stream with this profile-level-id.

        Moves that entry to the front of the registry, so the answer's fmtp carries this exact
        profile-level-id (aiortc matches on profile only, first entry wins). The list is built
        once per profile-level-id; callers must not modify it.
        """
        return self._selection(profile_level_id)[0]

    def local_codecs(self, profile_level_id: str) -> list[RTCRtpCodecParameters]:
        """The registered ``[H.264 entry, its RTX]`` a session of this stream negotiates from."""
        return self._selection(profile_level_id)[1]

    def _selection(
        self, profile_level_id: str
    ) -> tuple[list[RTCRtpCodecCapability], list[RTCRtpCodecParameters]]:
        plid = profile_level_id.lower()
        selection = self._selections.get(plid)
        entry = self._ensure(plid)
        if self._front != plid or CODECS["video"][0] is not entry:
            rtx = next(c for c in CODECS["video"]
                       if c.mimeType.lower() == "video/rtx"
                       and c.parameters.get("apt") == entry.payloadType)
            CODECS["video"].remove(entry)
            CODECS["video"].remove(rtx)
            CODECS["video"][0:0] = [entry, rtx]
            self._front = plid
        if selection is None:
            rtx = CODECS["video"][1]
            selection = self._selections[plid] = (
                [RTCRtpCodecCapability(mimeType=H264_MIME, clockRate=CLOCK_RATE,
                                       parameters=dict(entry.parameters)),
                 RTCRtpCodecCapability(mimeType=RTX_MIME, clockRate=CLOCK_RATE)],
                [entry, rtx])
        return selection
