"""``listen = "[::]:PORT"`` (the example the config's own error message gives) means every
address of both families, for HTTP, RTSP and the WebRTC UDP port alike. asyncio alone makes a
``::`` TCP socket IPv6-only: the device page and RTSP were out of reach of every IPv4 client
(most of a LAN) while the UDP mux, which binds both itself, was not."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    CameraConfig,
    Config,
    HostPort,
    HttpConfig,
    RtspConfig,
    StateConfig,
    WebRtcConfig,
)


def free_dual_stack_port(kind: int) -> int:
    """A port free right now on both families (bound dual-stack and released)."""
    with socket.socket(socket.AF_INET6, kind) as sock:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", 0))
        port: int = sock.getsockname()[1]
        return port


async def rtsp_options(host: str, port: int) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"OPTIONS rtsp://{host}:{port}/ RTSP/1.0\r\nCSeq: 1\r\n\r\n".encode())
        async with asyncio.timeout(30):
            return (await reader.readuntil(b"\r\n\r\n")).decode()
    finally:
        writer.close()


def udp_ports_bound() -> dict[int, set[str]]:
    """Local UDP ports of this process's sockets by family ("4"/"6"), from /proc."""
    ports: dict[int, set[str]] = {}
    for family, path in (("4", "/proc/net/udp"), ("6", "/proc/net/udp6")):
        for line in Path(path).read_text().splitlines()[1:]:
            local = line.split()[1]
            ports.setdefault(int(local.rsplit(":", 1)[1], 16), set()).add(family)
    return ports


async def test_an_unspecified_ipv6_listen_serves_ipv4_and_ipv6(tmp_path: Path) -> None:
    http_port = free_dual_stack_port(socket.SOCK_STREAM)
    rtsp_port = free_dual_stack_port(socket.SOCK_STREAM)
    udp_port = free_dual_stack_port(socket.SOCK_DGRAM)
    app = Appliance(Config(
        cameras=(CameraConfig(name="cam", source="synthetic", width=160, height=96,
                              framerate=30, keyframe_interval=30, bitrate=200_000),),
        http=HttpConfig(listen=HostPort("::", http_port)),
        webrtc=WebRtcConfig(listen=HostPort("::", udp_port), advertise=("127.0.0.1",)),
        rtsp=RtspConfig(enable=True, listen=HostPort("::", rtsp_port)),
        state=StateConfig(dir=str(tmp_path / "state"))))
    await app.start()
    try:
        async with aiohttp.ClientSession() as http:
            for base in (f"http://127.0.0.1:{http_port}", f"http://[::1]:{http_port}"):
                async with http.get(f"{base}/healthz") as response:
                    assert response.status == 200, (base, await response.text())
        for host in ("127.0.0.1", "::1"):
            answer = await rtsp_options(host, rtsp_port)
            assert answer.startswith("RTSP/1.0 200 OK"), (host, answer)
        assert udp_ports_bound().get(udp_port) == {"4", "6"}
    finally:
        await app.stop()
