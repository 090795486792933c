"""One RTSP session: a camera's RTP to one client, over its RTSP connection or over UDP.

A playing session is one more consumer of the fan-out's shared packets (``FanoutConsumer``),
like a relay: its own :class:`ViewerCursor` (the viewers' join logic: it starts at the newest
cached keyframe, catches up or asks for a fresh IDR) takes each frame's shared packetization,
and per packet the session writes only its 12-byte RTP header (its own SSRC, sequence number
and timestamp, continuous for the session's life whatever the source does).

Delivery:

- TCP interleaved (``RTP/AVP/TCP;interleaved=0-1``): each packet framed as ``$ channel length``
  on the RTSP connection; a frame is written whole or not at all, so framing never breaks. The
  connection's send buffer is bounded: when more than ``buffer_limit`` bytes wait (a slow or
  stuck client), the session skips to the next keyframe like a slow viewer; nothing ever
  blocks the event loop or the other clients. A client stuck for :data:`STUCK_CLOSE_S` is
  disconnected.
- UDP (``RTP/AVP;unicast;client_port=a-b``): from a pair of sockets of its own, to the RTSP
  client's own address only (the connection's peer), never to an address the client names.

A session may carry the camera's sound too (:attr:`RtspSession.audio`, rtsp/audio.py's
:class:`RtspAudioTrack`, its own transport), or only the sound (:attr:`video_set_up` False):
PLAY, PAUSE and close act on both tracks, and both tracks' sender reports map RTP time to the
capture clock (:meth:`RtspSession._video_anchor`).

RTCP: sender reports on channel 1 / the RTCP port; the client's PLI/FIR become the capture's
coalesced keyframe request; receiver reports give loss figures. Only the client's own address
is heard on UDP.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import socket
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ruseon_appliance.capture.h264 import StreamInfo
from ruseon_appliance.capture.ring import FrameView
from ruseon_appliance.rtsp.rtp import RtcpSending, ntp_of_us, open_rtp_pair, rtp_at
from ruseon_appliance.stream.cursor import VideoFeed, ViewerCursor
from ruseon_appliance.stream.fanout import Fanout
from ruseon_appliance.stream.gso import GSO_MAX_BYTES, GSO_MAX_SEGMENTS, GSO_REFUSED, UDP_SEGMENT
from ruseon_appliance.stream.history import PacketizedFrame
from ruseon_appliance.stream.pacing import JOIN_PACE_BYTES, JOIN_PACE_S
from ruseon_appliance.stream.rtcp import rtcp_feedback, sender_report, sender_report_at

if TYPE_CHECKING:
    from ruseon_appliance.rtsp.audio import RtspAudioTrack

logger = logging.getLogger(__name__)

PAYLOAD_TYPE = 96
# Sender report interval (randomised 0.5-1.5x, RFC 3550).
SR_INTERVAL_S = 1.0
# Queued frames (seconds' worth) beyond which a session skips to the next keyframe.
MAX_BACKLOG_S = 0.5
# Bytes waiting in a TCP connection's user-space buffer beyond which frames are skipped.
TCP_BUFFER_LIMIT = 1 << 20
# A TCP client that has taken nothing for this long is disconnected (it holds a slot).
STUCK_CLOSE_S = 30.0
# Pictures a sender report's map of RTP to capture time is taken from (about a second).
ANCHOR_FRAMES = 30

_INTERLEAVED_RTP = struct.Struct("!BBHBBHII")  # $, channel, length, then the 12-byte RTP header
_RTP = struct.Struct("!BBHII")


class RecorderCursor(ViewerCursor[PacketizedFrame]):
    """The viewers' join (newest cached keyframe, catch-up burst or fresh IDR), but a join
    burst keeps the frames' own timestamps instead of being squeezed into the last ticks.

    RTSP clients are mostly recorders (FFmpeg in Frigate, NVRs): frames 1/90000 s apart make
    FFmpeg's muxer rewrite them ("Non-monotonous DTS ... changing to") and a recording's first
    second has frames without duration. With their own spacing the burst's last frame is still
    the newest frame's stamp, so the live timeline is unchanged and stays continuous; the burst
    is simply stamped when it was captured (the RTCP sender reports say so too), and a player
    that paces by timestamps shows it at normal speed, as live as the GOP is old.

    Tried and dropped: spacing a long burst closer (its span capped at 0.5 s) made FFmpeg's
    decoding CLI warn "non monotonically increasing dts to muxer" (it re-stamps decoded frames
    at the frame rate it estimated, so frames under a frame interval apart collide). The cost
    of the choice: GStreamer's rtpjitterbuffer (rtspsrc's default slave mode) resets its clock
    when timestamps lead arrival by more than ~1 s, so the frames of a burst beyond the first
    second get one and the same timestamp there (decoded all the same; with the squeeze every
    frame was 11 us apart, no better). Bursts that long only come from sources that cannot make
    a keyframe on demand (a file, rpicam-vid between restarts); a camera's join burst is at
    most ``catch_up_max_frames``.
    """

    def __init__(self, feed: VideoFeed, take: Callable[[FrameView], PacketizedFrame], *,
                 after_pts: int | None = None, **settings: Any) -> None:
        # A PLAY after PAUSE: the last timestamp the client got, which the new one must pass
        # (the cached keyframe may be older than the pause).
        self._after_pts = after_pts
        self._joining = False
        self._burst_pts: list[int] = []

        def take_noting_pts(view: FrameView) -> PacketizedFrame:
            if self._joining:
                self._burst_pts.append(view.pts)
            return take(view)

        super().__init__(feed, take_noting_pts, **settings)
        self._interval = max(1, int(settings.get("frame_interval", 3000)))
        # Whatever the join mode, nothing goes out at or before it (the cursor's own guard).
        self._last_pts = after_pts

    @property
    def timeline_offset(self) -> int:
        """What the output timeline adds to a live frame's pts now (its pts + this is the RTP
        time it goes out with): the sender reports' map of RTP to capture time."""
        return self._offset

    def join(self) -> None:
        """As the viewers join; the burst (if any) stamped by :meth:`burst_stamps`."""
        self._joining, self._burst_pts = True, []
        try:
            super().join()
        finally:
            self._joining, self._burst_pts = False, []

    def burst_stamps(self, now_pts: int, sizes: list[int],  # type: ignore[override]
                     ticks_per_byte: float) -> list[int]:
        """The burst's frames at their capture timestamps (the last one is ``now_pts``). Should
        those not run strictly up to ``now_pts`` (a source that restarted within the GOP), one
        frame interval apart ending at ``now_pts``."""
        stamps = list(self._burst_pts[-len(sizes):]) if sizes else []
        ordered = (len(stamps) == len(sizes) and stamps[-1] == now_pts
                   and all(b > a for a, b in itertools.pairwise(stamps)))
        count = len(sizes)
        if not ordered:
            stamps = [now_pts - (count - 1 - i) * self._interval for i in range(count)]
        floor = self._after_pts
        if floor is not None and stamps and stamps[0] <= floor:
            # Resumed within the GOP it paused in: the burst fits between the last timestamp
            # sent and now, keeping its proportions (the viewers' squeeze if there is no room).
            room, span = now_pts - floor - 1, now_pts - stamps[0]
            if room >= count and span > 0:
                stamps = [now_pts - (now_pts - stamp) * room // span for stamp in stamps]
                for i in range(count - 2, -1, -1):
                    stamps[i] = min(stamps[i], stamps[i + 1] - 1)
            else:
                stamps = [now_pts - (count - 1 - i) for i in range(count)]
        return stamps


class RtspFeed(VideoFeed, Protocol):
    """What a session needs from capture (``CapturePipeline`` satisfies it)."""

    @property
    def stream_info(self) -> StreamInfo | None: ...


class RtspSession(RtcpSending):
    """One client's session on one camera (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        camera: str,
        feed: RtspFeed,
        fanout: Fanout,
        *,
        framerate: int,
        catch_up_max_frames: int,
        keyframe_interval_frames: int,
        peer: tuple[str, int],
        peer_scope: int = 0,
        buffer_limit: int = TCP_BUFFER_LIMIT,
        catch_up_max_bytes: int = 0,
    ) -> None:
        self.id = session_id
        self.camera = camera
        self._feed = feed
        self._fanout = fanout
        self._frame_interval = round(90_000 / max(1, framerate))
        self._max_backlog_frames = max(2, round(framerate * MAX_BACKLOG_S))
        self._cursor_settings = (catch_up_max_frames, keyframe_interval_frames,
                                 catch_up_max_bytes)
        self.peer = peer
        self.peer_scope = peer_scope  # an IPv6 link-local peer's interface
        self.buffer_limit = buffer_limit
        self.transport_kind: Literal["tcp", "udp", ""] = ""
        self.state = "init"  # "ready" after SETUP, "playing", "closed"
        self.created = time.monotonic()
        self.last_activity = self.created
        self.cursor: ViewerCursor[PacketizedFrame] | None = None
        # TCP
        self._tcp: asyncio.WriteTransport | None = None
        self.channels = (0, 1)
        # UDP
        self._rtp_sock: socket.socket | None = None
        self._rtcp_sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.client_ports = (0, 0)
        self.on_close: Callable[[RtspSession, str], None] | None = None
        # RTP state
        self.ssrc = random.randrange(1, 1 << 32)
        self.cname = f"ruseon-{self.ssrc:08x}"
        self._seq = random.randrange(0, 32768)
        self._ts_origin = random.randrange(0, 1 << 32)
        self._last_ts = 0
        self._last_out_pts: int | None = None  # the cursor's timeline, for a PLAY after PAUSE
        self._last_send_monotonic = 0.0
        self._next_sr = 0.0
        self._skipping = False
        self._stuck_since: float | None = None
        # UDP: the join burst leaves in slices (as the fan-out paces its viewers'), so a Wi-Fi
        # link or a switch buffer does not lose part of it.
        self._pace_handle: asyncio.TimerHandle | None = None
        self.paced_slices = 0
        # Frames of the join burst not sent yet: a backlog the session made itself (a GOP of a
        # file source can be hundreds of frames), not a sign that the board cannot keep up.
        self._burst_left = 0
        # counters
        self.frames_sent = 0
        self.keyframes_sent = 0
        self.packets_sent = 0
        self.payload_bytes_sent = 0
        self.bytes_sent = 0
        self.keyframe_skips = 0
        self._skipped_before = 0  # frames skipped by cursors closed on PAUSE
        self.sender_reports = 0
        self.rtcp_received = 0
        self.rtcp_ignored = 0
        self.rtcp_malformed = 0
        self.keyframe_requests_received = 0
        self.keyframes_forced = 0
        self.fraction_lost = 0.0
        self.send_errors = 0
        # UDP: runs of equal-sized packets leave in one UDP_SEGMENT send (GSO), as the fan-out
        # sends to viewers, until the kernel refuses it once (then datagram by datagram).
        self.gso = True
        self.gso_sends = 0
        # The video track was SETUP (a session may carry only the sound), and the sound's.
        self.video_set_up = False
        self.audio: RtspAudioTrack | None = None

    # -- setup -----------------------------------------------------------------------------------

    def use_tcp(self, transport: asyncio.WriteTransport, channels: tuple[int, int]) -> None:
        """Deliver interleaved on the RTSP connection's ``transport``."""
        self.transport_kind = "tcp"
        self._tcp = transport
        self.channels = channels
        self.state = "ready"
        self.video_set_up = True

    def use_udp(self, local_host: str, client_ports: tuple[int, int], *,
                scope_id: int = 0) -> tuple[int, int]:
        """Open this session's RTP/RTCP sockets on ``local_host`` (an even port and the next
        one, as RFC 3550 likes; ``scope_id``: a link-local address's interface); returns the
        server ports. Raises ``OSError``."""
        self._loop = asyncio.get_running_loop()
        rtp, rtcp, port = open_rtp_pair(local_host, scope_id)
        for sock in (rtp, rtcp):
            self._loop.add_reader(sock.fileno(), self._on_udp, sock)
        self._rtp_sock, self._rtcp_sock = rtp, rtcp
        self.client_ports = client_ports
        self.transport_kind = "udp"
        self.state = "ready"
        self.video_set_up = True
        return port, port + 1

    def add_audio(self, track: RtspAudioTrack) -> None:
        """The session carries ``track`` too (SETUP of the audio track, its transport chosen).
        Without the video's, the session's transport is the sound's."""
        self.audio = track
        track.on_activity = self._touch
        track.cname = self.cname  # one CNAME: what binds the two tracks for lip sync
        if not self.video_set_up:
            self.transport_kind = track.transport_kind
            if track.transport_kind == "tcp":
                self.channels = track.channels
            self.state = "ready"

    def _touch(self) -> None:
        self.last_activity = time.monotonic()

    def channels_in_use(self) -> set[int]:
        """The interleaved channels this session's TCP tracks use."""
        used: set[int] = set()
        if self.video_set_up and self.transport_kind == "tcp":
            used.update(self.channels)
        if self.audio is not None and self.audio.transport_kind == "tcp":
            used.update(self.audio.channels)
        return used

    # -- play / pause / close --------------------------------------------------------------------

    def prepare_play(self) -> tuple[int, int | None]:
        """Join the ring (as a viewer does) before the PLAY response; returns the sequence
        number and, when a frame is already queued, the RTP timestamp of the first packet."""
        if not self.video_set_up:
            return self._seq, None
        catch_up, gop, gop_bytes = self._cursor_settings
        if self.cursor is None:
            self.cursor = RecorderCursor(self._feed, self._fanout.take,
                                         after_pts=self._last_out_pts,
                                         frame_interval=self._frame_interval,
                                         catch_up_max_frames=catch_up,
                                         keyframe_interval_frames=gop,
                                         on_keyframe_request=self._request_keyframe,
                                         catch_up_max_bytes=gop_bytes)
        self.cursor.pull()
        rtptime = None
        self._burst_left = len(self.cursor.queue)
        if self.cursor.queue:
            rtptime = (self._ts_origin + self.cursor.queue[0][1]) & 0xFFFFFFFF
        return self._seq, rtptime

    def start_capture_us(self) -> int | None:
        """The capture time the PLAY starts at (after :meth:`prepare_play`): the first queued
        picture's, else (a join that waits for a fresh IDR) the newest picture's; None with
        no picture at all."""
        if self.cursor is not None and self.cursor.queue:
            return self.cursor.queue[0][3]
        anchor = self._video_anchor()
        return anchor[1] if anchor is not None else None

    def video_rtptime_at(self, capture_us: int) -> int | None:
        """The video RTP time of capture time ``capture_us`` (the sender reports' map)."""
        anchor = self._video_anchor()
        if anchor is None:
            return None
        return rtp_at(*anchor, capture_us, 90_000)

    def _video_anchor(self) -> tuple[int, int] | None:
        """(RTP time unwrapped, capture time) of a recent picture on this session's output
        timeline: the live frames' map of RTP to the capture clock (a join burst keeps its
        frames' own pts on it, the stale keyframe of a late join goes out at the newest's).

        Of the last :data:`ANCHOR_FRAMES` pictures, the one captured least late for its pts:
        a picture's capture stamp can only be late against its pts (a busy encoder thread),
        never early, so the least late one is the camera's own clock, and the map does not
        wobble by a late frame's lateness from one report to the next (FFmpeg re-times
        everything after a report by it). (For a second after a source restart whose pts went
        back, the map may still be the old run's.)"""
        ring = self._feed.ring
        newest = ring.newest_seq
        best: tuple[float, int, int] | None = None
        for seq in range(newest, max(ring.oldest_seq, newest - ANCHOR_FRAMES + 1) - 1, -1):
            view = ring.frame(seq)
            if view is None:
                continue
            late = view.capture_time_us - view.pts * 1_000_000 / 90_000
            if best is None or late < best[0]:
                best = (late, view.pts, view.capture_time_us)
        if best is None:
            return None
        cursor = self.cursor
        offset = cursor.timeline_offset if isinstance(cursor, RecorderCursor) else 0
        return self._ts_origin + best[1] + offset, best[2]

    def play(self) -> None:
        """Start sending (after the PLAY response is written). With the sound too, each track
        sends a sender report before its first packet: a client places both on the capture
        clock from the start (FFmpeg otherwise starts each track at 0 until a report)."""
        if self.state == "closed":
            return
        self._loop = asyncio.get_running_loop()
        self.state = "playing"
        self._next_sr = 0.0
        now = time.monotonic()
        if self.video_set_up:
            if self.audio is not None:
                self.send_report(now)
            self._fanout.add_consumer(self)
            self.service(now)
        if self.audio is not None:
            self.audio.play(now)

    def pause(self) -> None:
        """Stop sending; a later PLAY joins the ring again at a keyframe."""
        if self.state != "playing":
            return
        self.state = "ready"
        self._fanout.remove_consumer(self)
        self._cancel_pacing()
        if self.cursor is not None:
            self._skipped_before += self.cursor.frames_skipped
            self.cursor.close()
            self.cursor = None
        if self.audio is not None:
            self.audio.pause()

    def close(self, why: str = "teardown") -> None:
        """Leave the fan-out, close the UDP sockets (idempotent)."""
        if self.state == "closed":
            return
        self.state = "closed"
        self._fanout.remove_consumer(self)
        self._cancel_pacing()
        if self.cursor is not None:
            self.cursor.close()
        if self.audio is not None:
            self.audio.close()
        for sock in (self._rtp_sock, self._rtcp_sock):
            if sock is not None:
                if self._loop is not None:
                    self._loop.remove_reader(sock.fileno())
                sock.close()
        self._rtp_sock = self._rtcp_sock = None
        self._tcp = None
        if self.on_close is not None:
            self.on_close(self, why)

    # -- sending (a FanoutConsumer) --------------------------------------------------------------

    def service(self, now: float) -> None:
        """Send what the ring has for this client (called by the fan-out on each ring write)."""
        cursor = self.cursor
        if cursor is None or self.state != "playing":
            return
        cursor.pull()
        tcp = self._tcp
        if self.transport_kind == "tcp":
            if tcp is None or tcp.is_closing():
                return
            if tcp.get_write_buffer_size() > self.buffer_limit:
                self._fell_behind(cursor, now)
                return
            self._stuck_since = None
            if len(cursor.queue) > self._max_backlog_frames + self._burst_left:
                self._fell_behind(cursor, now)
                cursor.pull()
        elif len(cursor.queue) > 4 * self._max_backlog_frames + self._burst_left:
            # UDP's queue only outlasts a call while a burst is paced; this long, the pacing
            # timer is starved (an overloaded board): catch up at the next keyframe.
            self._fell_behind(cursor, now)
            cursor.pull()
        sent_bytes = 0
        while cursor.queue:
            if tcp is None and sent_bytes >= JOIN_PACE_BYTES:
                self._pace_later()
                break
            frame, out_pts, keyframe, _capture = cursor.queue.popleft()
            self._burst_left = max(0, self._burst_left - 1)
            sent_bytes += frame.size
            timestamp = (self._ts_origin + out_pts) & 0xFFFFFFFF
            if tcp is not None:
                self._send_tcp(tcp, frame, timestamp)
            else:
                self._send_udp(frame, timestamp)
            self.frames_sent += 1
            self.keyframes_sent += keyframe
            if keyframe:
                self._skipping = False
            self._last_ts = timestamp
            self._last_out_pts = out_pts
            self._last_send_monotonic = now
        if now >= self._next_sr and self.packets_sent:
            self._next_sr = now + SR_INTERVAL_S * (0.5 + random.random())
            self.send_report(now)

    def _pace_later(self) -> None:
        if self._pace_handle is None and self._loop is not None:
            self.paced_slices += 1
            self._pace_handle = self._loop.call_later(JOIN_PACE_S, self._paced)

    def _paced(self) -> None:
        self._pace_handle = None
        try:
            self.service(time.monotonic())
        except Exception:  # as the fan-out guards its consumers: one client's trouble only
            logger.exception("rtsp: sending to %s failed", self.peer[0])

    def _cancel_pacing(self) -> None:
        if self._pace_handle is not None:
            self._pace_handle.cancel()
            self._pace_handle = None

    def _fell_behind(self, cursor: ViewerCursor[PacketizedFrame], now: float) -> None:
        """The client cannot keep up: drop what waits, go on at the next keyframe."""
        self._burst_left = 0
        cursor.skip_to_next_keyframe()  # the cursor counts what it drops
        if not self._skipping:
            self._skipping = True
            self.keyframe_skips += 1
        if self.transport_kind == "tcp":
            if self._stuck_since is None:
                self._stuck_since = now
            elif now - self._stuck_since > STUCK_CLOSE_S and self._tcp is not None:
                logger.info("rtsp: closing %s: it has taken nothing for %.0f s",
                            self.peer[0], STUCK_CLOSE_S)
                self._tcp.abort()

    def _send_tcp(self, tcp: asyncio.WriteTransport, frame: PacketizedFrame,
                  timestamp: int) -> None:
        """The frame's packets, each framed ``$ channel length``, written in one piece."""
        payloads = frame.payloads
        last = len(payloads) - 1
        channel, ssrc, seq = self.channels[0], self.ssrc, self._seq
        pack = _INTERLEAVED_RTP.pack
        parts: list[bytes] = []
        octets = 0
        for i, payload in enumerate(payloads):
            parts.append(pack(0x24, channel, 12 + len(payload), 0x80,
                              (0x80 | PAYLOAD_TYPE) if i == last else PAYLOAD_TYPE,
                              seq, timestamp, ssrc))
            parts.append(payload)
            seq = (seq + 1) & 0xFFFF
            octets += len(payload)
        data = b"".join(parts)
        tcp.write(data)
        self._seq = seq
        self.packets_sent += len(payloads)
        self.payload_bytes_sent += octets
        self.bytes_sent += len(data)

    def _send_udp(self, frame: PacketizedFrame, timestamp: int) -> None:
        """The frame's packets to the client's RTP port: each run of equal-sized payloads
        (``frame.ends``) in one GSO send of up to :data:`GSO_MAX_SEGMENTS` datagrams, else one
        ``sendmsg`` per packet."""
        sock = self._rtp_sock
        if sock is None:
            return
        target = self._client_address(self.client_ports[0])
        payloads = frame.payloads
        last = len(payloads) - 1
        ssrc, first_seq = self.ssrc, self._seq
        pack = _RTP.pack
        sent = octets = 0
        start = 0
        for run_end in frame.ends:
            i = start
            while i < run_end:
                segment = len(payloads[i])
                j, total = i, 0
                parts: list[bytes] = []
                while (j < run_end and j - i < GSO_MAX_SEGMENTS
                       and total + 12 + len(payloads[j]) <= GSO_MAX_BYTES):
                    parts.append(pack(0x80, (0x80 | PAYLOAD_TYPE) if j == last else PAYLOAD_TYPE,
                                      (first_seq + j) & 0xFFFF, timestamp, ssrc))
                    parts.append(payloads[j])
                    total += 12 + len(payloads[j])
                    j += 1
                count = j - i
                if count > 1 and self.gso:
                    try:
                        sock.sendmsg(parts, [(socket.SOL_UDP, UDP_SEGMENT,
                                              struct.pack("H", 12 + segment))], 0, target)
                        self.gso_sends += 1
                        sent += count
                        octets += total - 12 * count
                        i = j
                        continue
                    except OSError as exc:
                        if exc.errno not in GSO_REFUSED:  # a full buffer: lost like on the wire
                            self.send_errors += count
                            i = j
                            continue
                        self.gso = False
                        logger.info("rtsp: UDP GSO refused to %s (%s); datagram by datagram",
                                    self.peer[0], exc)
                for k in range(count):
                    try:
                        sock.sendmsg((parts[2 * k], parts[2 * k + 1]), (), 0, target)
                    except OSError:  # a full socket buffer, an ICMP error: lost like on the wire
                        self.send_errors += 1
                        continue
                    sent += 1
                    octets += len(parts[2 * k + 1])
                i = j
            start = run_end
        self._seq = (first_seq + len(payloads)) & 0xFFFF
        self.packets_sent += sent
        self.payload_bytes_sent += octets
        self.bytes_sent += octets + 12 * sent

    def _client_address(self, port: int) -> tuple[str, int] | tuple[str, int, int, int]:
        """Where UDP to the client goes: its own address, with its IPv6 scope (a link-local
        address is not routable without its interface: the send fails with EINVAL)."""
        if self.peer_scope:
            return (self.peer[0], port, 0, self.peer_scope)
        return (self.peer[0], port)

    def send_report(self, now: float) -> None:
        """An RTCP sender report + SDES CNAME, on channel 1 or to the client's RTCP port. Its
        RTP time is the capture clock's (:meth:`_video_anchor`): NTP now is the RTP time a
        picture captured now would have, the same map as the sound's, so clients sync the
        two. (Before a picture is in the ring: the last sent, moved on by the time since.)"""
        anchor = self._video_anchor()
        if anchor is not None:
            unix_us = time.time_ns() // 1000
            rtp_ts = rtp_at(*anchor, unix_us, 90_000)
            packet = sender_report_at(ntp_of_us(unix_us), self.ssrc, rtp_ts, self.packets_sent,
                                      self.payload_bytes_sent, self.cname)
        else:
            rtp_ts = self._last_ts + int((now - self._last_send_monotonic) * 90_000)
            packet = sender_report(self.ssrc, rtp_ts, self.packets_sent,
                                   self.payload_bytes_sent, self.cname)
        self._send_report_packet(packet)

    # -- receiving -------------------------------------------------------------------------------

    def _on_udp(self, sock: socket.socket) -> None:
        for _ in range(32):
            try:
                data, address = sock.recvfrom(2048)
            except OSError:  # BlockingIOError, or an ICMP error from an earlier send
                return
            # (a link-local sender's address comes as "fe80::...%if")
            if address[0].split("%", 1)[0] != self.peer[0]:
                self.rtcp_ignored += 1
                continue
            # Anything from the client (RTCP, or the NAT punch FFmpeg sends to the RTP port)
            # shows it is still there.
            self.last_activity = time.monotonic()
            if sock is self._rtcp_sock:
                self.handle_rtcp(data)

    def handle_rtcp(self, data: bytes) -> None:
        """RTCP from the client (interleaved channel 1, or the RTCP port)."""
        self.last_activity = time.monotonic()
        feedback = rtcp_feedback(data, self.ssrc)
        if feedback is None:
            self.rtcp_malformed += 1
            return
        self.rtcp_received += 1
        for reason in feedback.keyframe_requests:
            self.keyframe_requests_received += 1
            self._request_keyframe(reason)
        if feedback.fraction_lost is not None:
            self.fraction_lost = feedback.fraction_lost

    def _request_keyframe(self, reason: str) -> None:
        # A source with IDRs on demand makes one (coalesced, shared with every viewer). One
        # without (rpicam-vid, a file, an IP camera) ignores it and the client waits for the
        # next periodic IDR: unlike a WebRTC viewer, an RTSP client is usually a recorder
        # (an NVR, Frigate, ffmpeg), which would store a GOP re-sent from the ring as the same
        # seconds twice, and the RTSP timeline keeps the frames' own timestamps.
        if self._feed.request_keyframe(f"rtsp {self.camera}: {reason}"):
            self.keyframes_forced += 1

    # -- stats -----------------------------------------------------------------------------------

    @property
    def frames_skipped(self) -> int:
        """Frames this client never got (joining, or dropped because it could not keep up)."""
        return self._skipped_before + (self.cursor.frames_skipped if self.cursor else 0)

    def stats(self) -> dict[str, Any]:
        """This session's figures, for ``/api/status``."""
        return {
            "camera": self.camera,
            "transport": self.transport_kind,
            "client": self.peer[0],
            "state": self.state,
            "join_mode": self.cursor.join_mode if self.cursor else "",
            "frames_sent": self.frames_sent,
            "keyframes_sent": self.keyframes_sent,
            "packets_sent": self.packets_sent,
            "bytes_sent": self.bytes_sent,
            "frames_skipped": self.frames_skipped,
            "keyframe_skips": self.keyframe_skips,
            "sender_reports": self.sender_reports,
            "rtcp_received": self.rtcp_received,
            "keyframe_requests_received": self.keyframe_requests_received,
            "fraction_lost": round(self.fraction_lost, 4),
            "send_errors": self.send_errors,
            "paced_slices": self.paced_slices,
            "gso_sends": self.gso_sends,
            "video": self.video_set_up,
            **({"audio": self.audio.stats()} if self.audio is not None else {}),
        }
