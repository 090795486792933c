"""The packet history and the send loop, alone (a real ring; recorded H.264)."""

from __future__ import annotations

import time

from ruseon_appliance.capture.access_unit import AccessUnit
from ruseon_appliance.capture.h264 import AccessUnitSplitter
from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.stream.fanout import Fanout
from ruseon_appliance.stream.h264_rtp import packetize
from ruseon_appliance.stream.history import PacketHistory
from tests.stream.conftest import DATA


class Feed:
    """What the loop needs of capture: a ring (no keyframes on demand)."""

    def __init__(self) -> None:
        self.ring = RingBuffer(8 << 20, 64)

    def request_keyframe(self, reason: str = "") -> bool:
        return False


def filled_feed(count: int) -> Feed:
    feed = Feed()
    units = AccessUnitSplitter().split_all(DATA.read_bytes())
    for n, (data, keyframe) in enumerate(units[:count]):
        feed.ring.write(AccessUnit(data, n * 3000, keyframe, 0))
    return feed


def test_each_frame_is_packetized_once_and_forgotten_after_the_history() -> None:
    feed = filled_feed(10)
    history = PacketHistory(history_s=1.5)
    view = feed.ring.frame(feed.ring.newest_seq)
    assert view is not None
    first = history.frame(view)
    assert history.frame(view) is first  # shared: the same objects for every reader
    assert first.payloads == packetize(bytes(view.data)) and first.keyframe == view.keyframe
    assert (history.frames_packetized, history.packets_packetized) == (1, len(first.payloads))
    history.prune(time.monotonic())
    assert len(history) == 1
    history.prune(time.monotonic() + 2.0)
    assert len(history) == 0


class Recorder:
    """A viewer or consumer that notes the order it was serviced in."""

    def __init__(self, name: str, log: list[str], fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail
        self.keyframe_skips = 0

    def service(self, now: float) -> None:
        self.log.append(self.name)
        if self.fail:
            raise RuntimeError("broken")

    def maybe_send_report(self, now: float) -> None:
        self.log.append(self.name + ":report")


async def test_the_loop_services_viewers_then_consumers_and_isolates_failures() -> None:
    feed = filled_feed(3)
    fanout = Fanout(feed, lambda family: None, framerate=30, min_bitrate=1_000_000)
    log: list[str] = []
    broken, viewer = Recorder("broken", log), Recorder("viewer", log)
    consumer = Recorder("consumer", log)
    fanout.activate(broken)
    fanout.activate(viewer)
    assert log == ["broken", "viewer"]  # activating sends at once
    broken.fail = True
    fanout.add_consumer(consumer)
    log.clear()
    fanout.pump()
    assert log == ["broken", "viewer", "viewer:report", "consumer"]
    assert fanout.service_errors == 1
    fanout.remove(broken)
    fanout.remove_consumer(consumer)
    log.clear()
    fanout.pump()
    assert log == ["viewer", "viewer:report"]
    assert fanout.stats()["viewers"] == 1 and fanout.stats()["consumers"] == 0


def test_budgets_scale_with_the_stream_but_never_below_the_configured_minimum() -> None:
    fanout = Fanout(Feed(), lambda family: None, framerate=30, min_bitrate=800_000)
    assert fanout.stream_byte_rate() == 100_000
    fanout.history.byte_rate = 500_000.0
    assert fanout.stream_byte_rate() == 500_000
    assert fanout.max_backlog_frames == 15 and fanout.gso and fanout.gso_refused is None
