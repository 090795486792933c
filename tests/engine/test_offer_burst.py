"""Offers first (issue 19): while offers are being answered, the UDP mux keeps new viewers'
datagrams (connected viewers' are handled at once, issue 31) and the cyclic garbage collector
pauses, both bounded; what waited is handled afterwards, and every viewer still connects and
decodes. The answer text is the one aiortc would give."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest
from aiortc import RTCSessionDescription

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.engine import Engine
from ruseon_appliance.engine import engine as engine_module
from ruseon_appliance.engine import offer_burst as offer_burst_module
from ruseon_appliance.engine.errors import OfferError
from ruseon_appliance.engine.offer_burst import OfferBurst
from ruseon_appliance.engine.session import WhepSession
from tests.engine.conftest import (
    Viewer,
    camera_config,
    connect_viewer,
    make_offer,
    wait_for,
    webrtc_config,
)
from tests.engine.test_offer_path import offers_to_parse


class Reader:
    """Stands in for the mux: records whether it is reading."""

    def __init__(self) -> None:
        self.reading = True
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.reading = False
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.reading = True
        self.calls.append("resume")


async def test_burst_holds_reading_and_the_collector_until_done_and_is_bounded() -> None:
    assert gc.isenabled()
    reader = Reader()
    burst = OfferBurst(reader, max_hold_s=0.2)
    try:
        burst.begin()
        assert burst.holding and not reader.reading and not gc.isenabled()
        burst.begin()  # nested begin: one hold
        burst.end()
        assert reader.reading
        await asyncio.sleep(0)  # the collector resumes after the current callbacks
        assert gc.isenabled()
        assert reader.calls == ["pause", "resume"]

        # Bounded: a hold that runs out resumes everything and is not taken again until the
        # engine was idle once (end()).
        burst.begin()
        await wait_for(lambda: reader.reading and gc.isenabled(), timeout=10)
        assert not burst.holding and burst.stats()["holds_expired"] == 1
        burst.begin()
        assert reader.reading and gc.isenabled()
        burst.end()
        burst.begin()
        assert not reader.reading and not gc.isenabled()
        # A new burst right after an end, before the collector resumed: still held, and the
        # earlier resume does not turn it on in the middle of the burst.
        burst.end()
        burst.begin()
        await asyncio.sleep(0.01)
        assert not gc.isenabled()
        burst.close()
        assert reader.reading and gc.isenabled()
        assert burst.stats() == {"holds": 4, "holds_expired": 1}

        # Someone else turned the collector off: left off.
        gc.disable()
        burst.begin()
        burst.end()
        await asyncio.sleep(0.01)
        assert not gc.isenabled()
    finally:
        burst.close()
        gc.enable()


def first_viewer_reports(engine: Engine) -> int:
    """Receiver reports the engine has handled, over its sessions (the fan-out viewers')."""
    return sum(int(s.stats().get("receiver_reports") or 0) for s in engine.sessions.values())


async def test_new_viewers_datagrams_wait_while_an_offer_is_pending_connected_ones_do_not(
        feed: CapturePipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An offer for a camera that never starts stays pending for STREAM_READY_TIMEOUT_S: the
    # engine holds the mux meanwhile (the hold's bound raised above that for the test).
    monkeypatch.setattr(offer_burst_module, "MAX_HOLD_S", 30.0)
    monkeypatch.setattr(engine_module, "STREAM_READY_TIMEOUT_S", 4.0)
    engine = Engine(webrtc_config(), tmp_path / "state", feed)
    await engine.start()
    silent = CapturePipeline(camera_config())  # never started: no video, ever
    viewers: list[Viewer] = []
    try:
        first = await connect_viewer(engine)
        viewers.append(first)
        await wait_for(lambda: first.frames >= 3, timeout=40)

        pc, offer = await make_offer()
        late = Viewer(pc)
        viewers.append(late)
        pc.on("track", lambda track: setattr(
            late, "task", asyncio.ensure_future(late.consume(track))))
        session, answer = await engine.offer(offer)
        # (An offer of a shape answered before is answered at once, from its template: no
        # hold for it; one of a new shape holds while it is answered.)
        holds = engine.stats()["offer_bursts"]["holds"]
        in_before = engine.mux.counters["datagrams_in"]
        pending = asyncio.ensure_future(engine.offer(offer, feed=silent))
        await wait_for(lambda: engine.stats()["offer_bursts"]["holds"] == holds + 1,
                       timeout=10)
        # The late viewer starts ICE while the other offer is pending: its checks are kept
        # (none answered), while the first viewer's datagrams (its RTCP receiver reports,
        # from an address it validated) are still read and handled.
        held_before = engine.mux.counters["held"]
        rtcp_before = first_viewer_reports(engine)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await wait_for(lambda: engine.mux.counters["held"] > held_before, timeout=10)
        await wait_for(lambda: first_viewer_reports(engine) > rtcp_before, timeout=10)
        assert engine.mux.counters["datagrams_in"] > in_before
        assert session.state == "connecting" and engine.mux.stats()["held_now"] > 0
        with pytest.raises(OfferError):
            await pending
        assert session.state in ("connecting", "connected")
        # Then it connects and decodes, as does the first viewer.
        frames = first.frames
        await wait_for(lambda: late.frames >= 3 and first.frames >= frames + 3, timeout=40)
        assert session.state == "connected"
        assert engine.stats()["offer_bursts"]["holds_expired"] == 0
        assert gc.isenabled()
    finally:
        await asyncio.gather(*(v.close() for v in viewers))
        await engine.stop()


async def test_concurrent_offers_all_connect_and_decode(engine: Engine) -> None:
    made = [await make_offer() for _ in range(8)]
    viewers = [Viewer(pc) for pc, _ in made]
    for viewer in viewers:
        viewer.pc.on("track", lambda track, v=viewer: setattr(
            v, "task", asyncio.ensure_future(v.consume(track))))
    try:
        answers = await asyncio.gather(*(engine.offer(offer) for _, offer in made))
        assert engine.stats()["offer_bursts"]["holds"] == 1  # one burst, held once
        assert gc.isenabled()
        for viewer, (_, answer) in zip(viewers, answers, strict=True):
            await viewer.pc.setRemoteDescription(
                RTCSessionDescription(sdp=answer, type="answer"))
        await wait_for(lambda: all(v.frames >= 3 for v in viewers), timeout=60)
        assert all(s.state == "connected" for s, _ in answers)
    finally:
        await asyncio.gather(*(v.close() for v in viewers))


async def test_concurrent_offers_are_answered_one_at_a_time_in_order(engine: Engine) -> None:
    """Each offer's answer is back with its caller before the next offer's session is built
    (not all together at the end of the burst, as aiortc's awaits would interleave them).
    Every offer built at once here (lazy sessions off): with them, the burst's later offers are
    answered from the first one's template, at once (test_lazy_sessions.py)."""
    engine.lazy_sessions = False
    made = [await make_offer() for _ in range(6)]
    tasks: list[asyncio.Task[tuple[WhepSession, str]]] = []
    # Callers that had their answer (done callbacks run on a later loop iteration than the
    # offer's last step) when each session was started.
    answered: list[int] = []
    answered_when_started: list[int] = []
    engine.add_listener(lambda event, session: answered_when_started.append(
        len(answered)) if event == "session-started" else None)
    try:
        for i, (_, offer) in enumerate(made):
            tasks.append(asyncio.ensure_future(engine.offer(offer)))
            tasks[-1].add_done_callback(lambda _, i=i: answered.append(i))
        await asyncio.gather(*tasks)
        assert answered == list(range(6))
        assert answered_when_started == list(range(6))  # lockstep: [0, 0, 0, 0, 0, 0]
    finally:
        for task in tasks:
            if task.done() and not task.exception():
                await engine.close(task.result()[0].id)
        await asyncio.gather(*(pc.close() for pc, _ in made))


async def test_answer_is_what_aiortc_renders_for_the_session(engine: Engine) -> None:
    """The engine returns the text createAnswer rendered instead of rendering
    pc.localDescription again: the two are equal for aiortc, audio-first and Chromium
    offers."""
    for sdp in await offers_to_parse():
        session, answer = await engine.offer(sdp)
        assert answer == session.pc.localDescription.sdp
        assert "a=ice-ufrag:" + session.ufrag in answer
        await engine.close(session.id)
