"""One viewer: its peer connection, its track, its place on the mux, and its counters."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiortc import RTCPeerConnection, RTCRtpSender

from ruseon_appliance.engine import aiortc_internals
from ruseon_appliance.engine.audio import AudioViewer
from ruseon_appliance.engine.fanout import FanoutViewer
from ruseon_appliance.engine.track import ViewerTrack

logger = logging.getLogger(__name__)

# How long closing a peer connection may take before the session is dropped anyway.
CLOSE_TIMEOUT_S = 5.0


class WhepSession:
    """A viewer's session. ``state`` is one of ``new``, ``connecting``, ``connected``,
    ``closed``; ``end_reason`` says why it closed (``delete``, ``ice-failed``,
    ``consent-expired``, ``peer-closed``, ``connect-timeout``, ``reclaimed`` (a pending session
    closed to make room for a new offer), ``shutdown``...).

    A *lazy* session (answered from a template, engine.py) starts without ``pc``, ``sender``
    and ``track`` (None): no aiortc object exists for it until the viewer's first valid STUN
    check, when the engine builds them and calls :meth:`materialize`."""

    def __init__(
        self,
        pc: RTCPeerConnection | None,
        sender: RTCRtpSender | None,
        track: ViewerTrack | FanoutViewer | None,
        ufrag: str,
        release: Callable[[WhepSession], Awaitable[None]],
        on_connected: Callable[[str], None] | None = None,
    ) -> None:
        self.id = secrets.token_urlsafe(24)
        self.etag = '"' + secrets.token_urlsafe(12) + '"'
        self.state = "new"
        # Unix timestamps for reports; durations (age, handshake) use the monotonic ones, which
        # a wall-clock step (NTP setting a Pi's clock) does not move.
        self.created = time.time()
        self.created_monotonic = time.monotonic()
        self.connected_at: float | None = None
        self.connected_monotonic: float | None = None
        self.closed_at: float | None = None
        self.end_reason = ""
        self.ufrag = ufrag
        self.pc = pc
        self.sender = sender
        self.track = track
        self.keyframes_requested = 0
        self.keyframes_forced = 0
        self.nacks = 0
        self.created_monotonic = time.monotonic()
        # The offer's source (engine.address_key), for the per-address pending cap.
        self.remote_key: str | None = None
        # The feed (a camera's pipeline) this session watches; set by the engine. The web
        # layer maps it back to a camera name; the engine never knows names.
        self.feed: Any = None
        # The session's audio stream (set by the engine), None when it has no sound.
        self.audio: AudioViewer | None = None
        self._release = release
        # Called with the ufrag once connected (the engine: the mux stops holding this
        # viewer's datagrams during offer bursts, offer_burst.py).
        self._on_connected = on_connected
        self._closing: asyncio.Task[None] | None = None
        self._reaper: asyncio.TimerHandle | None = None
        self.remote_addresses: list[tuple[str, int]] = []
        # The SRTP profile the DTLS handshake settled on (OpenSSL's name), once connected.
        self.srtp_profile: str | None = None
        # The engine's DTLS role ("server" for browsers' actpass offers), once connected.
        self.dtls_role: str | None = None
        # A lazy session's connection being built (engine), until it is done.
        self.building: asyncio.Task[None] | None = None

    @property
    def built(self) -> bool:
        """Whether the session's aiortc objects exist (False: a lazy session, pending)."""
        return self.pc is not None

    # -- wiring ------------------------------------------------------------------------------------

    def attach(self, connect_timeout_s: float) -> None:
        """Follow the connection's state, and reap it if it is not connected in time."""
        self.state = "connecting"
        if self.pc is not None:
            self.pc.on("connectionstatechange", self._on_state)
        loop = asyncio.get_running_loop()
        self._reaper = loop.call_later(connect_timeout_s, self._on_connect_timeout)

    def materialize(self, pc: RTCPeerConnection, sender: RTCRtpSender,
                    track: ViewerTrack | FanoutViewer) -> None:
        """A lazy session's aiortc objects, built (its connect timeout keeps running)."""
        self.pc, self.sender, self.track = pc, sender, track
        pc.on("connectionstatechange", self._on_state)

    def on_nack(self, sequence_number: int) -> None:
        """The viewer asked for a packet again."""
        self.nacks += 1

    def _on_state(self) -> None:
        if self.pc is None:
            return
        state = self.pc.connectionState
        if state == "connected" and self.state == "connecting":
            self.state = "connected"
            self.connected_at = time.time()
            self.connected_monotonic = time.monotonic()
            if self._reaper is not None:
                self._reaper.cancel()
                self._reaper = None
            for conn in aiortc_internals.ice_connection_of(self.pc):
                self.remote_addresses = [r for _, r in aiortc_internals.nominated_addresses(conn)]
            self.srtp_profile = aiortc_internals.selected_srtp_profile(self.pc)
            self.dtls_role = aiortc_internals.dtls_role(self.pc)
            if self._on_connected is not None:
                self._on_connected(self.ufrag)
            logger.info("session %s connected from %s in %.0f ms", self.id[:8],
                        ",".join(f"{h}:{p}" for h, p in self.remote_addresses),
                        (time.monotonic() - self.created_monotonic) * 1000)
        elif state in ("failed", "closed") and self.state != "closed":
            self.close_soon(self._why_ended(state))

    def _why_ended(self, pc_state: str) -> str:
        # The DTLS transport may notice first (and close the connection) when ICE dies, so ask
        # the ICE connection itself whether consent expired.
        if self.pc is not None and self.state == "connected" and any(
                aiortc_internals.consent_expired(c)
                for c in aiortc_internals.ice_connection_of(self.pc)):
            return "consent-expired"
        if pc_state == "failed":
            return "connection-failed" if self.state == "connected" else "ice-failed"
        return "peer-closed"

    def _on_connect_timeout(self) -> None:
        self._reaper = None
        if self.state != "connected":
            self.close_soon("connect-timeout")

    # -- ending ----------------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """Whether the session is closed or on its way (its place is free)."""
        return self._closing is not None or self.state == "closed"

    def close_soon(self, reason: str) -> None:
        """Start closing (from a callback); the task is kept so it is not garbage-collected."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.close(reason))

    async def close(self, reason: str) -> None:
        """Close the connection, release the track's ring cursor and the mux routes."""
        if self.state == "closed":
            if self._closing is not None and self._closing is not asyncio.current_task():
                await asyncio.shield(self._closing)
            return
        self.state = "closed"
        self.end_reason = reason
        self.closed_at = time.time()
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        building = self.building
        if building is not None and building is not asyncio.current_task():
            # Being built: the build is cancelled and closes what it made, before this returns
            # (the engine stops once every session's close has).
            building.cancel()
            await asyncio.wait([building])
        if self.track is not None:
            self.track.stop()
        if self.audio is not None:
            self.audio.stop()
        if self.pc is not None:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await self.pc.close()
            except Exception:
                logger.exception("session %s: closing the peer connection failed", self.id[:8])
            else:
                aiortc_internals.release_native_state(self.pc)
                aiortc_internals.break_reference_cycles(self.pc)
        await self._release(self)
        logger.info("session %s ended (%s) after %.1f s, %d frames sent", self.id[:8], reason,
                    time.monotonic() - self.created_monotonic,
                    self.track.frames_sent if self.track is not None else 0)

    # -- stats -----------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """State, timestamps and counters (bytes/packets sent, keyframes requested, NACKs, RTT)."""
        track = self.track
        if isinstance(track, FanoutViewer):
            packets, octets, rtt = track.counters()
            send_path: dict[str, Any] = {"send_path": "fanout", **track.stats()}
        elif self.sender is not None:
            packets, octets, rtt = aiortc_internals.sender_counters(self.sender)
            send_path = {"send_path": "aiortc"}
        else:  # a lazy session, not built yet
            packets, octets, rtt = 0, 0, None
            send_path = {"send_path": None}
        return {
            "id": self.id,
            "state": self.state,
            "end_reason": self.end_reason,
            "created": self.created,
            "connected_at": self.connected_at,
            "closed_at": self.closed_at,
            "remote_addresses": [f"{h}:{p}" for h, p in self.remote_addresses],
            "built": track is not None,
            "join_mode": track.join_mode if track is not None else "",
            "frames_sent": track.frames_sent if track is not None else 0,
            "keyframes_sent": track.keyframes_sent if track is not None else 0,
            "frames_skipped": track.frames_skipped if track is not None else 0,
            "packets_sent": packets,
            "bytes_sent": octets,
            "keyframes_requested": self.keyframes_requested,
            "keyframes_forced": self.keyframes_forced,
            "nacks": self.nacks,
            "rtt_ms": None if rtt is None else round(rtt * 1000, 1),
            "srtp_profile": self.srtp_profile,
            "dtls_role": self.dtls_role,
            "audio": None if self.audio is None else self.audio.stats(),
            **send_path,
        }
