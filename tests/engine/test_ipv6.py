"""IPv6 (issue 12): a viewer over ``::1`` only, and one dual-stack port serving IPv4 and IPv6
viewers at once. Real aiortc viewers over real UDP, decoding what they receive."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import aioice.ice
import pytest
from aiortc.sdp import SessionDescription

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.config import HostPort
from ruseon_appliance.engine import Engine, aiortc_internals
from tests.engine.conftest import Viewer, connect_viewer, wait_for, webrtc_config


def client_gathers(monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    """The next client peers offer exactly one host candidate, ``address``."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses",
                        lambda use_ipv4, use_ipv6: [address])


def answer_candidates(viewer: Viewer) -> list[tuple[str, int]]:
    media = SessionDescription.parse(viewer.answer).media
    return [(c.ip, c.port) for m in media for c in m.ice_candidates]


def client_remote(viewer: Viewer) -> tuple[str, int]:
    """The server address the client's nominated pair points at."""
    (conn,) = aiortc_internals.ice_connection_of(viewer.pc)
    ((_, remote),) = aiortc_internals.nominated_addresses(conn)
    return remote


async def test_a_viewer_over_ipv6_loopback(feed: CapturePipeline, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(webrtc_config(listen=HostPort("::1", 0), advertise=("::1",)),
                    tmp_path / "s", feed)
    await engine.start()
    client_gathers(monkeypatch, "::1")
    viewer: Viewer | None = None
    try:
        assert engine.mux.families == [socket.AF_INET6]
        viewer = await connect_viewer(engine)
        await wait_for(lambda: viewer is not None and viewer.frames >= 10, timeout=40)
        assert answer_candidates(viewer) == [("::1", engine.udp_port)]
        assert client_remote(viewer) == ("::1", engine.udp_port)
        session = engine.sessions[viewer.session_id]
        assert session.state == "connected"
        (route,) = engine.mux.routes_for(session.ufrag)
        assert route[0] == "::1"
    finally:
        if viewer is not None:
            await viewer.close()
        await engine.stop()


async def test_one_dual_stack_port_serves_ipv4_and_ipv6_viewers_at_once(
        feed: CapturePipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(webrtc_config(listen=HostPort("::", 0), advertise=("127.0.0.1", "::1")),
                    tmp_path / "s", feed)
    await engine.start()
    viewers: list[Viewer] = []
    try:
        assert sorted(engine.mux.families) == sorted([socket.AF_INET, socket.AF_INET6])
        client_gathers(monkeypatch, "127.0.0.1")
        viewers.append(await connect_viewer(engine))
        client_gathers(monkeypatch, "::1")
        viewers.append(await connect_viewer(engine))
        await wait_for(lambda: all(v.frames >= 10 for v in viewers), timeout=40)
        port = engine.udp_port
        for v in viewers:  # both answers offer both families, on the one port
            assert sorted(answer_candidates(v)) == sorted([("127.0.0.1", port), ("::1", port)])
        assert client_remote(viewers[0]) == ("127.0.0.1", port)
        assert client_remote(viewers[1]) == ("::1", port)
        routes = [engine.mux.routes_for(engine.sessions[v.session_id].ufrag) for v in viewers]
        assert [{h for h, _ in r} for r in routes] == [{"127.0.0.1"}, {"::1"}]
        assert all(s.state == "connected" for s in engine.sessions.values())
        # Both keep decoding side by side.
        counts = [v.frames for v in viewers]
        await wait_for(lambda: all(v.frames >= c + 10 for v, c in zip(viewers, counts,
                                                                      strict=True)))
    finally:
        await asyncio.gather(*(v.close() for v in viewers))
        await engine.stop()


def test_the_command_line_takes_ipv6_rtc_and_advertise(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruseon_appliance", "config", "--rtc", "[::1]:8189",
         "--advertise", "::1", "--state-dir", str(tmp_path)],
        capture_output=True, text=True, check=True)
    assert 'listen = "[::1]:8189"' in out.stdout, out.stdout
    assert 'advertise = ["::1"]' in out.stdout, out.stdout
