"""Digest replays: a qop=auth request counts (nc) per nonce, and a count not higher than before
is refused, even from the client's own address; FFmpeg uses qop when offered."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time

import pytest

from ruseon_appliance.rtsp import auth as rtsp_auth
from ruseon_appliance.rtsp.auth import RtspAuth
from tests.rtsp.conftest import RawClient, Rig
from tests.rtsp.test_rtsp_clients import decode_rtsp

TOKEN = "0123456789abcdef-token"


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def digest(nonce: str, method: str, uri: str, *, nc: int | None,
           password: str = TOKEN, realm: str = "RUSEON") -> str:
    """A Digest ``Authorization`` value; ``nc`` None: without qop (RFC 2069 style)."""
    ha1, ha2 = md5(f"nvr:{realm}:{password}"), md5(f"{method}:{uri}")
    header = f'Digest username="nvr", realm="{realm}", nonce="{nonce}", uri="{uri}"'
    if nc is None:
        return header + f', response="{md5(f"{ha1}:{nonce}:{ha2}")}"'
    count = f"{nc:08x}"
    response = md5(f"{ha1}:{nonce}:{count}:c0ffee:auth:{ha2}")
    return header + f', response="{response}", qop=auth, nc={count}, cnonce="c0ffee"'


def nonce_of(challenge: str) -> str:
    found = re.search(r'nonce="([^"]+)"', challenge)
    assert found is not None, challenge
    return found.group(1)


async def test_a_replayed_qop_request_is_refused_from_the_clients_own_address(rig: Rig) -> None:
    server = await rig.server(token=TOKEN)
    client = await RawClient.connect(server.port)
    try:
        bare = await client.request("DESCRIBE")
        assert bare.status == 401
        challenge = bare.headers["www-authenticate"][0]
        assert challenge.startswith("Digest ") and 'qop="auth"' in challenge
        nonce = nonce_of(challenge)
        first = {"Authorization": digest(nonce, "DESCRIBE", client.url, nc=1)}
        assert (await client.request("DESCRIBE", headers=first)).status == 200
        # The captured request, sent again (same address, even the same connection): refused,
        # with a fresh nonce offered (stale: an honest client retries without asking).
        replayed = await client.request("DESCRIBE", headers=first)
        assert replayed.status == 401
        assert "stale=true" in replayed.headers["www-authenticate"][0]
        assert server.stats()["auth_replays"] == 1
        # An older count is no better; the next one goes on with the same nonce.
        assert (await client.request("DESCRIBE", headers={
            "Authorization": digest(nonce, "DESCRIBE", client.url, nc=5)})).status == 200
        assert (await client.request("DESCRIBE", headers={
            "Authorization": digest(nonce, "DESCRIBE", client.url, nc=4)})).status == 401
        assert (await client.request("DESCRIBE", headers={
            "Authorization": digest(nonce, "DESCRIBE", client.url, nc=6)})).status == 200
        # A count of 0 or one that is not hex is wrong, not a first use.
        for nc_text in ("00000000", "zz"):
            bad = digest(nonce, "DESCRIBE", client.url, nc=7).replace("nc=00000007",
                                                                     f"nc={nc_text}")
            assert (await client.request("DESCRIBE", headers={"Authorization": bad})).status == 401
        # Without qop (GStreamer, live555) the response cannot count: still let in.
        plain = {"Authorization": digest(nonce, "DESCRIBE", client.url, nc=None)}
        assert (await client.request("DESCRIBE", headers=plain)).status == 200
        assert (await client.request("DESCRIBE", headers=plain)).status == 200
        assert server.stats()["auth_replays"] == 2
    finally:
        await client.close()


async def test_ffmpeg_counts_its_requests_with_qop(rig: Rig) -> None:
    server = await rig.server(token=TOKEN)
    url = f"rtsp://nvr:{TOKEN}@127.0.0.1:{server.port}/cam"
    result = await asyncio.to_thread(decode_rtsp, url, "tcp", 10)
    assert result["first_key"] is True and not result["errors"], result["errors"]
    stats = server.stats()
    assert stats["auth_replays"] == 0 and stats["auth_failures"] == 0
    assert server.auth is not None
    # DESCRIBE, SETUP, PLAY (at least) counted under one nonce: FFmpeg used qop=auth.
    assert server.auth._nc and max(server.auth._nc.values()) >= 3, server.auth._nc


def test_a_nonce_pushed_out_of_the_table_is_stale_not_open_to_replay(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rtsp_auth, "NONCE_TABLE_SIZE", 2)
    auth = RtspAuth(TOKEN)
    url, peer = "rtsp://127.0.0.1:8554/cam", "127.0.0.1"
    now = time.time()
    older, old, recent = (auth.nonce(peer, now=now - age) for age in (30, 20, 10))

    def check(nonce: str, nc: int) -> str:
        return auth.check("DESCRIBE", url, digest(nonce, "DESCRIBE", url, nc=nc), peer)

    assert check(older, 1) == "ok" and check(old, 1) == "ok"
    assert check(recent, 1) == "ok"  # pushes `older` out
    assert len(auth._nc) == 2
    # `older` is no longer remembered: any count of it is stale (it may have been used).
    assert check(older, 1) == "stale" and check(older, 9) == "stale"
    # Those still in the table go on counting; a nonce made after the horizon is a first use.
    assert check(old, 2) == "ok" and check(old, 2) == "stale"
    fresh = auth.nonce(peer)
    assert check(fresh, 1) == "ok"
    assert auth.replays == 3


async def test_wrong_passwords_are_throttled_per_address_and_viewing_can_be_open(
        rig: Rig) -> None:
    from ruseon_appliance.access.credentials import AdminSecret, Credentials

    viewer_token = "viewer-token-for-rtsp-0123"
    closed = Credentials(AdminSecret(TOKEN, "auth.token"), viewer_token=viewer_token,
                         viewing_open=False)
    server = await rig.server(credentials=closed)
    guesser = await RawClient.connect(server.port)
    try:
        nonce = nonce_of((await guesser.request("DESCRIBE")).headers["www-authenticate"][0])
        for n in range(10):
            wrong = {"Authorization": digest(nonce, "DESCRIBE", guesser.url, nc=n + 1,
                                             password=f"guess-{n}")}
            assert (await guesser.request("DESCRIBE", headers=wrong)).status == 401
        # The 11th try waits, even with the right password, and says how long.
        right = {"Authorization": digest(nonce, "DESCRIBE", guesser.url, nc=20)}
        waiting = await guesser.request("DESCRIBE", headers=right)
        assert waiting.status == 429 and int(waiting.header("retry-after")) >= 1
        assert server.stats()["auth_failures"] == 10 and server.stats()["auth_throttled"] == 1
        assert closed.throttle.failures == {"rtsp": 10}
    finally:
        await guesser.close()
    # Another address is served at once, with the viewer token as well as the admin secret.
    for count, password in enumerate((viewer_token, TOKEN), start=1):
        other = await RawClient.connect(server.port, source="127.0.0.2")
        try:
            nonce = nonce_of((await other.request("DESCRIBE")).headers["www-authenticate"][0])
            answer = await other.request("DESCRIBE", headers={
                # Both connections may get the same nonce (same second, same address): count on.
                "Authorization": digest(nonce, "DESCRIBE", other.url, nc=count,
                                        password=password)})
            assert answer.status == 200
        finally:
            await other.close()
    # With viewing open (the default), playing needs no credential at all.
    open_server = await rig.server(credentials=Credentials(AdminSecret(TOKEN, "auth.token")))
    anyone = await RawClient.connect(open_server.port)
    try:
        assert (await anyone.request("DESCRIBE")).status == 200
        # The methods that would change what the server holds are still refused.
        assert (await anyone.request("ANNOUNCE")).status == 405
    finally:
        await anyone.close()
