"""A camera's sound as the RTSP server's second track: AAC-LC in RTP as ``mpeg4-generic``
(RFC 3640, AAC-hbr mode), one access unit per packet.

The audio room encodes once per camera (``AudioPipeline.aac_ring``: 1024-sample AAC-LC frames,
48 kHz mono, ``pts`` in 1/48000 s, ``capture_time_us`` on the video's wall clock). Here:

- :class:`RtspAudioFeed`, one per camera with sound: one task waits on the AAC ring and hands
  each new frame to every playing audio track of that camera; a frame's RTP payload (the
  2-byte AU-headers-length, the 2-byte AU-header, the raw frame) is made once and shared. The
  audio room encodes a codec only while its ring has a reader: the feed holds one while any
  session has the track set up (from its SETUP: the encoder is warm by PLAY), none otherwise.
- :class:`RtspAudioTrack`, one per session that SETUPs the audio track: its own SSRC, sequence
  numbers and random timestamp origin (RTP timestamp = origin + the frame's pts, the clock
  rate 48000), TCP interleaved on its own channels or UDP from a socket pair of its own to the
  client's own address, like the video track.

Sync: both tracks' RTCP sender reports map RTP time to the *capture* wall clock (the NTP
time of a frame's RTP timestamp is when it was captured), the same clock for picture and
sound, and both carry the session's one CNAME (RFC 3550 6.5.1: what binds the two for lip
sync). A PLAY's ``RTP-Info`` gives each track the RTP time of the same capture instant (the
first picture sent), and the audio starts with the frame that covers that instant, so a
recorder that joins on a GOP burst gets the sound of the same seconds.

Opus is not offered: see the README (RTSP, "Sound").
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import struct
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from ruseon_appliance.audio.format import AAC_FRAME_SAMPLES, AUDIO_CLOCK_RATE
from ruseon_appliance.capture.ring import FrameView, RingBuffer, RingReader
from ruseon_appliance.rtsp.rtp import RtcpSending, ntp_of_us, open_rtp_pair, rtp_at
from ruseon_appliance.stream.rtcp import rtcp_feedback, sender_report_at
from ruseon_appliance.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

AAC_PAYLOAD_TYPE = 97
AAC_FRAME_US = AAC_FRAME_SAMPLES * 1_000_000 // AUDIO_CLOCK_RATE
# RFC 3640 AAC-hbr: a 13-bit AU size, so no frame above this (AAC-LC mono is at most 768).
MAX_AU_BYTES = (1 << 13) - 1
SR_INTERVAL_S = 1.0
# Payloads of the newest frames kept for the other tracks of the same camera.
PAYLOAD_CACHE = 64

_RTP = struct.Struct("!BBHII")
_INTERLEAVED_RTP = struct.Struct("!BBHBBHII")


class RtspAudio(Protocol):
    """What the RTSP server needs of a camera's sound (``audio.pipeline.AudioPipeline``)."""

    @property
    def aac_ring(self) -> RingBuffer: ...

    @property
    def aac_config(self) -> bytes: ...

    def aac_config_for(self, seq: int) -> bytes: ...


def aac_hbr_payload(frame: bytes | memoryview) -> bytes:
    """One AAC frame as an RFC 3640 AAC-hbr RTP payload: AU-headers-length (16 bits: one
    16-bit AU-header), the AU-header (13-bit size, 3-bit index 0), the raw frame."""
    size = len(frame)
    if size > MAX_AU_BYTES:
        raise ValueError(f"an AAC frame of {size} bytes does not fit AAC-hbr's 13-bit size")
    return struct.pack("!HH", 16, size << 3) + bytes(frame)


class RtspAudioFeed:
    """One camera's AAC ring served to its playing audio tracks (see the module docstring)."""

    def __init__(self, audio: RtspAudio) -> None:
        self.audio = audio
        self.ring = audio.aac_ring
        self.tracks: set[RtspAudioTrack] = set()  # playing
        self._holders: set[RtspAudioTrack] = set()  # set up
        self._reader: RingReader | None = None
        self._task: asyncio.Task[None] | None = None
        self._payloads: dict[int, bytes] = {}
        self.frames_packetized = 0
        self.frames_too_large = 0

    def hold(self, track: RtspAudioTrack) -> None:
        """``track`` is set up: the AAC is encoded from now on (the ring has a reader)."""
        self._holders.add(track)
        if self._reader is None:
            self._reader = self.ring.reader("next")  # never read: the encoder's "someone"

    def release(self, track: RtspAudioTrack) -> None:
        """``track`` is closed; the last one lets the encoder rest."""
        self.remove(track)
        self._holders.discard(track)
        if not self._holders and self._reader is not None:
            self._reader.close()
            self._reader = None

    def add(self, track: RtspAudioTrack) -> None:
        """Start serving ``track`` (its first frames go out at once)."""
        self.tracks.add(track)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def remove(self, track: RtspAudioTrack) -> None:
        """Stop serving ``track``; the task ends with the last one."""
        self.tracks.discard(track)
        if not self.tracks and self._task is not None:
            self._task.cancel()
            self._task = None

    async def stop(self) -> None:
        """End the task (server stop)."""
        self.tracks.clear()
        self._holders.clear()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            await self.ring.wait()
            now = time.monotonic()
            for track in list(self.tracks):
                try:
                    track.service(now)
                except Exception:  # one client's trouble only
                    logger.exception("rtsp: sending sound to %s failed", track.peer[0])

    def payload(self, view: FrameView) -> bytes | None:
        """The RTP payload of ring frame ``view`` (made once for every track), None for a
        frame AAC-hbr cannot carry."""
        payload = self._payloads.get(view.seq)
        if payload is None:
            try:
                payload = aac_hbr_payload(view.data)
            except ValueError:
                self.frames_too_large += 1
                return None
            self.frames_packetized += 1
            self._payloads[view.seq] = payload
            while len(self._payloads) > PAYLOAD_CACHE:
                del self._payloads[next(iter(self._payloads))]
        return payload


class RtspAudioTrack(RtcpSending):
    """The audio track of one RTSP session (see the module docstring)."""

    def __init__(self, feed: RtspAudioFeed, *, peer: tuple[str, int], cname: str,
                 peer_scope: int = 0, buffer_limit: int = 1 << 20,
                 on_activity: Callable[[], None] | None = None) -> None:
        self.feed = feed
        self.peer = peer
        self.peer_scope = peer_scope
        self.cname = cname
        self.buffer_limit = buffer_limit
        self.on_activity = on_activity or (lambda: None)
        # The AudioSpecificConfig its SDP gave (DESCRIBE came just before): frames of another
        # one (the camera's own AAC, passed through once it connects, when DESCRIBE came
        # first) are not sent; the client gets the new one by describing again.
        self.config = feed.audio.aac_config
        self.frames_other_config = 0
        self.ssrc = random.randrange(1, 1 << 32)
        self._seq = random.randrange(0, 32768)
        self._ts_origin = random.randrange(0, 1 << 32)
        self.transport_kind: Literal["tcp", "udp", ""] = ""
        self.channels = (2, 3)
        self.client_ports = (0, 0)
        self._tcp: asyncio.WriteTransport | None = None
        self._rtp_sock: socket.socket | None = None
        self._rtcp_sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.playing = False
        self._next: int | None = None  # the ring seq to send next
        self._last_pts: int | None = None  # of the last frame sent (a PLAY after PAUSE)
        # (RTP timestamp unwrapped, capture time) of the last frame sent or about to be
        self._anchor: tuple[int, int] | None = None
        self._next_sr = 0.0
        self.frames_sent = 0
        self.packets_sent = 0
        self.payload_bytes_sent = 0
        self.bytes_sent = 0
        self.frames_dropped = 0  # lapped by the ring, or the connection was full
        self.sender_reports = 0
        self.rtcp_received = 0
        self.rtcp_ignored = 0
        self.rtcp_malformed = 0
        self.fraction_lost = 0.0
        self.send_errors = 0

    # -- setup -----------------------------------------------------------------------------------

    def use_tcp(self, transport: asyncio.WriteTransport, channels: tuple[int, int]) -> None:
        """Deliver interleaved on the RTSP connection's ``transport``."""
        self.transport_kind = "tcp"
        self._tcp = transport
        self.channels = channels
        self.feed.hold(self)

    def use_udp(self, local_host: str, client_ports: tuple[int, int], *,
                scope_id: int = 0) -> tuple[int, int]:
        """Open the track's RTP/RTCP sockets (as the video track's); returns the server
        ports. Raises ``OSError``."""
        self._loop = asyncio.get_running_loop()
        rtp, rtcp, port = open_rtp_pair(local_host, scope_id)
        for sock in (rtp, rtcp):
            self._loop.add_reader(sock.fileno(), self._on_udp, sock)
        self._rtp_sock, self._rtcp_sock = rtp, rtcp
        self.client_ports = client_ports
        self.transport_kind = "udp"
        self.feed.hold(self)
        return port, port + 1

    # -- play / pause / close --------------------------------------------------------------------

    def prepare_play(self, start_capture_us: int | None) -> tuple[int, int | None]:
        """Place the track before the PLAY response: at the frame that covers capture time
        ``start_capture_us`` (the first picture's; None: the next frame written), never at or
        before a frame already sent. Returns the sequence number and the RTP time of
        ``start_capture_us`` (of the first frame without it; None when no frame is known)."""
        ring = self.feed.ring
        start = ring.newest_seq + 1
        if start_capture_us is not None:
            for seq in range(ring.oldest_seq, ring.newest_seq + 1):
                view = ring.frame(seq)
                if view is None or (self._last_pts is not None and view.pts <= self._last_pts):
                    continue
                if view.capture_time_us + AAC_FRAME_US > start_capture_us:
                    start = seq
                    break
        self._next = start
        first = ring.frame(start)
        reference = first or ring.frame(ring.newest_seq)
        if reference is None:
            return self._seq, None
        self._anchor = (self._ts_origin + reference.pts, reference.capture_time_us)
        if start_capture_us is None:
            if first is None:
                return self._seq, None
            return self._seq, (self._ts_origin + first.pts) & 0xFFFFFFFF
        return self._seq, rtp_at(*self._anchor, start_capture_us, AUDIO_CLOCK_RATE)

    def play(self, now: float, *, report_first: bool = True) -> None:
        """Start sending (after the PLAY response): a sender report first (the client has
        the track's place on the capture clock before its first packet), then what the ring
        has from the place :meth:`prepare_play` chose."""
        if self.playing:
            return
        self.playing = True
        if report_first and self._anchor is not None:
            self.send_report(now)
        self._next_sr = now + SR_INTERVAL_S * (0.5 + random.random())
        self.feed.add(self)
        self.service(now)

    def pause(self) -> None:
        """Stop sending; a later PLAY is placed again."""
        if self.playing:
            self.playing = False
            self.feed.remove(self)

    def close(self) -> None:
        """Stop and close the UDP sockets (idempotent)."""
        self.pause()
        self.feed.release(self)
        for sock in (self._rtp_sock, self._rtcp_sock):
            if sock is not None:
                if self._loop is not None:
                    self._loop.remove_reader(sock.fileno())
                sock.close()
        self._rtp_sock = self._rtcp_sock = None
        self._tcp = None

    # -- sending ---------------------------------------------------------------------------------

    def service(self, now: float) -> None:
        """Send every frame written since the last call (the feed calls it on each write)."""
        if not self.playing or self._next is None:
            return
        ring = self.feed.ring
        tcp = self._tcp
        if self.transport_kind == "tcp" and (tcp is None or tcp.is_closing()):
            return
        newest = ring.newest_seq
        while self._next <= newest:
            if self._next < ring.oldest_seq:  # lapped (a client stalled for ~10 s)
                self.frames_dropped += ring.oldest_seq - self._next
                self._next = ring.oldest_seq
            view = ring.frame(self._next)
            self._next += 1
            if view is None:
                continue
            if self._last_pts is not None and view.pts <= self._last_pts:
                continue
            if self.feed.audio.aac_config_for(view.seq) != self.config:
                if not self.frames_other_config:
                    logger.info("rtsp: the camera's AAC configuration changed; %s gets no sound "
                                "until it describes the stream again", self.peer[0])
                self.frames_other_config += 1
                continue
            payload = self.feed.payload(view)
            if payload is None:
                self.frames_dropped += 1
                continue
            if tcp is not None and tcp.get_write_buffer_size() > self.buffer_limit:
                # The connection is full (the video skips to a keyframe meanwhile): the sound
                # of this moment is lost, as on a lossy link; it goes on live.
                self.frames_dropped += 1
                continue
            ts = self._ts_origin + view.pts
            if self.sender_reports == 0:
                self._anchor = (ts, view.capture_time_us)
                self.send_report(now)  # a report before the first packet (see play)
            self._send(tcp, payload, ts & 0xFFFFFFFF)
            self.frames_sent += 1
            self._last_pts = view.pts
            self._anchor = (ts, view.capture_time_us)
        if now >= self._next_sr and self.packets_sent:
            self._next_sr = now + SR_INTERVAL_S * (0.5 + random.random())
            self.send_report(now)

    def _send(self, tcp: asyncio.WriteTransport | None, payload: bytes, timestamp: int) -> None:
        if tcp is not None:
            data = _INTERLEAVED_RTP.pack(0x24, self.channels[0], 12 + len(payload), 0x80,
                                         0x80 | AAC_PAYLOAD_TYPE, self._seq, timestamp,
                                         self.ssrc) + payload
            tcp.write(data)
            sent = len(data)
        else:
            sock = self._rtp_sock
            if sock is None:
                return
            packet = _RTP.pack(0x80, 0x80 | AAC_PAYLOAD_TYPE, self._seq, timestamp,
                               self.ssrc) + payload
            try:
                sock.sendto(packet, self._client_address(self.client_ports[0]))
            except OSError:  # a full socket buffer, an ICMP error: lost like on the wire
                self.send_errors += 1
                self._seq = (self._seq + 1) & 0xFFFF
                return
            sent = len(packet)
        self._seq = (self._seq + 1) & 0xFFFF
        self.packets_sent += 1
        self.payload_bytes_sent += len(payload)
        self.bytes_sent += sent

    def _client_address(self, port: int) -> tuple[str, int] | tuple[str, int, int, int]:
        if self.peer_scope:
            return (self.peer[0], port, 0, self.peer_scope)
        return (self.peer[0], port)

    def send_report(self, now: float) -> None:
        """An RTCP sender report + SDES CNAME: NTP now, RTP the time on the capture clock."""
        if self._anchor is None:
            return
        unix_us = time.time_ns() // 1000
        packet = sender_report_at(ntp_of_us(unix_us), self.ssrc,
                                  rtp_at(*self._anchor, unix_us, AUDIO_CLOCK_RATE),
                                  self.packets_sent, self.payload_bytes_sent, self.cname)
        self._send_report_packet(packet)

    # -- receiving -------------------------------------------------------------------------------

    def _on_udp(self, sock: socket.socket) -> None:
        for _ in range(32):
            try:
                data, address = sock.recvfrom(2048)
            except OSError:
                return
            if address[0].split("%", 1)[0] != self.peer[0]:
                self.rtcp_ignored += 1
                continue
            self.on_activity()
            if sock is self._rtcp_sock:
                self.handle_rtcp(data)

    def handle_rtcp(self, data: bytes) -> None:
        """RTCP from the client about this track (receiver reports: loss)."""
        self.on_activity()
        feedback = rtcp_feedback(data, self.ssrc)
        if feedback is None:
            self.rtcp_malformed += 1
            return
        self.rtcp_received += 1
        if feedback.fraction_lost is not None:
            self.fraction_lost = feedback.fraction_lost

    def stats(self) -> dict[str, Any]:
        """The track's figures (a session's ``stats()["audio"]``)."""
        return {
            "codec": "aac",
            "transport": self.transport_kind,
            "ssrc": self.ssrc,
            "frames_sent": self.frames_sent,
            "packets_sent": self.packets_sent,
            "bytes_sent": self.bytes_sent,
            "frames_dropped": self.frames_dropped,
            "sender_reports": self.sender_reports,
            "rtcp_received": self.rtcp_received,
            "fraction_lost": round(self.fraction_lost, 4),
            "send_errors": self.send_errors,
        }
