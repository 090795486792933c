"""The fan-out send path with real aiortc viewers over real UDP on 127.0.0.1.

Every picture carries the synthetic camera's stamp (capture time, frame number), so "every frame
decoded" is checked frame by frame: every frame the camera put into the ring between two pictures
a viewer decoded must have been decoded too. (Not "consecutive numbers": on a busy machine the
camera skips the slots it fell behind on, as a real sensor drops frames, and those numbers never
exist; CI saw such skips as "gaps" under load.)
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import os
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.stamp import read_stamp
from ruseon_appliance.engine import Engine, aiortc_internals
from ruseon_appliance.engine.fanout import FanoutViewer
from ruseon_appliance.stream import fanout as fanout_module
from ruseon_appliance.stream import pacing
from ruseon_appliance.stream.cursor import ViewerCursor
from tests.datagram_loss import LOSS_HOOK, segment_udp_in_software
from tests.engine.conftest import wait_for

FRAME_US = 1_000_000 // 30


@dataclass(eq=False)
class StampedViewer:
    """A client peer that records every decoded frame's stamp and every RTP packet header."""

    pc: RTCPeerConnection
    session_id: str = ""
    answer: str = ""
    # (frame_number, capture_time_us, decode_time_us)
    frames: list[tuple[int, int, int]] = field(default_factory=list)
    unstamped: int = 0
    packets: list[tuple[int, int, int, str | None, int | None]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    async def consume(self, track: Any) -> None:
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            now_us = time.time_ns() // 1000
            stamp = read_stamp(frame)
            if stamp is None:
                self.unstamped += 1
            else:
                self.frames.append((stamp[1], stamp[0], now_us))

    def on_packet(self, packet: Any) -> None:
        self.packets.append((packet.ssrc, packet.payload_type, packet.sequence_number,
                             packet.extensions.mid, packet.extensions.abs_send_time))

    async def close(self) -> None:
        await self.pc.close()
        if self.task is not None:
            self.task.cancel()


async def offering_peer() -> RTCPeerConnection:
    """A client peer with its recvonly offer made (an engine's first offer adds its camera's
    H.264 profile to aiortc's codec list, which this process's client peers offer too: peers
    made before it offer the same shape)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc


async def connect(engine: Engine, pc: RTCPeerConnection | None = None) -> StampedViewer:
    if pc is None:
        pc = await offering_peer()
    viewer = StampedViewer(pc)

    def on_track(track: Any) -> None:
        viewer.task = asyncio.ensure_future(viewer.consume(track))

    pc.on("track", on_track)

    session, answer = await engine.offer(pc.localDescription.sdp)
    viewer.session_id, viewer.answer = session.id, answer
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    aiortc_internals.tap_received_rtp(pc, viewer.on_packet)
    return viewer


def rtx_received(viewer: StampedViewer) -> int:
    """RTX packets the client received (the answer's rtx payload type on its second SSRC): the
    client's own evidence that something was retransmitted, not the server's counter."""
    ssrcs = [int(x) for x in re.findall(r"^a=ssrc:(\d+) ", viewer.answer, re.M)]
    rtx_pt = int(re.search(r"^a=rtpmap:(\d+) rtx/90000", viewer.answer, re.M).group(1))  # type: ignore[union-attr]
    return sum(1 for p in viewer.packets if p[1] == rtx_pt and p[0] == ssrcs[1])


class CameraLog:
    """The capture time of every frame the camera put into the ring from the newest keyframe on
    (where a viewer joining now starts), read by a ring reader of its own; a decoded picture's
    stamp carries the same capture time."""

    def __init__(self, feed: CapturePipeline) -> None:
        self.reader = feed.ring.reader("keyframe")
        self.times: list[int] = []
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self.times.append((await self.reader.next()).capture_time_us)

    def close(self) -> None:
        self.task.cancel()
        self.reader.close()


@pytest.fixture
async def camera(feed: CapturePipeline) -> Any:
    log = CameraLog(feed)
    yield log
    log.close()


def gaps(viewer: StampedViewer, camera: CameraLog, start: int = 0) -> list[tuple[int, int]]:
    """Pairs of consecutive decoded frame numbers between which the camera produced a frame that
    the viewer never decoded ([] when nothing is missing)."""
    assert camera.reader.overruns == 0  # the log is complete
    decoded = [(n, c) for n, c, _ in viewer.frames[start:]]
    produced = camera.times
    # Pictures come out in order, each once, and each is a frame the camera produced (so the
    # check below can never pass because stamps and the log stopped matching).
    assert all(a[1] < b[1] for a, b in itertools.pairwise(decoded)), decoded
    known = set(produced)
    assert produced and all(c in known for _, c in decoded if c >= produced[0])
    return [(a, b) for (a, ca), (b, cb) in itertools.pairwise(decoded)
            if bisect.bisect_right(produced, ca) < bisect.bisect_left(produced, cb)]


def fanout_viewer(engine: Engine, viewer: StampedViewer) -> FanoutViewer:
    track = engine.sessions[viewer.session_id].track
    assert isinstance(track, FanoutViewer)
    return track


class DecodeErrors(logging.Handler):
    """Counts aiortc's 'failed to decode' warnings (PyAV errors the decoder swallows)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "decode" in record.getMessage().lower():
            self.count += 1


@pytest.fixture
def decode_errors() -> Any:
    handler = DecodeErrors()
    logger = logging.getLogger("aiortc.codecs.h264")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


async def test_every_frame_decodes_and_rtp_matches_the_answer(
        engine: Engine, camera: CameraLog, decode_errors: DecodeErrors) -> None:
    assert engine.stats()["send_path"] == "fanout"
    viewers = [await connect(engine) for _ in range(3)]
    try:
        await wait_for(lambda: all(len(v.frames) >= 75 for v in viewers), timeout=40)
        for v in viewers:
            session = engine.sessions[v.session_id]
            # After the join (which may skip stale frames once), nothing is missing.
            assert gaps(v, camera, start=5) == [], gaps(v, camera, start=5)[:5]
            assert v.unstamped == 0
            # The packets carry what the answer promised (what Chrome checks).
            ssrcs = [int(x) for x in re.findall(r"^a=ssrc:(\d+) ", v.answer, re.M)]
            pt = int(re.search(r"^a=rtpmap:(\d+) H264/90000", v.answer, re.M).group(1))  # type: ignore[union-attr]
            mid = re.search(r"^a=mid:(\S+)", v.answer, re.M).group(1)  # type: ignore[union-attr]
            media = [p for p in v.packets if p[1] == pt]
            assert media and {p[0] for p in media} == {ssrcs[0]}
            assert {p[3] for p in media} == {mid}
            assert all(p[4] is not None for p in media)  # abs-send-time (negotiated by aiortc)
            seqs = [p[2] for p in media]
            assert all((b - a) & 0xFFFF == 1 for a, b in itertools.pairwise(seqs))
            stats = session.stats()
            assert stats["send_path"] == "fanout"
            assert stats["packets_sent"] >= len(media) and stats["frames_sent"] >= 75
        assert decode_errors.count == 0
        # Packetized once, whatever the number of viewers.
        fanout = engine.stats()["fanout"]
        sent = sum(fanout_viewer(engine, v).packets_sent for v in viewers)
        assert fanout["packets_packetized"] < sent / 2
        # Multi-packet frames (the keyframes here) left in one UDP_SEGMENT send per viewer.
        assert fanout["gso"] == 1 and engine.fanout is not None
        assert engine.fanout.gso_refused is None
        assert fanout["gso_sends"] > 0
    finally:
        for v in viewers:
            await v.close()


async def test_sender_reports_arrive_and_rtt_appears(engine: Engine) -> None:
    v = await connect(engine)
    try:
        await wait_for(lambda: engine.sessions[v.session_id].stats()["rtt_ms"] is not None,
                       timeout=20)
        stats = engine.sessions[v.session_id].stats()
        assert stats["sender_reports"] >= 1 and stats["receiver_reports"] >= 1
        assert stats["rtt_ms"] >= 0 and stats["packets_lost"] == 0
        # The client parsed our SR: aiortc records it as remote-outbound-rtp stats.
        report = await v.pc.getTransceivers()[0].receiver.getStats()
        remote = [s for s in report.values() if s.type == "remote-outbound-rtp"]
        assert remote and remote[0].packetsSent > 0
    finally:
        await v.close()


def nft(*args: str) -> None:
    subprocess.run(["nft", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def lossy_output() -> Any:
    """A private nftables table that drops every 25th large UDP datagram from a port."""
    if shutil.which("nft") is None:
        pytest.fail("nft (nftables) is needed for the packet-loss test")
    table = "ruseon_fanout_test"

    def drop_from(port: int) -> None:
        if os.environ.get("TEST_PRIVATE_NETNS") == "1":  # never the host's links
            segment_udp_in_software()  # datagrams are dropped, not whole GSO batches
        nft("add", "table", "inet", table)
        nft("add", "chain", "inet", table, "out", LOSS_HOOK)
        nft("add", "rule", "inet", table, "out", "udp", "sport", str(port), "udp", "length",
            "gt", "400", "numgen", "inc", "mod", "25", "==", "7", "counter", "drop")

    yield drop_from
    subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)


async def test_nacked_packets_are_retransmitted_without_a_keyframe(
        engine: Engine, camera: CameraLog, lossy_output: Any, decode_errors: DecodeErrors) -> None:
    v = await connect(engine)
    try:
        await wait_for(lambda: len(v.frames) >= 20)
        await asyncio.sleep(0.7)  # past the join's keyframe requests
        session = engine.sessions[v.session_id]
        requested = session.keyframes_requested
        lossy_output(engine.udp_port)
        mark = len(v.frames)
        await wait_for(lambda: len(v.frames) >= mark + 90, timeout=40)
        viewer = fanout_viewer(engine, v)
        assert viewer.nacked > 0 and viewer.retransmitted > 0 and rtx_received(v) > 0
        assert session.stats()["nacks"] == viewer.nacked
        # Every frame arrived and decoded, and nobody asked for a keyframe to get there.
        assert gaps(v, camera, start=mark) == [], gaps(v, camera, start=mark)[:5]
        assert session.keyframes_requested == requested
        assert decode_errors.count == 0
        # Retransmissions were RTX on the answer's second SSRC.
        ssrcs = [int(x) for x in re.findall(r"^a=ssrc:(\d+) ", v.answer, re.M)]
        assert viewer.rtx_ssrc == ssrcs[1]
    finally:
        await v.close()


async def test_a_lost_first_media_packet_is_recovered_by_nack(
        engine: Engine, camera: CameraLog, decode_errors: DecodeErrors) -> None:
    """The join keyframe's first packet (its SPS/PPS) is lost on the way to a new viewer.

    A receiver cannot see the loss of a stream's very first packet; the padding packet the
    fan-out path sends in front turns it into a gap that is NACKed and retransmitted, so the
    viewer decodes its first picture without an error or a keyframe request.
    """
    if shutil.which("nft") is None:
        pytest.fail("nft (nftables) is needed for the packet-loss test")
    table = "ruseon_first_packet_test"
    # RTP with the header-extension bit (0x90) is media; the padding packet is 0xb0, RTCP 0x8x.
    nft("add", "table", "inet", table)
    nft("add", "chain", "inet", table, "out", "{ type filter hook output priority 0 ; }")
    nft("add", "rule", "inet", table, "out", "udp", "sport", str(engine.udp_port),
        "@th,64,8", "0x90", "numgen", "inc", "mod", "1000000", "==", "0", "counter", "drop")
    try:
        v = await connect(engine)
        try:
            await wait_for(lambda: len(v.frames) >= 15)
            listing = subprocess.run(["nft", "list", "table", "inet", table], check=True,
                                     capture_output=True, text=True).stdout
            assert "packets 1 " in listing, listing
            viewer = fanout_viewer(engine, v)
            assert viewer.retransmitted >= 1 and rtx_received(v) >= 1
            assert decode_errors.count == 0
            # A join on a keyframe too old to catch up from shows it, then skips the stale
            # P-frames to a fresh IDR (track.py); the machine's load decides which join it is.
            start = 1 if viewer.join_mode == "keyframe-then-live" else 0
            assert gaps(v, camera, start) == [], (viewer.join_mode, gaps(v, camera, start)[:5])
        finally:
            await v.close()
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)


class GopReplay:
    """A stand-in camera replaying a recorded 320x240 libx264 stream (GOP 30): at start it
    delivers a keyframe and ``preload`` P-frames at once, then the rest at 30 fps once
    :attr:`go` is set."""

    kind = "file"
    keyframes_on_demand = False  # as a file replay: joins get the GOP so far

    def __init__(self, preload: int) -> None:
        from ruseon_appliance.capture.h264 import AccessUnitSplitter

        data = (Path(__file__).resolve().parent.parent / "capture" / "data"
                / "cam_320x240_baseline.h264").read_bytes()
        self.units = AccessUnitSplitter().split_all(data)
        assert self.units[0][1] and not any(k for _, k in self.units[1:preload + 1])
        self.preload = preload
        self.go = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, deliver: Any) -> None:
        from ruseon_appliance.capture.access_unit import AccessUnit

        def send(i: int) -> None:
            data, key = self.units[i % len(self.units)]
            deliver(AccessUnit(data, i * 3000, key, time.time_ns() // 1000))

        for i in range(self.preload + 1):
            send(i)

        async def play() -> None:
            await self.go.wait()
            for i in itertools.count(self.preload + 1):
                await asyncio.sleep(1 / 30)
                send(i)

        self._task = asyncio.ensure_future(play())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def request_keyframe(self) -> None:
        """Recorded: the next keyframe comes when the recording has one."""

    def stats(self) -> dict[str, Any]:
        return {}


@contextlib.asynccontextmanager
async def gop_engine(tmp_path: Path, *, preload: int
                     ) -> AsyncIterator[tuple[GopReplay, CapturePipeline, Engine]]:
    """An engine fed by a :class:`GopReplay` holding ``preload`` frames after its IDR."""
    from tests.engine.conftest import camera_config, webrtc_config

    camera = GopReplay(preload=preload)
    feed = CapturePipeline(camera_config(), source=camera)
    await feed.start()
    engine = Engine(webrtc_config(), tmp_path / "state", feed)
    await engine.start()
    try:
        assert await feed.wait_first_frame(10)
        yield camera, feed, engine
    finally:
        await engine.stop()
        await feed.stop()


async def test_joining_on_the_longest_catch_up_burst_is_not_a_backlog_skip(
        tmp_path: Path, decode_errors: DecodeErrors) -> None:
    """A keyframe exactly as old as the catch-up window: the burst (keyframe + 15 frames) goes
    out at once instead of being mistaken for a viewer that cannot keep up."""
    async with gop_engine(tmp_path, preload=15) as (camera, _feed, engine):
        v = await connect(engine)
        try:
            # The viewer joins (DTLS up) while the ring still holds exactly that GOP.
            viewer = fanout_viewer(engine, v)
            await wait_for(lambda: viewer.active)
            camera.go.set()
            # The recording carries no stamp: count decoded pictures.
            await wait_for(lambda: len(v.frames) + v.unstamped >= 20, timeout=20)
            assert viewer.cursor.join_mode == "catch-up"
            assert viewer.keyframe_skips == 0 and viewer.cursor.frames_skipped == 0
            assert viewer.frames_sent >= 20
            assert decode_errors.count == 0
        finally:
            await v.close()


async def test_joining_late_in_a_gop_of_a_file_source_sends_the_gop_paced(
        tmp_path: Path, decode_errors: DecodeErrors, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19: a source that cannot make a keyframe on demand (a file replay), a viewer joining
    25 frames after its IDR (beyond the 15-frame catch-up window): instead of the keyframe and
    a still picture until the next IDR, it gets the whole GOP so far, paced, and decodes every
    picture of it before the camera delivers anything new: motion at once."""
    # Small slices, so the burst is paced over many of them even at 320x240.
    monkeypatch.setattr(pacing, "JOIN_PACE_BYTES", 2000)
    async with gop_engine(tmp_path, preload=25) as (camera, feed, engine):
        assert feed.source_kind == "file"
        v = await connect(engine)
        try:
            viewer = fanout_viewer(engine, v)
            # The camera holds still: whatever decodes now came from the join burst (all of it
            # but the last frame, which aiortc's jitter buffer releases when the next begins).
            await wait_for(lambda: len(v.frames) + v.unstamped >= 25, timeout=20)
            assert viewer.cursor.join_mode == "catch-up-gop"
            assert viewer.cursor.burst_ticks_per_byte == pacing.JOIN_TICKS_PER_BYTE
            assert viewer.frames_sent == 26 and viewer.cursor.frames_skipped == 0
            assert viewer.join_slices > 3 and viewer.keyframe_skips == 0
            camera.go.set()
            await wait_for(lambda: len(v.frames) + v.unstamped >= 60, timeout=20)
            session = engine.sessions[v.session_id]
            assert decode_errors.count == 0
            # Clean: the viewer never asked for a keyframe (no PLI/FIR), nothing was skipped.
            assert session.stats()["keyframes_requested"] == 0
            assert viewer.cursor.frames_skipped == 0 and viewer.keyframe_skips == 0
        finally:
            await v.close()


def test_join_burst_timestamps_follow_the_pacing() -> None:
    """A paced join burst is stamped at the pace it leaves (a 720p GOP takes tens of ms: frames
    arriving that much later than their squeezed timestamps froze Chromium after the burst);
    unpaced (the aiortc path, relays) it stays squeezed into the last ticks."""
    sizes = [30_000, 6_000, 9_000, 10, 12_000]
    squeezed = ViewerCursor.burst_stamps(900_000, sizes, 0.0)
    assert squeezed == [899_996, 899_997, 899_998, 899_999, 900_000]
    per_byte = pacing.JOIN_TICKS_PER_BYTE
    # 32 KiB every 5 ms: 450 ticks (5 ms at 90 kHz) per 32 KiB.
    assert per_byte == pytest.approx(450 / 32_768)
    stamps = ViewerCursor.burst_stamps(900_000, sizes, per_byte)
    assert stamps[-1] == 900_000
    assert all(b > a for a, b in itertools.pairwise(stamps))
    # Each step is the next frame's size at the pacing rate (the 10-byte frame: one tick),
    # give or take a tick of rounding.
    steps = [b - a for a, b in itertools.pairwise(stamps)]
    for step, size in zip(steps, sizes[1:], strict=True):
        assert abs(step - max(1.0, size * per_byte)) <= 1, (steps, sizes)
    # The whole burst spans its bytes at the pacing rate: about 5 ms per 32 KiB.
    assert abs((stamps[-1] - stamps[0]) - sum(sizes[1:]) * per_byte) <= 2


async def test_a_viewer_that_cannot_keep_up_skips_to_keyframes_others_unaffected(
        engine: Engine, camera: CameraLog, decode_errors: DecodeErrors) -> None:
    fast, slow = await connect(engine), await connect(engine)
    try:
        await wait_for(lambda: len(fast.frames) >= 20 and len(slow.frames) >= 20)
        await asyncio.sleep(0.5)
        before = len(fast.frames)
        await asyncio.sleep(2.0)
        reference = [d - c for _, c, d in fast.frames[before:]]

        # The slow viewer's budget drops to a third of the stream: it cannot keep up.
        lagging = fanout_viewer(engine, slow)
        lagging.budget_bytes_per_s = engine.stats()["fanout"]["stream_byte_rate"] / 3
        slow_mark, fast_mark = len(slow.frames), len(fast.frames)
        await wait_for(lambda: lagging.keyframe_skips >= 2, timeout=20)
        await asyncio.sleep(1.0)
        during = [d - c for _, c, d in fast.frames[fast_mark:]]

        # The other viewer got every frame, as live as before.
        assert gaps(fast, camera, start=fast_mark) == []
        assert len(during) >= 60
        assert statistics.median(during) <= statistics.median(reference) + FRAME_US
        # The slow one still decodes cleanly: only from keyframes, never a broken picture.
        assert len(slow.frames) > slow_mark
        assert decode_errors.count == 0
        assert engine.sessions[slow.session_id].stats()["keyframe_skips"] >= 2

        # Given its budget back, it is complete again from the next keyframe on.
        lagging.budget_bytes_per_s = None
        skips = lagging.keyframe_skips
        recovered = len(slow.frames)
        await wait_for(lambda: len(slow.frames) >= recovered + 75, timeout=20)
        assert lagging.keyframe_skips == skips
        assert gaps(slow, camera, start=recovered + 5) == []
    finally:
        await fast.close()
        await slow.close()


async def test_stock_sender_path_still_selectable(
        feed: CapturePipeline, camera: CameraLog, tmp_path: Any) -> None:
    from tests.engine.conftest import webrtc_config

    engine = Engine(webrtc_config(send_path="aiortc"), tmp_path / "state", feed)
    await engine.start()
    try:
        peers = [await offering_peer() for _ in range(2)]
        v = await connect(engine, peers[0])
        await wait_for(lambda: len(v.frames) >= 20)
        assert engine.sessions[v.session_id].stats()["send_path"] == "aiortc"
        assert engine.stats()["fanout"] is None
        assert gaps(v, camera, start=5) == []
        # A second viewer of the same shape: answered from the first one's template, its
        # stock sender built on its first STUN check.
        second = await connect(engine, peers[1])
        await wait_for(lambda: len(second.frames) >= 20)
        assert engine.sessions[second.session_id].stats()["send_path"] == "aiortc"
        lazy = engine.stats()["lazy"]
        assert (lazy["answered"], lazy["built"], lazy["answer_mismatch"]) == (1, 1, 0), lazy
        assert gaps(second, camera, start=5) == []
        await second.close()
        await v.close()
    finally:
        await engine.stop()


class RefusingGso:
    """A mux socket whose kernel refuses UDP_SEGMENT (as over a device without checksum
    offload): ``sendmsg`` with the option fails with EINVAL, everything else is the socket's."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.refused = 0

    def sendmsg(self, buffers: Any, ancdata: Any = (), flags: int = 0,
                address: Any = None) -> int:
        import errno

        if ancdata:
            self.refused += 1
            raise OSError(errno.EINVAL, "Invalid argument")
        return int(self._sock.sendmsg(buffers, ancdata, flags, address))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


async def test_gso_refused_once_falls_back_to_datagrams(
        engine: Engine, camera: CameraLog, decode_errors: DecodeErrors) -> None:
    fanout = engine.fanout
    assert fanout is not None
    wrapped: dict[int, RefusingGso] = {}
    socket_for = fanout.socket_for

    def refusing(family: int) -> Any:
        sock = socket_for(family)
        if sock is None:
            return None
        if family not in wrapped:
            wrapped[family] = RefusingGso(sock)
        return wrapped[family]

    fanout.socket_for = refusing
    v = await connect(engine)
    try:
        await wait_for(lambda: len(v.frames) >= 75, timeout=40)
        stats = engine.stats()["fanout"]
        # Refused once, detected once: every later batch went datagram by datagram, and the
        # refused batch itself was resent that way (nothing missing, nothing broken).
        assert sum(w.refused for w in wrapped.values()) == 1
        assert stats["gso"] == 0 and "EINVAL" in (fanout.gso_refused or "")
        assert stats["gso_sends"] == 0 and stats["datagram_sends"] > 75
        assert gaps(v, camera, start=5) == [], gaps(v, camera, start=5)[:5]
        assert decode_errors.count == 0
        viewer = fanout_viewer(engine, v)
        assert viewer.send_errors == 0 and viewer.retransmitted == 0
    finally:
        await v.close()


class BrokenConsumer:
    """A fan-out consumer that fails on every ring write (a relay with a bug, say)."""

    def __init__(self) -> None:
        self.calls = 0

    def service(self, now: float) -> None:
        self.calls += 1
        raise RuntimeError("consumer bug")


async def test_a_consumer_failing_on_every_frame_is_counted_not_logged_each_time(
        engine: Engine, camera: CameraLog, caplog: pytest.LogCaptureFixture) -> None:
    viewer = await connect(engine)
    broken = BrokenConsumer()
    try:
        await wait_for(lambda: len(viewer.frames) >= 5, timeout=30)
        assert engine.fanout is not None
        engine.fanout.add_consumer(broken)
        start = len(viewer.frames)
        began = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="ruseon_appliance.stream.fanout"):
            await wait_for(lambda: broken.calls >= 30 and len(viewer.frames) >= start + 30,
                           timeout=40)
        engine.fanout.remove_consumer(broken)
        # Not a timing assertion: how many log lines the interval allows in the time it took.
        allowed = 1 + int((time.monotonic() - began) / fanout_module.ERROR_LOG_INTERVAL_S)
        failures = [r for r in caplog.records if "a consumer failed" in r.getMessage()]
        # Every failure counted; the traceback logged once in the interval, not 30+ times.
        assert engine.stats()["fanout"]["service_errors"] >= broken.calls >= 30
        assert 1 <= len(failures) <= allowed < broken.calls
        assert failures[0].exc_info is not None
        # The viewer's video went on through all of it.
        assert gaps(viewer, camera, start=start) == []
    finally:
        await viewer.close()
