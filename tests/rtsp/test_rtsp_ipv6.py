"""RTSP over IPv6 with UDP delivery: to ::1, and to a link-local client, whose address means
nothing without its interface (the scope id). The link-local part builds a veth pair in the
private network namespace scripts/test runs pytest in (never on the host's links)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
from collections.abc import Iterator

import pytest

from ruseon_appliance.config import HostPort, RtspConfig
from ruseon_appliance.rtsp import RtspServer, RtspSource
from tests.rtsp.conftest import FPS, RawClient, Rig, wait_for
from tests.tooling import IN_CI, require_tool

VETH, VETH_PEER = "rtsp6a", "rtsp6b"
SERVER_LL, CLIENT_LL = "fe80::5254:1", "fe80::5254:2"


async def server_on(rig: Rig, host: str) -> RtspServer:
    source = RtspSource("cam", rig.capture, rig.fanout, framerate=FPS,
                        catch_up_max_frames=15, keyframe_interval_frames=60)
    server = RtspServer(RtspConfig(enable=True, listen=HostPort(host, 0)), [source])
    await server.start()
    rig.servers.append(server)
    return server


async def connect(sock: socket.socket, address: tuple[str, int, int, int],
                  url: str) -> RawClient:
    """A RawClient over ``sock`` (already bound) connected to ``address``."""
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, address)
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
    client = RawClient(reader, writer, url)
    client._task = asyncio.get_running_loop().create_task(client._read_loop())
    return client


def receive(sock: socket.socket, frames: int) -> tuple[list[int], int, str]:
    """RTP sequence numbers until ``frames`` marker bits; the sender's port and address."""
    sequence: list[int] = []
    seen = port = 0
    host = ""
    while seen < frames:
        data, source = sock.recvfrom(4096)
        assert data[0] == 0x80
        host, port = source[0], source[1]
        seq = struct.unpack_from("!H", data, 2)[0]
        if sequence:
            seq = sequence[-1] + ((seq - sequence[-1]) & 0xFFFF)
        sequence.append(seq)
        seen += data[1] >> 7
    return sequence, port, host


async def play_udp_and_receive(server: RtspServer, client: RawClient, *, here: str,
                               here_scope: int, there: str, there_scope: int) -> None:
    """SETUP UDP to a pair of sockets at ``here``, PLAY, and check that whole frames arrive
    from the server's port (at ``there``) and that the client's RTCP is heard."""
    rtp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    rtcp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        rtp.bind((here, 0, 0, here_scope))
        port = rtp.getsockname()[1]
        rtcp.bind((here, port + 1, 0, here_scope))
        rtp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        rtp.settimeout(30)
        described = await client.request("DESCRIBE")
        assert described.status == 200 and b"IN IP6 " in described.body
        setup = await client.request("SETUP", f"{client.url}/trackID=0", {
            "Transport": f"RTP/AVP;unicast;client_port={port}-{port + 1}"})
        assert setup.status == 200, setup
        client.session = setup.header("session").split(";")[0]
        server_port = int(setup.header("transport").split("server_port=")[1].split("-")[0])
        assert (await client.request("PLAY")).status == 200
        sequence, sender_port, _ = await asyncio.to_thread(receive, rtp, 30)
        assert sender_port == server_port
        assert sequence == list(range(sequence[0], sequence[0] + len(sequence)))
        assert server.stats()["send_errors"] == 0
        # Keyframes (several equal-sized packets) left in GSO sends, segmented by the kernel
        # (on lo; whether a veth segments is the kernel's business: there, either way).
        session = server.sessions[client.session]
        assert session.gso_sends >= 1 or (here != "::1" and not session.gso)
        # The client's receiver report (no report block) reaches the session: its address,
        # as the server's socket hears it, is recognised as the client's.
        session = server.sessions[client.session]
        ssrc = 0x1234
        rtcp.sendto(struct.pack("!BBHI", 0x80, 201, 1, ssrc),
                    (there, server_port + 1, 0, there_scope))
        await wait_for(lambda: session.rtcp_received >= 1, what="the receiver report")
        assert session.rtcp_ignored == 0
    finally:
        rtp.close()
        rtcp.close()


async def test_udp_delivery_over_ipv6_loopback(rig: Rig) -> None:
    server = await server_on(rig, "::1")
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.bind(("::1", 0, 0, 0))
    client = await connect(sock, ("::1", server.port, 0, 0), f"rtsp://[::1]:{server.port}/cam")
    try:
        await play_udp_and_receive(server, client, here="::1", here_scope=0, there="::1",
                                   there_scope=0)
    finally:
        await client.close()


@pytest.fixture
def link_local_pair() -> Iterator[tuple[int, int]]:
    """A veth pair with a link-local address on each end (``SERVER_LL`` on ``VETH``,
    ``CLIENT_LL`` on ``VETH_PEER``); yields their interface indexes."""
    # scripts/test runs pytest in a namespace of its own (other tests may have added their own
    # veths to it meanwhile, so its links are not checked by name).
    if os.environ.get("TEST_PRIVATE_NETNS") != "1":
        message = "needs scripts/test's private network namespace (never the host's links)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    ip = require_tool("ip", "apt-get install iproute2")
    subprocess.run([ip, "link", "del", VETH], capture_output=True)  # left by an aborted run
    commands = [
        [ip, "link", "add", VETH, "type", "veth", "peer", "name", VETH_PEER],
        # nodad: usable at once, not "tentative" for a second or two.
        [ip, "-6", "addr", "add", f"{SERVER_LL}/64", "dev", VETH, "nodad"],
        [ip, "-6", "addr", "add", f"{CLIENT_LL}/64", "dev", VETH_PEER, "nodad"],
        [ip, "link", "set", VETH, "up"],
        [ip, "link", "set", VETH_PEER, "up"],
    ]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True)
        yield socket.if_nametoindex(VETH), socket.if_nametoindex(VETH_PEER)
    finally:
        subprocess.run([ip, "link", "del", VETH], capture_output=True)


async def test_udp_delivery_to_a_link_local_client(rig: Rig,
                                                   link_local_pair: tuple[int, int]) -> None:
    _, client_if = link_local_pair
    server = await server_on(rig, "::")
    # The client's sockets are bound to its end of the pair: it reaches the server's address
    # through that interface (link-local: the scope is the interface one sends from).
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.bind((CLIENT_LL, 0, 0, client_if))
    client = await connect(sock, (SERVER_LL, server.port, 0, client_if),
                           f"rtsp://[{SERVER_LL}%25{VETH}]:{server.port}/cam")
    try:
        await play_udp_and_receive(server, client, here=CLIENT_LL, here_scope=client_if,
                                   there=SERVER_LL, there_scope=client_if)
        # The client is known by its address alone (no zone) for everything but sending.
        assert server.stats()["session_list"][0]["client"] == CLIENT_LL
    finally:
        await client.close()
