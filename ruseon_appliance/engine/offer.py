"""Checking a viewer's SDP offer before any connection state is built for it.

Each way an offer can be refused has its own error type and a one-sentence reason, so the web
layer can answer 4xx with something a browser developer can act on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from aiortc.rtcrtpparameters import (
    RTCRtpCodecParameters,
    RTCRtpHeaderExtensionParameters,
)
from aiortc.sdp import H264Profile, SessionDescription

from ruseon_appliance.engine.aiortc_internals import copy_codec
from ruseon_appliance.engine.codec_registry import profile_name, profile_of
from ruseon_appliance.engine.errors import MalformedOffer, OfferTooLarge, UnsupportedOffer

# A WHEP offer has video, maybe audio, maybe a data channel; more is not a viewer.
MAX_MEDIA_SECTIONS = 4
# Distinct codec lists (per media section) whose parse the engine keeps (OfferParser).
MAX_CODEC_SHAPES = 16


@dataclass(frozen=True, slots=True)
class CheckedOffer:
    """An offer that passed :func:`check_offer`, with remote candidates removed."""

    sdp: str
    # ``sdp`` parsed (once: the engine hands this object to aiortc instead of the text).
    description: SessionDescription
    media_count: int
    # profile-level-ids of the H.264 packetization-mode=1 formats the offer's video can receive.
    h264_profile_level_ids: tuple[str, ...]


def strip_remote_candidates(sdp: str) -> str:
    """Remove ``a=candidate`` and ``a=end-of-candidates`` lines.

    The engine never sends to an address that has not authenticated with a STUN check first, so
    the viewer's candidates are not needed; dropping them also avoids resolving mDNS names.
    Without end-of-candidates aioice keeps waiting for the viewer's checks instead of failing.
    """
    lines = sdp.splitlines()
    kept = [ln for ln in lines
            if not ln.startswith("a=candidate:") and not ln.startswith("a=end-of-candidates")]
    return "\r\n".join(kept) + "\r\n"


def _copy_extension(
        extension: RTCRtpHeaderExtensionParameters) -> RTCRtpHeaderExtensionParameters:
    return RTCRtpHeaderExtensionParameters(id=extension.id, uri=extension.uri)


# The lines aiortc's SDP parser builds a media section's codec list and header extensions from
# (and builds nothing else from).
CODEC_LINE_PREFIXES = ("a=rtpmap:", "a=fmtp:", "a=rtcp-fb:", "a=extmap:")


_Shape = tuple[list[RTCRtpCodecParameters], list[RTCRtpHeaderExtensionParameters]]


class OfferParser:
    """aiortc's ``SessionDescription.parse``, with each media section's codec list (and header
    extensions) parsed once per distinct set of codec lines.

    Most of an offer is its codecs (a browser offers twenty-odd formats, each with rtpmap, fmtp
    and rtcp-fb lines), and every offer from the same browser lists the same ones; only the
    ICE credentials, fingerprint and ids differ. aiortc builds ``media.rtp.codecs`` from the
    section's ``a=rtpmap``/``a=fmtp``/``a=rtcp-fb`` lines alone (and its ``m=`` line's kind),
    and ``media.rtp.headerExtensions`` from its ``a=extmap`` lines alone, so: the first offer
    of a shape is parsed whole and each section's codecs and extensions are kept under those
    lines as key; later offers of the same shape are parsed without them and get fresh
    copies of what was kept. The result equals a full parse (tests compare them), and no
    codec object is shared between two descriptions. At most :data:`MAX_CODEC_SHAPES` shapes
    are kept (least recently used dropped), so strangers sending odd offers cost nothing but
    full parses."""

    def __init__(self, max_shapes: int = MAX_CODEC_SHAPES) -> None:
        self._max_shapes = max_shapes
        self._codecs: OrderedDict[str, _Shape] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def parse(self, sdp: str) -> SessionDescription:
        """Parse ``sdp`` as aiortc would (raises what aiortc's parser raises)."""
        kept: list[str] = []
        sections: list[list[str]] = []
        current: list[str] | None = None
        # Lines and sections exactly as aiortc's grouplines() cuts them (str.splitlines).
        for line in sdp.splitlines():
            if line.startswith("m="):
                # The port (the offerer's, once it has gathered) changes from offer to offer
                # and plays no part in the codecs: left out of the key.
                kind, _, rest = line.partition(" ")
                current = [kind, rest.partition(" ")[2]]
                sections.append(current)
                kept.append(line)
            elif current is not None and line.startswith(CODEC_LINE_PREFIXES):
                current.append(line)
            else:
                kept.append(line)
        keys = ["\n".join(section) for section in sections]
        templates = [self._codecs.get(key) for key in keys]
        if not keys or any(t is None for t in templates):
            self.misses += 1
            description = SessionDescription.parse(sdp)
            if len(description.media) == len(keys):
                for key, media in zip(keys, description.media, strict=True):
                    self._keep(key, ([copy_codec(c) for c in media.rtp.codecs],
                                     [_copy_extension(x) for x in media.rtp.headerExtensions]))
            return description
        self.hits += 1
        description = SessionDescription.parse("\r\n".join(kept) + "\r\n")
        if len(description.media) != len(keys):  # cannot happen: the same m= lines
            return SessionDescription.parse(sdp)
        for key, template, media in zip(keys, templates, description.media, strict=True):
            assert template is not None
            self._codecs.move_to_end(key)
            codecs, extensions = template
            media.rtp.codecs = [copy_codec(c) for c in codecs]
            media.rtp.headerExtensions = [_copy_extension(x) for x in extensions]
        return description

    def _keep(self, key: str, shape: _Shape) -> None:
        self._codecs[key] = shape
        self._codecs.move_to_end(key)
        while len(self._codecs) > self._max_shapes:
            self._codecs.popitem(last=False)


def check_offer(sdp: str, *, max_bytes: int, stream_profile_level_id: str,
                parse: Callable[[str], SessionDescription] | None = None) -> CheckedOffer:
    """Validate ``sdp`` as a WHEP viewer's offer for a stream of ``stream_profile_level_id``.
    ``parse`` is the SDP parser (default aiortc's; the engine passes its
    :meth:`OfferParser.parse`).

    Raises :class:`OfferTooLarge`, :class:`MalformedOffer` or :class:`UnsupportedOffer`.
    """
    size = len(sdp.encode("utf-8", errors="replace"))
    if size > max_bytes:
        raise OfferTooLarge(f"the offer is {size} bytes; at most {max_bytes} are accepted")
    text = sdp.strip()
    if not text.startswith("v=0"):
        raise MalformedOffer("the body is not an SDP offer: it must start with 'v=0'")
    stripped = strip_remote_candidates(text)
    try:
        description = (parse or SessionDescription.parse)(stripped)
    except Exception as exc:  # aiortc's parser raises ValueError, IndexError, KeyError...
        raise MalformedOffer(
            f"the SDP offer cannot be parsed ({type(exc).__name__}: {exc})") from None

    media = description.media
    if len(media) > MAX_MEDIA_SECTIONS:
        raise UnsupportedOffer(
            f"the offer has {len(media)} media sections; at most {MAX_MEDIA_SECTIONS} are accepted")
    videos = [m for m in media if m.kind == "video"]
    if not videos:
        raise UnsupportedOffer("the offer has no video media section (m=video)")
    for m in media:
        if not m.ice.usernameFragment or not m.ice.password:
            raise MalformedOffer(f"the offer's m={m.kind} section has no ice-ufrag/ice-pwd")
        if m.dtls is None or not m.dtls.fingerprints:
            raise MalformedOffer(f"the offer's m={m.kind} section has no DTLS fingerprint")
        if m.kind in ("audio", "video") and not m.rtcp_mux:
            raise UnsupportedOffer(f"the offer's m={m.kind} section does not use rtcp-mux")
    if len(media) > 1:
        bundle = next((g for g in description.group if g.semantic == "BUNDLE"), None)
        mids = {m.rtp.muxId for m in media}
        if bundle is None or set(bundle.items) != mids:
            raise UnsupportedOffer(
                "the offer has several media sections but does not BUNDLE them all; "
                "the engine serves one transport per viewer")

    video = videos[0]
    if video.direction not in ("recvonly", "sendrecv"):
        raise UnsupportedOffer(
            f"the offer's video is {video.direction or 'sendrecv'}; a WHEP viewer must offer "
            "recvonly video (this endpoint only sends)")

    h264 = [c for c in video.rtp.codecs if c.mimeType.lower() == "video/h264"]
    mode1 = [c for c in h264 if str(c.parameters.get("packetization-mode", "0")) == "1"]
    if not mode1:
        what = "H.264" if not h264 else "H.264 with packetization-mode=1"
        raise UnsupportedOffer(f"the offer's video has no {what}; the camera sends only that")
    offered: list[str] = []
    for c in mode1:
        plid = str(c.parameters.get("profile-level-id", "42e01f")).lower()
        if plid not in offered:
            offered.append(plid)

    wanted = profile_of(stream_profile_level_id)
    compatible: list[H264Profile] = []
    for plid in offered:
        try:
            compatible.append(profile_of(plid))
        except ValueError:
            continue
    if wanted not in compatible:
        raise UnsupportedOffer(
            f"the camera sends H.264 {profile_name(wanted)} (profile-level-id "
            f"{stream_profile_level_id}) but the offer only receives "
            + ", ".join(offered)
            + "; use a browser that decodes this profile or set the camera profile to baseline")
    return CheckedOffer(sdp=stripped, description=description, media_count=len(media),
                        h264_profile_level_ids=tuple(offered))
