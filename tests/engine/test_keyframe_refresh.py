"""Keyframe requests never restart the camera for everyone (issue 24).

rpicam-vid (the stand-in, replaying a stamped recording) cannot make an IDR on request; it used
to be restarted for one viewer's PLI, freezing every viewer. Now a viewer's PLI/FIR is answered
for that viewer alone from the ring (the newest keyframe and the GOP since, paced like a join
burst): 20 PLIs from one real aiortc viewer in 10 s, and rpicam-vid is started once, that
viewer gets a keyframe after each and decodes every picture without an error, and another
viewer's pictures come one after another with no frame missing or repeated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fractions
import itertools
import re
from pathlib import Path

import av
import numpy as np
import pytest

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.sources.rpicam import RpicamSource
from ruseon_appliance.capture.stamp import draw_stamp
from ruseon_appliance.engine import Engine
from ruseon_appliance.engine.fanout import FanoutViewer
from tests.capture.test_sources import fake_rpicam_camera
from tests.engine.conftest import webrtc_config
from tests.engine.test_fanout import (  # noqa: F401 (decode_errors is a fixture)
    DecodeErrors,
    StampedViewer,
    connect,
    decode_errors,
)

FPS, GOP, SECONDS = 30, 30, 20
WIDTH, HEIGHT = 192, 112
PLIS, PLI_EVERY_S = 20, 0.5


def stamped_recording(path: Path) -> Path:
    """A stamped libx264 Constrained Baseline stream: frame numbers 0..FPS*SECONDS-1, an IDR
    (with SPS/PPS) every GOP frames."""
    encoder = av.CodecContext.create("libx264", "w")
    encoder.width, encoder.height, encoder.pix_fmt = WIDTH, HEIGHT, "yuv420p"
    encoder.time_base, encoder.framerate = fractions.Fraction(1, FPS), FPS
    encoder.options = {"tune": "zerolatency", "preset": "ultrafast", "g": str(GOP),
                       "keyint_min": str(GOP), "profile": "baseline", "bf": "0",
                       "repeat-headers": "1"}
    with path.open("wb") as out:
        for n in range(FPS * SECONDS):
            luma = np.full((HEIGHT, WIDTH), 60 + n % 40, np.uint8)
            draw_stamp(luma, n * 1_000_000 // FPS, n)
            frame = av.VideoFrame(WIDTH, HEIGHT, "yuv420p")
            frame.planes[0].update(luma.tobytes())
            frame.pts = n
            for packet in encoder.encode(frame):
                out.write(bytes(packet))
        for packet in encoder.encode(None):
            out.write(bytes(packet))
    return path


def fanout_viewer(engine: Engine, viewer: StampedViewer) -> FanoutViewer:
    track = engine.sessions[viewer.session_id].track
    assert isinstance(track, FanoutViewer)
    return track


async def wait_until(predicate: object, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met"
        await asyncio.sleep(0.05)


async def send_pli(viewer: StampedViewer) -> None:
    """The client's own PLI for the server's video SSRC (as a browser on lossy Wi-Fi)."""
    media_ssrc = int(re.findall(r"^a=ssrc:(\d+) ", viewer.answer, re.M)[0])
    receiver = viewer.pc.getReceivers()[0]
    await receiver._send_rtcp_pli(media_ssrc)


async def test_plis_from_one_viewer_are_answered_from_the_ring_for_it_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decode_errors: DecodeErrors) -> None:  # noqa: F811
    stream = stamped_recording(tmp_path / "stamped.h264")
    camera = fake_rpicam_camera(tmp_path, monkeypatch, FAKE_RPICAM_STREAM=str(stream))
    camera = dataclasses.replace(camera, width=WIDTH, height=HEIGHT, framerate=FPS,
                                 keyframe_interval=GOP, bitrate=300_000)
    source = RpicamSource(camera)
    feed = CapturePipeline(camera, source=source)
    await feed.start()
    engine = Engine(webrtc_config(), tmp_path / "state", feed)
    await engine.start()
    lossy = other = None
    try:
        assert await feed.wait_first_frame(20)
        lossy, other = await connect(engine), await connect(engine)
        await wait_until(lambda: len(lossy.frames) >= 30 and len(other.frames) >= 30)
        a, b = fanout_viewer(engine, lossy), fanout_viewer(engine, other)
        keyframes_a, keyframes_b = a.keyframes_sent, b.keyframes_sent
        mark_b = len(other.frames)
        answered = []
        for _ in range(PLIS):
            refreshes, decoded = a.refreshes, len(lossy.frames)
            await send_pli(lossy)
            await wait_until(lambda r=refreshes: a.refreshes > r, timeout=10)
            # A clean picture after each: the refresh's pictures decode, the picture moves on.
            await wait_until(lambda d=decoded: len(lossy.frames) > d + 5, timeout=10)
            answered.append(a.refreshes - refreshes)
            await asyncio.sleep(PLI_EVERY_S)
        mark_a = len(lossy.frames)  # the last replay (at most a GOP) is decoded by now
        await wait_until(lambda: len(other.frames) >= mark_b + 30
                         and len(lossy.frames) >= mark_a + GOP + 20)

        assert answered == [1] * PLIS
        starts = (tmp_path / "starts.log").read_text().splitlines()
        assert len(starts) == 1, starts  # rpicam-vid was never restarted
        assert source.crashes == 0
        assert decode_errors.count == 0
        assert lossy.unstamped == 0 and other.unstamped == 0
        # The lossy viewer got a keyframe for each PLI, on top of the stream's own.
        own = b.keyframes_sent - keyframes_b
        assert a.keyframes_sent - keyframes_a >= own + PLIS, (a.keyframes_sent, own)
        # The other viewer: every picture once, in order, none missing (the replay loops at
        # FPS * SECONDS), and only the stream's own keyframes.
        numbers = [n for n, _, _ in other.frames[mark_b:]]
        steps = [(y - x) % (FPS * SECONDS) for x, y in itertools.pairwise(numbers)]
        assert set(steps) == {1}, [s for s in steps if s != 1][:10]
        assert engine.stats()["keyframe_refreshes"] == PLIS
        assert b.refreshes == 0
        # The lossy viewer's pictures after its last refresh carry on in order too.
        tail = [n for n, _, _ in lossy.frames[-20:]]
        assert all((y - x) % (FPS * SECONDS) == 1 for x, y in itertools.pairwise(tail))
    finally:
        for viewer in (lossy, other):
            if viewer is not None:
                await viewer.close()
        await engine.stop()
        await feed.stop()


class RingFeed:
    """A ring written by the test (what a viewer cursor needs of a pipeline)."""

    def __init__(self) -> None:
        from ruseon_appliance.capture.ring import RingBuffer

        self.ring = RingBuffer(1 << 20, 256)
        self.requests: list[str] = []

    def request_keyframe(self, reason: str = "") -> bool:
        self.requests.append(reason)
        return True


def write(feed: RingFeed, n: int, keyframe: bool) -> None:
    from ruseon_appliance.capture.access_unit import AccessUnit

    feed.ring.write(AccessUnit(bytes([n % 256]) * 100, n * 3000, keyframe, n))


@pytest.mark.parametrize("max_bytes", [0, 10_000, 150])
def test_a_refresh_replays_the_gop_after_what_was_sent(max_bytes: int) -> None:
    """The cursor's refresh: the newest keyframe and the frames since, stamped strictly after
    what the viewer already has and before the next live frame; with a GOP over the byte bound
    the keyframe alone, then nothing until the next keyframe. The source is never asked."""
    from ruseon_appliance.stream.cursor import ViewerCursor

    feed = RingFeed()
    cursor: ViewerCursor[bytes] = ViewerCursor(
        feed, lambda view: bytes(view.data), frame_interval=3000, catch_up_max_frames=3,
        keyframe_interval_frames=10, catch_up_max_bytes=max_bytes)
    for n in range(25):
        write(feed, n, keyframe=n % 10 == 0)
        cursor.pull()
    sent = list(cursor.queue)
    cursor.queue.clear()
    last = sent[-1][1]
    requests = len(feed.requests)
    assert cursor.refresh()
    replay = list(cursor.queue)
    assert replay[0][0][0] == 20 and replay[0][2] is True  # the newest keyframe first
    whole = max_bytes == 0 or max_bytes >= 500
    assert [taken[0] for taken, *_ in replay] == ([20, 21, 22, 23, 24] if whole else [20])
    stamps = [pts for _, pts, _, _ in replay]
    assert stamps == sorted(stamps) and stamps[0] > last and len(set(stamps)) == len(stamps)
    cursor.queue.clear()
    for n in range(25, 31):
        write(feed, n, keyframe=n % 10 == 0)
        cursor.pull()
    live = list(cursor.queue)
    assert [taken[0] for taken, *_ in live] == ([25, 26, 27, 28, 29, 30] if whole else [30])
    assert live[0][1] > stamps[-1]
    assert len(feed.requests) == requests  # nothing asked of the source
