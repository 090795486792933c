"""The engine: built once, owning the certificate, the codec registry, the UDP mux and sessions.

A new viewer adds only its own connection state: a peer connection (sharing the certificate),
ICE credentials and routes on the shared socket, and a cursor into the ring buffer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import secrets
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aioice.ice
from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpCodecCapability,
    RTCRtpTransceiver,
    RTCSessionDescription,
)
from aiortc.rtcconfiguration import RTCBundlePolicy

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.config import WebRtcConfig
from ruseon_appliance.engine import aiortc_internals, srtp_profiles
from ruseon_appliance.engine.answer_template import (
    AnswerTemplate,
    Identities,
    offer_shape,
    quick_offer,
    same_answer,
)
from ruseon_appliance.engine.audio import (
    AudioFanout,
    AudioFeed,
    AudioViewer,
    FanoutAudioTrack,
    offers_opus,
)
from ruseon_appliance.engine.certificate import DtlsCertificate, load_or_create_certificate
from ruseon_appliance.engine.codec_registry import CodecRegistry
from ruseon_appliance.engine.errors import (
    MalformedOffer,
    OfferError,
    TooManyFromAddress,
    TooManyViewers,
    UnknownSession,
    UnsupportedOffer,
)
from ruseon_appliance.engine.fanout import FanoutTrack, FanoutViewer
from ruseon_appliance.engine.offer import (
    MAX_CODEC_SHAPES,
    CheckedOffer,
    OfferParser,
    check_offer,
)
from ruseon_appliance.engine.offer_burst import OfferBurst
from ruseon_appliance.engine.prebuilt import PrebuiltPool
from ruseon_appliance.engine.session import WhepSession
from ruseon_appliance.engine.track import ViewerTrack
from ruseon_appliance.engine.udp_mux import UdpMux
from ruseon_appliance.logs import RateLimit
from ruseon_appliance.stream.cursor import ViewerCursor
from ruseon_appliance.stream.fanout import Fanout
from ruseon_appliance.stream.pacing import JOIN_TICKS_PER_BYTE

logger = logging.getLogger(__name__)

DEFAULT_MAX_OFFER_BYTES = 64 * 1024
# How long an offer may wait for the camera's first SPS before being told to retry.
STREAM_READY_TIMEOUT_S = 3.0
# Retry-After for an address at its share of places while some of them are pending (they
# connect within a second or so, or time out), and when every one of them is connected.
PENDING_RETRY_AFTER_S = 2
CONNECTED_RETRY_AFTER_S = 10
# At most one log line per this many seconds for datagrams that raised inside aiortc.
RECEIVE_ERROR_LOG_INTERVAL_S = 10.0
# A source that cannot make an IDR on demand (``keyframes_on_demand`` False: a file replay,
# rpicam-vid, an IP camera): a viewer joining mid-GOP is sent the GOP so far, and a viewer's
# PLI/FIR is answered the same way, up to this many seconds of stream.
GOP_CATCH_UP_MAX_S = 2.5
# Peer connections built ahead for fan-out viewers (engine/prebuilt.py): enough for a burst of
# this many offers at once (about 35 KB each), at most max_viewers.
PREBUILT_PEER_CONNECTIONS = 32
# Whether an Engine answers offers of a shape it has answered before from the shape's template,
# building their aiortc objects only on the viewer's first valid STUN check (answer_template.py;
# bench/pion.py's ``eager`` variant turns it off).
LAZY_SESSIONS = True

SessionListener = Callable[[str, WhepSession], None]
# An answer template's key: the stream's profile-level-id, whether the engine has sound for
# the feed, and the offer's shape (answer_template.offer_shape).
_TemplateKey = tuple[str, bool, str]


@dataclass(frozen=True, slots=True)
class _LazyOffer:
    """What a lazy session keeps until its first valid STUN check: the offer's text and what
    its answer promised (a few fields; no aiortc object)."""

    sdp: str
    profile_level_id: str
    audio: AudioFeed | None
    password: str
    identities: Identities
    answer: str
    key: _TemplateKey


def keyframes_on_demand(feed: object) -> bool:
    """Whether ``feed`` (a camera's pipeline) can make an IDR when asked; a feed that does not
    say (a test's) is taken to."""
    return bool(getattr(feed, "keyframes_on_demand", True))


class StreamNotReady(TooManyViewers):
    """No video yet (camera starting): like a full engine, the web layer answers 503."""


class AnswerMismatch(Exception):
    """aiortc answered a lazy session's offer otherwise than the template that was sent."""


def _ice_string(length: int) -> str:
    # Hex is a subset of ICE's ice-char set; token_hex is one urandom call, not one per char.
    return secrets.token_hex((length + 1) // 2)[:length]


def default_advertise(families: list[int]) -> list[str]:
    """The board's own interface addresses for the families the mux listens on."""
    addresses: list[str] = aioice.ice.get_host_addresses(
        use_ipv4=socket.AF_INET in families, use_ipv6=socket.AF_INET6 in families)
    return addresses


class Engine:
    """The WebRTC engine. HTTP-free: the web layer and the HIL harness use only
    :meth:`offer`, :meth:`close`, :attr:`sessions`, :meth:`stats` and :meth:`add_listener`."""

    def __init__(
        self,
        webrtc: WebRtcConfig,
        state_dir: Path,
        feed: CapturePipeline | None = None,
        *,
        udp_socket: socket.socket | None = None,
        max_offer_bytes: int = DEFAULT_MAX_OFFER_BYTES,
        lazy_sessions: bool | None = None,
    ) -> None:
        self.config = webrtc
        self._state_dir = Path(state_dir)
        self._feed = feed
        self._udp_socket = udp_socket
        self._max_offer_bytes = max_offer_bytes
        self._certificate: DtlsCertificate | None = None
        self._codecs = CodecRegistry()
        self._offer_parser = OfferParser()
        # Offers of a shape already answered once are answered from its template, and their
        # aiortc objects are built on the viewer's first valid STUN check (answer_template.py).
        self.lazy_sessions = LAZY_SESSIONS if lazy_sessions is None else lazy_sessions
        # None: a shape whose template failed once (answered eagerly from then on).
        self._templates: OrderedDict[_TemplateKey, AnswerTemplate | None] = OrderedDict()
        self._lazy: dict[str, _LazyOffer] = {}
        self.lazy_counts: Counter[str] = Counter()
        self._mux = UdpMux(webrtc.listen, sockets=[udp_socket] if udp_socket else [])
        # While offers are pending, datagrams and the garbage collector wait (bounded).
        self._burst = OfferBurst(self._mux)
        self._answer_lock = asyncio.Lock()
        # One fan-out send loop per feed with viewers (or consumers), by id(feed).
        self._fanouts: dict[int, Fanout] = {}
        # One audio send loop per audio feed with viewers, by id(audio feed).
        self._audio_fanouts: dict[int, AudioFanout] = {}
        self._sessions: dict[str, WhepSession] = {}
        # Offers being answered (not sessions yet), in all and by source address key.
        self._pending = 0
        # Offers being answered and lazy sessions being built: while there are any, the burst
        # holds datagrams and the collector (offer_burst.py).
        self._burst_work = 0
        self._answering: Counter[str] = Counter()
        self._listeners: list[SessionListener] = []
        self._advertise: list[str] = []
        self._rtc_configuration = RTCConfiguration(iceServers=[])
        self._prebuilt: PrebuiltPool[tuple[RTCPeerConnection, RTCRtpTransceiver,
                                           FanoutTrack]] | None = None
        # How many OpenSSL contexts the DTLS connections share (aiortc_internals).
        self._dtls_contexts: Callable[[], int] = lambda: 0
        self._started = False
        self._stopping = False
        self.offers_accepted = 0
        self.offers_rejected: Counter[str] = Counter()
        self.sessions_ended: Counter[str] = Counter()
        self.keyframe_requests: Counter[str] = Counter()
        # Viewers' keyframe requests answered from the ring (a source without IDR on demand).
        self.keyframe_refreshes = 0
        # Why offers found no place, and why pending sessions were closed to make one.
        self.places_refused: Counter[str] = Counter()
        self.places_reclaimed: Counter[str] = Counter()
        # Exceptions a received datagram raised inside aiortc, swallowed by the guard.
        self.receive_errors: Counter[str] = Counter()
        self._receive_error_log = RateLimit(RECEIVE_ERROR_LOG_INTERVAL_S)
        # SRTP profiles offered in every DTLS handshake (chosen at start; engine/srtp_profiles).
        self.srtp_capability = srtp_profiles.AesCapability(None, "not started")
        self.srtp_profiles: tuple[str, ...] = ()
        self._srtp_offer: list[Any] = []

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the certificate, register codecs, open the UDP port."""
        if self._started:
            return
        self._certificate = await asyncio.to_thread(load_or_create_certificate, self._state_dir)
        aiortc_internals.install_certificate_hook()
        aiortc_internals.install_lean_offer_hooks()
        aiortc_internals.cache_fingerprints(self._certificate.rtc)
        self._choose_srtp_profiles()
        self._rtc_configuration = RTCConfiguration(iceServers=self._ice_servers(),
                                                   bundlePolicy=RTCBundlePolicy.BALANCED)
        self._codecs.install()
        self._mux.start()
        capacity = min(PREBUILT_PEER_CONNECTIONS, self.config.max_viewers)
        if self.config.send_path == "fanout":
            self._prebuilt = PrebuiltPool(self._build_fanout_peer_connection, capacity,
                                          busy=self._answering_offers)
            self._prebuilt.start()
        # One DTLS context for every connection, built now rather than in the first handshake.
        self._dtls_contexts = aiortc_internals.share_ssl_contexts(self._certificate.rtc)
        self._certificate.rtc._create_ssl_context(srtp_profiles=list(self._srtp_offer))
        self._started = True
        if self._feed is not None:
            self.fanout_for(self._feed)
        if self.config.advertise:
            self._advertise = list(self.config.advertise)
        elif self.config.listen.host not in ("0.0.0.0", "::", ""):
            self._advertise = [self.config.listen.host]
        else:
            self._advertise = default_advertise(self._mux.families)
        if not self._advertise:
            logger.warning("no address to advertise in answers: set webrtc.advertise")
        deprecated = deprecated_settings(self.config)
        if deprecated:
            logger.warning("%s", deprecated)
        logger.info("engine ready: UDP port %d, advertising %s, fingerprint %s",
                    self._mux.port, ", ".join(self._advertise) or "nothing",
                    self._certificate.fingerprint)

    async def stop(self) -> None:
        """Close every session, then the socket."""
        if not self._started or self._stopping:
            return
        self._stopping = True
        self._burst.close()
        await asyncio.gather(*(s.close("shutdown") for s in list(self._sessions.values())),
                             return_exceptions=True)
        if self._prebuilt is not None:
            self._prebuilt.stop()
        self._prebuilt = None
        fanouts, self._fanouts = list(self._fanouts.values()), {}
        for fanout in fanouts:
            await fanout.stop()
        audio_fanouts, self._audio_fanouts = list(self._audio_fanouts.values()), {}
        for audio_fanout in audio_fanouts:
            await audio_fanout.stop()
        self._mux.close()
        self._started = False
        self._stopping = False
        logger.info("engine stopped")

    # -- public interface ------------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        """``sha-256 AB:CD:...`` of the DTLS certificate every viewer sees."""
        if self._certificate is None:
            raise RuntimeError("engine not started")
        return self._certificate.fingerprint

    @property
    def udp_port(self) -> int:
        """The one UDP port carrying every viewer's ICE, DTLS and SRTP."""
        return self._mux.port

    @property
    def advertised_addresses(self) -> list[str]:
        """Addresses put in answers as host candidates."""
        return list(self._advertise)

    @property
    def sessions(self) -> Mapping[str, WhepSession]:
        """Live sessions by id (read-only view)."""
        return MappingProxyType(self._sessions)

    @property
    def fanout(self) -> Fanout | None:
        """The default feed's fan-out send loop (see :meth:`fanout_for`), None on the aiortc
        send path or without a default feed."""
        return self._fanouts.get(id(self._feed)) if self._feed is not None else None

    def fanout_for(self, feed: CapturePipeline) -> Fanout | None:
        """The fan-out send loop of ``feed`` while running on that send path (else None),
        started on first use: other consumers of its packetize-once frames attach here
        (``Fanout.add_consumer``)."""
        if self.config.send_path != "fanout" or not self._started:
            return None
        fanout = self._fanouts.get(id(feed))
        if fanout is None:
            camera = feed.camera
            fanout = self._fanouts[id(feed)] = Fanout(
                feed, self._mux.socket_for, framerate=camera.framerate,
                min_bitrate=camera.bitrate)
            fanout.start()
        return fanout

    @property
    def mux(self) -> UdpMux:
        """The UDP mux (for stats and tests)."""
        return self._mux

    def add_listener(self, listener: SessionListener) -> None:
        """Call ``listener(event, session)`` on ``session-started`` and ``session-ended``."""
        self._listeners.append(listener)

    async def offer(self, sdp: str, *, feed: CapturePipeline | None = None,
                    remote: str | None = None,
                    audio: AudioFeed | None = None) -> tuple[WhepSession, str]:
        """Answer a viewer's offer for ``feed`` (default: the engine's default feed): returns
        the new session and the answer SDP. Every feed shares the certificate and UDP port.

        ``audio`` is the feed's sound (its Opus packets), if it has any: an offer whose
        ``m=audio`` receives Opus is answered with it (on the fan-out send path), one without
        gets video alone, and an offer's audio section the engine cannot serve is answered
        inactive, never refused.

        ``remote`` is the address the offer came from (the HTTP client's), if known: it may
        hold at most :meth:`~WebRtcConfig.places_per_address` places, connected and pending
        (answered, not yet connected) together; offers within that share are all answered,
        however many arrive at once. When every place is taken and some are only pending, a
        pending session gives way: the oldest of the address holding the most pending ones
        (a flood gives way first). Connected viewers are never displaced.
        Raises an :class:`~.errors.OfferError` subclass for every refusal.
        """
        try:
            chosen = feed if feed is not None else self._feed
            if chosen is None:
                raise StreamNotReady("no camera was named for this viewer", retry_after=5)
            return await self._offer(sdp, address_key(remote), chosen, audio)
        except OfferError as exc:
            self.offers_rejected[type(exc).__name__] += 1
            logger.info("offer refused (%s): %s", type(exc).__name__, exc.reason)
            raise

    async def close(self, session_id: str, reason: str = "delete") -> bool:
        """End a session (a DELETE); False if there is no such live session."""
        session = self._sessions.get(session_id)
        if session is None:
            return False
        await session.close(reason)
        return True

    def get(self, session_id: str) -> WhepSession:
        """The live session with that id, or :class:`UnknownSession`."""
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UnknownSession("no live session has that id") from None

    def stats(self) -> dict[str, Any]:
        """Engine-wide counters: sessions, offers, ends by reason, the mux."""
        states = Counter(s.state for s in self._sessions.values())
        pending = self._pending_sessions()
        places = self._places_by_address()
        return {
            "sessions": len(self._sessions),
            "sessions_connected": states.get("connected", 0),
            "sessions_connecting": states.get("connecting", 0),
            # Places held without a connection: pending sessions and offers being answered.
            "sessions_pending": len(pending) + self._pending,
            "pending_addresses": len({s.remote_key for s in pending} | set(self._answering)),
            # Places (connected and pending) one address may hold; how many addresses hold
            # places now, and the most one of them holds.
            "max_viewers_per_address": self.config.places_per_address(),
            "addresses": len(places),
            "address_places_max": max(places.values(), default=0),
            "pending_timeout_s": self.config.connect_timeout_s,
            "places_refused": dict(self.places_refused),
            "places_reclaimed": dict(self.places_reclaimed),
            "max_viewers": self.config.max_viewers,
            "send_path": self.config.send_path,
            "udp_port": self._mux.port,
            "advertise": list(self._advertise),
            "fingerprint": self._certificate.fingerprint if self._certificate else None,
            "offers_accepted": self.offers_accepted,
            "offers_rejected": dict(self.offers_rejected),
            "sessions_ended": dict(self.sessions_ended),
            "keyframe_requests": dict(self.keyframe_requests),
            "keyframe_refreshes": self.keyframe_refreshes,
            "receive_errors": dict(self.receive_errors),
            "mux": self._mux.stats(),
            "srtp": self._srtp_stats(),
            "fanout": _summed([f.stats() for f in self._fanouts.values()]),
            "audio_fanout": _summed([f.stats() for f in self._audio_fanouts.values()]),
            "prebuilt": self._prebuilt.stats() if self._prebuilt is not None else None,
            # OpenSSL contexts the DTLS connections share (one per SRTP profile list).
            "dtls_contexts": self._dtls_contexts(),
            "offer_bursts": self._burst.stats(),
            # Answers from a template; their sessions built on a STUN check, still waiting for
            # one, failed to build; answers aiortc wrote otherwise than the template (each
            # closes its session and drops the template); templates kept.
            "lazy": {**{k: self.lazy_counts[k] for k in (
                "answered", "answered_after_learning", "built", "build_failed",
                "answer_mismatch", "learned")},
                "pending": len(self._lazy),
                "templates": sum(t is not None for t in self._templates.values())},
        }

    # -- offer handling --------------------------------------------------------------------------

    def _pending_sessions(self) -> list[WhepSession]:
        """Sessions answered but not connected (and not closing), oldest first."""
        return sorted((s for s in self._sessions.values()
                       if s.state == "connecting" and not s.closing),
                      key=lambda s: s.created_monotonic)

    def _places_by_address(self) -> Counter[str]:
        """Places held by each known address key: its sessions (connected or pending, not
        closing) and its offers being answered."""
        places = Counter(s.remote_key for s in self._sessions.values()
                         if s.remote_key is not None and not s.closing)
        places.update(self._answering)
        return places

    def _take_place(self, key: str | None) -> None:
        """Find the offer a place, closing a pending session if that is the only way, or
        raise (and count why not)."""
        pending = self._pending_sessions()
        share = self.config.places_per_address()
        # A share of every place is no limit beyond max_viewers itself (below: 503, or a
        # pending place given way), as with a single place.
        if key is not None and share < self.config.max_viewers:
            mine = self._places_by_address()[key]
            if mine >= share:
                waiting = sum(s.remote_key == key for s in pending) + self._answering[key]
                self.places_refused["address-share"] += 1
                raise TooManyFromAddress(
                    f"this address already holds {mine} viewer places ({waiting} of them not "
                    f"connected yet), the most one address may of the device's "
                    f"{self.config.max_viewers} (webrtc.max_viewers_per_address); close one, "
                    "or wait for one to connect or time out",
                    retry_after=PENDING_RETRY_AFTER_S if waiting else CONNECTED_RETRY_AFTER_S)
        taken = sum(not s.closing for s in self._sessions.values()) + self._pending
        if taken < self.config.max_viewers:
            return
        if not pending:
            self.places_refused["all-connected"] += 1
            raise TooManyViewers(
                f"all {self.config.max_viewers} viewer places are taken; try again later",
                retry_after=CONNECTED_RETRY_AFTER_S)
        # Connected viewers keep their places; a pending one may be a client that never
        # starts ICE (or an attacker holding places): one gives way to the newcomer. The oldest
        # of the address with the most pending sessions, so that a flood from one address
        # costs that address its places and not another's viewers who are still connecting.
        by_address = Counter(s.remote_key for s in pending)
        oldest = max(pending, key=lambda s: by_address[s.remote_key])  # first: oldest of them
        self.places_reclaimed["oldest-pending"] += 1
        logger.info("session %s closed to make room: pending for %.1f s (%d pending from its "
                    "address)", oldest.id[:8], time.monotonic() - oldest.created_monotonic,
                    by_address[oldest.remote_key])
        oldest.close_soon("reclaimed")

    async def _offer(self, sdp: str, key: str | None, feed: CapturePipeline,
                     audio: AudioFeed | None = None) -> tuple[WhepSession, str]:
        if not self._started or self._stopping:
            raise StreamNotReady("the engine is not running", retry_after=5)
        self._take_place(key)
        info = feed.stream_info
        if info is not None:
            # An offer of a shape answered before, its per-offer values plainly valid (what
            # check_offer would accept: answer_template.quick_offer), is answered from the
            # shape's template at once: no await, nothing built, nothing to hold back.
            lazily = self._template_answer(sdp, info.profile_level_id,
                                           self._serves_audio(audio), feed, audio)
            if lazily is not None:
                lazily[0].remote_key = key
                return lazily
        self._pending += 1
        self._work_begins()
        if key is not None:
            self._answering[key] += 1
        try:
            info = feed.stream_info
            if info is None:
                await feed.wait_first_frame(STREAM_READY_TIMEOUT_S)
                info = feed.stream_info
            if info is None:
                raise StreamNotReady("the camera has not produced video yet", retry_after=2)
            serves_audio = self._serves_audio(audio)
            checked = check_offer(sdp, max_bytes=self._max_offer_bytes,
                                  stream_profile_level_id=info.profile_level_id,
                                  parse=self._offer_parser.parse)
            template_key = (info.profile_level_id, serves_audio, offer_shape(checked.sdp))
            # One offer at a time, in arrival order: each answer leaves the moment it is ready
            # instead of all together at the end of a burst (aiortc's awaits would otherwise
            # interleave them in lockstep), so viewers get and apply their answers while later
            # ones are made; what would run between them waits (offer_burst.py).
            async with self._answer_lock:
                # A burst of one new shape (the first viewers after boot, a browser update):
                # the offer answered before this one made its template; answered from it too.
                lazily = self._template_answer(sdp, info.profile_level_id, serves_audio, feed,
                                               audio)
                if lazily is not None:
                    self.lazy_counts["answered_after_learning"] += 1
                    session, answer = lazily
                else:
                    session, answer = await self._build_session(
                        checked, info.profile_level_id, feed, audio, template_key=template_key)
            session.remote_key = key
            return session, answer
        finally:
            self._pending -= 1
            self._work_ends()
            if key is not None:
                self._answering[key] -= 1
                if not self._answering[key]:
                    del self._answering[key]

    def _template_answer(self, sdp: str, profile_level_id: str, serves_audio: bool,
                         feed: CapturePipeline, audio: AudioFeed | None
                         ) -> tuple[WhepSession, str] | None:
        """The answer from the template of this offer's shape, if there is one (None: the
        offer is answered by aiortc)."""
        if not self.lazy_sessions or not self._templates:
            return None
        quick = quick_offer(sdp, self._max_offer_bytes)
        if quick is None:
            return None
        template_key = (profile_level_id, serves_audio, quick.shape)
        template = self._templates.get(template_key)
        if template is None:
            return None
        self._templates.move_to_end(template_key)
        return self._answer_lazily(quick.sdp, template, template_key, feed, audio)

    def _ice_servers(self) -> list[RTCIceServer]:
        return [RTCIceServer(urls=url) for url in self.config.ice_servers]

    @staticmethod
    def _cursor_settings(feed: CapturePipeline) -> tuple[int, int, int]:
        """``(frame_interval, catch_up_max_frames, keyframe_interval_frames)``."""
        camera = feed.camera
        return (round(90_000 / camera.framerate),
                # A burst of up to the coalescing window (at least a few frames) is cheaper
                # than waiting for an IDR that coalescing may not force.
                camera.catch_up_frames,
                camera.keyframe_interval)

    @staticmethod
    def _gop_catch_up_bytes(feed: CapturePipeline) -> int:
        """How much of a GOP a joining viewer may be sent to see motion at once: up to
        :data:`GOP_CATCH_UP_MAX_S` of the stream for a source that cannot make a keyframe on
        demand; none for one that can (a fresh IDR comes instead, see ``stream/cursor.py``)."""
        if keyframes_on_demand(feed):
            return 0
        return int(feed.camera.bitrate / 8 * GOP_CATCH_UP_MAX_S)

    def _answering_offers(self) -> bool:
        """Whether offers are being answered now (the pools wait until they are done)."""
        return self._burst_work > 0

    def _work_begins(self) -> None:
        self._burst_work += 1
        if self._burst_work == 1:
            self._burst.begin()

    def _work_ends(self) -> None:
        self._burst_work -= 1
        if not self._burst_work:
            self._burst.end()

    def _build_fanout_peer_connection(
            self) -> tuple[RTCPeerConnection, RTCRtpTransceiver, FanoutTrack]:
        """What a fan-out viewer's offer starts from (the pool builds these when idle)."""
        assert self._certificate is not None
        track = FanoutTrack()
        pc, transceiver = aiortc_internals.sendonly_peer_connection(
            self._rtc_configuration, self._certificate.rtc, track)
        return pc, transceiver, track

    def _new_peer_connection(
        self, feed: CapturePipeline, fanout: Fanout | None
    ) -> tuple[RTCPeerConnection, RTCRtpTransceiver, ViewerTrack | FanoutTrack]:
        """A fresh peer connection with the viewer's sendonly transceiver and track."""
        if fanout is not None and self._prebuilt is not None:
            return self._prebuilt.take()
        assert self._certificate is not None
        with aiortc_internals.shared_certificate(self._certificate.rtc):
            pc = RTCPeerConnection(self._rtc_configuration)
        track = self._new_track(feed, fanout)
        return pc, pc.addTransceiver(track, direction="sendonly"), track

    def _new_track(self, feed: CapturePipeline, fanout: Fanout | None
                   ) -> ViewerTrack | FanoutTrack:
        if fanout is not None:
            return FanoutTrack()
        interval, catch_up, gop = self._cursor_settings(feed)
        return ViewerTrack(feed, frame_interval=interval, catch_up_max_frames=catch_up,
                           keyframe_interval_frames=gop)

    def _new_fanout_viewer(self, fanout: Fanout, feed: CapturePipeline) -> FanoutViewer:
        interval, catch_up, gop = self._cursor_settings(feed)
        cursor = ViewerCursor(feed, fanout.take, frame_interval=interval,
                              catch_up_max_frames=catch_up, keyframe_interval_frames=gop,
                              catch_up_max_bytes=self._gop_catch_up_bytes(feed),
                              burst_ticks_per_byte=JOIN_TICKS_PER_BYTE)
        return FanoutViewer(fanout, cursor, on_keyframe_request=lambda reason: None,
                            on_nack=lambda seq: None)

    def _serves_audio(self, audio: AudioFeed | None) -> bool:
        """Whether an offer receiving Opus gets ``audio`` (sound on the fan-out path only)."""
        return audio is not None and self.config.send_path == "fanout"

    async def _build_session(
        self, offer: CheckedOffer, profile_level_id: str, feed: CapturePipeline,
        audio: AudioFeed | None = None, *, template_key: _TemplateKey | None = None,
        lazy: WhepSession | None = None
    ) -> tuple[WhepSession, str]:
        assert self._certificate is not None
        preferences = self._codecs.select(profile_level_id)
        wants_audio = any(offers_opus(m) for m in offer.description.media)
        with aiortc_internals.lean_offer(offer.sdp, offer.description,
                                         self._codecs.local_codecs(profile_level_id)):
            return await self._build_lean_session(
                offer.sdp, preferences, feed, audio if wants_audio else None,
                template_key=template_key, lazy=lazy)

    def audio_fanout_for(self, audio: AudioFeed) -> AudioFanout:
        """The audio send loop of ``audio`` (started on first use)."""
        fanout = self._audio_fanouts.get(id(audio))
        if fanout is None:
            fanout = self._audio_fanouts[id(audio)] = AudioFanout(audio, self._mux.socket_for)
            fanout.start()
        return fanout

    async def _build_lean_session(
        self, offer_sdp: str, preferences: list[RTCRtpCodecCapability], feed: CapturePipeline,
        audio: AudioFeed | None = None, *, template_key: _TemplateKey | None = None,
        lazy: WhepSession | None = None
    ) -> tuple[WhepSession, str]:
        """Build a viewer's aiortc objects and answer its offer: a new session (the eager
        path: the first offer of a shape, which teaches ``template_key``'s template), or
        ``lazy``, a session answered from a template, built now with the values its answer
        gave (ufrag, password, SSRCs...)."""
        promised = self._lazy.get(lazy.id) if lazy is not None else None
        if lazy is not None and promised is None:
            raise RuntimeError("a lazy session without its offer")
        fanout = self.fanout_for(feed)
        pc, transceiver, track = self._new_peer_connection(feed, fanout)
        viewer = self._new_fanout_viewer(fanout, feed) if fanout is not None else None
        # Before setRemoteDescription: set afterwards, aiortc silently falls back to VP8.
        transceiver.setCodecPreferences(preferences)
        # Sound on the fan-out path only (the stock sender would encode it again per viewer).
        audio_viewer: AudioViewer | None = None
        audio_transceiver = None
        if audio is not None and fanout is not None:
            audio_transceiver = aiortc_internals.add_sendonly_transceiver(
                pc, FanoutAudioTrack())
            audio_transceiver.setCodecPreferences(self._codecs.audio_preferences())
            audio_viewer = AudioViewer(self.audio_fanout_for(audio))
        ufrag: str | None = None
        try:
            if promised is not None:
                aiortc_internals.impose_identities(pc, promised.identities)
            try:
                await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
            except ValueError as exc:
                raise MalformedOffer(f"the offer was refused by the WebRTC stack: {exc}") from None
            except Exception as exc:
                raise UnsupportedOffer(f"the offer cannot be answered: {exc}") from None
            connections = aiortc_internals.ice_connection_of(pc)
            if len(connections) != 1:
                raise UnsupportedOffer("the offer needs more than one transport; BUNDLE it")
            connection = connections[0]
            if lazy is not None and promised is not None:
                aiortc_internals.set_local_credentials(connection, lazy.ufrag, promised.password)
                endpoint = self._mux.register(connection, self._advertise)
                ufrag = lazy.ufrag
            else:
                ufrag = self._new_ufrag()
                aiortc_internals.set_local_credentials(connection, ufrag, _ice_string(24))
                endpoint = self._mux.register(connection, self._advertise)
            if not endpoint.candidates:
                raise StreamNotReady("the engine has no address to advertise", retry_after=30)
            aiortc_internals.install_local_candidates(
                connection, list(endpoint.protocols.values()), endpoint.candidates)
            # Before setLocalDescription: aiortc's connect task may start ICE while we await.
            aiortc_internals.connect_promptly(connection)
            # Gathering is already done (the mux gave the candidates, so this does not wait):
            # completed before createAnswer, its text carries a=end-of-candidates as
            # pc.localDescription does, and needs no second rendering.
            for gatherer in _ice_gatherers(pc):
                await gatherer.gather()
            # DTLS server when the browser lets us choose: connected one round trip sooner.
            aiortc_internals.answer_as_dtls_server(pc)
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
            # The text createAnswer rendered is what pc.localDescription would render again
            # (setLocalDescription re-applies the same transport fields; tests compare them).
            answer_sdp = answer.sdp
            # aiortc's connect task may already have started ICE during the awaits above, but
            # DTLS starts only once ICE completes, and that needs the viewer's checks, which
            # it sends only after it has this answer: these still come before DTLS.
            aiortc_internals.guard_dtls_receive(pc, self._on_receive_error)
            aiortc_internals.offer_srtp_profiles(pc, self._srtp_offer)
            if transceiver.currentDirection != "sendonly":
                raise UnsupportedOffer("the offer does not let the engine send video")
            if viewer is not None:
                viewer.attach(transceiver.sender, connection)
            if audio_viewer is not None and audio_transceiver is not None:
                if audio_transceiver.currentDirection == "sendonly":
                    audio_viewer.attach(audio_transceiver.sender, connection)
                else:  # the offer's audio section matched another way: video alone
                    audio_viewer.stop()
                    audio_viewer = None
            if promised is not None and not same_answer(answer_sdp, promised.answer):
                self.lazy_counts["answer_mismatch"] += 1
                self._templates[promised.key] = None  # this shape is answered eagerly
                logger.warning("session %s: aiortc's answer differs from the template's that "
                               "was sent; the template is dropped (its shape is answered "
                               "eagerly again)\nsent:\n%s\naiortc:\n%s",
                               lazy.id[:8] if lazy else "", promised.answer, answer_sdp)
                raise AnswerMismatch("the answer sent does not match the connection")
        except BaseException:
            if ufrag is not None:
                self._mux.unregister(ufrag)
            track.stop()
            if viewer is not None:
                viewer.stop()
            if audio_viewer is not None:
                audio_viewer.stop()
            await pc.close()
            raise

        if template_key is not None and lazy is None:
            self._learn(template_key, answer_sdp, ufrag, connection, pc)
        if lazy is not None:
            session = lazy
            session.materialize(pc, transceiver.sender, viewer if viewer is not None else track)
        elif viewer is not None:
            session = WhepSession(pc, transceiver.sender, viewer, ufrag, self._release,
                                  self._mux.mark_established)
        else:
            session = WhepSession(pc, transceiver.sender, track, ufrag, self._release,
                                  self._mux.mark_established)
        if viewer is not None:
            viewer.cursor.request = lambda reason: self._request_keyframe(session, reason)
            viewer.on_keyframe_request = (
                lambda reason: self._viewer_keyframe_request(session, viewer.refresh, reason))
            viewer.on_nack = session.on_nack
        else:
            assert isinstance(track, ViewerTrack)
            track._request = lambda reason: self._request_keyframe(session, reason)
            aiortc_internals.forward_keyframe_requests(
                transceiver.sender,
                lambda: self._viewer_keyframe_request(session, track.refresh, "pli/fir"))
            aiortc_internals.count_retransmissions(transceiver.sender, session.on_nack)
        session.feed = feed
        session.audio = audio_viewer
        if lazy is not None:
            self._lazy.pop(session.id, None)
            self.lazy_counts["built"] += 1
            # The checks that came meanwhile now reach the connection (routes open as usual).
            self._mux.replay(self._mux.take_pending(session.ufrag))
            return session, answer_sdp
        self._sessions[session.id] = session
        session.attach(self.config.connect_timeout_s)
        self.offers_accepted += 1
        self._notify("session-started", session)
        return session, answer_sdp

    def _learn(self, key: _TemplateKey, answer: str, ufrag: str, connection: Any,
               pc: RTCPeerConnection) -> None:
        """Keep the template of an eager session's answer for later offers of its shape."""
        if not self.lazy_sessions or key in self._templates:
            return
        template = AnswerTemplate.learn(answer, ufrag, connection.local_password,
                                        aiortc_internals.identities_of(pc))
        self._templates[key] = template  # None: this shape stays eager
        self.lazy_counts["learned" if template is not None else "not_learned"] += 1
        while len(self._templates) > MAX_CODEC_SHAPES:
            self._templates.popitem(last=False)

    def _answer_lazily(self, offer_sdp: str, template: AnswerTemplate, key: _TemplateKey,
                       feed: CapturePipeline, audio: AudioFeed | None
                       ) -> tuple[WhepSession, str]:
        """Answer from ``template`` and keep a pending session of a few fields: its aiortc
        objects are built on the viewer's first valid STUN check (:meth:`_build_lazy`)."""
        ufrag = self._new_ufrag()
        password = _ice_string(24)
        identities = Identities.fresh(template.senders)
        answer = template.render(ufrag, password, identities)
        session = WhepSession(None, None, None, ufrag, self._release,
                              self._mux.mark_established)
        session.feed = feed
        self._lazy[session.id] = _LazyOffer(offer_sdp, key[0], audio, password, identities,
                                            answer, key)
        self._mux.register_pending(ufrag, password, lambda: self._first_check(session))
        self._sessions[session.id] = session
        session.attach(self.config.connect_timeout_s)
        self.offers_accepted += 1
        self.lazy_counts["answered"] += 1
        self._notify("session-started", session)
        return session, answer

    def _first_check(self, session: WhepSession) -> None:
        """The mux got a lazy session's first valid STUN check: build it."""
        if session.closing or session.building is not None or session.built:
            return
        session.building = asyncio.ensure_future(self._build_lazy(session))

    async def _build_lazy(self, session: WhepSession) -> None:
        promised = self._lazy.get(session.id)
        # A build is held like an offer (offer_burst.py): while builds wait and run, the mux
        # keeps new viewers' datagrams and the collector waits (bounded), so a burst of viewers
        # is built one after another, and its allocations cost one collection afterwards
        # instead of several on the way; connected viewers' datagrams go on meanwhile.
        self._work_begins()
        try:
            if promised is None:
                return
            async with self._answer_lock:
                if session.closing:
                    return
                checked = check_offer(promised.sdp, max_bytes=self._max_offer_bytes,
                                      stream_profile_level_id=promised.profile_level_id,
                                      parse=self._offer_parser.parse)
                await self._build_session(checked, promised.profile_level_id, session.feed,
                                          promised.audio, lazy=session)
        except asyncio.CancelledError:
            if not session.closing:
                raise
        except AnswerMismatch:
            session.close_soon("answer-mismatch")
        except Exception as exc:
            self.lazy_counts["build_failed"] += 1
            logger.warning("session %s could not be built on its first check (%s: %s)",
                           session.id[:8], type(exc).__name__, exc)
            session.close_soon("build-failed")
        finally:
            session.building = None
            self._work_ends()

    def _choose_srtp_profiles(self) -> None:
        """Pick the SRTP profiles to offer from the configuration and the CPU."""
        self.srtp_capability = srtp_profiles.detect()
        wanted = srtp_profiles.choose(self.config.srtp_profiles, self.srtp_capability)
        available = aiortc_internals.available_srtp_profiles()
        chosen = tuple(name for name in wanted if name in available)
        if not chosen:
            logger.warning("none of the SRTP profiles %s is supported by this libsrtp: "
                           "offering %s", ", ".join(wanted), ", ".join(available))
            chosen = tuple(available)
        elif chosen != wanted:
            logger.warning("SRTP profiles %s not supported by this libsrtp: left out",
                           ", ".join(n for n in wanted if n not in available))
        self.srtp_profiles = chosen
        self._srtp_offer = [available[name] for name in chosen]
        logger.info("SRTP profiles offered: %s (%s, %s)", ", ".join(chosen),
                    self.config.srtp_profiles[0] if self.config.srtp_profiles == ("auto",)
                    else "configured", self.srtp_capability.why)

    def _srtp_stats(self) -> dict[str, Any]:
        hardware = self.srtp_capability.hardware
        return {
            "profiles": list(self.srtp_profiles),
            # 1 / 0: the CPU has / lacks AES and carry-less multiply instructions; -1 unknown.
            "hardware_aes": -1 if hardware is None else int(hardware),
            "cpu": self.srtp_capability.why,
            # Connected sessions by the profile their handshake settled on.
            "sessions": dict(Counter(s.srtp_profile for s in self._sessions.values()
                                     if s.srtp_profile is not None)),
        }

    def _on_receive_error(self, exc: Exception) -> None:
        """A datagram raised inside aiortc's DTLS/SRTP receive path: count it, log it at most
        every RECEIVE_ERROR_LOG_INTERVAL_S, and keep the session (the guard keeps reading)."""
        self.receive_errors[type(exc).__name__] += 1
        if self._receive_error_log.ready():
            logger.warning("a received datagram raised %s inside aiortc (session kept; %d so "
                           "far): %s", type(exc).__name__, sum(self.receive_errors.values()), exc)

    def _new_ufrag(self) -> str:
        while True:
            ufrag = _ice_string(8)
            if not self._mux.is_live(ufrag):
                return ufrag

    def _viewer_keyframe_request(self, session: WhepSession, refresh: Callable[[], bool],
                                 reason: str) -> None:
        """A viewer's PLI/FIR. A source that makes IDRs on demand is asked (coalesced, one IDR
        for everyone); for one that cannot (rpicam-vid, a file, an IP camera) ``refresh``
        answers this viewer alone from the ring: the encoder keeps running and the other
        viewers, the recording and HLS see nothing."""
        if keyframes_on_demand(session.feed):
            self._request_keyframe(session, reason)
            return
        session.keyframes_requested += 1
        self.keyframe_requests[reason.split(":")[0]] += 1
        if refresh():
            self.keyframe_refreshes += 1

    def _request_keyframe(self, session: WhepSession, reason: str) -> None:
        session.keyframes_requested += 1
        kind = reason.split(":")[0]
        self.keyframe_requests[kind] += 1
        if session.feed.request_keyframe(f"session {session.id[:8]}: {reason}"):
            session.keyframes_forced += 1

    async def _release(self, session: WhepSession) -> None:
        self._lazy.pop(session.id, None)
        self._mux.unregister(session.ufrag)
        if self._sessions.pop(session.id, None) is not None:
            self.sessions_ended[session.end_reason] += 1
            self._notify("session-ended", session)

    def _notify(self, event: str, session: WhepSession) -> None:
        for listener in list(self._listeners):
            try:
                listener(event, session)
            except Exception:
                logger.exception("session listener failed on %s", event)


def _ice_gatherers(pc: RTCPeerConnection) -> list[Any]:
    """The distinct ICE gatherers of a peer connection's (possibly bundled) transports."""
    transports = [t.receiver.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        transports.append(pc.sctp.transport)
    gatherers: list[Any] = []
    for dtls in transports:
        gatherer = dtls.transport.iceGatherer
        if gatherer not in gatherers:
            gatherers.append(gatherer)
    return gatherers


def deprecated_settings(webrtc: WebRtcConfig) -> str | None:
    """The warning for a deprecated ``webrtc.pending_per_address``, saying what it now does
    (widens the default share, or nothing), or None when it is not set."""
    old = webrtc.pending_per_address
    if not old:
        return None
    share = webrtc.places_per_address()
    if webrtc.max_viewers_per_address:
        return (f"webrtc.pending_per_address = {old} is deprecated and ignored: "
                f"webrtc.max_viewers_per_address = {share} sets the places one address may hold")
    if share == min(old, webrtc.max_viewers):
        return (f"webrtc.pending_per_address = {old} is deprecated: taken as "
                f"webrtc.max_viewers_per_address = {share} (places one address may hold, "
                "connected and pending together); set that instead")
    return (f"webrtc.pending_per_address = {old} is deprecated and ignored (a cap on "
            "not-yet-connected sessions refused a camera grid's offers); one address may hold "
            f"{share} of the {webrtc.max_viewers} places (webrtc.max_viewers_per_address); "
            "remove it")


def address_key(remote: str | None) -> str | None:
    """What the share of places counts by: the IPv4 address, or the IPv6 /64 (one host commonly
    has a whole /64 to pick addresses from); None when unknown or not an IP address."""
    if not remote:
        return None
    try:
        ip = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def is_loopback(address: str) -> bool:
    """Whether ``address`` is a loopback literal (tests advertise only those)."""
    return ipaddress.ip_address(address).is_loopback


def _summed(stats: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fan-outs' figures added up (one fan-out per feed); None when there is none."""
    if not stats:
        return None
    total: dict[str, Any] = {}
    for one in stats:
        for key, value in one.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    return total
