"""The mux's hold (issue 31): while the engine answers offers, STUN from addresses no viewer has
validated is kept and handled afterwards in arrival order, everything else is handled at once
(connected viewers' datagrams: ``test_offer_burst.py``), and the queue is bounded: past it the
mux stops reading and the socket's buffer keeps the rest, nothing lost."""

from __future__ import annotations

import socket
import struct

import pytest
from aioice import Connection

from ruseon_appliance.config import HostPort
from ruseon_appliance.engine import udp_mux
from ruseon_appliance.engine.udp_mux import UdpMux
from tests.engine.conftest import wait_for
from tests.engine.test_bad_input import binding_request


@pytest.fixture
async def mux():  # type: ignore[no-untyped-def]
    m = UdpMux(HostPort("127.0.0.1", 0))
    m.start()
    yield m
    m.close()


def client() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


async def test_unknown_checks_wait_for_the_hold_other_datagrams_do_not(mux: UdpMux) -> None:
    stranger = client()
    target = ("127.0.0.1", mux.port)
    check = binding_request("nobody00:abcd", b"k" * 22)
    mux.pause_reading()
    stranger.sendto(check, target)
    stranger.sendto(b"\xff" + b"x" * 40, target)  # garbage: dropped at once, as always
    await wait_for(lambda: mux.counters["datagrams_in"] == 2, timeout=10)
    assert mux.dropped["garbage"] == 1
    assert mux.dropped["stun_unknown_ufrag"] == 0 and mux.stats()["held_now"] == 1
    mux.resume_reading()
    await wait_for(lambda: mux.dropped["stun_unknown_ufrag"] == 1, timeout=10)
    assert mux.stats()["held_now"] == 0 and mux.counters["held"] == 1
    stranger.close()


async def test_a_full_queue_stops_reading_and_loses_nothing(
        mux: UdpMux, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(udp_mux, "HELD_MAX", 3)
    stranger = client()
    target = ("127.0.0.1", mux.port)
    mux.pause_reading()
    for n in range(10):
        stranger.sendto(binding_request(f"nobody{n:02d}:abcd", b"k" * 22), target)
    await wait_for(lambda: mux.counters["held_full"] == 1, timeout=10)
    assert mux.counters["datagrams_in"] == 3 and mux.stats()["held_now"] == 3
    mux.resume_reading()
    # The kept three first, then the socket's seven: each refused for its unknown ufrag (or,
    # past the unknown sources' STUN budget, as a flood), none lost.
    await wait_for(lambda: mux.dropped["stun_unknown_ufrag"] + mux.dropped["stun_flood"] == 10,
                   timeout=10)
    assert mux.counters["datagrams_in"] == 10 and mux.stats()["held_now"] == 0
    stranger.close()


async def test_a_viewer_past_ice_waits_until_connected_then_never(mux: UdpMux) -> None:
    # A registered viewer whose address ICE validated (a route), DTLS not done: its datagrams
    # wait like a new viewer's; once the engine marks it connected they pass during a hold.
    connection = Connection(ice_controlling=False)
    endpoint = mux.register(connection, ["127.0.0.1"])
    viewer = client()
    addr = viewer.getsockname()
    protocol = endpoint.protocols[socket.AF_INET]
    mux._routes[addr] = protocol  # what a valid check from it does (test_bad_input: real ones)
    endpoint.routes.add(addr)
    got: list[bytes] = []
    protocol.datagram_received = lambda data, a: got.append(data)  # type: ignore[method-assign]
    def dtls(n: int) -> bytes:  # a DTLS handshake record (epoch 0, sequence n)
        body = bytes(40)
        return struct.pack("!BHH6sH", 22, 0xFEFD, 0, n.to_bytes(6, "big"), len(body)) + body

    target = ("127.0.0.1", mux.port)
    mux.pause_reading()
    viewer.sendto(dtls(1), target)
    await wait_for(lambda: mux.counters["datagrams_in"] == 1, timeout=10)
    assert got == [] and mux.stats()["held_now"] == 1
    mux.mark_established(connection.local_username)
    viewer.sendto(dtls(2), target)
    await wait_for(lambda: len(got) == 1, timeout=10)
    assert got == [dtls(2)] and mux.stats()["held_now"] == 1
    mux.resume_reading()
    await wait_for(lambda: len(got) == 2, timeout=10)
    assert got[1] == dtls(1) and mux.stats()["held_now"] == 0
    viewer.close()
    mux.unregister(connection.local_username)
