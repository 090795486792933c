"""Nothing a stranger sends from a viewer's own address ends that viewer's stream (issue 12).

UDP source addresses are trivially forged on a LAN. These tests forge them for real: a raw
socket (``IPPROTO_RAW``, IP and UDP headers built here; the suite runs as root in its own
network namespace) sends datagrams to the engine's port *from the address and port of a live
aiortc viewer*, so the mux sees them on that viewer's route. Interleaved with the viewer's real
traffic go empty and 1-byte datagrams, truncated and oversized DTLS records, alerts and
handshake records with wrong epochs and sequence numbers, records of every content type, SRTP
and SRTCP with bad authentication tags, STUN requests and responses with bad MESSAGE-INTEGRITY
or FINGERPRINT, and a property-based fuzz of arbitrary bytes (hypothesis). Every viewer keeps
decoding every frame the engine sends it (loss recovery included), no session ends, and the
drop counters show the mux, not aiortc, threw the datagrams away.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

from aioice import stun
from aiortc import RTCSessionDescription
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ruseon_appliance.engine import Engine, aiortc_internals
from tests.engine.conftest import Viewer, connect_viewer, make_offer, wait_for

# --- forging datagrams ------------------------------------------------------------------------


class Spoofer:
    """Sends UDP datagrams with any IPv4 source address and port (a raw socket; root)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
        self.sent = 0

    def send(self, payload: bytes, src: tuple[str, int], dst: tuple[str, int]) -> None:
        udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0)  # checksum 0: none
        # Total length and header checksum are filled in by the kernel (IP_HDRINCL).
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 0, 0, 0, 64, socket.IPPROTO_UDP, 0,
                         socket.inet_aton(src[0]), socket.inet_aton(dst[0]))
        self.sock.sendto(ip + udp + payload, (dst[0], 0))
        self.sent += 1

    def close(self) -> None:
        self.sock.close()


def dtls_record(content_type: int, epoch: int, seq: int, body: bytes, *,
                version: int = 0xFEFD, length: int | None = None) -> bytes:
    """One DTLSPlaintext record header and body (``length`` overrides the length field)."""
    return (struct.pack("!BHH", content_type, version, epoch) + seq.to_bytes(6, "big")
            + struct.pack("!H", len(body) if length is None else length) + body)


def srtp_shaped(*, payload_type: int, ssrc: int, size: int) -> bytes:
    """An RTP header in clear and random bytes where payload and tag would be."""
    header = struct.pack("!BBHII", 0x80, payload_type, int.from_bytes(os.urandom(2), "big"),
                         int.from_bytes(os.urandom(4), "big"), ssrc)
    return header + os.urandom(size - len(header))


def srtcp_shaped(*, packet_type: int, ssrc: int) -> bytes:
    """An RTCP header (receiver report / feedback) in clear, then random report, index, tag."""
    body = os.urandom(24)
    header = struct.pack("!BBHI", 0x81, packet_type, (8 + len(body)) // 4 - 1, ssrc)
    return header + body + struct.pack("!I", 0x80000000 | 7) + os.urandom(10)


def stun_message(method: stun.Method, cls: stun.Class, *, username: str | None = None,
                 key: bytes | None = None, transaction_id: bytes | None = None,
                 break_fingerprint: bool = False, fingerprint: bool = True) -> bytes:
    msg = stun.Message(method, cls, transaction_id=transaction_id or os.urandom(12))
    if username is not None:
        msg.attributes["USERNAME"] = username
        msg.attributes["PRIORITY"] = 1
        msg.attributes["ICE-CONTROLLING"] = 1
    if cls != stun.Class.REQUEST:
        msg.attributes["XOR-MAPPED-ADDRESS"] = ("127.0.0.1", 9)
    if key is not None:
        msg.add_message_integrity(key)
    if fingerprint:
        msg.add_fingerprint()
    data = bytes(msg)
    if break_fingerprint:
        data = data[:-1] + bytes([data[-1] ^ 0x5A])
    return data


def attack_list(local_ufrag: str, remote_ufrag: str, ssrc: int) -> Iterator[bytes]:
    """The issue's list: every shape a spoofer might try, a few of each."""
    username = f"{local_ufrag}:{remote_ufrag}"
    wrong_key = b"not-the-password-of-this"
    for _ in range(3):
        yield b""
    for first in (0x00, 0x01, 0x16, 0x17, 0x15, 0x80, 0x81, 0xFF, 0x40):
        yield bytes([first])
    # Truncated and oversized DTLS records.
    yield dtls_record(22, 0, 1, os.urandom(20), length=100)  # says 100, carries 20
    yield dtls_record(22, 0, 1, b"")[:9]  # not even a whole header
    yield dtls_record(23, 1, 9, os.urandom(40), length=2**14 + 2049)
    yield dtls_record(23, 1, 9, os.urandom(2**14 + 2049))  # longer than any record may be
    yield dtls_record(22, 0, 1, os.urandom(30)) + b"\x16\xfe"  # trailing half header
    yield dtls_record(22, 0, 1, os.urandom(30), version=0x0303)  # TLS, not DTLS
    yield bytes([26]) + os.urandom(40)  # content type 26 does not exist
    # Alerts: close_notify and fatal, in clear (epoch 0) and "encrypted" (epoch 1), and an epoch
    # no handshake reaches; sequence numbers low, high, and the largest.
    for epoch, seq in ((0, 0), (0, 2**48 - 1), (1, 5), (1, 2**47), (7, 3)):
        yield dtls_record(21, epoch, seq, b"\x01\x00")  # warning close_notify
        yield dtls_record(21, epoch, seq, b"\x02\x28")  # fatal handshake_failure
        yield dtls_record(21, epoch, seq, os.urandom(26))  # ciphertext-sized garbage
    # Handshake records: HelloRequest (asks the client to renegotiate), ClientHello,
    # ServerHello-ish and Finished-sized, with wrong epochs and sequence numbers.
    for epoch, seq in ((0, 0), (0, 77), (1, 1), (1, 2**48 - 1), (3, 0)):
        yield dtls_record(22, epoch, seq, bytes([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]))
        yield dtls_record(22, epoch, seq, bytes([1, 0, 0, 40, 0, 0, 0, 0, 0, 0, 0, 40])
                          + os.urandom(40))
        yield dtls_record(22, epoch, seq, bytes([2]) + os.urandom(60))
        yield dtls_record(22, epoch, seq, os.urandom(48))
    # Every content type, in both epochs.
    for content_type in range(20, 26):
        for epoch in (0, 1):
            yield dtls_record(content_type, epoch, 12345, os.urandom(1))
            yield dtls_record(content_type, epoch, 12346, os.urandom(64))
    yield dtls_record(20, 0, 3, b"\x01")  # a ChangeCipherSpec, as in the handshake
    # Two records in one datagram, the second one lying about its length.
    yield dtls_record(21, 0, 1, b"\x01\x00") + dtls_record(22, 0, 2, os.urandom(10), length=50)
    # DTLS 1.3 unified headers: with a connection ID, too short, and random ciphertext.
    yield bytes([0x3F]) + os.urandom(30)
    yield bytes([0x2C, 0, 1, 0, 40]) + os.urandom(10)
    yield bytes([0x2C, 0, 1, 0, 20]) + os.urandom(20)
    # SRTP and SRTCP with bad authentication tags (well-formed headers).
    for pt in (96, 97, 102, 111, 127):
        yield srtp_shaped(payload_type=pt, ssrc=ssrc, size=200)
        yield srtp_shaped(payload_type=pt | 0x80, ssrc=ssrc, size=1200)
    yield srtp_shaped(payload_type=96, ssrc=ssrc, size=12)  # no room for a tag
    for packet_type in (200, 201, 205, 206):
        yield srtcp_shaped(packet_type=packet_type, ssrc=ssrc)
    yield srtcp_shaped(packet_type=201, ssrc=ssrc)[:14]  # truncated
    yield bytes([0x90, 96]) + os.urandom(10) + struct.pack("!HH", 0xBEDE, 400)  # bad ext len
    # STUN from the viewer's address: bad MESSAGE-INTEGRITY, bad FINGERPRINT, no credentials,
    # another method, indications, and responses/errors to no open transaction.
    yield stun_message(stun.Method.BINDING, stun.Class.REQUEST, username=username, key=wrong_key)
    yield stun_message(stun.Method.BINDING, stun.Class.REQUEST, username=username,
                       key=wrong_key, break_fingerprint=True)
    yield stun_message(stun.Method.BINDING, stun.Class.REQUEST, username=username)
    yield stun_message(stun.Method.BINDING, stun.Class.REQUEST)
    yield stun_message(stun.Method.ALLOCATE, stun.Class.REQUEST, username=username,
                       key=wrong_key)
    yield stun_message(stun.Method.BINDING, stun.Class.INDICATION)
    yield stun_message(stun.Method.BINDING, stun.Class.RESPONSE, key=wrong_key)
    yield stun_message(stun.Method.BINDING, stun.Class.RESPONSE, key=wrong_key,
                       break_fingerprint=True)
    yield stun_message(stun.Method.BINDING, stun.Class.ERROR, key=wrong_key)
    yield stun_message(stun.Method.BINDING, stun.Class.REQUEST, username=username,
                       key=wrong_key)[:-3]  # truncated
    # A STUN header whose length field lies.
    yield struct.pack("!HHI12s", 0x0001, 400, stun.COOKIE, os.urandom(12))


# --- a viewer that checks every frame --------------------------------------------------------


def route_of(engine: Engine, viewer: Viewer) -> tuple[str, int]:
    session = engine.sessions.get(viewer.session_id)
    assert session is not None, "a viewer's session ended during the attack"
    (route,) = engine.mux.routes_for(session.ufrag)
    return route


def remote_ufrag(viewer: Viewer) -> str:
    (conn,) = aiortc_internals.ice_connection_of(viewer.pc)
    return str(conn.local_username)


# Frames sent but not yet decoded at any one moment (about 100 ms at 30 fps).
IN_FLIGHT_FRAMES = 3


async def watch_while_attacked(engine: Engine, viewers: list[Viewer],
                               attack: Any) -> None:
    """Run ``attack()`` (a coroutine) while the viewers watch; then check every viewer kept
    decoding with nothing missing that the engine did not skip itself, and no session ended."""
    await wait_for(lambda: all(len(v.numbers) >= 5 for v in viewers), timeout=40)
    ended: list[str] = []
    engine.add_listener(lambda event, s: ended.append(s.end_reason)
                        if event == "session-ended" else None)
    marks = [len(v.numbers) for v in viewers]
    await attack()
    counts = [len(v.numbers) for v in viewers]
    # Still decoding afterwards: a dozen more frames each (under a second at 30 fps).
    await wait_for(lambda: all(len(v.numbers) >= c + 12 for v, c in zip(viewers, counts,
                                                                          strict=True)),
                   timeout=40)

    def undecoded(v: Viewer) -> int:
        return engine.sessions[v.session_id].track.frames_sent - v.frames

    # Every frame the engine sent was decoded (NACK recovers what loopback loses under load;
    # frames the engine itself skips to catch up are never sent): at some moment the viewer's
    # decoder is level with the sender but for the few frames in flight. A frame lost for good,
    # or one that failed to decode, keeps the two apart forever.
    await wait_for(lambda: all(undecoded(v) <= IN_FLIGHT_FRAMES for v in viewers), timeout=40)
    assert ended == []
    for v, mark in zip(viewers, marks, strict=True):
        session = engine.sessions[v.session_id]
        assert session.state == "connected"
        assert aiortc_internals.dtls_transports_of(session.pc)[0].state == "connected"
        nums = v.numbers[mark:]  # stamped frame numbers only go up
        assert nums == sorted(nums) and len(set(nums)) == len(nums)
    assert engine.receive_errors == {}


async def test_spoofed_attack_list_from_a_viewers_address_ends_nothing(engine: Engine) -> None:
    viewers = [await connect_viewer(engine) for _ in range(2)]
    spoofer = Spoofer()
    target = ("127.0.0.1", engine.udp_port)
    try:
        await wait_for(lambda: all(engine.mux.routes_for(s.ufrag)
                                   for s in engine.sessions.values()), timeout=40)
        before = dict(engine.mux.dropped)
        total = 0

        async def attack() -> None:
            nonlocal total
            for _round in range(3):
                for v in viewers:
                    session = engine.sessions.get(v.session_id)
                    assert session is not None, "a viewer's session ended during the attack"
                    ssrc = aiortc_internals.sender_ssrcs(session.sender)[0]
                    for i, datagram in enumerate(attack_list(session.ufrag, remote_ufrag(v),
                                                             ssrc)):
                        spoofer.send(datagram, route_of(engine, v), target)
                        total += 1
                        if i % 8 == 0:
                            await asyncio.sleep(0.005)  # interleave with real traffic
                await asyncio.sleep(0.3)

        await watch_while_attacked(engine, viewers, attack)

        def moved(reason: str) -> int:
            return engine.mux.dropped[reason] - before.get(reason, 0)

        # Dropped by the mux, on the viewers' routes, each under its own reason.
        for reason in ("empty", "too_short", "dtls_truncated", "dtls_bad_content_type",
                       "dtls_bad_version", "dtls_bad_epoch", "dtls_bad_header",
                       "dtls_plaintext_alert",
                       "rtp_truncated", "rtcp_truncated", "stun_bad_integrity",
                       "stun_malformed", "stun_no_credentials", "stun_not_binding",
                       "stun_indication", "stun_unsolicited", "stun_truncated"):
            assert moved(reason) > 0, reason
        assert moved("empty") == 3 * 3 * len(viewers)
        assert moved("dtls_unknown_source") == moved("rtp_unknown_source") == 0
        assert engine.mux.route_count == len(viewers)
    finally:
        spoofer.close()
        await asyncio.gather(*(v.close() for v in viewers))


# Arbitrary bytes, and bytes that start like each kind of packet (so they get past the first
# byte and into the shape checks, OpenSSL and libsrtp).
_fuzz = st.one_of(
    st.binary(max_size=1500),
    st.tuples(st.sampled_from([0, 1, 20, 21, 22, 23, 24, 25, 0x2C, 0x3F, 0x80, 0x81, 0x90]),
              st.binary(max_size=300)).map(lambda t: bytes([t[0]]) + t[1]),
    st.tuples(st.integers(20, 25), st.sampled_from([0xFEFD, 0xFEFF]), st.integers(0, 1),
              st.integers(0, 2**48 - 1), st.binary(min_size=1, max_size=200)).map(
        lambda t: dtls_record(t[0], t[2], t[3], t[4], version=t[1])),
    st.tuples(st.sampled_from([96, 102, 200, 201, 205, 206]), st.binary(min_size=10,
                                                                        max_size=400)).map(
        lambda t: bytes([0x80, t[0]]) + t[1]),
)


async def test_fuzzed_bytes_from_a_viewers_address_end_nothing(engine: Engine) -> None:
    viewer = await connect_viewer(engine)
    spoofer = Spoofer()
    target = ("127.0.0.1", engine.udp_port)
    try:
        await wait_for(lambda: bool(engine.mux.routes_for(
            engine.sessions[viewer.session_id].ufrag)), timeout=40)
        datagrams_before = engine.mux.counters["datagrams_in"]

        async def attack() -> None:
            src = route_of(engine, viewer)

            @settings(max_examples=60, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(_fuzz)
            def send(data: bytes) -> None:
                spoofer.send(data, src, target)

            for _round in range(5):  # hypothesis runs synchronously: yield between rounds
                send()
                await asyncio.sleep(0.2)

        await watch_while_attacked(engine, [viewer], attack)
        assert spoofer.sent >= 5 * 50
        assert engine.mux.counters["datagrams_in"] - datagrams_before >= spoofer.sent
    finally:
        spoofer.close()
        await viewer.close()


async def test_guard_keeps_a_session_when_aiortc_raises_on_a_datagram(engine: Engine) -> None:
    """Defence in depth: were the mux ever to let through something aiortc chokes on (here an
    empty datagram handed straight to the ICE connection, past the mux), the DTLS loop's guard
    counts it and the session lives on."""
    viewer = await connect_viewer(engine)
    try:
        await wait_for(lambda: len(viewer.numbers) >= 5, timeout=40)
        session = engine.sessions[viewer.session_id]
        (connection,) = aiortc_internals.ice_connection_of(session.pc)

        async def attack() -> None:
            for _ in range(5):
                connection.data_received(b"", 1)
                await asyncio.sleep(0.05)

        await wait_for(lambda: True)
        engine_errors_before = sum(engine.receive_errors.values())
        await attack()
        await wait_for(lambda: sum(engine.receive_errors.values()) >= engine_errors_before + 5)
        assert engine.receive_errors["IndexError"] >= 5
        mark = len(viewer.numbers)
        await wait_for(lambda: len(viewer.numbers) >= mark + 12, timeout=40)
        assert session.state == "connected" and engine.sessions[viewer.session_id] is session
    finally:
        await viewer.close()


async def test_a_forged_alert_during_the_dtls_handshake_fails_nothing(engine: Engine) -> None:
    """Between ICE and the end of the DTLS handshake, OpenSSL acts on alerts in clear (a
    single forged close_notify failed the joining session): the mux drops them. The viewer's
    DTLS (the server role here) is held for a second so the forged datagrams land mid-handshake.
    """
    pc, offer = await make_offer()
    viewer = Viewer(pc)
    (dtls,) = aiortc_internals.dtls_transports_of(pc)
    original = dtls._recv_next
    held = [False]

    async def held_first(original: Any = original) -> None:
        if not held[0]:
            held[0] = True
            await asyncio.sleep(1.0)
        await original()

    dtls._recv_next = held_first

    def on_track(track: Any) -> None:
        if track.kind == "video":
            viewer.task = asyncio.ensure_future(viewer.consume(track))

    pc.on("track", on_track)
    session, answer = await engine.offer(offer)
    viewer.session_id = session.id
    spoofer = Spoofer()
    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await wait_for(lambda: bool(engine.mux.routes_for(session.ufrag)), timeout=40)
        assert session.state == "connecting"
        before = engine.mux.dropped["dtls_plaintext_alert"]
        for body in (b"\x01\x00", b"\x02\x28", b"\x02\x0a"):  # close_notify, fatal x2
            spoofer.send(dtls_record(21, 0, 1, body), route_of(engine, viewer),
                         ("127.0.0.1", engine.udp_port))
        await wait_for(lambda: len(viewer.numbers) >= 10, timeout=40)
        assert session.state == "connected" and engine.sessions[session.id] is session
        assert engine.mux.dropped["dtls_plaintext_alert"] == before + 3
    finally:
        spoofer.close()
        await viewer.close()
