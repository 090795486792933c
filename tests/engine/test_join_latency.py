"""Joining mid-GOP: a picture at once, then as live as a viewer who was already there.

Latency is read from the synthetic source's stamp (capture wall-clock time drawn into every
picture) in what each client decodes, so it is capture-to-decode through the whole path.
"""

from __future__ import annotations

import asyncio
import statistics

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.engine import Engine
from tests.engine.conftest import FPS, Viewer, connect_viewer, wait_for

FRAME_US = 1_000_000 // FPS


async def wait_gop_position(feed: CapturePipeline, low: int, high: int) -> None:
    """Wait until the newest keyframe is between ``low`` and ``high`` frames old."""
    def behind() -> int:
        k = feed.ring.newest_keyframe_seq
        return -1 if k is None else feed.ring.newest_seq - k
    await wait_for(lambda: low <= behind() <= high, timeout=10, interval=0.005)


def latencies(viewer: Viewer, skip: int) -> dict[int, int]:
    """capture_time_us -> capture-to-decode µs, after the first ``skip`` decoded frames."""
    return {cap: dec - cap for cap, dec in viewer.stamps[skip:]}


async def test_mid_gop_joiners_are_as_live_as_a_settled_viewer(
        engine: Engine, feed: CapturePipeline) -> None:
    settled = await connect_viewer(engine)
    await wait_for(lambda: settled.frames >= 10)

    # Old keyframe (more than the catch-up burst): keyframe at once, then the fresh IDR.
    await wait_gop_position(feed, 20, 35)
    stale = await connect_viewer(engine)
    # Young keyframe: keyframe plus a short burst squeezed into a few RTP ticks.
    await wait_gop_position(feed, 2, 6)
    young = await connect_viewer(engine)
    await wait_for(lambda: stale.frames >= 3 and young.frames >= 3)
    modes = {v: engine.sessions[v.session_id].track.join_mode for v in (stale, young)}
    assert modes[stale] == "keyframe-then-live", modes
    assert modes[young] in ("catch-up", "keyframe-then-live"), modes
    assert engine.sessions[stale.session_id].stats()["frames_skipped"] > 0

    # Let ~1.5 s of live video flow to everyone, then compare frame by frame.
    mark = {v: len(v.stamps) for v in (settled, stale, young)}
    await asyncio.sleep(1.5)
    reference = latencies(settled, mark[settled])
    for joiner in (stale, young):
        mine = latencies(joiner, max(mark[joiner], 2))
        common = sorted(set(mine) & set(reference))
        assert len(common) >= FPS // 2, (len(common), modes[joiner])
        deltas = [mine[c] - reference[c] for c in common]
        # Same frames, same moment of decoding give or take scheduling: within one frame.
        assert abs(statistics.median(deltas)) <= FRAME_US, (modes[joiner], deltas[:10])
        assert statistics.median(mine[c] for c in common) <= (
            statistics.median(reference[c] for c in common) + FRAME_US)

    # The stale joiner's very first picture was the cached keyframe: shown at once, old.
    first_capture, first_decode = stale.stamps[0]
    assert first_decode - first_capture > 10 * FRAME_US

    for v in (settled, stale, young):
        await v.close()
