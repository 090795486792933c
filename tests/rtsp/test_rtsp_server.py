"""The RTSP server against a raw client on real TCP: status codes and headers, authentication,
transports it refuses, bad input, a stuck client, limits, RTCP both ways, session timeouts."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import socket
import struct

from tests.rtsp.conftest import RawClient, Rig, wait_for

TOKEN = "0123456789abcdef-token"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def digest(challenge: str, method: str, uri: str, password: str, *, qop: bool = False) -> str:
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    md5 = lambda text: hashlib.md5(text.encode()).hexdigest()  # noqa: E731
    ha1 = md5(f"nvr:{params['realm']}:{password}")
    ha2 = md5(f"{method}:{uri}")
    if qop:
        response = md5(f"{ha1}:{params['nonce']}:00000001:abcdef:auth:{ha2}")
        extra = ', qop=auth, nc=00000001, cnonce="abcdef"'
    else:
        response = md5(f"{ha1}:{params['nonce']}:{ha2}")
        extra = ""
    return (f'Digest username="nvr", realm="{params["realm"]}", nonce="{params["nonce"]}", '
            f'uri="{uri}", response="{response}"{extra}')


async def test_describe_answers_an_sdp_with_the_parameter_sets_and_unknown_paths_404(
        rig: Rig) -> None:
    server = await rig.server()
    client = await RawClient.connect(server.port)
    try:
        options = await client.request("OPTIONS")
        assert options.status == 200 and "GET_PARAMETER" in options.header("public")
        described = await client.request("DESCRIBE")
        assert described.status == 200
        assert described.header("content-type") == "application/sdp"
        assert described.header("content-base") == client.url + "/"
        sdp = described.body.decode()
        info = rig.capture.stream_info
        assert info is not None
        assert f"profile-level-id={info.profile_level_id}" in sdp
        assert "packetization-mode=1" in sdp and "sprop-parameter-sets=" in sdp
        assert "a=control:trackID=0" in sdp and "a=range:npt=0-" in sdp
        assert "a=framerate:30\r\n" in sdp
        sprop = re.search(r"sprop-parameter-sets=([^;\r\n]+)", sdp)
        assert sprop is not None
        sps, pps = (base64.b64decode(p) for p in sprop.group(1).split(","))
        assert sps[0] & 0x1F == 7 and pps[0] & 0x1F == 8

        for path in ("", "stream"):
            other = await client.request("DESCRIBE", f"rtsp://127.0.0.1:{server.port}/{path}")
            assert other.status == 200
        missing = await client.request("DESCRIBE", f"rtsp://127.0.0.1:{server.port}/nope")
        assert missing.status == 404 and b"cam" in missing.body
        unsupported = await client.request("ANNOUNCE")
        assert unsupported.status == 405
        unknown = await client.request("FROBNICATE")
        assert unknown.status == 501
        no_session = await client.request("PLAY", headers={"Session": "deadbeef"})
        assert no_session.status == 454
    finally:
        await client.close()


async def test_auth_401_without_or_with_wrong_credentials_basic_and_digest_let_in(
        rig: Rig) -> None:
    server = await rig.server(token=TOKEN)
    client = await RawClient.connect(server.port)
    url = client.url
    try:
        # OPTIONS reveals nothing and needs nothing.
        assert (await client.request("OPTIONS")).status == 200
        bare = await client.request("DESCRIBE")
        assert bare.status == 401
        challenges = bare.headers["www-authenticate"]
        assert challenges[0].startswith("Digest ") and challenges[1].startswith("Basic ")
        assert (await client.request("DESCRIBE", headers={
            "Authorization": basic("nvr", "wrong")})).status == 401
        assert (await client.request("DESCRIBE", headers={
            "Authorization": basic("nvr", TOKEN[:-1])})).status == 401
        assert (await client.request("DESCRIBE", headers={
            "Authorization": digest(challenges[0], "DESCRIBE", url, "wrong")})).status == 401
        # Digest for another URI or method does not let in.
        assert (await client.request("DESCRIBE", headers={
            "Authorization": digest(challenges[0], "DESCRIBE", url + "x", TOKEN)})).status == 401
        assert (await client.request("DESCRIBE", headers={
            "Authorization": digest(challenges[0], "SETUP", url, TOKEN)})).status == 401
        # A nonce this server did not make does not let in.
        forged = challenges[0].replace('nonce="', 'nonce="1')
        assert (await client.request("DESCRIBE", headers={
            "Authorization": digest(forged, "DESCRIBE", url, TOKEN)})).status == 401
        assert (await client.request("DESCRIBE", headers={
            "Authorization": "Bearer " + TOKEN})).status == 401
        stats = server.stats()
        assert stats["auth_challenges"] == 1 and stats["auth_failures"] == 7
        assert stats["auth_accepted"] == {}

        ok_basic = await client.request("DESCRIBE", headers={
            "Authorization": basic("anyone", TOKEN)})
        assert ok_basic.status == 200 and b"m=video" in ok_basic.body
        for qop in (False, True):
            ok_digest = await client.request("DESCRIBE", headers={
                "Authorization": digest(challenges[0], "DESCRIBE", url, TOKEN, qop=qop)})
            assert ok_digest.status == 200
        assert server.stats()["auth_accepted"] == {"basic": 1, "digest": 2}

        # What another machine on the LAN captured of that exchange does not let it in: the
        # nonce belongs to 127.0.0.1. Its own challenge does (the control).
        other = await RawClient.connect(server.port, source="127.0.0.2")
        try:
            for qop in (False, True):
                replayed = await other.request("DESCRIBE", url, headers={
                    "Authorization": digest(challenges[0], "DESCRIBE", url, TOKEN, qop=qop)})
                assert replayed.status == 401
            own = (await other.request("DESCRIBE", url)).headers["www-authenticate"][0]
            assert (await other.request("DESCRIBE", url, headers={
                "Authorization": digest(own, "DESCRIBE", url, TOKEN)})).status == 200
        finally:
            await other.close()

        # The whole session with Basic: frames arrive.
        await client.play_tcp({"Authorization": basic("nvr", TOKEN)})
        await wait_for(lambda: client.frames >= 10, what="10 frames")
    finally:
        await client.close()


async def test_udp_to_another_address_or_multicast_is_refused(rig: Rig) -> None:
    server = await rig.server()
    client = await RawClient.connect(server.port)
    try:
        track = f"{client.url}/trackID=0"
        elsewhere = await client.request("SETUP", track, {
            "Transport": "RTP/AVP;unicast;destination=127.0.0.2;client_port=40000-40001"})
        assert elsewhere.status == 403 and b"own address" in elsewhere.body
        multicast = await client.request("SETUP", track, {
            "Transport": "RTP/AVP;multicast;client_port=40000-40001"})
        assert multicast.status == 461
        no_ports = await client.request("SETUP", track, {"Transport": "RTP/AVP;unicast"})
        assert no_ports.status == 461
        assert server.stats()["sessions_total"] == 0 and not server.sessions

        # The client's own address is fine, named or not: packets come to it over UDP.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rtp:
            rtp.bind(("127.0.0.1", 0))
            rtp.settimeout(20)
            port = rtp.getsockname()[1]
            own = await client.request("SETUP", track, {
                "Transport": f"RTP/AVP;unicast;destination=127.0.0.1;client_port={port}-"
                             f"{port + 1}"})
            assert own.status == 200
            assert f"client_port={port}-{port + 1}" in own.header("transport")
            assert "server_port=" in own.header("transport")
            client.session = own.header("session").split(";")[0]
            assert (await client.request("PLAY")).status == 200
            rtp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            # Every packet arrives, in order, from the server's port, frame after frame.
            sequence, frames, server_port = await asyncio.to_thread(receive_frames, rtp, 45)
            assert server_port == int(own.header("transport").split("server_port=")[1]
                                      .split("-")[0])
            assert sequence == list(range(sequence[0], sequence[0] + len(sequence)))
            assert frames == 45
    finally:
        await client.close()


def receive_frames(sock: socket.socket, frames: int) -> tuple[list[int], int, int]:
    """RTP sequence numbers (unwrapped) until ``frames`` marker bits, and the sender's port."""
    sequence: list[int] = []
    seen = 0
    port = 0
    while seen < frames:
        data, source = sock.recvfrom(4096)
        assert data[0] == 0x80 and source[0] == "127.0.0.1"
        port = source[1]
        seq = struct.unpack_from("!H", data, 2)[0]
        if sequence:
            seq = sequence[-1] + ((seq - sequence[-1]) & 0xFFFF)
        sequence.append(seq)
        seen += data[1] >> 7
    return sequence, seen, port


async def test_garbage_gets_400_and_a_close_other_clients_play_on(rig: Rig) -> None:
    server = await rig.server()
    good = await RawClient.connect(server.port)
    try:
        await good.play_tcp()
        await wait_for(lambda: good.frames >= 5, what="the good client's first frames")
        for garbage in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # TLS hello
                        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                        b"DESCRIBE rtsp://x/cam RTSP/1.0\r\n\r\n",  # no CSeq
                        b"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\n" + b"X: " + b"a" * 9000 + b"\r\n\r\n",
                        b"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\nContent-Length: 999999\r\n\r\n"):
            bad = await RawClient.connect(server.port)
            bad.writer.write(garbage)
            response = await bad.response()
            assert response.status in (400, 413), garbage
            assert await bad.closed()
            await bad.close()
        assert server.stats()["bad_requests"] == 5
        before = good.frames
        await wait_for(lambda: good.frames >= before + 15, what="the good client going on")
        assert good.sequence_gaps == 0
        assert server.stats()["playing"] == 1
    finally:
        await good.close()


async def test_a_stuck_tcp_client_does_not_delay_another(rig: Rig) -> None:
    """A client that stops reading fills its connection; the server skips it to the next
    keyframe (counted) while the good client gets every frame on time."""
    server = await rig.server(buffer_limit=16 * 1024, socket_send_buffer=8 * 1024)
    stuck = await RawClient.connect(server.port, rcvbuf=4096)
    good = await RawClient.connect(server.port)
    try:
        await stuck.play_tcp()
        await good.play_tcp()
        stuck.stop_reading()
        stuck_session = server.sessions[stuck.session]
        await wait_for(lambda: stuck_session.keyframe_skips >= 1, timeout=60,
                       what="the stuck client's buffer to fill")
        good_before, skipped_before = good.frames, stuck_session.frames_skipped
        await wait_for(lambda: good.frames >= good_before + 30
                       and stuck_session.frames_skipped >= skipped_before + 30,
                       timeout=60, what="the good client's frames while the other is stuck")
        assert good.sequence_gaps == 0
        good_session = server.sessions[good.session]
        assert good_session.frames_skipped == 0 and good_session.keyframe_skips == 0
        assert server.stats()["keyframe_skips"] >= 1
    finally:
        await stuck.close()
        await good.close()


async def test_max_clients_503_and_pli_becomes_a_keyframe_request(rig: Rig) -> None:
    server = await rig.server(max_clients=1)
    first = await RawClient.connect(server.port)
    try:
        await first.play_tcp()
        await wait_for(lambda: first.frames >= 3, what="first frames")
        assert first.first_nal == 7, "the stream did not start at a keyframe"
        # RTP-Info names the first packet's sequence number and timestamp.
        assert first.played is not None
        info = first.played.header("rtp-info")
        assert info.startswith(f"url={first.url}/trackID=0;")
        assert f";seq={first.first_seq}" in info and f";rtptime={first.first_timestamp}" in info
        second = await RawClient.connect(server.port)
        refused = await second.request("OPTIONS")
        assert refused.status == 503 and refused.header("retry-after")
        assert await second.closed()
        await second.close()
        assert server.stats()["rejected_full"] == 1
        # A flood of idle connections: past twice max_clients (+16) they are cut at once.
        idle = [await RawClient.connect(server.port) for _ in range(17)]
        await wait_for(lambda: server.stats()["clients"] == 18, what="18 connections")
        cut = await RawClient.connect(server.port)
        assert await cut.closed()
        assert server.stats()["clients"] == 18 and server.stats()["rejected_full"] == 2
        for client in (cut, *idle):
            await client.close()

        # Sender reports on channel 1; a PLI there is the capture's keyframe request.
        await wait_for(lambda: any(p[1] == 200 for p in first.rtcp), what="a sender report")
        session = server.sessions[first.session]
        requests_before = rig.capture.stats()["keyframe_requests"]
        pli = struct.pack("!BBHII", 0x81, 206, 2, 1, session.ssrc)
        first.writer.write(struct.pack("!BBH", 0x24, 1, len(pli)) + pli)
        await wait_for(lambda: session.keyframe_requests_received == 1, what="the PLI")
        assert rig.capture.stats()["keyframe_requests"] > requests_before
        # PAUSE stops the stream, PLAY resumes it at a keyframe, numbering continuous.
        assert (await first.request("PAUSE")).status == 200
        assert rig.fanout.stats()["consumers"] == 0
        keyframes = first.keyframes
        assert (await first.request("PLAY")).status == 200
        await wait_for(lambda: first.keyframes > keyframes, what="a keyframe after PLAY")
        assert first.sequence_gaps == 0
        alive = await first.request("GET_PARAMETER")
        assert alive.status == 200 and alive.header("session").startswith(first.session)
        assert (await first.request("TEARDOWN")).status == 200
        assert not server.sessions and rig.fanout.stats()["consumers"] == 0
    finally:
        await first.close()


async def test_udp_sessions_without_signs_of_life_are_reaped(rig: Rig) -> None:
    server = await rig.server(session_timeout_s=2.0)
    client = await RawClient.connect(server.port)
    try:
        setup = await client.request("SETUP", f"{client.url}/trackID=0", {
            "Transport": "RTP/AVP;unicast;client_port=40000-40001"})
        assert setup.status == 200 and setup.header("session").endswith(";timeout=2")
        client.session = setup.header("session").split(";")[0]
        assert (await client.request("PLAY")).status == 200
        assert rig.fanout.stats()["consumers"] == 1
        # Keep-alives keep it: OPTIONS (as some clients send) for 1.5 timeouts, then
        # GET_PARAMETER for 1.5 timeouts; then it is left alone.
        for i in range(12):
            if i < 6:  # (the raw client names the session itself in all but OPTIONS)
                alive = await client.request("OPTIONS", headers={"Session": client.session})
            else:
                alive = await client.request("GET_PARAMETER")
            assert alive.status == 200
            await asyncio.sleep(0.4)  # a fifth of the timeout: room for a loaded machine
        assert server.stats()["sessions_reaped"] == 0 and len(server.sessions) == 1
        # Nothing comes back from 127.0.0.1:40000 (no RTCP, no keep-alive): reaped.
        await wait_for(lambda: server.stats()["sessions_reaped"] == 1, what="the reaping")
        assert not server.sessions and rig.fanout.stats()["consumers"] == 0
        assert (await client.request("GET_PARAMETER")).status == 454
    finally:
        await client.close()


async def test_a_silent_udp_client_whose_session_was_reaped_frees_its_connection(
        rig: Rig) -> None:
    # A client that played over UDP, then vanished without closing its RTSP connection (an NVR
    # that lost power): the session is reaped, and its connection must go too, or such ghosts
    # fill max_clients and every later client gets 503 for ever.
    server = await rig.server(session_timeout_s=1.0, max_clients=1)
    ghost = await RawClient.connect(server.port)
    other: RawClient | None = None
    try:
        setup = await ghost.request("SETUP", f"{ghost.url}/trackID=0", {
            "Transport": "RTP/AVP;unicast;client_port=40000-40001"})
        assert setup.status == 200
        ghost.session = setup.header("session").split(";")[0]
        assert (await ghost.request("PLAY")).status == 200
        await wait_for(lambda: server.stats()["sessions_reaped"] == 1, what="the reaping")
        assert await ghost.closed(timeout=30.0)
        await wait_for(lambda: server.stats()["clients"] == 0, what="the connection to go")
        other = await RawClient.connect(server.port)
        assert (await other.request("DESCRIBE")).status == 200
    finally:
        await ghost.close()
        if other is not None:
            await other.close()


async def test_numbers_too_long_for_int_get_a_4xx_answer(rig: Rig) -> None:
    # Python refuses int() of more than 4300 digits (ValueError): a Content-Length or a port
    # that long must be answered like any other bad number, not end the connection unanswered.
    server = await rig.server()
    digits = "9" * 5000
    bad = await RawClient.connect(server.port)
    try:
        bad.writer.write(f"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\nContent-Length: {digits}\r\n\r\n"
                         .encode())
        assert (await bad.response()).status in (400, 413)
    finally:
        await bad.close()
    client = await RawClient.connect(server.port)
    try:
        for transport in (f"RTP/AVP;unicast;client_port={digits}-40001",
                          f"RTP/AVP/TCP;unicast;interleaved=0-{digits}"):
            setup = await client.request("SETUP", f"{client.url}/trackID=0",
                                         {"Transport": transport})
            assert setup.status == 461, transport
        assert (await client.request("OPTIONS")).status == 200
    finally:
        await client.close()


async def test_a_client_that_never_reads_its_answers_is_cut_off(rig: Rig) -> None:
    # Requests keep coming, answers are never read: the answers must not pile up in the
    # server's memory without bound (a stranger's cheap way to run a Pi out of memory; a 401
    # is several times the size of the request that earns it). The connection is closed.
    server = await rig.server(buffer_limit=16 * 1024, socket_send_buffer=16 * 1024)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", server.port))
        await wait_for(lambda: server.stats()["clients"] == 1, what="the connection")
        requests = b"".join(f"OPTIONS * RTSP/1.0\r\nCSeq: {i}\r\n\r\n".encode()
                            for i in range(1, 30_001))  # ~1 MB in, ~3.5 MB of answers
        highest = 0
        try:
            for start in range(0, len(requests), 64 * 1024):
                await loop.sock_sendall(sock, requests[start:start + 64 * 1024])
                await asyncio.sleep(0.01)  # (let the server take them)
                for conn in server._connections:
                    highest = max(highest, conn.writer.transport.get_write_buffer_size())
        except (ConnectionResetError, BrokenPipeError):
            pass
        await wait_for(lambda: server.stats()["clients"] == 0, what="the connection to be cut")
        assert highest <= 4 * 16 * 1024 + 1024
    finally:
        sock.close()
