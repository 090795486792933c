"""Bad offers get specific errors; bad datagrams on the UDP port are dropped, each counted,
while existing viewers keep receiving video."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path

import pytest
from aioice import stun

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.engine import (
    Engine,
    MalformedOffer,
    OfferTooLarge,
    TooManyViewers,
    UnsupportedOffer,
)
from tests.engine.conftest import connect_viewer, make_offer, wait_for, webrtc_config

# --- offers ----------------------------------------------------------------------------------


async def offer_text() -> str:
    pc, offer = await make_offer()
    await pc.close()
    return offer


def only_h264_profile(offer: str, profile_prefix: str) -> str:
    """Keep only H.264 formats whose profile-level-id starts with ``profile_prefix``."""
    import re

    lines = offer.split("\r\n")
    keep_pts: set[str] = set()
    for ln in lines:
        m = re.match(r"a=fmtp:(\d+) .*profile-level-id=(\w+)", ln)
        if m and m.group(2).startswith(profile_prefix) and "packetization-mode=1" in ln:
            keep_pts.add(m.group(1))
    out = []
    for ln in lines:
        m = re.match(r"a=(?:rtpmap|fmtp|rtcp-fb):(\d+)", ln)
        if m and m.group(1) not in keep_pts:
            continue
        if ln.startswith("m=video"):
            head = ln.split(" ")[:3]
            ln = " ".join(head + sorted(keep_pts))
        out.append(ln)
    return "\r\n".join(out)


async def test_offer_errors_have_specific_types(engine: Engine) -> None:
    offer = await offer_text()
    with pytest.raises(MalformedOffer):
        await engine.offer("hello, this is not SDP")
    with pytest.raises(UnsupportedOffer, match="no video"):
        await engine.offer(offer.replace("m=video", "m=audio").replace("H264/", "opus/"))
    with pytest.raises(UnsupportedOffer, match=r"no H\.264"):
        await engine.offer(offer.replace("H264/90000", "VP9/90000"))
    with pytest.raises(UnsupportedOffer, match="packetization-mode=1"):
        await engine.offer(offer.replace("packetization-mode=1", "packetization-mode=0"))
    with pytest.raises(UnsupportedOffer, match="recvonly"):
        await engine.offer(offer.replace("a=recvonly", "a=sendonly"))
    # A Main-only receiver cannot take the camera's Constrained Baseline: refused, not black.
    with pytest.raises(UnsupportedOffer, match="constrained baseline"):
        await engine.offer(only_h264_profile(offer, "4d"))
    many = offer + "".join(
        f"m=audio 9 UDP/TLS/RTP/SAVPF 0\r\nc=IN IP4 0.0.0.0\r\na=mid:x{i}\r\n" for i in range(5))
    with pytest.raises(UnsupportedOffer, match="media sections"):
        await engine.offer(many)
    with pytest.raises(OfferTooLarge):
        await engine.offer(offer + "a=x-pad:" + "x" * 70_000 + "\r\n")
    assert engine.sessions == {}
    rejected = engine.stats()["offers_rejected"]
    assert rejected["UnsupportedOffer"] == 6 and rejected["MalformedOffer"] == 1
    assert engine.mux.stats()["sessions"] == 0


async def test_max_viewers(feed: CapturePipeline, tmp_path: Path) -> None:
    engine = Engine(webrtc_config(max_viewers=1), tmp_path / "state", feed)
    await engine.start()
    try:
        v = await connect_viewer(engine)
        # Only connected viewers hold a place for sure (a pending one gives way to a newcomer).
        await wait_for(lambda: engine.sessions[v.session_id].state == "connected")
        with pytest.raises(TooManyViewers) as info:
            await engine.offer(await offer_text())
        assert info.value.retry_after > 0
        await engine.close(v.session_id)
        await v.close()
        w = await connect_viewer(engine)  # the place is free again
        await w.close()
    finally:
        await engine.stop()


# --- datagrams -------------------------------------------------------------------------------


def binding_request(username: str, key: bytes) -> bytes:
    msg = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
    msg.attributes["USERNAME"] = username
    msg.attributes["PRIORITY"] = 1
    msg.attributes["ICE-CONTROLLING"] = 1
    msg.add_message_integrity(key)
    return bytes(msg)


async def test_garbage_on_the_port_is_dropped_and_counted(engine: Engine) -> None:
    viewers = [await connect_viewer(engine) for _ in range(2)]
    await wait_for(lambda: all(v.frames >= 3 for v in viewers))
    live_ufrag = next(iter(engine.sessions.values())).ufrag
    target = ("127.0.0.1", engine.udp_port)
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    attacker.bind(("127.0.0.1", 0))
    good = binding_request(f"{live_ufrag}:abcd", b"wrong-password-wrong-pw")
    kinds = {
        "garbage": [bytes([0xFF]) + os.urandom(99), os.urandom(0)[:0] + b"\x70" * 10],
        "stun_truncated": [binding_request("zzzz:abcd", b"k" * 22)[:30]],
        # A wrong FINGERPRINT, and an unknown STUN method.
        "stun_malformed": [good[:-1] + bytes([good[-1] ^ 0xFF]),
                           struct.pack("!HHI12s", 0x02EF, 0, stun.COOKIE, os.urandom(12))],
        "stun_unknown_ufrag": [binding_request("nobody00:abcd", b"k" * 22)],
        "stun_bad_integrity": [good],
        "dtls_unknown_source": [bytes([22, 0xFE, 0xFD]) + os.urandom(60)],
        "rtp_unknown_source": [bytes([0x80, 96]) + os.urandom(100)],
    }
    before = dict(engine.mux.dropped)
    for datagrams in kinds.values():
        for d in datagrams:
            attacker.sendto(d, target)
    # A flood of Binding requests from one source: most are dropped before any HMAC is computed.
    flood = binding_request("nobody00:abcd", b"k" * 22)
    for _ in range(600):
        attacker.sendto(flood, target)
    frames = [v.frames for v in viewers]

    def dropped(reason: str) -> int:
        return engine.mux.dropped[reason] - before[reason]

    await wait_for(lambda: dropped("stun_flood") + dropped("stun_unknown_ufrag") >= 601)
    for reason, datagrams in kinds.items():
        if reason == "stun_unknown_ufrag":
            assert dropped(reason) >= 1
        else:
            assert dropped(reason) == len(datagrams), reason
    assert dropped("stun_flood") >= 400
    # The attacker never got a route or a reply, and the viewers still receive video.
    assert engine.mux.route_count == 2
    attacker.setblocking(False)
    with pytest.raises(BlockingIOError):
        attacker.recvfrom(2048)
    await wait_for(lambda: all(v.frames >= f + 10 for v, f in zip(viewers, frames, strict=True)))
    assert all(s.state == "connected" for s in engine.sessions.values())
    attacker.close()
    await asyncio.gather(*(v.close() for v in viewers))
