"""Join/leave churn leaves nothing behind: every engine-side object a session made is freed.

Object counts, not RSS: after real viewers (aiortc clients over UDP on 127.0.0.1, decoding
the video) join and leave, the number of live peer connections, transports, ICE connections,
SRTP sessions, OpenSSL connections, sessions, fan-out viewers, ring cursors and tasks returns
to what it was before, and the mux's tables are empty again. Deterministic, unlike RSS.
And with the cyclic garbage collector off, everything a closed session made (peer connection,
transports, ICE connection, sender/receiver, session, viewer; above all the OpenSSL connection
and SRTP sessions, which hold native memory) is freed by reference counting as the session
closes: the engine cuts aiortc's reference cycles instead of leaving them for the collector.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections import Counter

import aioice
import pylibsrtp
from aiortc import (
    RTCDtlsTransport,
    RTCIceTransport,
    RTCPeerConnection,
    RTCRtpReceiver,
    RTCRtpSender,
    RTCSctpTransport,
)
from OpenSSL import SSL

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.ring import RingReader
from ruseon_appliance.engine import Engine, aiortc_internals
from ruseon_appliance.engine.aiortc_internals import MuxStunProtocol
from ruseon_appliance.engine.fanout import FanoutViewer
from ruseon_appliance.engine.session import WhepSession
from ruseon_appliance.stream.cursor import ViewerCursor
from tests.engine.conftest import connect_viewer, wait_for

CYCLES = 20

# Kinds of object a session creates (on either side: the clients are closed too).
KINDS: tuple[type, ...] = (
    RTCPeerConnection, RTCDtlsTransport, RTCIceTransport, aioice.Connection, RTCSctpTransport,
    RTCRtpSender, RTCRtpReceiver, pylibsrtp.Session, SSL.Connection, WhepSession, FanoutViewer,
    ViewerCursor, RingReader, MuxStunProtocol, asyncio.Task,
)


def live_counts() -> Counter[str]:
    """Live objects of each of :data:`KINDS`, after a full collection."""
    gc.collect()
    counts: Counter[str] = Counter({_name(kind): 0 for kind in KINDS})
    for obj in gc.get_objects():
        for kind in KINDS:
            if isinstance(obj, kind):
                counts[_name(kind)] += 1
    return counts


def _name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def engine_side_objects(session: WhepSession) -> list[object]:
    """Everything the engine made for one (connected) session."""
    track = session.track
    objects: list[object] = [session, session.pc, track,
                             *aiortc_internals.owned_objects(session.pc)]
    if isinstance(track, FanoutViewer):
        objects.append(track.cursor)  # its RingReader has slots, no weak references: counted
    return objects


async def test_join_leave_cycles_free_every_engine_object(
        engine: Engine, feed: CapturePipeline) -> None:
    # One warm-up cycle: first-use caches (codec tables, loggers, ...) are not a leak.
    warm = await connect_viewer(engine)
    await wait_for(lambda v=warm: v.frames >= 1)
    await engine.close(warm.session_id)
    await warm.close()
    await wait_for(lambda: not engine.sessions)
    del warm  # the client side is counted too: drop our references
    await asyncio.sleep(0.2)
    baseline = live_counts()
    tasks = len(asyncio.all_tasks())
    readers = feed.ring.stats()["readers"]

    refs: list[weakref.ref[object]] = []
    native_alive = 0
    waiting: Counter[str] = Counter()  # engine objects the collector would have had to free
    for cycle in range(CYCLES):
        viewer = await connect_viewer(engine)
        await wait_for(lambda v=viewer: v.frames >= 1)
        session = engine.sessions[viewer.session_id]
        assert session.state == "connected"
        objects = engine_side_objects(session)
        refs += [weakref.ref(obj) for obj in objects]
        # What holds native memory (OpenSSL, libsrtp) must go when the session closes, not
        # whenever the cyclic collector next runs: it does not count native memory.
        native = [weakref.ref(obj) for obj in objects
                  if isinstance(obj, SSL.Connection | pylibsrtp.Session)]
        assert len(native) == 3  # the OpenSSL connection, SRTP in and out
        # And the rest of the session too: its cycles are cut on close, so reference counting
        # alone frees it (a full collection under churn is rare and pauses the send loop).
        mine = [weakref.ref(obj) for obj in objects]
        del session, objects
        gc.disable()
        try:
            if cycle % 2:
                await engine.close(viewer.session_id)  # a DELETE
                await viewer.close()
            else:
                await viewer.close()  # the viewer hangs up; the engine follows
            await wait_for(lambda: not engine.sessions)
            native_alive += sum(r() is not None for r in native)
            # aiortc finishes closing in tasks of its own.
            await wait_for(lambda: len(asyncio.all_tasks()) <= tasks)
            await asyncio.sleep(0.05)
            waiting += Counter(type(r()).__name__ for r in mine if r() is not None)
        finally:
            gc.enable()
        del viewer

    assert engine.stats()["sessions_ended"] == {"delete": CYCLES // 2 + 1,
                                                "peer-closed": CYCLES - CYCLES // 2}
    # aiortc finishes closing in tasks of its own: wait for them to end, then look.
    await wait_for(lambda: len(asyncio.all_tasks()) <= tasks)
    assert native_alive == 0, f"{native_alive} OpenSSL/SRTP objects waited for the collector"
    assert not waiting, f"closed sessions' objects waited for the cyclic collector: {waiting}"
    counts = live_counts()
    alive = Counter(type(r()).__name__ for r in refs if r() is not None)
    assert not alive, f"engine objects outlived their sessions: {dict(alive)}"
    grown = {k: (baseline[k], counts[k]) for k in counts if counts[k] > baseline[k]}
    assert not grown, f"live objects grew over {CYCLES} join/leave cycles: {grown}"
    mux = engine.mux.stats()
    assert (mux["sessions"], mux["routes"], mux["tracked_sources"]) == (0, 0, 0)
    assert engine.stats()["fanout"]["viewers"] == 0
    assert feed.ring.stats()["readers"] == readers
