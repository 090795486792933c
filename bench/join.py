"""Join benchmark: how soon a viewer joining mid-GOP sees the picture, and sees it *move*.

Issue 19, goal 3: "motion within 200 ms of joining, even when the source cannot make a keyframe
on demand". The source is the file source replaying the fan-out bench's recording (720p30,
2 Mbit/s, Constrained Baseline, an IDR every 2 s; ``bench/fanout.py``), which cannot make a
keyframe on demand. Three servers run it side by side, in their own processes:

- ``naive``: the tutorial way, a new ``RTCPeerConnection`` per viewer relaying the live track
  (the viewer gets frames from the moment it joins: P-frames it cannot decode until the next IDR);
- ``aiortc``: the engine with ``webrtc.send_path = "aiortc"`` (the newest IDR at once, then a
  still picture until the next IDR: "keyframe-then-live");
- ``fanout``: the engine's default send path (the GOP so far as a paced catch-up burst,
  "catch-up-gop").

One client process joins real aiortc viewers (ICE, DTLS, SRTP, PyAV's H.264 decoder) one at a
time, interleaving the servers, each join at a chosen point of the GOP (stratified random over
the 60 frames, the same points for every server). Per viewer, all on the client's clock from
just before the POST: the answer, ICE+DTLS connected, the first decoded frame, the first *moving*
frame (the first decoded frame whose picture differs from the first one), frames decoded in the
first second, decode errors (aiortc's decoder warnings) and PLIs sent; when the first media
packet came and when the last packet of the join burst did (the leading frames whose RTP
timestamps are squeezed together), and from the server, when it had sent the burst. Everything
stays on 127.0.0.1.

Reading the figures: aiortc's receiver hands a frame to the decoder only when a packet of the
*next* frame arrives, so an aiortc viewer's "first frame" on the ``aiortc`` path (a lone IDR, the
next frame one GOP away) is as late as its first moving frame; Chromium shows that IDR at once
(see ``chromium``). The moving-frame figure is not affected that way. An aiortc viewer receives
a large burst slower than the server sends it (Python's per-packet receive path, and its small
socket buffer overflows on loopback: some NACK/RTX), which does not delay the first two frames.

    .venv/bin/python bench/join.py                    # 12 joins per server
    .venv/bin/python bench/join.py --joins 30 --modes aiortc fanout
    .venv/bin/python bench/join.py --source rpicam    # the fake rpicam-vid (restarts for IDRs)
    sudo .venv/bin/python bench/join.py chromium      # Chromium at 720p (see chromium_main)
    sudo .venv/bin/python bench/join.py chromium --paths fanout fanout:8192 fanout:1048576
    sudo .venv/bin/python bench/join.py chromium --paths fanout fanout:squeeze

``chromium`` measures what Chromium shows joining the same stream through the device page
(``ruseon serve --source file:``, one server per send path, joins interleaved), inside a private
network namespace (tests/e2e/browser_netns.py): getStats sampled every 10 ms from the page itself
(Chromium may cache a report for ~50 ms), requestVideoFrameCallback for the frames actually
presented, and the server's session times on the page's clock (same machine), which split the
handshake (POST -> the server's ICE+DTLS up) from what the join burst controls (server connected
-> first picture -> first moving picture). Run it at the normal priority: under ``nice`` on a
busy machine the server and Chromium are starved and stall for hundreds of ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aioice.ice

# Loopback only (aioice skips 127.0.0.1 when gathering).
aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]  # type: ignore[assignment]

import av  # noqa: E402
from aiohttp import ClientSession, web  # noqa: E402
from aiortc import (  # noqa: E402
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError  # noqa: E402
from aiortc.rtcrtpreceiver import RTCRtpReceiver  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fanout import BITRATE, FPS, GOP, free_port, recorded_stream  # noqa: E402
from whep_endpoint import serve_until_cancelled  # noqa: E402

from ruseon_appliance.capture.pipeline import CapturePipeline  # noqa: E402
from ruseon_appliance.capture.ring import RingBuffer  # noqa: E402
from ruseon_appliance.config import CameraConfig, HostPort, WebRtcConfig  # noqa: E402
from ruseon_appliance.engine import Engine, OfferError  # noqa: E402
from ruseon_appliance.engine.codec_registry import CodecRegistry  # noqa: E402
from ruseon_appliance.engine.track import TIME_BASE  # noqa: E402

MODES = ("naive", "aiortc", "fanout")
# How long a viewer is watched: at least this long after the POST, and until it has seen motion
# (or LONGEST_S passes: a naive viewer waits for the next IDR, up to a GOP).
WATCH_S = 1.2
LONGEST_S = 5.0
GOAL_MS = 200.0


# --- servers ---------------------------------------------------------------------------------


class LiveTrack(MediaStreamTrack):  # type: ignore[misc]
    """The naive relay: this viewer's frames from the moment it joined, as ``av.Packet``."""

    kind = "video"

    def __init__(self, ring: RingBuffer) -> None:
        super().__init__()
        self._reader = ring.reader("next")

    async def recv(self) -> av.Packet:  # type: ignore[override]
        if self.readyState != "live":
            raise MediaStreamError
        try:
            view = await self._reader.next()
        except EOFError:
            raise MediaStreamError from None
        packet = av.Packet(bytes(view.data))
        packet.pts = packet.dts = view.pts
        packet.time_base = TIME_BASE
        return packet

    def stop(self) -> None:
        super().stop()
        self._reader.close()


def time_join_bursts() -> dict[int, dict[str, float]]:
    """Note, per fan-out viewer, when its first frames went out and when the last slice of its
    join burst did (server clock, ms after the first), and how late the pacing timer fired."""
    from ruseon_appliance.engine.fanout import FanoutViewer
    from ruseon_appliance.stream.pacing import JOIN_PACE_S

    timings: dict[int, dict[str, float]] = {}
    original = FanoutViewer.service

    def service(self: FanoutViewer, now: float) -> None:
        was_out = self.frames_sent >= self.pacer.burst_frames and self._current is None
        original(self, now)
        t = time.monotonic()
        mine = timings.setdefault(id(self), {"start": t, "last": t, "late_ms_max": 0.0})
        if mine.get("burst_out_ms") is None and not was_out and self.frames_sent:
            late = (t - mine["last"] - JOIN_PACE_S) * 1000
            mine["late_ms_max"] = max(mine["late_ms_max"], late)
            mine["last"] = t
            if self.frames_sent >= self.pacer.burst_frames and self._current is None:
                mine["burst_out_ms"] = (t - mine["start"]) * 1000

    FanoutViewer.service = service  # type: ignore[method-assign]
    return timings


async def serve(mode: str, port: int, source: str) -> None:
    rpicam_command = ""
    if source == "rpicam":
        # tests/capture/fake_rpicam_vid.py stands in for the camera (FAKE_RPICAM_STREAM: the
        # recording); like rpicam-vid it starts every run with an IDR.
        os.environ["FAKE_RPICAM_STREAM"] = str(recorded_stream())
        rpicam_command = f"{sys.executable} {ROOT / 'tests' / 'capture' / 'fake_rpicam_vid.py'}"
    camera = CameraConfig(source=source, width=1280, height=720, framerate=FPS, bitrate=BITRATE,
                          keyframe_interval=GOP, rpicam_command=rpicam_command)
    feed = CapturePipeline(camera)
    await feed.start()
    await feed.wait_first_frame(10)
    engine: Engine | None = None
    peers: dict[str, RTCPeerConnection] = {}
    bursts = time_join_bursts() if mode == "fanout" else {}
    registry = CodecRegistry()
    if mode == "naive":
        registry.install()
    else:
        engine = Engine(WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",),
                                     send_path=mode), Path(tempfile.mkdtemp()), feed)
        await engine.start()

    async def post(request: web.Request) -> web.Response:
        offer = await request.text()
        if engine is not None:
            try:
                session, answer = await engine.offer(offer)
            except OfferError as exc:
                return web.Response(status=400, text=exc.reason)
            return web.Response(status=201, text=answer, content_type="application/sdp",
                                headers={"Location": f"/whep/{session.id}"})
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        transceiver = pc.addTransceiver(LiveTrack(feed.ring), direction="sendonly")
        assert feed.stream_info is not None
        transceiver.setCodecPreferences(registry.select(feed.stream_info.profile_level_id))
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        sid = os.urandom(8).hex()
        peers[sid] = pc
        return web.Response(status=201, text=pc.localDescription.sdp,
                            content_type="application/sdp", headers={"Location": f"/whep/{sid}"})

    async def delete(request: web.Request) -> web.Response:
        """Close the session; answer with what the server knows of it."""
        sid = request.match_info["sid"]
        stats: dict[str, Any] = {}
        if engine is not None:
            session = engine.sessions.get(sid)
            if session is not None:
                stats = {k: v for k, v in session.stats().items()
                         if k in ("join_mode", "frames_sent", "keyframes_sent", "frames_skipped",
                                  "keyframe_skips", "keyframes_requested", "join_slices",
                                  "bytes_sent", "nacked", "retransmitted")}
                source_stats = feed.source.stats()
                if "keyframe_restarts" in source_stats:
                    stats["source_restarts"] = source_stats["keyframe_restarts"]
                timing = bursts.pop(id(session.track), {})
                if timing.get("burst_out_ms") is not None:
                    stats["server_burst_out_ms"] = round(timing["burst_out_ms"], 1)
                    stats["server_pace_late_ms_max"] = round(timing["late_ms_max"], 1)
            await engine.close(sid)
        elif sid in peers:
            await peers.pop(sid).close()
        return web.json_response(stats)

    async def phase(request: web.Request) -> web.Response:
        """Frames since the newest IDR: where in the GOP a viewer joining now joins."""
        ring = feed.ring
        k = ring.newest_keyframe_seq
        return web.json_response({"age_frames": None if k is None else ring.newest_seq - k})

    async def cleanup() -> None:
        for pc in peers.values():
            await pc.close()
        if engine is not None:
            await engine.stop()
        await feed.stop()

    await serve_until_cancelled(
        [("POST", "/whep", post), ("DELETE", "/whep/{sid}", delete), ("GET", "/phase", phase)],
        port, cleanup)


class Server:
    """A server subprocess (``serve --mode MODE``)."""

    def __init__(self, mode: str, source: str) -> None:
        self.mode = mode
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve", "--mode", mode, "--port", str(self.port),
             "--source", source], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {mode} server did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


# --- the client ------------------------------------------------------------------------------


class DecodeErrors(logging.Handler):
    """Counts aiortc's "failed to decode" warnings (its decoder thread logs them)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "failed to decode" in record.getMessage():
            self.count += 1


_plis: dict[int, int] = {}
_original_send_pli = RTCRtpReceiver._send_rtcp_pli


async def _counting_send_pli(self: RTCRtpReceiver, media_ssrc: int) -> None:
    _plis[id(self)] = _plis.get(id(self), 0) + 1
    await _original_send_pli(self, media_ssrc)


RTCRtpReceiver._send_rtcp_pli = _counting_send_pli  # type: ignore[method-assign]

# Media packets as they reach each receiver: (perf_counter, RTP timestamp, payload bytes).
_arrivals: dict[int, list[tuple[float, int, int]]] = {}
_original_handle_rtp = RTCRtpReceiver._handle_rtp_packet


async def _noting_handle_rtp(self: RTCRtpReceiver, packet: Any, arrival_time_ms: int) -> None:
    if packet.payload:  # not the leading padding packet
        _arrivals.setdefault(id(self), []).append(
            (time.perf_counter(), packet.timestamp, len(packet.payload)))
    await _original_handle_rtp(self, packet, arrival_time_ms)


RTCRtpReceiver._handle_rtp_packet = _noting_handle_rtp  # type: ignore[method-assign]


def burst_figures(arrivals: list[tuple[float, int, int]], t0: float) -> dict[str, Any]:
    """When the first packet came, and the join burst: the leading frames whose RTP timestamps
    are squeezed (under 1 ms of stream time apart), its size and when its last packet came."""
    if not arrivals:
        return {"first_packet_ms": None, "burst_frames": 0, "burst_bytes": 0,
                "burst_end_ms": None}
    frames = 1
    size = 0
    end = arrivals[0][0]
    last_ts = arrivals[0][1]
    for at, ts, length in arrivals:
        step = (ts - last_ts) & 0xFFFFFFFF
        if step >= 90:  # a live frame: the burst is over
            break
        frames += step > 0
        size += length
        end = at
        last_ts = ts
    return {"first_packet_ms": round((arrivals[0][0] - t0) * 1000, 1), "burst_frames": frames,
            "burst_bytes": size, "burst_end_ms": round((end - t0) * 1000, 1)}


def picture_digest(frame: av.VideoFrame) -> bytes:
    """A digest of the luma plane: equal digests, same picture."""
    return hashlib.blake2b(bytes(frame.planes[0]), digest_size=16).digest()


async def one_join(http: ClientSession, url: str, errors: DecodeErrors) -> dict[str, Any]:
    """Join, watch until motion (at least :data:`WATCH_S`), leave; the figures in ms."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    transceiver = pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    loop = asyncio.get_running_loop()
    connected: asyncio.Future[float] = loop.create_future()
    frames: list[tuple[float, bytes]] = []  # (ms since POST, picture digest)
    moving = asyncio.Event()

    def on_state() -> None:
        if pc.connectionState == "connected" and not connected.done():
            connected.set_result(time.perf_counter())

    async def consume(track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            frames.append(((time.perf_counter() - t0) * 1000, picture_digest(frame)))
            if frames[-1][1] != frames[0][1]:
                moving.set()

    tasks: list[asyncio.Task[None]] = []
    pc.on("connectionstatechange", on_state)
    pc.on("track", lambda track: tasks.append(asyncio.ensure_future(consume(track))))
    errors_before = errors.count
    t0 = time.perf_counter()
    async with http.post(url + "/whep", data=pc.localDescription.sdp,
                         headers={"Content-Type": "application/sdp"}) as resp:
        answer = await resp.text()
        if resp.status != 201:
            raise RuntimeError(f"offer refused: {resp.status} {answer}")
        location = resp.headers["Location"]
    t_answer = time.perf_counter()
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    t_connected = await asyncio.wait_for(connected, 30)
    remaining = LONGEST_S - (time.perf_counter() - t0)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(moving.wait(), max(0.0, remaining))
    remaining = WATCH_S - (time.perf_counter() - t0)
    if remaining > 0:
        await asyncio.sleep(remaining)
    async with http.delete(url + location) as resp:
        server_side = await resp.json()
    plis = _plis.pop(id(transceiver.receiver), 0)
    arrivals = _arrivals.pop(id(transceiver.receiver), [])
    await pc.close()
    for task in tasks:
        task.cancel()
    first = frames[0][0] if frames else None
    moved = next((ms for ms, digest in frames if digest != frames[0][1]), None)
    return {
        "answer_ms": round((t_answer - t0) * 1000, 1),
        "connected_ms": round((t_connected - t0) * 1000, 1),
        "first_frame_ms": None if first is None else round(first, 1),
        "moving_ms": None if moved is None else round(moved, 1),
        "second_frame_ms": round(frames[1][0], 1) if len(frames) > 1 else None,
        "frames_first_second": sum(ms <= 1000 for ms, _ in frames),
        "decode_errors": errors.count - errors_before,
        "plis": plis,
        **burst_figures(arrivals, t0),
        **server_side,
    }


async def wait_for_phase(http: ClientSession, url: str, target: int) -> int:
    """Poll the server until its newest IDR is ``target`` frames old; return the age seen."""
    deadline = time.monotonic() + 10
    while True:
        async with http.get(url + "/phase") as resp:
            age = (await resp.json())["age_frames"]
        if age == target or time.monotonic() > deadline:
            return int(age)
        await asyncio.sleep(0.004)


async def client(urls: dict[str, str], joins: int, seed: int) -> None:
    errors = DecodeErrors()
    logging.getLogger("aiortc.rtcrtpreceiver").addHandler(errors)
    rng = random.Random(seed)
    # Stratified: one join point in each of `joins` equal parts of the GOP, in random order.
    points = [min(GOP - 1, int((i + rng.random()) * GOP / joins)) for i in range(joins)]
    rng.shuffle(points)
    modes = list(urls)
    async with ClientSession() as http:
        for i, target in enumerate(points):
            order = modes[i % len(modes):] + modes[:i % len(modes)]  # rotate who goes first
            for mode in order:
                age = await wait_for_phase(http, urls[mode], target)
                row = await one_join(http, urls[mode], errors)
                print(json.dumps({"mode": mode, "join_age_frames": age, **row}), flush=True)
                await asyncio.sleep(0.2)  # let the previous viewer's teardown settle


# --- Chromium --------------------------------------------------------------------------------

# Injected before the device page's own scripts: note when the page POSTs its offer, then sample
# the video receiver's getStats() every 10 ms (Chromium may serve a cached report for up to
# ~50 ms) and every frame the <video> presents (requestVideoFrameCallback: rtpTimestamp tells a
# new picture from a repeated one). Times in ms after the POST, on the page's clock.
CHROMIUM_PROBE_JS = """(() => {
  const J = window.__join = {post: null, samples: [], presented: [], stop: false, pc: null};
  const Original = window.RTCPeerConnection;
  const Wrapped = function (...args) {
    const pc = new Original(...args);
    J.pc = pc;
    pc.addEventListener('iceconnectionstatechange', () => {
      if (pc.iceConnectionState === 'connected' && J.ice === undefined) {
        J.ice = performance.now() - J.post;
      }
    });
    // Local candidate gathering and the answer being applied, on the same clock.
    pc.addEventListener('icecandidate', (e) => {
      if (e.candidate && J.candidate === undefined) J.candidate = performance.now() - J.post;
    });
    pc.addEventListener('icegatheringstatechange', () => {
      if (pc.iceGatheringState === 'complete') J.gathered = performance.now() - J.post;
    });
    const srd = pc.setRemoteDescription.bind(pc);
    pc.setRemoteDescription = (d) => {
      J.srd_called = performance.now() - J.post;
      return srd(d).then((r) => { J.srd_done = performance.now() - J.post; return r; });
    };
    pc.addEventListener('connectionstatechange', () => {
      if (pc.connectionState === 'connected' && J.connected === undefined) {
        J.connected = performance.now() - J.post;
      }
    });
    return pc;
  };
  Wrapped.prototype = Original.prototype;
  Wrapped.generateCertificate = Original.generateCertificate;
  window.RTCPeerConnection = Wrapped;
  const originalFetch = window.fetch;
  window.fetch = function (url, options) {
    if (J.post === null && options && options.method === 'POST' && String(url).includes('/whep')) {
      J.post = performance.now();
      poll();
      watchVideo();
      return originalFetch.apply(this, arguments).then((response) => {
        J.answered = performance.now() - J.post;
        return response;
      });
    }
    return originalFetch.apply(this, arguments);
  };
  async function poll() {
    while (!J.stop) {
      if (J.pc) {
        try {
          const report = await J.pc.getStats();
          report.forEach((s) => {
            if (s.type !== 'inbound-rtp' || s.kind !== 'video') return;
            J.samples.push({t: performance.now() - J.post, decoded: s.framesDecoded || 0,
              received: s.framesReceived || 0, keyframes: s.keyFramesDecoded || 0,
              freezes: s.freezeCount || 0, freeze_s: s.totalFreezesDuration || 0,
              plis: s.pliCount || 0, firs: s.firCount || 0, dropped: s.framesDropped || 0,
              nacks: s.nackCount || 0, lost: s.packetsLost || 0,
              packets: s.packetsReceived || 0, bytes: s.bytesReceived || 0,
              jb_delay_s: s.jitterBufferDelay || 0, jb_emitted: s.jitterBufferEmittedCount || 0,
              jb_target_s: s.jitterBufferTargetDelay || 0,
              decode_s: s.totalDecodeTime || 0, decoder: s.decoderImplementation || null,
              width: s.frameWidth || 0, stats_ts: s.timestamp});
          });
        } catch (e) { /* closed */ }
      }
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }
  function watchVideo() {
    const video = document.getElementById('video');
    if (!video) { setTimeout(watchVideo, 5); return; }
    const onFrame = (now, meta) => {
      J.presented.push({t: now - J.post, n: meta.presentedFrames, rtp: meta.rtpTimestamp,
                        received: meta.receiveTime ? meta.receiveTime - J.post : null,
                        decode_ms: meta.processingDuration ? meta.processingDuration * 1000
                                                           : null});
      if (!J.stop) video.requestVideoFrameCallback(onFrame);
    };
    video.requestVideoFrameCallback(onFrame);
  }
})();"""


def first_at(samples: list[dict[str, Any]], key: str, n: int) -> float | None:
    """ms after the POST of the first sample with ``samples[key] >= n``."""
    return next((round(s["t"], 1) for s in samples if s[key] >= n), None)


def late_jitter_buffer(samples: list[dict[str, Any]], after_ms: float) -> dict[str, Any]:
    """Mean jitter-buffer delay and target delay of the frames emitted from ``after_ms``
    after the POST to the last sample."""
    start = next((s for s in samples if s["t"] >= after_ms), None)
    end = samples[-1]
    if start is None or end["jb_emitted"] <= start["jb_emitted"]:
        return {"late_jitter_buffer_ms": None, "late_jitter_target_ms": None}
    emitted = end["jb_emitted"] - start["jb_emitted"]
    return {
        "late_jitter_buffer_ms": round(1000 * (end["jb_delay_s"] - start["jb_delay_s"])
                                       / emitted, 1),
        "late_jitter_target_ms": round(1000 * (end["jb_target_s"] - start["jb_target_s"])
                                       / emitted, 1),
    }


def answer_seconds_total(server: Any) -> float:
    """The server's ``ruseon_whep_answer_seconds_sum`` (POST received -> answer sent)."""
    with urllib.request.urlopen(server.url + "metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("ruseon_whep_answer_seconds_sum"):
                return float(line.split()[-1])
    return 0.0


def server_trace(trace: Path | None, offset: int, post_wall_ms: float
                 ) -> tuple[int, dict[str, Any]]:
    """The newest session's handshake events from the server's trace (see PACE_HOOK), in ms
    after the page's POST: ``stun_rx`` (the first check; ``stun_use``: the first carrying
    USE-CANDIDATE), ``check_in_progress``/``check_succeeded`` (our own check), ``ice_done``,
    ``dtls_start``, ``dtls_rx``/``dtls_tx`` (#n: the nth record datagram), ``dtls_up`` and
    ``rtp_tx`` (the first RTP packet out). Returns the new file offset too."""
    if trace is None or not trace.exists():
        return offset, {}
    with trace.open() as f:
        f.seek(offset)
        text = f.read()
        offset = f.tell()
    by_ufrag: dict[str, list[dict[str, Any]]] = {}
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            by_ufrag.setdefault(event["u"], []).append(event)
    started = [(e["t"], u) for u, es in by_ufrag.items() for e in es if e["e"] == "ice_connect"]
    if not started:
        return offset, {}
    events = by_ufrag[max(started)[1]]
    out: dict[str, Any] = {}
    # The server's event-loop stalls from the session's first event to its first RTP packet.
    span = [e["t"] for e in events]
    out["lags"] = [[round(e["t"] * 1000 - post_wall_ms, 1), e["wall"], e["cpu"]]
                   for e in by_ufrag.get("*", []) if min(span) <= e["t"] <= max(span) + 0.05]
    for e in events:
        name = e["e"] if e["n"] == 1 else f"{e['e']}#{e['n']}"
        out[name] = round(e["t"] * 1000 - post_wall_ms, 1)
        if e["e"] == "stun_rx" and e.get("use") and "stun_use" not in out:
            out["stun_use"] = out[name]
        if e["e"] == "dtls_start":
            out["dtls_role_server"] = float(e.get("role") == "server")
        if e["e"] in ("dtls_rx", "dtls_tx"):
            out.setdefault("dtls_log", []).append(
                [e["e"][-2:], out[name], e.get("size"), e.get("r")])
    return offset, out


def chromium_join(browser: Any, server: Any, watch_s: float, trace: Path | None = None,
                  trace_offset: int = 0) -> dict[str, Any]:
    """One page joining: what getStats and the presented frames show."""
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.add_init_script(CHROMIUM_PROBE_JS)
    answer_before = answer_seconds_total(server)
    age_s = server.status()["source"]["keyframe_age_s"]
    page.goto(server.url)
    page.wait_for_function(
        f"window.__join.post !== null && window.__join.samples.length > 0 && "
        f"window.__join.samples[window.__join.samples.length - 1].t > {watch_s * 1000}",
        timeout=60_000)
    sessions = server.status()["viewers"]["sessions"]
    data = page.evaluate("(() => { window.__join.stop = true; const j = window.__join; "
                         "return {post: j.post, post_wall: performance.timeOrigin + j.post, "
                         "connected: j.connected, answered: j.answered, "
                         "candidate: j.candidate, gathered: j.gathered, "
                         "srd_called: j.srd_called, srd_done: j.srd_done, "
                         "ice: j.ice, samples: j.samples, "
                         "presented: j.presented}; })()")
    page.close()
    server_answer_ms = (answer_seconds_total(server) - answer_before) * 1000
    session = max(sessions, key=lambda s: s["stats"].get("created") or 0)["stats"]
    created, connected_at = session.get("created"), session.get("connected_at")
    samples, presented = data["samples"], data["presented"]
    last = samples[-1]
    within = [s for s in samples if s["t"] <= 1000]
    one_s = within[-1] if within else last
    first = next((p for p in presented), None)
    moving = next((p for p in presented if first is not None and p["rtp"] != first["rtp"]), None)
    burst = session.get("frames_sent", 0)
    trace_offset, events = server_trace(trace, trace_offset, data["post_wall"])
    return {
        "trace_offset": trace_offset,
        "server_events": events,
        "join_mode": session.get("join_mode"),
        # The newest IDR's age when the page was opened, plus the time the page took to POST.
        "join_age_s": None if age_s is None
        else round((age_s + data["post"] / 1000) % (GOP / FPS), 2),
        "post_after_open_ms": round(data["post"], 1),
        "connected_ms": None if data.get("connected") is None else round(data["connected"], 1),
        "answered_ms": None if data.get("answered") is None else round(data["answered"], 1),
        # The page's first local candidate and gathering complete (negative: before the
        # POST), setRemoteDescription(answer) called and resolved.
        **{f"{k}_ms": None if data.get(k) is None else round(data[k], 1)
           for k in ("candidate", "gathered", "srd_called", "srd_done")},
        "server_answer_ms": round(server_answer_ms, 1),
        "server_handshake_ms": None if not created or not connected_at
        else round((connected_at - created) * 1000, 1),
        # The server's clock (time.time) against the page's (timeOrigin + now), same machine:
        # when the POST reached the session, and when the server's ICE+DTLS was up.
        "server_created_ms": None if not created else round(created * 1000 - data["post_wall"], 1),
        "server_connected_ms": None if not connected_at
        else round(connected_at * 1000 - data["post_wall"], 1),
        "ice_connected_ms": None if data.get("ice") is None else round(data["ice"], 1),
        "first_packet_ms": first_at(samples, "packets", 1),
        "first_decoded_ms": first_at(samples, "decoded", 1),
        "tenth_decoded_ms": first_at(samples, "decoded", 10),
        "thirtieth_decoded_ms": first_at(samples, "decoded", 30),
        "first_presented_ms": None if first is None else round(first["t"], 1),
        "moving_presented_ms": None if moving is None else round(moving["t"], 1),
        # From the page's navigation start (what a user opening the page waits).
        "moving_after_open_ms": None if moving is None else round(moving["t"] + data["post"], 1),
        "motion_after_connected_ms": None if moving is None or data.get("connected") is None
        else round(moving["t"] - data["connected"], 1),
        "presented_first_second": len({p["rtp"] for p in presented if p["t"] <= 1000}),
        "decoded_first_second": one_s["decoded"],
        "frames_sent_by_server": burst,
        **{f"server_{k}": session.get(k) for k in ("keyframe_skips", "frames_skipped",
                                                   "retransmitted", "send_dropped_full",
                                                   "send_errors")},
        "freezes": last["freezes"], "freeze_s": round(last["freeze_s"], 3),
        "plis": last["plis"], "firs": last["firs"], "dropped": last["dropped"],
        "nacks": last["nacks"], "lost": last["lost"],
        "received_minus_decoded": last["received"] - last["decoded"],
        "decode_ms_per_frame": round(1000 * last["decode_s"] / last["decoded"], 2)
        if last["decoded"] else None,
        "mean_jitter_buffer_ms": round(1000 * last["jb_delay_s"] / last["jb_emitted"], 1)
        if last["jb_emitted"] else None,
        # The live frames after the burst: how long they waited in the jitter buffer (mean, and
        # the target delay Chromium aimed for), from 1 s after the POST to the end.
        **late_jitter_buffer(samples, 1000.0),
        "decoder": last["decoder"], "width": last["width"],
        "samples": len(samples),
        # (ms, frames received, decoded, packets, freezes) every ~50 ms of the first 1.5 s.
        "timeline": [[round(x["t"]), x["received"], x["decoded"], x["packets"], x["freezes"]]
                     for x in samples[::5] if x["t"] <= 1500],
        "presented": [[round(p["t"], 1), p["n"], p["rtp"],
                       None if p["received"] is None else round(p["received"], 1)]
                      for p in presented[:12]],
    }


# Loaded by a ``ruseon serve`` started for a ``fanout:BYTES`` path (the join burst leaves in
# slices of BYTES every JOIN_PACE_S instead of the engine's JOIN_PACE_BYTES), or for
# ``fanout:squeeze`` (the join burst's RTP timestamps squeezed into the last ticks, as before they
# followed the pacing: see stream/cursor.py).
PACE_HOOK = """import os
if os.environ.get("JOIN_BENCH_PACE_BYTES"):
    from ruseon_appliance.stream import pacing
    pacing.JOIN_PACE_BYTES = int(os.environ["JOIN_BENCH_PACE_BYTES"])
if os.environ.get("JOIN_BENCH_SQUEEZE"):
    from ruseon_appliance.stream import cursor
    original_init = cursor.ViewerCursor.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.burst_ticks_per_byte = 0.0

    cursor.ViewerCursor.__init__ = init
if os.environ.get("JOIN_BENCH_DTLS_ACTIVE"):
    # The old way: answer a browser's actpass with active (the appliance the DTLS client).
    from ruseon_appliance.engine import aiortc_internals
    aiortc_internals.answer_as_dtls_server = lambda pc: 0
if os.environ.get("JOIN_BENCH_STATIC"):
    # Another version of the device page (e.g. an older one, side by side with this one).
    from pathlib import Path

    from ruseon_appliance.web import app as _web_app
    _web_app.STATIC_DIR = Path(os.environ["JOIN_BENCH_STATIC"])
if os.environ.get("JOIN_BENCH_ICE_PACED"):
    # The old way: DTLS starts at aioice's next 20 ms check tick after ICE completed.
    from ruseon_appliance.engine import aiortc_internals
    aiortc_internals.connect_promptly = lambda connection: None
if os.environ.get("JOIN_BENCH_TRACE"):
    # The server's side of each handshake, one JSON line per event (time.time(), by local ICE
    # ufrag): STUN checks received (and USE-CANDIDATE), our checks, ICE completed, DTLS
    # started/records in and out/connected, the first RTP packet sent.
    import json
    import time

    import aioice.ice
    from aiortc import rtcdtlstransport

    from ruseon_appliance.engine import fanout as _fanout

    _trace = open(os.environ["JOIN_BENCH_TRACE"], "a", buffering=1)
    _counts = {}

    def _note(ufrag, event, limit=1, **extra):
        n = _counts[(ufrag, event)] = _counts.get((ufrag, event), 0) + 1
        if n <= limit:
            _trace.write(json.dumps({"u": ufrag, "e": event, "n": n, "t": time.time(),
                                     **extra}) + "\\n")

    # Event-loop stalls: a 5 ms timer that fired more than 15 ms late, with the CPU time the
    # process's main thread used meanwhile (about the gap: the loop was busy with our own work;
    # about zero: the process was not scheduled).
    import asyncio as _asyncio

    def _lag_probe(last=None):
        now, cpu = time.monotonic(), time.thread_time()
        if last is not None and now - last[0] > 0.020:
            _trace.write(json.dumps({"u": "*", "e": "lag", "n": 1, "t": time.time(),
                                     "wall": round((now - last[0] - 0.005) * 1000, 1),
                                     "cpu": round((cpu - last[1]) * 1000, 1)}) + "\\n")
        _asyncio.get_running_loop().call_later(0.005, _lag_probe, (now, cpu))

    _loop_new = _asyncio.new_event_loop

    def _start_probe_with(loop):
        loop.call_soon(_lag_probe)
        return loop

    _policy = _asyncio.get_event_loop_policy()
    _policy_new = _policy.new_event_loop
    _policy.new_event_loop = lambda: _start_probe_with(_policy_new())

    _C = aioice.ice.Connection
    _orig = {k: getattr(_C, k) for k in ("request_received", "check_state", "connect",
                                          "_check_list_maybe_complete", "data_received",
                                          "sendto")}

    def request_received(self, message, addr, protocol):
        _note(self.local_username, "stun_rx", limit=8,
              use=("USE-CANDIDATE" in message.attributes))
        return _orig["request_received"](self, message, addr, protocol)

    def check_state(self, pair, state):
        if state.name in ("IN_PROGRESS", "SUCCEEDED", "FAILED"):
            _note(self.local_username, "check_" + state.name.lower(), limit=4)
        return _orig["check_state"](self, pair, state)

    async def connect(self):
        _note(self.local_username, "ice_connect")
        return await _orig["connect"](self)

    def maybe_complete(self):
        done = self._check_list_done
        result = _orig["_check_list_maybe_complete"](self)
        if result and not done:
            _note(self.local_username, "ice_done")
        return result

    def _records(data):
        # (content type, handshake type or -1) of each DTLSPlaintext record in a datagram.
        out, pos = [], 0
        while pos + 13 <= len(data) and 19 < data[pos] < 26:
            length = int.from_bytes(data[pos + 11:pos + 13], "big")
            epoch = int.from_bytes(data[pos + 3:pos + 5], "big")
            out.append([data[pos], data[pos + 13] if data[pos] == 22 and epoch == 0
                        and pos + 13 < len(data) else -1])
            pos += 13 + length
        return out

    def data_received(self, data, component):
        if data and 19 < data[0] < 64:
            _note(self.local_username, "dtls_rx", limit=10, size=len(data), r=_records(data))
        return _orig["data_received"](self, data, component)

    async def sendto(self, data, component):
        if data and 19 < data[0] < 64:
            _note(self.local_username, "dtls_tx", limit=10, size=len(data), r=_records(data))
        elif data and 127 < data[0] < 192:
            _note(self.local_username, "rtp_tx")
        return await _orig["sendto"](self, data, component)

    _C.request_received = request_received
    _C.check_state = check_state
    _C.connect = connect
    _C._check_list_maybe_complete = maybe_complete
    _C.data_received = data_received
    _C.sendto = sendto

    _D = rtcdtlstransport.RTCDtlsTransport
    _dtls_start, _dtls_set_state = _D.start, _D._set_state

    def _ufrag(dtls):
        return dtls.transport._connection.local_username

    async def dtls_start(self, remote):
        _note(_ufrag(self), "dtls_start", role=self._role)
        return await _dtls_start(self, remote)

    def dtls_set_state(self, state):
        if state.name == "CONNECTED":
            _note(_ufrag(self), "dtls_up", role=self._role)
        return _dtls_set_state(self, state)

    _D.start = dtls_start
    _D._set_state = dtls_set_state
    _padding = _fanout.FanoutViewer._send_leading_padding

    def send_leading_padding(self, sock, addr, timestamp):
        _note(self._connection.local_username, "rtp_tx")
        return _padding(self, sock, addr, timestamp)

    _fanout.FanoutViewer._send_leading_padding = send_leading_padding
    _viewer_start = _fanout.FanoutViewer._start

    async def viewer_start(self, parameters):
        _note(self._connection.local_username, "send_start")
        return await _viewer_start(self, parameters)

    _fanout.FanoutViewer._start = viewer_start
"""


def chromium_summary(rows: list[dict[str, Any]], path: str) -> None:
    mine = [r for r in rows if r["send_path"] == path]
    parts = []
    for key in ("post_after_open_ms", "moving_after_open_ms",
                "server_created_ms", "server_connected_ms", "connected_ms",
                "first_presented_ms", "moving_presented_ms",
                "motion_after_connected_ms", "thirtieth_decoded_ms", "late_jitter_buffer_ms"):
        values = [r[key] for r in mine if r[key] is not None]
        if values:
            missing = len(mine) - len(values)
            parts.append(f"{key} p50 {statistics.median(values):.0f} p95 "
                         f"{percentile(values, 0.95):.0f} max {max(values):.0f}"
                         + (f" ({missing} missing)" if missing else ""))
    moved = [r["moving_presented_ms"] for r in mine if r["moving_presented_ms"] is not None]
    parts.append(f"moving within {GOAL_MS:.0f} ms of the POST: "
                 f"{sum(ms <= GOAL_MS for ms in moved)}/{len(mine)}")
    parts.append(f"freezes {sum(r['freezes'] for r in mine)}, PLIs "
                 f"{sum(r['plis'] + r['firs'] for r in mine)}, decoded in 1 s p50 "
                 f"{statistics.median(r['decoded_first_second'] for r in mine):.0f}")
    print(f"{path:6} " + "; ".join(parts))
    print(json.dumps({"figure": "join_chromium_summary", "send_path": path, "joins": len(mine),
                      "summary": parts}))


# The handshake and the first pictures, in order, in ms after the page's POST: the page's own
# events (p:) and the server's (s:, see server_trace), medians per send path.
PHASES = (("s:created", "server_created_ms"), ("p:answered", "answered_ms"),
          ("p:candidate", "candidate_ms"), ("p:gathered", "gathered_ms"),
          ("p:srd_called", "srd_called_ms"), ("p:srd_done", "srd_done_ms"),
          ("s:stun_rx", "stun_rx"), ("s:check_ok", "check_succeeded"), ("s:stun_use", "stun_use"),
          ("s:ice_done", "ice_done"), ("p:ice", "ice_connected_ms"),
          ("s:dtls_start", "dtls_start"), ("s:dtls_rx", "dtls_rx"), ("s:dtls_tx", "dtls_tx"),
          ("p:dtls_up", "connected_ms"), ("s:dtls_up", "dtls_up"), ("s:send_start", "send_start"),
          ("s:rtp_tx", "rtp_tx"),
          ("p:first_picture", "first_presented_ms"), ("p:moving", "moving_presented_ms"))


def chromium_phases(rows: list[dict[str, Any]], path: str) -> dict[str, float]:
    """Median of each phase (PHASES) over ``path``'s joins."""
    mine = [r for r in rows if r["send_path"] == path]
    out: dict[str, float] = {}
    for label, key in PHASES:
        # Row fields (server_created_ms, the page's) or the server trace's events.
        values = [v for r in mine
                  if (v := r[key] if key in r else r["server_events"].get(key)) is not None]
        if values:
            out[label] = round(statistics.median(values), 1)
    return out


def chromium_main(joins: int, watch_s: float, source: str, paths: list[str]) -> None:
    """Chromium joining ``ruseon serve --source file:`` ``joins`` times per send path, spread
    over the GOP, the paths interleaved. Re-runs itself in a private network namespace first
    (needs root)."""
    from tests.e2e.browser_netns import (
        NETNS_ENV,
        Server,
        chromium,
        inside_browser_netns,
        prepare_namespace,
    )

    if not inside_browser_netns():
        command = ["unshare", "--net", "--fork", "--", sys.executable, __file__, "chromium",
                   "--joins", str(joins), "--watch", str(watch_s), "--source", source,
                   "--paths", *paths]
        raise SystemExit(subprocess.run(command, env={**os.environ, NETNS_ENV: "1"},
                                        check=False).returncode)
    prepare_namespace()
    rows: list[dict[str, Any]] = []
    rng = random.Random(19)
    gop_s = GOP / FPS
    targets = [(i + rng.random()) * gop_s / joins for i in range(joins)]
    rng.shuffle(targets)
    with tempfile.TemporaryDirectory() as state, contextlib.ExitStack() as stack:
        servers = {}
        hook = Path(state) / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(PACE_HOOK)
        traces: dict[str, Path] = {}
        offsets: dict[str, int] = {}
        for path in paths:
            send_path, _, pace = path.partition(":")
            config = Path(state) / f"{send_path}.toml"
            config.write_text(f'[webrtc]\nsend_path = "{send_path}"\n')
            # A file name for the path (it may hold a directory: static=DIR).
            name = hashlib.sha1(path.encode()).hexdigest()[:12]
            server = Server(Path(state) / name,
                            extra_args=["--source", source, "--config", str(config)])
            saved = dict(os.environ)
            traces[path] = Path(state) / f"{name}.trace"
            offsets[path] = 0
            os.environ["JOIN_BENCH_TRACE"] = str(traces[path])
            os.environ["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
            for option in filter(None, pace.split("+")):  # experiments: see PACE_HOOK
                if option == "squeeze":
                    os.environ["JOIN_BENCH_SQUEEZE"] = "1"
                elif option == "active":
                    os.environ["JOIN_BENCH_DTLS_ACTIVE"] = "1"
                elif option == "paced":
                    os.environ["JOIN_BENCH_ICE_PACED"] = "1"
                elif option.startswith("static="):
                    os.environ["JOIN_BENCH_STATIC"] = option.removeprefix("static=")
                else:
                    os.environ["JOIN_BENCH_PACE_BYTES"] = option
            try:
                server.start()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            stack.callback(server.stop)
            servers[path] = server
        browser = stack.enter_context(chromium())
        for i, target in enumerate(targets):
            order = paths[i % len(paths):] + paths[:i % len(paths)]
            for path in order:
                server = servers[path]
                # Open the page at a spread point of the GOP (its POST follows ~0.1-0.3 s
                # later; join_age_s is taken at the POST).
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    age = server.status()["source"]["keyframe_age_s"] or 0.0
                    if abs(age - target) < 0.05:
                        break
                    time.sleep(0.01)
                row = {"send_path": path, **chromium_join(browser, server, watch_s,
                                                           traces[path], offsets[path])}
                offsets[path] = row.pop("trace_offset")
                rows.append(row)
                print(json.dumps({"figure": "join_chromium", **row}), flush=True)
                time.sleep(0.5)
    load = os.getloadavg()
    print(f"\nChromium, {joins} joins per send path, source {source}; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for row in rows:
        print(f"{row['send_path']:6} join at {row['join_age_s']} s ({row['join_mode']}): "
              f"connected {row['connected_ms']} ms, decoded #1 {row['first_decoded_ms']} / #10 "
              f"{row['tenth_decoded_ms']} / #30 {row['thirtieth_decoded_ms']} ms; presented "
              f"#1 {row['first_presented_ms']}, moving {row['moving_presented_ms']} ms; "
              f"1st s: {row['decoded_first_second']} decoded, {row['presented_first_second']} "
              f"presented; freezes {row['freezes']}, PLIs {row['plis']}, "
              f"{row['decode_ms_per_frame']} ms decode/frame, "
              f"jitter buffer {row['mean_jitter_buffer_ms']} ms (after 1 s: "
              f"{row['late_jitter_buffer_ms']} ms, target {row['late_jitter_target_ms']} ms)")
    for path in paths:
        chromium_summary(rows, path)
    print("\nPhase medians, ms after the POST (p: the page, s: the server):")
    for path in paths:
        phases = chromium_phases(rows, path)
        print(f"{path:14} " + "  ".join(f"{k} {v:.0f}" for k, v in phases.items()))
        print(json.dumps({"figure": "join_chromium_phases", "send_path": path, **phases}))
    # Side by side with the first path: moving picture p50 / p95 ratios.
    base = [r["moving_presented_ms"] for r in rows if r["send_path"] == paths[0]
            and r["moving_presented_ms"] is not None]
    for path in paths[1:]:
        other = [r["moving_presented_ms"] for r in rows if r["send_path"] == path
                 and r["moving_presented_ms"] is not None]
        if base and other:
            p50 = statistics.median(other) / statistics.median(base)
            p95 = percentile(other, 0.95) / percentile(base, 0.95)
            print(f"moving picture {path} / {paths[0]}: p50 {p50:.2f}x, p95 {p95:.2f}x")
            print(json.dumps({"figure": "join_chromium_ratio", "send_path": path,
                              "against": paths[0], "moving_p50_ratio": round(p50, 2),
                              "moving_p95_ratio": round(p95, 2)}))


# --- orchestration ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    mine = [r for r in rows if r["mode"] == mode]
    out: dict[str, Any] = {"mode": mode, "joins": len(mine)}
    for key in ("connected_ms", "first_frame_ms", "moving_ms", "frames_first_second"):
        values = [r[key] for r in mine if r[key] is not None]
        out[f"{key}_missing"] = len(mine) - len(values)
        if values:
            out[f"{key}_p50"] = round(statistics.median(values), 1)
            out[f"{key}_p95"] = round(percentile(values, 0.95), 1)
            out[f"{key}_max"] = round(max(values), 1)
    moved = [r["moving_ms"] for r in mine if r["moving_ms"] is not None]
    out["moving_within_goal"] = sum(ms <= GOAL_MS for ms in moved)
    out["decode_errors"] = sum(r["decode_errors"] for r in mine)
    out["plis"] = sum(r["plis"] for r in mine)
    out["join_modes"] = sorted({str(r.get("join_mode", "-")) for r in mine})
    return out


def bench(modes: list[str], joins: int, seed: int, source: str) -> None:
    servers = {mode: Server(mode, source) for mode in modes}
    rows: list[dict[str, Any]] = []
    try:
        time.sleep(1.0)
        proc = subprocess.Popen(
            [sys.executable, __file__, "client", "--joins", str(joins), "--seed", str(seed),
             "--urls", json.dumps({m: s.url for m, s in servers.items()})],
            stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            row = json.loads(line)
            rows.append(row)
            print(f"{row['mode']:7} join at frame {row['join_age_frames']:2} of {GOP}: "
                  f"first frame {row['first_frame_ms']} ms, moving {row['moving_ms']} ms "
                  f"(connected {row['connected_ms']} ms), {row['frames_first_second']} frames "
                  f"in 1 s, {row['decode_errors']} decode errors, {row['plis']} PLIs, "
                  f"{row.get('join_mode', '')}; first packet {row['first_packet_ms']} ms, "
                  f"burst {row['burst_frames']} frames {row['burst_bytes'] // 1024} KiB in by "
                  f"{row['burst_end_ms']} ms"
                  + (f"; camera restarts so far {row['source_restarts']}"
                     if "source_restarts" in row else ""), flush=True)
            print(json.dumps({"figure": "join_viewer", **row}), flush=True)
        if proc.wait() != 0:
            raise RuntimeError("the client failed")
    finally:
        for server in servers.values():
            server.close()
    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{joins} joins per server, source {source}")
    summaries = {mode: summarize(rows, mode) for mode in modes}
    for s in summaries.values():
        print(f"{s['mode']:7} first frame p50 {s.get('first_frame_ms_p50')} / p95 "
              f"{s.get('first_frame_ms_p95')} ms; moving p50 {s.get('moving_ms_p50')} / p95 "
              f"{s.get('moving_ms_p95')} / max {s.get('moving_ms_max')} ms "
              f"({s['moving_within_goal']}/{s['joins']} within {GOAL_MS:.0f} ms, "
              f"{s['moving_ms_missing']} never); connected p50 {s.get('connected_ms_p50')} ms; "
              f"frames in 1 s p50 {s.get('frames_first_second_p50')}; decode errors "
              f"{s['decode_errors']}, PLIs {s['plis']}; {', '.join(s['join_modes'])}")
        print(json.dumps({"figure": "join", "load_average": load[0], **s}))
    ours = summaries.get("fanout")
    if ours is None:
        return
    for mode, s in summaries.items():
        if s is ours:
            continue
        for key in ("moving_ms_p50", "moving_ms_p95", "first_frame_ms_p50"):
            if key in s and key in ours and ours[key]:
                ratio = s[key] / ours[key]
                print(f"{mode}/fanout {key} ratio {ratio:.2f}x")
                print(json.dumps({"figure": "join_ratio", "against": mode, "key": key,
                                  "ratio": round(ratio, 2)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="bench",
                        choices=["bench", "serve", "client", "chromium"])
    parser.add_argument("--mode", choices=MODES, default="fanout")
    parser.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--urls", default="{}")
    parser.add_argument("--joins", type=int, default=12, help="joins per server")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--source", default="",
                        help="default: the recording (file:PATH); 'rpicam': the recording "
                        "through tests/capture/fake_rpicam_vid.py, restarted for keyframes")
    parser.add_argument("--watch", type=float, default=1.5, help="chromium: seconds per join")
    parser.add_argument("--paths", nargs="*", default=["fanout", "aiortc"],
                        help="chromium: the engine's send paths to join; fanout:BYTES = the "
                        "fan-out with join-burst slices of BYTES (default 32768); "
                        "fanout:squeeze = the burst's timestamps squeezed (the old way); "
                        "PATH:active = the appliance answers a browser's actpass as the "
                        "DTLS client, PATH:paced = DTLS starts at aioice's next 20 ms tick "
                        "after ICE (both the old way), PATH:static=DIR = the device page from "
                        "DIR; options combine: fanout:active+paced")
    args = parser.parse_args()
    source = args.source or f"file:{recorded_stream()}"
    if args.role == "serve":
        asyncio.run(serve(args.mode, args.port, source))
    elif args.role == "client":
        asyncio.run(client(json.loads(args.urls), args.joins, args.seed))
    elif args.role == "chromium":
        chromium_main(args.joins, args.watch, source, args.paths)
    else:
        bench(args.modes, args.joins, args.seed, source)


if __name__ == "__main__":
    main()
