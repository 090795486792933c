"""One relay target: the camera's H.264 as RTP (optionally SRTP) to a media server.

A relay is one more consumer of the fan-out's shared packets (:class:`FanoutConsumer`): its own
ring cursor (:class:`ViewerCursor`, the same join and continuity logic as a viewer's) takes each
frame's packetization from :class:`PacketHistory`, so a frame is still packetized once for every
viewer and every relay. Per packet the relay writes only its 12-byte RTP header (its own SSRC,
sequence number and timestamp), protects it in place when SRTP is configured and ``sendto``\\ s it
on its own UDP socket: about the cost of one WebRTC viewer.

Sequence numbers and timestamps stay continuous for the relay's whole life, whatever the source
does (restarts, file loops, camera reconnects): Janus gives late joiners nothing after a
timestamp jump back.

RTCP: sender reports (+ SDES CNAME) go to the server's RTCP port; the server's PLI/FIR (Janus
sends them to whatever address its mountpoint's ``rtcpport`` last heard from, i.e. this socket)
become the capture's coalesced keyframe request. Only datagrams from the target's address are
read.

When the server is down the kernel reports ICMP port unreachable (``IP_RECVERR``): the relay logs
it once, stops sending media, probes once every :data:`RETRY_S` and resumes at a keyframe when a
probe goes unanswered by an ICMP error. The error queue says which destination refused: only the
RTP port's refusals pause the media; a closed RTCP port (a mountpoint without ``rtcpport``) is
logged once and counted, and errors about any other destination are ignored.

Sound (``audio_port``): the camera's Opus packets, read from its ring once and sent as they are,
beside the video from the same socket (:class:`_RelayAudio`): its own SSRC, the same SRTP key
and CNAME, its own RTCP port. Both streams' sender reports map RTP time to the capture clock
(``stream.reports.SenderReports``), so the server (and whoever reads the SDP) can line them up.
The audio pauses and resumes on its own: a server without an audio port costs the picture
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
import secrets
import socket
import struct
import time
from typing import Any

import pylibsrtp

from ruseon_appliance.capture.ring import RingReader
from ruseon_appliance.config import RelayConfig
from ruseon_appliance.logs import RateLimit
from ruseon_appliance.stream import srtp
from ruseon_appliance.stream.cursor import VideoFeed, ViewerCursor
from ruseon_appliance.stream.fanout import Fanout
from ruseon_appliance.stream.history import PacketizedFrame
from ruseon_appliance.stream.opus import OPUS_CLOCK_RATE, AudioFeed, OpusTimeline
from ruseon_appliance.stream.reports import SenderReports
from ruseon_appliance.stream.rtcp import rtcp_feedback

logger = logging.getLogger(__name__)

# Sender report interval (randomised 0.5-1.5x, RFC 3550). Janus learns where to send its PLIs from
# the first RTCP packet it gets on the mountpoint's rtcpport: the first SR goes out at once.
SR_INTERVAL_S = 1.0
# While the server refuses (ICMP port unreachable): one probe per RETRY_S; media resumes when a
# probe has had RESUME_AFTER_S without an ICMP error.
RETRY_S = 1.0
RESUME_AFTER_S = 0.3
# Queued frames (seconds' worth) beyond which the relay skips to the next keyframe.
MAX_BACKLOG_S = 0.5
SEND_BUFFER_BYTES = 1 << 20
# Sender reports refused in a row, with no RTP refusal between, before the RTCP port is said to
# be closed (a server that is down refuses both, and the RTP warning says so).
RTCP_REFUSALS_TO_WARN = 3
# How often a target name that did not resolve is tried again, and how long start-up waits
# for the first answer before going on without it.
RESOLVE_RETRY_S = 5.0
RESOLVE_TIMEOUT_S = 2.0

IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
IPV6_RECVERR = getattr(socket, "IPV6_RECVERR", 25)
_REFUSED = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH,
                      errno.EHOSTDOWN})

# An Opus packet with no frame data (RFC 6716 3.2.1: TOC config 31 = CELT fullband 20 ms, one
# frame of length 0): DTX, concealed by the decoder. The audio's probe while refused.
OPUS_DTX = bytes([31 << 3])

# The video's probe while refused with no RTCP port: an H.264 access unit delimiter (NAL type 9,
# primary_pic_type 7), which decoders skip. Janus forwards a probe to the mountpoint's viewers;
# a padding-only packet, as before, reached them as an empty payload, and FFmpeg (aiortc's
# decoder) takes an empty packet as the end of the stream: that viewer never decoded again.
PROBE_AUD = bytes([0x09, 0xF0])

_HEADER = struct.Struct("!BBHII")  # V/P/X/CC, M/PT, sequence number, timestamp, SSRC


class RtpRelay:
    """Sends the camera's RTP to one target (see the module docstring); a :class:`Fanout`
    consumer. Built and owned by the composition root."""

    def __init__(
        self,
        config: RelayConfig,
        feed: VideoFeed,
        fanout: Fanout,
        *,
        framerate: int,
        catch_up_max_frames: int,
        keyframe_interval_frames: int,
        audio: AudioFeed | None = None,
        camera: str = "",
    ) -> None:
        self.config = config
        self.name = config.name
        self._feed = feed
        self._fanout = fanout
        self._frame_interval = round(90_000 / max(1, framerate))
        self._max_backlog_frames = max(2, round(framerate * MAX_BACKLOG_S))
        self._cursor_settings = (catch_up_max_frames, keyframe_interval_frames)
        self.cursor: ViewerCursor[PacketizedFrame] | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resolver: asyncio.Task[None] | None = None
        self.target: tuple[str, int] = (config.target.host, config.target.port)
        self.rtcp_target: tuple[str, int] | None = None
        self.ssrc = random.randrange(1, 1 << 32)
        self.cname = "ruseon-" + secrets.token_hex(4)
        self.payload_type = config.payload_type
        self._seq = random.randrange(0, 32768)  # lower half: no early SRTP rollover
        self._ts_origin = random.randrange(0, 1 << 32)
        self._buffer = srtp.SrtpPacketBuffer()
        self._srtp: pylibsrtp.Session | None = None
        self._srtp_handle: Any = None
        master = config.srtp_master()
        if master is not None:
            policy = pylibsrtp.Policy(key=master, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND,
                                      srtp_profile=pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80)
            self._srtp = pylibsrtp.Session(policy)
            self._srtp_handle = srtp.srtp_handle(self._srtp)
        # Sender reports map RTP time to the capture clock (lip sync with the audio's).
        self._reports = SenderReports(self.ssrc, self.cname)
        self._burst_left = 0  # join-burst frames still to send (stamped for their send time)
        self._last_ts = 0
        self._next_sr = 0.0
        # The camera's sound (see :class:`_RelayAudio`): None when the relay sends video only.
        self.camera = camera
        self.audio: _RelayAudio | None = None
        if config.audio_port and audio is not None:
            self.audio = _RelayAudio(self, audio)
        # "starting", "unresolved" (name not resolving yet), "sending", "unreachable" (ICMP
        # errors: media paused, probing), "stopped".
        self.state = "starting"
        self._refused_at = 0.0
        self._probe_at = 0.0
        self._next_probe = 0.0
        self._resync = False
        # counters
        self.frames_sent = 0
        self.keyframes_sent = 0
        self.frames_dropped_unreachable = 0
        self.keyframe_skips = 0
        self.packets_sent = 0
        self.payload_bytes_sent = 0
        self.bytes_sent = 0
        self.sender_reports = 0
        self.rtcp_received = 0
        self.rtcp_ignored = 0
        self.receiver_reports = 0
        self.keyframe_requests_received = 0
        self.keyframes_forced = 0
        self.remb_bps: int | None = None
        self.fraction_lost = 0.0
        self.outages = 0
        self._rtcp_refusal_logged = False
        self._rtcp_refusals_since_rtp = 0
        self.errors: dict[str, int] = {"unreachable": 0, "rtcp_unreachable": 0, "icmp_other": 0,
                                       "send": 0, "dropped_full": 0, "srtp": 0,
                                       "rtcp_malformed": 0}

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Resolve the target, open and bind the socket, join the fan-out.

        A target name that does not resolve yet (DNS not up at boot) does not stop the
        appliance: the relay says so once and tries again every :data:`RESOLVE_RETRY_S`.
        A local address that cannot be bound is a configuration error and raises ``OSError``.
        """
        self._loop = asyncio.get_running_loop()
        self._warn_no_sound()
        try:
            # Bounded: a DNS server that does not answer would otherwise hold the whole start-up
            # (and systemd's READY) for the resolver's timeouts, relay after relay.
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                family, address = await self._resolve()
        except OSError as exc:  # TimeoutError included
            self.state = "unresolved"
            why = str(exc) or f"no answer within {RESOLVE_TIMEOUT_S:.0f} s"
            logger.warning("relay %s: cannot resolve %s (%s); retrying every %.0f s",
                           self.name, self.target[0], why, RESOLVE_RETRY_S)
            self._resolver = self._loop.create_task(self._resolve_later())
            return
        self._open(family, address)

    def _warn_no_sound(self) -> None:
        if self.config.audio_port and self.audio is None:
            logger.warning("relay %s: camera %s has no sound: relay %s sends video only",
                           self.name, self.camera or "(default)", self.name)

    async def _resolve(self) -> tuple[int, tuple[str, int]]:
        assert self._loop is not None
        host, port = self.target
        infos = await self._loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        if not infos:
            raise OSError(f"no address for {host}")
        family, _, _, _, address = infos[0]
        return family, (str(address[0]), int(address[1]))

    async def _resolve_later(self) -> None:
        while self.state == "unresolved":
            await asyncio.sleep(RESOLVE_RETRY_S)
            try:
                family, address = await self._resolve()
            except OSError:
                continue
            if self.state != "unresolved":
                return
            try:
                self._open(family, address)
            except OSError as exc:
                self.errors["send"] += 1
                logger.error("relay %s: cannot open its socket: %s", self.name, exc)
                return

    def _open(self, family: int, address: tuple[str, int]) -> None:
        assert self._loop is not None
        self.target = address
        rtcp_port = self.config.rtcp_target_port
        if rtcp_port:
            self.rtcp_target = (self.target[0], rtcp_port)
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            # ICMP errors reach an unconnected UDP socket only with IP_RECVERR.
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVERR, 1)
            else:
                sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
            bind = self.config.bind
            bind_host = bind.host
            if family == socket.AF_INET6 and bind_host == "0.0.0.0":
                bind_host = "::"
            try:
                sock.bind((bind_host, bind.port))
            except OSError as exc:
                # Start-up fails on this: say which relay and which setting, not just "[Errno 99]".
                raise OSError(exc.errno, f"relay {self.name}: cannot bind relay.bind = "
                                         f"{bind.host}:{bind.port}: {exc.strerror}") from exc
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._loop.add_reader(sock.fileno(), self._on_readable)
        catch_up, gop = self._cursor_settings
        self.cursor = ViewerCursor(self._feed, self._fanout.take,
                                   frame_interval=self._frame_interval,
                                   catch_up_max_frames=catch_up, keyframe_interval_frames=gop,
                                   on_keyframe_request=self._cursor_keyframe_request)
        self.state = "sending"
        self._next_sr = 0.0
        self._fanout.add_consumer(self)
        logger.info("relay %s: sending RTP to %s:%d from port %d%s", self.name, *self.target,
                    self.local_port, " (SRTP)" if self._srtp else "")
        if self.audio is not None:
            self.audio.open(self.target[0])

    def stop(self) -> None:
        """Leave the fan-out and close the socket (idempotent)."""
        if self.state == "stopped":
            return
        self.state = "stopped"
        if self._resolver is not None:
            self._resolver.cancel()
            self._resolver = None
        self._fanout.remove_consumer(self)
        if self.cursor is not None:
            self.cursor.close()
        if self.audio is not None:
            self.audio.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(sock.fileno())
            sock.close()

    @property
    def local_port(self) -> int:
        """The port of the relay's own UDP socket (0 before start)."""
        return int(self._sock.getsockname()[1]) if self._sock is not None else 0

    # -- sending (a FanoutConsumer) --------------------------------------------------------------

    def service(self, now: float) -> None:
        """Send what the ring has for the target (called by the fan-out on each ring write)."""
        cursor, sock = self.cursor, self._sock
        if cursor is None or sock is None:
            return
        joining = cursor.reader is None
        cursor.pull()
        if joining:
            # The join burst (keyframe + catch-up) is stamped for when it leaves.
            self._burst_left = len(cursor.queue)
        if self.state == "unreachable":
            self._while_unreachable(cursor, sock, now)
            return
        if self._resync:
            # Back from an outage: the server's decoders need a keyframe first.
            self._resync = False
            cursor.skip_to_next_keyframe()
            self._request_keyframe("relay resumed")
            cursor.pull()
        elif self.frames_sent and len(cursor.queue) > self._max_backlog_frames:
            cursor.skip_to_next_keyframe()
            self.keyframe_skips += 1
            cursor.pull()
        while cursor.queue and self.state == "sending":
            frame, out_pts, keyframe, capture_us = cursor.queue.popleft()
            timestamp = (self._ts_origin + out_pts) & 0xFFFFFFFF
            packets, octets = self.packets_sent, self.payload_bytes_sent
            self._send_frame(sock, frame, timestamp)
            # A join burst's frames are squeezed into the ticks before the newest frame's, whose
            # own pts its last one keeps (unless the join re-stamped a stale keyframe "now").
            live = self._burst_left <= 0 or (self._burst_left == 1
                                             and cursor.join_mode != "keyframe-then-live")
            self._burst_left -= 1
            self._reports.sent(self.packets_sent - packets, self.payload_bytes_sent - octets,
                               timestamp, now, capture_us if live else None)
            self.frames_sent += 1
            self.keyframes_sent += keyframe
            self._last_ts = timestamp
        if self.rtcp_target is not None and now >= self._next_sr and self.packets_sent:
            self._next_sr = now + SR_INTERVAL_S * (0.5 + random.random())
            self.send_report(now)

    def _send_frame(self, sock: socket.socket, frame: PacketizedFrame, timestamp: int) -> None:
        """Header into the shared buffer, payload behind it, protect in place, send."""
        buffer = self._buffer
        view, length = buffer.view, buffer.length
        payloads = frame.payloads
        last = len(payloads) - 1
        pt, ssrc, seq = self.payload_type, self.ssrc, self._seq
        handle = self._srtp_handle
        protect = srtp.srtp_protect_in_place
        ok = srtp.SRTP_OK
        sendto = sock.sendto
        pack_into = _HEADER.pack_into
        target = self.target
        octets = wire = 0
        for i, payload in enumerate(payloads):
            n = 12 + len(payload)
            pack_into(view, 0, 0x80, (0x80 | pt) if i == last else pt, seq, timestamp, ssrc)
            view[12:n] = payload
            seq = (seq + 1) & 0xFFFF
            if handle is not None:
                length[0] = n
                if protect(handle, buffer.cdata, length) != ok:
                    self.errors["srtp"] += 1
                    continue
                n = length[0]
            try:
                sendto(view[:n], target)
            except BlockingIOError:
                self.errors["dropped_full"] += 1
                continue
            except OSError as exc:
                if exc.errno not in _REFUSED:
                    self.errors["send"] += 1
                    continue
                # An earlier ICMP error reported now, and this packet was not sent: the error
                # queue says whose it was (a closed RTCP port must not cost a media packet).
                self._drain_errors(sock)
                if self.state != "sending":
                    break
                try:
                    sendto(view[:n], target)
                except OSError:
                    self.errors["send"] += 1
                    continue
            octets += len(payload)
            wire += n
            self.packets_sent += 1
        self._seq = seq
        self.payload_bytes_sent += octets
        self.bytes_sent += wire

    def _probe_packet(self) -> bytes:
        """The probe when there is no RTCP port: an RTP packet of one access unit delimiter at
        the last frame's time (:data:`PROBE_AUD`), which a decoder skips."""
        header = _HEADER.pack(0x80, self.payload_type, self._seq, self._last_ts, self.ssrc)
        self._seq = (self._seq + 1) & 0xFFFF
        packet = header + PROBE_AUD
        if self._srtp is not None:
            packet = self._srtp.protect(packet)
        return packet

    def send_report(self, now: float) -> None:
        """An RTCP sender report + SDES CNAME to the server's RTCP port (SRTCP with SRTP). Its
        RTP time is placed by the capture time of the last live frame sent (the audio's are
        too), so a receiver lines the two streams up by the capture clock."""
        sock, target = self._sock, self.rtcp_target
        if sock is None or target is None:
            return
        packet, ntp = self._reports.report(now)
        self._reports.sent_report(ntp, now)
        if self._srtp is not None:
            packet = self._srtp.protect_rtcp(packet)
        try:
            sock.sendto(packet, target)
        except BlockingIOError:
            self.errors["dropped_full"] += 1
            return
        except OSError as exc:
            if exc.errno in _REFUSED:
                self._drain_errors(sock)  # an earlier ICMP error; this report was not sent
            else:
                self.errors["send"] += 1
            return
        self.sender_reports += 1

    # -- the server is down ----------------------------------------------------------------------

    def _rtp_refused(self, why: str) -> None:
        """The target's RTP port refused (an ICMP error about it): pause media, probe."""
        self.errors["unreachable"] += 1
        self._rtcp_refusals_since_rtp = 0
        self._refused_at = time.monotonic()
        if self.state == "sending":
            self.state = "unreachable"
            self.outages += 1
            self._next_probe = self._refused_at + RETRY_S
            logger.warning(
                "relay %s: %s:%d is not accepting (%s); media paused, retrying every %.0f s",
                self.name, *self.target, why, RETRY_S)

    def _rtcp_refused(self) -> None:
        """The server's RTCP port refused a sender report: media goes on, say so once (when it
        keeps refusing while the RTP port accepts: a server that is down refuses both, and
        that is the RTP warning's to say)."""
        self.errors["rtcp_unreachable"] += 1
        if self.state == "unreachable":
            self._refused_at = time.monotonic()  # the SR probe was refused: still down
            return
        self._rtcp_refusals_since_rtp += 1
        if (not self._rtcp_refusal_logged and self.state == "sending"
                and self._rtcp_refusals_since_rtp >= RTCP_REFUSALS_TO_WARN):
            self._rtcp_refusal_logged = True
            assert self.rtcp_target is not None
            logger.warning(
                "relay %s: RTCP port %s:%d is not accepting sender reports (media continues; "
                "is it the mountpoint's rtcpport?)", self.name, *self.rtcp_target)

    def _while_unreachable(self, cursor: ViewerCursor[PacketizedFrame], sock: socket.socket,
                           now: float) -> None:
        self.frames_dropped_unreachable += len(cursor.queue)
        cursor.queue.clear()
        if self._probe_at > self._refused_at and now - self._probe_at >= RESUME_AFTER_S:
            self.state = "sending"
            self._resync = True
            self._next_sr = 0.0
            logger.info("relay %s: %s:%d accepts again; resuming at a keyframe", self.name,
                        *self.target)
            return
        if now < self._next_probe:
            return
        self._next_probe = now + RETRY_S
        self._probe_at = now
        # The probe is an SR (the server learns where to send its PLIs from it; a server that
        # is down refuses it like the RTP), or an RTP packet of an access unit delimiter when
        # there is no RTCP port or it is known to be closed.
        if self.rtcp_target is not None and not self._rtcp_refusal_logged:
            self.send_report(now)
            return
        try:
            sock.sendto(self._probe_packet(), self.target)
        except OSError as exc:
            self._probe_at = 0.0  # not sent: it proves nothing
            if exc.errno in _REFUSED:
                self._drain_errors(sock)  # an earlier ICMP error, reported now
            else:
                self.errors["send"] += 1

    # -- receiving (RTCP from the server, ICMP errors) -------------------------------------------

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        self._drain_errors(sock)
        for _ in range(64):
            try:
                data, address = sock.recvfrom(2048)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno not in _REFUSED:
                    self.errors["send"] += 1
                    return
                self._drain_errors(sock)  # the pending error is an ICMP error: whose?
                continue
            if address[0] != self.target[0]:
                self.rtcp_ignored += 1
                continue
            self._handle_rtcp(data)

    def _drain_errors(self, sock: socket.socket) -> None:
        """Read the socket's error queue (``IP_RECVERR``): each entry is one ICMP error, about
        the destination of the datagram it answers (the message's address)."""
        for _ in range(64):
            try:
                _, ancillary, _, address = sock.recvmsg(64, 512, socket.MSG_ERRQUEUE)
            except OSError:  # BlockingIOError: the queue is empty
                return
            code = None
            for level, kind, data in ancillary:
                if ((level, kind) in ((socket.IPPROTO_IP, IP_RECVERR),
                                      (socket.IPPROTO_IPV6, IPV6_RECVERR))
                        and len(data) >= 4):
                    code = struct.unpack_from("=I", data)[0]  # sock_extended_err.ee_errno
            where = (str(address[0]), int(address[1])) if address else None
            audio = self.audio
            if code not in _REFUSED:
                self.errors["icmp_other"] += 1
            elif where == self.target:
                self._rtp_refused(os.strerror(code) if code else "port unreachable")
            elif self.rtcp_target is not None and where == self.rtcp_target:
                self._rtcp_refused()
            elif audio is not None and where == audio.target:
                audio.refused(os.strerror(code) if code else "port unreachable")
            elif audio is not None and where == audio.rtcp_target:
                audio.rtcp_refused()
            else:
                self.errors["icmp_other"] += 1  # about no destination of ours (forged?)

    def _handle_rtcp(self, data: bytes) -> None:
        feedback = rtcp_feedback(data, self.ssrc)
        if feedback is None:  # a stranger's bytes must not crash anything
            self.errors["rtcp_malformed"] += 1
            return
        self.rtcp_received += 1
        for reason in feedback.keyframe_requests:
            self.keyframe_requests_received += 1
            self._request_keyframe(reason)
        if feedback.remb_bps is not None:
            self.remb_bps = feedback.remb_bps
        self.receiver_reports += feedback.reports
        if self.audio is not None:
            about_audio = rtcp_feedback(data, self.audio.ssrc)
            if about_audio is not None:
                self.audio.receiver_reports += about_audio.reports
        if feedback.fraction_lost is not None:
            self.fraction_lost = feedback.fraction_lost

    def _request_keyframe(self, reason: str) -> None:
        # As for RTSP clients: a source with IDRs on demand makes one; one without ignores it
        # and the next periodic IDR serves. A GOP re-sent from the ring would reach every
        # viewer behind the relay (Janus fans it out), replaying seconds for all of them.
        if self._feed.request_keyframe(f"relay {self.name}: {reason}"):
            self.keyframes_forced += 1

    def _cursor_keyframe_request(self, reason: str) -> None:
        self._request_keyframe(reason)

    # -- stats -----------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Per-relay figures for ``/api/status`` and ``/metrics``."""
        cursor = self.cursor
        return {
            "name": self.name,
            "url": self.config.url,
            "state": self.state,
            "srtp": self._srtp is not None,
            "ssrc": self.ssrc,
            "local_port": self.local_port,
            "rtcp_port": self.config.rtcp_target_port,
            "packets_sent": self.packets_sent,
            "bytes_sent": self.bytes_sent,
            "payload_bytes_sent": self.payload_bytes_sent,
            "frames_sent": self.frames_sent,
            "keyframes_sent": self.keyframes_sent,
            "frames_skipped": (cursor.frames_skipped if cursor else 0)
            + self.frames_dropped_unreachable,
            "keyframe_skips": self.keyframe_skips,
            "sender_reports": self.sender_reports,
            "rtcp_received": self.rtcp_received,
            "rtcp_ignored": self.rtcp_ignored,
            "receiver_reports": self.receiver_reports,
            "keyframe_requests_received": self.keyframe_requests_received,
            "keyframes_forced": self.keyframes_forced,
            "remb_bps": self.remb_bps,
            "fraction_lost": round(self.fraction_lost, 4),
            "outages": self.outages,
            "errors": dict(self.errors),
            "audio": (self.audio.stats() if self.audio is not None else
                      {"state": "no sound" if self.config.audio_port else "off",
                       **_NO_AUDIO_COUNTS}),
        }



_NO_AUDIO_COUNTS: dict[str, Any] = {"packets_sent": 0, "bytes_sent": 0, "payload_bytes_sent": 0,
                                    "sender_reports": 0, "outages": 0}
AUDIO_ERROR_LOG_INTERVAL_S = 10.0


class _RelayAudio:
    """The camera's Opus beside the relay's video (``audio_port``).

    Sent from the relay's own socket (one firewall rule, one error queue) to
    ``HOST:audio_port``: its own SSRC and sequence numbers, RTP time from the packets' pts
    (48 kHz, 960 a packet; a timeline that goes back is rebased so the stream stays
    continuous), the marker on a talkspurt's first packet, the relay's SRTP session (the same
    key: Janus's ``srtpcrypto`` covers the whole mountpoint), the relay's CNAME. Sender reports
    go to the audio RTCP port with RTP time placed by the capture clock, as the video's.

    The ring is read (``reader("next")``) only while sending: without a reader the camera
    encodes no Opus. An ICMP refusal of the audio port pauses the audio alone (reader let go,
    one DTX probe per :data:`RETRY_S`, back at the next packet once a probe goes
    unrefused); the video never notices.
    """

    def __init__(self, relay: RtpRelay, feed: AudioFeed) -> None:
        self._relay = relay
        self._ring = feed.opus_ring
        config = relay.config
        self.payload_type = config.audio_payload_type
        self.ssrc = relay.ssrc
        while self.ssrc == relay.ssrc:
            self.ssrc = random.randrange(1, 1 << 32)
        self.target: tuple[str, int] | None = None
        self.rtcp_target: tuple[str, int] | None = None
        self._seq = random.randrange(0, 32768)
        self._timeline = OpusTimeline()
        self.reports = SenderReports(self.ssrc, relay.cname, clock_rate=OPUS_CLOCK_RATE)
        self._next_sr = 0.0
        # "starting", "sending", "unreachable" (ICMP errors: paused, probing), "stopped".
        self.state = "starting"
        self._reader: RingReader | None = None
        self._task: asyncio.Task[None] | None = None
        self._refused_at = 0.0
        self._refusal_logged = False
        self._rtcp_refusal_logged = False
        self._rtcp_refusals = 0
        self._error_log = RateLimit(AUDIO_ERROR_LOG_INTERVAL_S)
        self.packets_sent = 0
        self.bytes_sent = 0
        self.payload_bytes_sent = 0
        self.packets_read = 0
        self.sender_reports = 0
        self.receiver_reports = 0
        self.outages = 0
        self.errors: dict[str, int] = {"unreachable": 0, "rtcp_unreachable": 0, "send": 0,
                                       "dropped_full": 0, "srtp": 0, "service": 0}

    @property
    def reading(self) -> bool:
        """Whether the relay holds a reader on the camera's Opus ring now."""
        return self._reader is not None

    def open(self, host: str) -> None:
        """The relay's target resolved to ``host`` and its socket is open: start sending."""
        config = self._relay.config
        self.target = (host, config.audio_port)
        rtcp = config.audio_rtcp_target_port
        self.rtcp_target = (host, rtcp) if rtcp else None
        self._start_sending()
        logger.info("relay %s: sending the camera's Opus to %s:%d", self._relay.name,
                    *self.target)

    def close(self) -> None:
        """Stop sending and let the ring go (idempotent)."""
        self.state = "stopped"
        self._release()

    def _release(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        task, self._task = self._task, None
        try:
            current = asyncio.current_task()
        except RuntimeError:  # no running loop (a stop outside it)
            current = None
        if task is not None and task is not current:
            task.cancel()  # (from within, the loop sees the state and ends)

    def _start_sending(self) -> None:
        self.state = "sending"
        self._next_sr = 0.0
        self._reader = self._ring.reader("next")
        self._task = asyncio.get_running_loop().create_task(self._pump_loop())

    async def _pump_loop(self) -> None:
        ring = self._ring
        while self.state == "sending":
            await ring.wait()
            try:
                self.pump(time.monotonic())
            except Exception:  # the sound must never stop on one bad packet
                self.errors["service"] += 1
                if self._error_log.ready():
                    logger.exception("relay %s: sending audio failed (%d so far)",
                                     self._relay.name, self.errors["service"])

    # -- sending -------------------------------------------------------------------------------

    def pump(self, now: float) -> None:
        """Send every packet written since the last call (on each ring write)."""
        sock, reader = self._relay._sock, self._reader
        if sock is None or reader is None:
            return
        while self.state == "sending":
            view = reader.poll()
            if view is None:
                break
            self.packets_read += 1
            self._send(sock, bytes(view.data), view.pts, view.capture_time_us, now)
        if (self.rtcp_target is not None and self.state == "sending" and now >= self._next_sr
                and self.packets_sent):
            self._next_sr = now + SR_INTERVAL_S * (0.5 + random.random())
            self.send_report(now)

    def _send(self, sock: socket.socket, payload: bytes, pts: int, capture_us: int,
              now: float) -> None:
        timestamp, marker = self._timeline.stamp(pts)
        packet = _HEADER.pack(0x80, (0x80 | self.payload_type) if marker else self.payload_type,
                              self._seq, timestamp, self.ssrc) + payload
        self._seq = (self._seq + 1) & 0xFFFF
        sent = self._sendto(sock, packet)
        if sent:
            self.packets_sent += 1
            self.bytes_sent += sent
            self.payload_bytes_sent += len(payload)
        # Sent or not, the timestamp is used (a packet lost is lost like on the wire).
        self.reports.sent(1 if sent else 0, len(payload) if sent else 0, timestamp, now,
                          capture_us)

    def _sendto(self, sock: socket.socket, packet: bytes) -> int:
        """Protect and send one RTP packet to the audio port; its wire size, or 0."""
        srtp_session = self._relay._srtp
        if srtp_session is not None:
            try:
                packet = srtp_session.protect(packet)
            except pylibsrtp.Error:
                self.errors["srtp"] += 1
                return 0
        assert self.target is not None
        for attempt in range(2):
            try:
                sock.sendto(packet, self.target)
                return len(packet)
            except BlockingIOError:
                self.errors["dropped_full"] += 1
                return 0
            except OSError as exc:
                if exc.errno not in _REFUSED or attempt:
                    self.errors["send"] += 1
                    return 0
                # An earlier ICMP error reported now (whose? the error queue says: the video's
                # must not cost the audio a packet); this packet was not sent.
                before = self.state
                self._relay._drain_errors(sock)
                if self.state != before:  # it was the audio port's: paused now
                    return 0
        return 0

    def send_report(self, now: float) -> None:
        """A sender report + SDES CNAME to the audio RTCP port (SRTCP with SRTP)."""
        sock, target = self._relay._sock, self.rtcp_target
        if sock is None or target is None:
            return
        packet, ntp = self.reports.report(now)
        srtp_session = self._relay._srtp
        if srtp_session is not None:
            packet = srtp_session.protect_rtcp(packet)
        try:
            sock.sendto(packet, target)
        except BlockingIOError:
            self.errors["dropped_full"] += 1
            return
        except OSError as exc:
            if exc.errno in _REFUSED:
                self._relay._drain_errors(sock)
            else:
                self.errors["send"] += 1
            return
        self.reports.sent_report(ntp, now)
        self.sender_reports += 1

    # -- the audio port refuses ----------------------------------------------------------------

    def refused(self, why: str) -> None:
        """An ICMP error about the audio port: pause the audio (the ring let go), probe."""
        self.errors["unreachable"] += 1
        self._rtcp_refusals = 0
        self._refused_at = time.monotonic()
        if self.state != "sending":
            return
        self.state = "unreachable"
        self.outages += 1
        self._release()
        self._task = asyncio.get_running_loop().create_task(self._probe_loop())
        assert self.target is not None
        # Once at WARNING (a mountpoint without audio, a wrong audio_port; or the server is
        # down, which the video's warning says too), later outages at INFO.
        level = logging.INFO if self._refusal_logged else logging.WARNING
        self._refusal_logged = True
        logger.log(level, "relay %s: audio port %s:%d is not accepting (%s); audio paused, "
                   "video goes on, retrying every %.0f s (is it the mountpoint's audioport?)",
                   self._relay.name, *self.target, why, RETRY_S)

    def rtcp_refused(self) -> None:
        """The audio RTCP port refused a sender report: the sound goes on; said once."""
        self.errors["rtcp_unreachable"] += 1
        self._rtcp_refusals += 1
        if (not self._rtcp_refusal_logged and self.state == "sending"
                and self._rtcp_refusals >= RTCP_REFUSALS_TO_WARN):
            self._rtcp_refusal_logged = True
            assert self.rtcp_target is not None
            logger.warning("relay %s: audio RTCP port %s:%d is not accepting sender reports "
                           "(audio continues; is it the mountpoint's audiortcpport?)",
                           self._relay.name, *self.rtcp_target)

    def _probe_packet(self) -> bytes:
        """An Opus packet of 20 ms of nothing (DTX: a TOC byte, no frame data; a decoder
        conceals it), 20 ms of RTP time after the last. Not a padding-only packet: Janus
        forwards a probe to its viewers, and an empty payload fed to FFmpeg's Opus decoder
        (aiortc's) ends its stream (the video's probe is an AUD for the same reason)."""
        timestamp = self._timeline.next_empty()
        header = _HEADER.pack(0x80, self.payload_type, self._seq, timestamp, self.ssrc)
        self._seq = (self._seq + 1) & 0xFFFF
        return header + OPUS_DTX

    async def _probe_loop(self) -> None:
        """While refused: a probe (:meth:`_probe_packet`) once per :data:`RETRY_S`; the audio
        resumes when one has had :data:`RESUME_AFTER_S` without an ICMP error."""
        while self.state == "unreachable":
            await asyncio.sleep(RETRY_S)
            sock = self._relay._sock
            if sock is None or self.state != "unreachable":
                return
            probe_at = time.monotonic()
            if not self._sendto(sock, self._probe_packet()):
                continue
            await asyncio.sleep(RESUME_AFTER_S)
            if self.state == "unreachable" and self._refused_at < probe_at:
                assert self.target is not None
                logger.info("relay %s: audio port %s:%d accepts again; audio resumes",
                            self._relay.name, *self.target)
                self._start_sending()
                return

    def stats(self) -> dict[str, Any]:
        """The audio's figures (counted apart from the video's)."""
        return {
            "state": self.state,
            "codec": "opus",
            "port": self.target[1] if self.target else self._relay.config.audio_port,
            "rtcp_port": self._relay.config.audio_rtcp_target_port,
            "ssrc": self.ssrc,
            "payload_type": self.payload_type,
            "reading": self.reading,
            "packets_read": self.packets_read,
            "packets_sent": self.packets_sent,
            "bytes_sent": self.bytes_sent,
            "payload_bytes_sent": self.payload_bytes_sent,
            "sender_reports": self.sender_reports,
            "receiver_reports": self.receiver_reports,
            "outages": self.outages,
            "errors": dict(self.errors),
        }
