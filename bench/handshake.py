"""Handshake benchmark: a naive aiortc answerer against the engine, behind the same endpoint.

Both servers expose the same aiohttp WHEP-style endpoint (``POST /whep`` -> 201 + answer,
``DELETE /whep/{id}``, ``GET /sockets``), serving the same synthetic camera:

- ``naive``: the tutorial way, a new ``RTCPeerConnection`` per offer (its own certificate, its own
  ICE sockets on random ports), a pass-through track per viewer;
- ``engine``: :class:`ruseon_appliance.engine.Engine` (one certificate, one UDP port, the lean
  offer path: SDP parsed once, no per-offer codec deep copies or receiver bandwidth estimator;
  an offer of a shape answered before answered from a template, its aiortc objects built on
  the viewer's first STUN check);
- ``eager`` (with ``--modes``): the same engine without lazy sessions (every offer's aiortc
  objects built when it is answered);
- ``web`` (with ``--modes``): the same engine behind the appliance's real web application
  (``web.app.make_app``: CORS, problem and Bearer-token middlewares, ``POST /whep`` as
  ``ruseon serve`` answers it, metrics), a token configured and sent by the client.

A client in another process sends 30 sequential, then 30 concurrent offers from aiortc peers and
measures POST->answer latency and the time to ICE+DTLS connected; the server reports the CPU
time (thread time) each sequential offer took, and for the concurrent offers its CPU time from
the first POST's handler to the last answer (the client's wall-clock figures also count
whatever else the machine runs). With the 30 sequential viewers
still connected it asks the server how many UDP sockets it holds. Everything stays on 127.0.0.1.

    .venv/bin/python bench/handshake.py            # naive and engine, summary + JSON
    .venv/bin/python bench/handshake.py --viewers 10
    .venv/bin/python bench/handshake.py --modes naive engine web
    .venv/bin/python bench/handshake.py --modes eager engine   # lazy sessions off, on
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aioice.ice

# Loopback only: aioice skips 127.0.0.1 when gathering, which would leave no candidate at all in
# a network namespace with only `lo`, and would use the LAN address otherwise.
aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]  # type: ignore[assignment]

from aiohttp import ClientSession, web  # noqa: E402
from aiortc import (  # noqa: E402
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from whep_endpoint import serve_app_until_cancelled, serve_until_cancelled  # noqa: E402

from ruseon_appliance.capture.pipeline import CapturePipeline  # noqa: E402
from ruseon_appliance.config import (  # noqa: E402
    AuthConfig,
    CameraConfig,
    Config,
    HostPort,
    WebRtcConfig,
)
from ruseon_appliance.engine import Engine, OfferError  # noqa: E402
from ruseon_appliance.engine.codec_registry import CodecRegistry  # noqa: E402
from ruseon_appliance.engine.track import ViewerTrack  # noqa: E402

# The web mode's Bearer token (the client sends it in every mode; the others ignore it).
TOKEN = "handshake-bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODES = ("naive", "engine", "eager", "web")
CAMERA = CameraConfig(source="synthetic", width=320, height=240, framerate=30, bitrate=300_000,
                      keyframe_interval=60)


def udp_socket_count() -> int:
    """UDP sockets (v4 and v6) held by this process, from /proc."""
    inodes: set[str] = set()
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as fh:
                next(fh)
                inodes.update(line.split()[9] for line in fh)
        except OSError:
            continue
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            count += 1
    return count


# --- servers ---------------------------------------------------------------------------------


class BurstMeter:
    """Server CPU (thread time) from the start of the first of overlapping POSTs to the end
    of the last: for 30 concurrent offers, everything the loop did until the last answer
    (less sensitive to other processes on the machine than the client's wall-clock times)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.started = 0.0
        self.offers = 0
        self.bursts: list[tuple[int, float]] = []

    def begin(self) -> None:
        if not self.in_flight:
            self.started, self.offers = time.thread_time(), 0
        self.in_flight += 1
        self.offers += 1

    def end(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self.bursts.append((self.offers, (time.thread_time() - self.started) * 1000))

    def report(self) -> list[tuple[int, float]]:
        bursts, self.bursts = self.bursts, []
        return bursts



async def serve(mode: str, port: int) -> None:
    feed = CapturePipeline(CAMERA)
    await feed.start()
    await feed.wait_first_frame(10)
    sessions: dict[str, Any] = {}
    engine: Engine | None = None
    if mode == "web":
        await serve_web(feed, port)
        return
    if mode in ("engine", "eager"):
        engine = Engine(WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
                        Path(tempfile.mkdtemp()), feed, lazy_sessions=mode == "engine")
        await engine.start()
    else:
        registry = CodecRegistry()
        registry.install()

    offer_cpu_ms: list[float] = []
    meter = BurstMeter()

    async def post(request: web.Request) -> web.Response:
        offer = await request.text()
        started = time.thread_time()
        meter.begin()
        try:
            return await answer_offer(offer)
        finally:
            meter.end()
            # CPU of this offer (the awaits inside yield only briefly; in the sequential phase
            # little else runs meanwhile).
            offer_cpu_ms.append((time.thread_time() - started) * 1000)

    async def answer_offer(offer: str) -> web.Response:
        if engine is not None:
            try:
                session, answer = await engine.offer(offer)
            except OfferError as exc:
                return web.Response(status=400, text=exc.reason)
            return web.Response(status=201, text=answer, content_type="application/sdp",
                                headers={"Location": f"/whep/{session.id}"})
        # The tutorial way: everything per offer.
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))

        def request_keyframe(reason: str) -> None:
            feed.request_keyframe(reason)

        track = ViewerTrack(feed, frame_interval=3000, catch_up_max_frames=15,
                            keyframe_interval_frames=60,
                            # Same join behaviour as the engine's viewers (fresh IDR on join),
                            # so both servers send the same video and only the handshake differs.
                            on_keyframe_request=request_keyframe)
        transceiver = pc.addTransceiver(track, direction="sendonly")
        assert feed.stream_info is not None
        transceiver.setCodecPreferences(registry.select(feed.stream_info.profile_level_id))
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        sid = os.urandom(8).hex()
        sessions[sid] = pc
        return web.Response(status=201, text=pc.localDescription.sdp,
                            content_type="application/sdp", headers={"Location": f"/whep/{sid}"})

    async def delete(request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        if engine is not None:
            await engine.close(sid)
        elif sid in sessions:
            await sessions.pop(sid).close()
        return web.Response(status=200)

    async def sockets(request: web.Request) -> web.Response:
        cpu = list(offer_cpu_ms)
        offer_cpu_ms.clear()
        return web.json_response({"udp_sockets": udp_socket_count(), "offer_cpu_ms": cpu,
                                  "bursts": meter.report()})

    async def cleanup() -> None:
        if engine is not None:
            await engine.stop()
        await feed.stop()

    await serve_until_cancelled(
        [("POST", "/whep", post), ("DELETE", "/whep/{sid}", delete), ("GET", "/sockets", sockets)],
        port, cleanup)


async def serve_web(feed: CapturePipeline, port: int) -> None:
    """The appliance's own web application in front of the engine, token required."""
    from ruseon_appliance.web.app import make_app

    # Every offer comes from 127.0.0.1: lift the per-address share of places (default half)
    # and the viewer cap above the burst, as for the engine mode.
    config = Config(cameras=(CAMERA,), auth=AuthConfig(token=TOKEN), webrtc=WebRtcConfig(
        listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",), max_viewers=200,
        max_viewers_per_address=200))
    engine = Engine(config.webrtc, Path(tempfile.mkdtemp()), feed)
    await engine.start()
    app = make_app(config, engine, feed, started=time.monotonic())
    offer_cpu_ms: list[float] = []
    meter = BurstMeter()

    @web.middleware
    async def offer_cpu(request: web.Request, handler: Any) -> web.StreamResponse:
        # Outermost: the whole application's CPU for POST /whep (all middlewares), body read
        # included (it is in memory by then).
        if request.method != "POST" or request.path != "/whep":
            return await handler(request)  # type: ignore[no-any-return]
        started = time.thread_time()
        meter.begin()
        try:
            return await handler(request)  # type: ignore[no-any-return]
        finally:
            meter.end()
            offer_cpu_ms.append((time.thread_time() - started) * 1000)

    app.middlewares.insert(0, offer_cpu)

    async def sockets(request: web.Request) -> web.Response:
        cpu = list(offer_cpu_ms)
        offer_cpu_ms.clear()
        return web.json_response({"udp_sockets": udp_socket_count(), "offer_cpu_ms": cpu,
                                  "bursts": meter.report()})

    app.router.add_get("/sockets", sockets)
    # The bench's own route has no access level (access/policy.py): skip the start-up check
    # that refuses such routes (it stopped this mode from starting).
    from ruseon_appliance.web.app import _refuse_unclassified_routes

    app.on_startup.remove(_refuse_unclassified_routes)

    async def cleanup() -> None:
        await engine.stop()
        await feed.stop()

    await serve_app_until_cancelled(app, port, cleanup)


# --- client ----------------------------------------------------------------------------------


async def one_viewer(http: ClientSession, url: str) -> dict[str, Any]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    connected = asyncio.get_running_loop().create_future()

    def on_state() -> None:
        if pc.connectionState == "connected" and not connected.done():
            connected.set_result(time.perf_counter())

    pc.on("connectionstatechange", on_state)

    t0 = time.perf_counter()
    async with http.post(url + "/whep", data=pc.localDescription.sdp,
                         headers={"Content-Type": "application/sdp", **AUTH}) as resp:
        answer = await resp.text()
        location = resp.headers.get("Location", "")
        assert resp.status == 201, (resp.status, answer)
    t_answer = time.perf_counter()
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    t_connected = await asyncio.wait_for(connected, 30)
    return {"pc": pc, "location": location, "answer_ms": (t_answer - t0) * 1000,
            "connected_ms": (t_connected - t0) * 1000}


def summarize(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 2), "p95": round(p95, 2),
            "max": round(ordered[-1], 2)}


async def client(url: str, viewers: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    async with ClientSession(headers=AUTH) as http:
        async def close_all(items: list[dict[str, Any]]) -> None:
            for item in items:
                async with http.delete(url + item["location"]):
                    pass
                await item["pc"].close()

        sequential = [await one_viewer(http, url) for _ in range(viewers)]
        async with http.get(url + "/sockets") as resp:
            body = await resp.json()
            result["udp_sockets_with_viewers"] = body["udp_sockets"]
            result["server_cpu_per_offer_ms"] = summarize(body["offer_cpu_ms"])
        await close_all(sequential)
        await asyncio.sleep(1.0)
        concurrent = await asyncio.gather(*(one_viewer(http, url) for _ in range(viewers)))
        async with http.get(url + "/sockets") as resp:
            bursts = (await resp.json())["bursts"]
        # The concurrent offers' burst (the one with the most offers; sometimes a late one
        # is answered after the others finished, making a burst of its own).
        result["concurrent_server_cpu_ms"] = round(max(bursts)[1], 2) if bursts else 0.0
        await close_all(list(concurrent))
    for name, items in (("sequential", sequential), ("concurrent", concurrent)):
        result[name] = {"answer_ms": summarize([i["answer_ms"] for i in items]),
                        "connected_ms": summarize([i["connected_ms"] for i in items])}
    return result


# --- orchestration ---------------------------------------------------------------------------


def run_mode(mode: str, port: int, viewers: int) -> dict[str, Any]:
    server = subprocess.Popen([sys.executable, __file__, "serve", "--mode", mode,
                               "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{mode} server did not start")
        out = subprocess.run([sys.executable, __file__, "client", "--url",
                              f"http://127.0.0.1:{port}", "--viewers", str(viewers)],
                             check=True, capture_output=True, text=True, timeout=600)
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        server.terminate()
        server.wait(10)


def print_table(results: dict[str, dict[str, Any]]) -> None:
    """One column per mode, then ``naive/<mode>`` ratios (when naive ran)."""
    modes = list(results)
    others = [m for m in modes if m != "naive"] if "naive" in results else []
    print(f"{'metric':44}" + "".join(f" {m:>10}" for m in modes)
          + "".join(f" {'naive/' + m:>13}" for m in others))

    def row(label: str, values: dict[str, float], fmt: str) -> None:
        line = f"{label:44}" + "".join(f" {values[m]:>10{fmt}}" for m in modes)
        for m in others:
            line += f" {values['naive'] / values[m] if values[m] else float('nan'):>13.2f}"
        print(line)

    for phase in ("sequential", "concurrent"):
        for metric in ("answer_ms", "connected_ms"):
            for stat in ("p50", "p95", "max"):
                row(f"{phase} {metric.replace('_ms', '')} {stat} (ms)",
                    {m: results[m][phase][metric][stat] for m in modes}, ".1f")
    for stat in ("p50", "p95"):
        row(f"server CPU per offer {stat} (ms)",
            {m: results[m]["server_cpu_per_offer_ms"][stat] for m in modes}, ".2f")
    row("server CPU, concurrent, to last answer (ms)",
        {m: results[m]["concurrent_server_cpu_ms"] for m in modes}, ".1f")
    row("UDP sockets held with the viewers",
        {m: results[m]["udp_sockets_with_viewers"] for m in modes}, "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="bench", choices=["bench", "serve", "client"])
    parser.add_argument("--mode", choices=MODES, default="engine")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["naive", "engine"],
                        help="servers to measure, one after the other (default: naive engine)")
    parser.add_argument("--port", type=int, default=18480)
    parser.add_argument("--url", default="http://127.0.0.1:18480")
    parser.add_argument("--viewers", type=int, default=30)
    args = parser.parse_args()
    if args.role == "serve":
        asyncio.run(serve(args.mode, args.port))
    elif args.role == "client":
        print(json.dumps(asyncio.run(client(args.url, args.viewers))))
    else:
        results = {mode: run_mode(mode, args.port + i, args.viewers)
                   for i, mode in enumerate(args.modes)}
        print_table(results)
        print(json.dumps({"viewers": args.viewers, **results}))


if __name__ == "__main__":
    main()
