"""Who may keep or take over a session, and what the server says to options it lacks: a raw
client on real TCP (and UDP sessions whose RTP goes to ports nothing listens on)."""

from __future__ import annotations

import asyncio

from ruseon_appliance.rtsp.server import MAX_SESSIONS_PER_CONNECTION
from tests.rtsp.conftest import RawClient, Rig, wait_for
from tests.rtsp.test_rtsp_server import TOKEN, basic

AUTH = {"Authorization": basic("nvr", TOKEN)}


async def udp_session(client: RawClient, port: int, headers: dict[str, str] | None = None
                      ) -> str:
    """SETUP a UDP session (RTP to ``port``, where nothing listens); returns its id."""
    setup = await client.request("SETUP", f"{client.url}/trackID=0", {
        "Transport": f"RTP/AVP;unicast;client_port={port}-{port + 1}", **(headers or {})})
    assert setup.status == 200, setup
    return setup.header("session").split(";")[0]


async def test_options_without_credentials_does_not_keep_a_session_alive(rig: Rig) -> None:
    server = await rig.server(token=TOKEN, session_timeout_s=2.0)
    owner = await RawClient.connect(server.port)
    stranger: RawClient | None = None
    try:
        owner.session = await udp_session(owner, 40000, AUTH)
        assert (await owner.request("PLAY", headers=AUTH)).status == 200
        # With credentials OPTIONS is a keep-alive (1.5 timeouts of it keep the session).
        for _ in range(8):
            alive = await owner.request("OPTIONS", headers={"Session": owner.session, **AUTH})
            assert alive.status == 200
            await asyncio.sleep(0.4)
        assert server.stats()["sessions_reaped"] == 0 and len(server.sessions) == 1

        # Someone who knows the id sends OPTIONS naming it, without credentials: answered (as
        # any OPTIONS) but the session is not kept, however often it comes.
        stranger = await RawClient.connect(server.port)

        async def keep_poking() -> None:
            assert stranger is not None
            while True:
                poke = await stranger.request("OPTIONS", headers={"Session": owner.session})
                assert poke.status == 200
                await asyncio.sleep(0.2)

        poking = asyncio.get_running_loop().create_task(keep_poking())
        try:
            await wait_for(lambda: server.stats()["sessions_reaped"] == 1, what="the reaping")
            assert not poking.done()  # the stranger was answered all along
        finally:
            poking.cancel()
        assert not server.sessions and rig.fanout.stats()["consumers"] == 0
        # Wrong credentials are no better than none. (A new connection: the cancelled poker
        # may have left an answer unread on the stranger's.)
        other = await RawClient.connect(server.port)
        try:
            second = await udp_session(other, 40002, AUTH)
            bad = {"Session": second, "Authorization": basic("nvr", "wrong")}
            before = server.sessions[second].last_activity
            assert (await other.request("OPTIONS", headers=bad)).status == 200
            assert server.sessions[second].last_activity == before
        finally:
            await other.close()
    finally:
        await owner.close()
        if stranger is not None:
            await stranger.close()


async def test_a_udp_session_taken_over_counts_against_the_new_connection(rig: Rig) -> None:
    server = await rig.server(max_clients=2 * MAX_SESSIONS_PER_CONNECTION + 2)
    first = await RawClient.connect(server.port)
    full = await RawClient.connect(server.port)
    fresh = await RawClient.connect(server.port)
    try:
        moving = await udp_session(first, 40000)
        ports = iter(range(40100, 40100 + 2 * MAX_SESSIONS_PER_CONNECTION + 2, 2))
        for _ in range(MAX_SESSIONS_PER_CONNECTION):
            await udp_session(full, next(ports))
        refused = await full.request("SETUP", f"{full.url}/trackID=0", {
            "Transport": f"RTP/AVP;unicast;client_port={next(ports)}-40999"})
        assert refused.status == 455
        # The full connection may not take over a session of another connection either.
        for method in ("GET_PARAMETER", "PLAY"):
            taken = await full.request(method, headers={"Session": moving})
            assert taken.status == 455, (method, taken)
        # Its OPTIONS naming it is answered, but adopts nothing.
        assert (await full.request("OPTIONS", headers={"Session": moving})).status == 200
        assert max(len(c.sessions) for c in server._connections) == MAX_SESSIONS_PER_CONNECTION
        # A connection with room may (RFC 2326: a UDP session outlives its connection).
        fresh.session = moving
        assert (await fresh.request("PLAY")).status == 200
        assert server.sessions[moving].state == "playing"
    finally:
        for client in (first, full, fresh):
            await client.close()


async def test_require_gets_551_with_the_unsupported_options(rig: Rig) -> None:
    server = await rig.server(token=TOKEN)
    client = await RawClient.connect(server.port)
    try:
        for method in ("OPTIONS", "DESCRIBE", "SETUP"):
            answer = await client.request(method, headers={"Require": "implicit-play"})
            assert answer.status == 551, (method, answer)
            assert answer.header("unsupported") == "implicit-play"
        # Without Require the same requests go on as usual (here: asking for credentials).
        assert (await client.request("OPTIONS")).status == 200
        assert (await client.request("DESCRIBE")).status == 401
        assert (await client.request("DESCRIBE", headers=AUTH)).status == 200
    finally:
        await client.close()
