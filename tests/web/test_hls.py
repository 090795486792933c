"""``/hls/`` over real HTTP: the playlist and its files, blocking reloads (held, 400 far ahead,
503 when the live edge does not come in time, bounded and counted), caching headers, bad names
and paths, long query strings, the token (header, and ``?token=`` for HLS only), and what
``/api/status`` and ``/metrics`` report. Real synthetic camera, real segmenter, real aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import av
import pytest
from aiohttp.test_utils import TestClient, make_mocked_request

from ruseon_appliance.capture.ring import RingBuffer
from ruseon_appliance.config import Config
from ruseon_appliance.hls import HlsStream
from ruseon_appliance.web import hls as hls_web
from ruseon_appliance.web.app import make_app
from tests.hls.m3u8 import MediaPlaylist, parse
from tests.hls.test_playlist_conformance import FakeCamera
from tests.web.conftest import ADMIN, running_engine, serving, web_config

TOKEN = "s3cret-hls"


@contextlib.asynccontextmanager
async def hls_device(config: Config, tmp_path: Path, *, max_waiting: int = 1000,
                     fed_by_hand: bool = False,
                     ) -> AsyncIterator[tuple[HlsStream, TestClient[Any, Any]]]:
    """Capture, engine, an HLS stream and the web app. ``fed_by_hand``: the stream reads a
    ring nobody writes to, and the test feeds it fragments itself (the live edge then moves
    only when the test says so)."""
    async with running_engine(config, tmp_path) as (capture, engine):
        ring = RingBuffer(256 * 1024, 64) if fed_by_hand else capture.ring
        stream = HlsStream(ring, framerate=config.default_camera.framerate,
                           keyframe_interval=config.default_camera.keyframe_interval,
                           part_target_s=0.25, window_s=6.0, max_waiting=max_waiting)
        try:
            await stream.start()
            app = make_app(config, engine, capture, started=time.monotonic(), hls=stream)
            async with serving(app) as client:
                if not fed_by_hand:
                    assert await stream.wait_for_playlist(0, None, 20)  # one complete segment
                yield stream, client
        finally:
            await stream.stop()


@pytest.fixture
async def hls(tmp_path: Path) -> AsyncIterator[tuple[HlsStream, TestClient[Any, Any]]]:
    async with hls_device(web_config(), tmp_path) as running:
        yield running


async def raw_get(client: TestClient[Any, Any], target: str) -> tuple[int, bytes]:
    """GET ``target`` exactly as written (no client-side normalization); (status, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def parse_live(text: str, stream: HlsStream) -> MediaPlaylist:
    """:func:`parse` for a playlist of the live synthetic camera, which skips frames (or stalls)
    when the machine is busy: the parts the stream says it split at PART-TARGET may be under
    85% of it, and the one-frame parts it says outlast it may."""
    stats = stream.stats()
    return parse(text, split_parts=stats["parts_split_at_target"],
                 stalled_parts=stats["parts_over_target"])


async def get_playlist(stream: HlsStream, client: TestClient[Any, Any], query: str = "",
                       **headers: str) -> tuple[MediaPlaylist, Any]:
    response = await client.get("/hls/index.m3u8" + query, headers=headers)
    assert response.status == 200, await response.text()
    return parse_live(await response.text(), stream), response


async def test_playlist_and_files_decode_with_caching_headers(
    hls: tuple[HlsStream, TestClient[Any, Any]],
) -> None:
    stream, client = hls
    # Wait for one complete segment.
    await stream.wait_for_playlist(0, None, 10)
    playlist, response = await get_playlist(stream, client)
    assert response.content_type == "application/vnd.apple.mpegurl"
    assert response.headers["Cache-Control"] == "public, max-age=1, stale-while-revalidate=2"
    complete = [s for s in playlist.segments if s.uri]
    assert complete, playlist
    init = await client.get(f"/hls/{complete[0].map_uri}")
    segment = await client.get(f"/hls/{complete[0].uri}")
    newest_part = playlist.segments[-1].parts[-1].uri
    part = await client.get(f"/hls/{newest_part}")
    for answer in (init, segment, part):
        assert answer.status == 200
        assert answer.content_type == "video/mp4"
        cache = answer.headers["Cache-Control"]
        assert cache.startswith("public, max-age=") and cache.endswith(", immutable"), cache
        assert int(cache.split("=")[1].split(",")[0]) >= 6  # at least the window
    # init + segment is a playable fMP4 file: every sample of the segment decodes, and the
    # samples span the duration the playlist gives. (Counted from the file, not as duration x 30:
    # a camera that drops a frame under load leaves a longer sample, not a missing second.)
    body = await init.read() + await segment.read()
    container = av.open(io.BytesIO(body))
    stream_ = container.streams.video[0]
    samples = frames = 0
    span = 0.0
    for packet in container.demux(stream_):
        if packet.size:
            samples += 1
            assert packet.duration and packet.time_base, packet
            span += float(packet.duration * packet.time_base)
        frames += len(packet.decode())
    assert samples >= 25, samples  # about one second at 30 fps
    assert frames == samples, (frames, samples)
    assert abs(span - (complete[0].duration or 0)) < 0.002, (span, complete[0].duration)


async def test_blocking_reload_is_held_until_the_part_exists(
    hls: tuple[HlsStream, TestClient[Any, Any]],
) -> None:
    stream, client = hls
    live = stream.window.position
    want_msn, want_part = live.msn, live.parts  # the part after the newest
    response = await client.get(f"/hls/index.m3u8?_HLS_msn={want_msn}&_HLS_part={want_part}")
    assert response.status == 200
    playlist = parse_live(await response.text(), stream)
    assert stream.window.satisfies(want_msn, want_part)
    listed = {(s.msn, i) for s in playlist.segments for i in range(len(s.parts))}
    assert (want_msn, want_part) in listed or playlist.segments[-1].msn > want_msn
    # Keyed by its query, a blocking answer stays valid: caches may keep it.
    assert response.headers["Cache-Control"] == f"public, max-age={6 * playlist.target_duration}"
    # The preload hint names a part before it exists; asking for it holds until it does.
    hint = playlist.preload_hint
    assert hint is not None
    part = await client.get(f"/hls/{hint['URI']}")
    assert part.status == 200 and len(await part.read()) > 0
    assert stream.waits_satisfied >= 2


async def test_bad_or_far_ahead_blocking_requests_are_400(tmp_path: Path) -> None:
    # One device for all of them, fed by hand so the live edge stands still: the limits are
    # checked exactly at their boundaries (msn: newest + 2 is held, + 3 refused; part: the
    # Advance Part Limit, 3 s of parts at PART-TARGET 0.25, is 12 past the newest).
    async with hls_device(web_config(), tmp_path, fed_by_hand=True) as (stream, client):
        stream.add_fragments(list(FakeCamera(gop=60).fragments(30)), b"init")
        live = stream.window.position
        assert stream.window.part_target_s == 0.25
        for query in [
            f"?_HLS_msn={live.msn + 999_999}", f"?_HLS_msn={live.msn + 3}",
            f"?_HLS_msn={live.msn}&_HLS_part={live.parts - 1 + 13}", "?_HLS_part=1",
            "?_HLS_msn=abc", "?_HLS_msn=-1", "?_HLS_msn=1234567890123",
            "?_HLS_msn=1&_HLS_part=x",
        ]:
            started = stream.waits_satisfied + stream.waits_timed_out
            response = await client.get("/hls/index.m3u8" + query)
            assert response.status == 400, (query, await response.text())
            assert response.content_type == "application/problem+json"
            assert response.headers["Cache-Control"] == "no-store"
            assert stream.waits_satisfied + stream.waits_timed_out == started  # at once
        # Just inside the limits: held (waiting for the live edge), not refused.
        for query in [f"?_HLS_msn={live.msn + 2}",
                      f"?_HLS_msn={live.msn}&_HLS_part={live.parts - 1 + 12}"]:
            waiting = stream.waiting
            request = asyncio.ensure_future(client.get("/hls/index.m3u8" + query))
            for _ in range(1000):
                if stream.waiting > waiting or request.done():
                    break
                await asyncio.sleep(0.01)
            assert stream.waiting == waiting + 1 and not request.done(), query
            request.cancel()
            for _ in range(1000):  # the server lets go (at the latest when the hold times out)
                if stream.waiting == waiting:
                    break
                await asyncio.sleep(0.01)


async def test_unknown_names_traversal_and_long_queries_are_refused(
    hls: tuple[HlsStream, TestClient[Any, Any]],
) -> None:
    stream, client = hls
    run = stream.window.run_id
    for name in ["nothing.m4s", f"part-{run}-99999999.m4s", f"seg-{run}-99999.m4s",
                 f"init-{run}-7.mp4", "part-00000000-1.m4s", f"part-{run}-1.mp4",
                 f"seg-{run}-0.m4s..", "index.m3u8x"]:
        response = await client.get(f"/hls/{name}")
        assert response.status == 404, (name, response.status)
    # Sent byte for byte (a client library would resolve the dots itself first).
    for raw in ["/hls/../../../etc/passwd", "/hls/%2e%2e/%2e%2e/etc/passwd",
                "/hls/..%2F..%2F..%2Fetc%2Fpasswd", "/hls/%2Fetc%2Fpasswd",
                "/hls/part-%00.m4s", "/hls/..\\..\\etc\\passwd"]:
        status, body = await raw_get(client, raw)
        assert status in (400, 404), (raw, status, body[:200])
        assert b"root:" not in body
    long_query = await client.get("/hls/index.m3u8?x=" + "a" * 600)
    assert long_query.status == 414
    huge = await client.get("/hls/index.m3u8?x=" + "a" * 20000)
    assert 400 <= huge.status < 500
    # A part older than the window is gone.
    assert (await client.get(f"/hls/part-{run}-0.m4s")).status in (200, 404)


async def test_waiting_requests_are_bounded_counted_and_time_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(HlsStream, "hold_timeout_s", property(lambda self: 1.0))
    async with hls_device(web_config(), tmp_path, max_waiting=3) as (stream, client):
        live = stream.window.position
        # Two segments ahead: allowed (not 400), but it cannot arrive within the 1 s hold.
        query = f"/hls/index.m3u8?_HLS_msn={live.msn + 2}"
        held = [asyncio.ensure_future(client.get(query)) for _ in range(3)]
        for _ in range(200):
            if stream.waiting == 3:
                break
            await asyncio.sleep(0.01)
        assert stream.waiting == 3
        metrics = await (await client.get("/metrics", headers=ADMIN)).text()
        assert "ruseon_hls_blocking_outstanding 3" in metrics
        refused = await client.get(query)
        assert refused.status == 503 and refused.headers["Retry-After"] == "1"
        assert "too many" in (await refused.json())["detail"]
        answers = await asyncio.gather(*held)
        assert [a.status for a in answers] == [503, 503, 503]
        assert stream.waiting == 0
        assert stream.waits_refused == 1 and stream.waits_timed_out == 3
        metrics = await (await client.get("/metrics", headers=ADMIN)).text()
        assert "ruseon_hls_blocking_refused_total 1" in metrics
        assert "ruseon_hls_blocking_timed_out_total 3" in metrics


async def test_token_header_or_query_for_hls_only(tmp_path: Path) -> None:
    config = web_config(auth={"token": TOKEN, "viewing": "credential"})
    async with hls_device(config, tmp_path) as (stream, client):
        assert (await client.get("/hls/index.m3u8")).status == 401
        assert (await client.get("/hls/index.m3u8?token=wrong")).status == 401
        playlist, answer = await get_playlist(stream, client, Authorization=f"Bearer {TOKEN}")
        assert "token" not in (playlist.preload_hint or {}).get("URI", "")
        # Answers to authenticated requests are `public` (shared caches may store them), so
        # they must vary on the header: a cache may not hand them to a request without it.
        part = await client.get(f"/hls/{playlist.segments[-1].parts[-1].uri}",
                                headers={"Authorization": f"Bearer {TOKEN}"})
        for response in (answer, part):
            assert response.status == 200 and "public" in response.headers["Cache-Control"]
            assert response.headers.get("Vary") == "Authorization", response.headers
        # The URIs carry the token exactly when the query token is what authenticated the
        # request (what a cache in front keys on), whatever other Authorization comes along.
        basic = await client.get(f"/hls/index.m3u8?token={TOKEN}",
                                 headers={"Authorization": "Basic dXNlcjpwdw=="})
        assert basic.status == 200
        assert f'URI="part-{stream.window.run_id}' in (text := await basic.text())
        assert all(f"?token={TOKEN}" in line for line in text.splitlines() if "URI=" in line)
        # Native players get the token in the URL, and every URI in the playlist carries it.
        response = await client.get(f"/hls/index.m3u8?token={TOKEN}")
        text = await response.text()
        assert response.status == 200
        uris = [line for line in text.splitlines() if "URI=" in line or line.endswith(".m4s")
                or "m4s?" in line]
        assert uris and all(f"?token={TOKEN}" in line for line in uris)
        hinted = parse_live(text, stream).segments[-1].parts[-1].uri
        assert (await client.get(f"/hls/{hinted}")).status == 200
        assert (await client.get(f"/hls/{hinted.split('?')[0]}")).status == 401
        # Only HLS takes the token from the query: the API does not.
        assert (await client.get(f"/api/status?token={TOKEN}")).status == 401


async def test_status_and_metrics_report_clients_and_rates(
    hls: tuple[HlsStream, TestClient[Any, Any]],
) -> None:
    stream, client = hls
    for agent in ("player-a", "player-b"):
        await get_playlist(stream, client, **{"User-Agent": agent})
    status = await (await client.get("/api/status", headers=ADMIN)).json()
    section = status["hls"]
    assert section["clients"] >= 2
    assert section["requests"]["playlist"] >= 2
    assert set(section["request_rates"]) >= {"playlist", "blocking_playlist", "part"}
    assert section["stream"]["blocking_waiting"] == 0
    assert section["stream"]["codec"].startswith("avc1.")
    metrics = await (await client.get("/metrics", headers=ADMIN)).text()
    for family in ("ruseon_hls_clients", 'ruseon_hls_requests_total{kind="playlist"}',
                   'ruseon_hls_request_rate{kind="part"}', "ruseon_hls_blocking_outstanding",
                   "ruseon_hls_stream_parts_added"):
        assert family in metrics, family


async def test_thousands_of_blocking_reloads_are_bounded_and_the_board_keeps_answering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1500 blocking reloads at once against a bound of 1000: the rest are refused at once
    (503, counted), the board still answers a plain playlist and /healthz while 1000 are held,
    and every held one is answered when its segment arrives."""
    monkeypatch.setattr(HlsStream, "hold_timeout_s", property(lambda self: 60.0))
    async with hls_device(web_config(), tmp_path, max_waiting=1000, fed_by_hand=True) as (
            stream, client):
        camera = FakeCamera(gop=60)
        stream.add_fragments(list(camera.fragments(30)), b"init")  # three segments and a bit
        live = stream.window.position
        url = f"http://127.0.0.1:{client.port}/hls/index.m3u8?_HLS_msn={live.msn}"
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def blocking() -> int:
                async with session.get(url) as response:
                    await response.read()
                    return response.status

            held = [asyncio.ensure_future(blocking()) for _ in range(1500)]
            peak = 0
            for _ in range(6000):
                peak = max(peak, stream.waiting)
                if stream.waiting + stream.waits_refused >= 1500:
                    break
                await asyncio.sleep(0.01)
            assert (stream.waiting, stream.waits_refused) == (1000, 500), stream.stats()
            assert not any(h.done() and h.result() == 200 for h in held)
            # The board is not exhausted: other requests are answered meanwhile.
            assert (await client.get("/hls/index.m3u8")).status == 200
            assert (await client.get("/healthz")).status == 200
            metrics = await (await client.get("/metrics", headers=ADMIN)).text()
            assert "ruseon_hls_blocking_outstanding 1000" in metrics
            # The open segment completes: every held request is answered.
            stream.add_fragments(list(camera.fragments(9)), b"init")
            statuses = await asyncio.gather(*held)
        assert peak == 1000, peak
        assert statuses.count(503) == 500 and statuses.count(200) == 1000
        assert stream.waiting == 0 and stream.waits_satisfied >= 1000


def test_requester_tracking_stays_bounded_under_a_flood(monkeypatch: pytest.MonkeyPatch) -> None:
    """Distinct addresses/user agents (a flood, or a botnet) cost at most the bound: the oldest
    are forgotten, user agents are cut short, and expired requesters leave the count."""
    monkeypatch.setattr(hls_web, "MAX_TRACKED_CLIENTS", 100)
    now = [1000.0]
    metrics = hls_web.HlsMetrics(clock=lambda: now[0])
    for i in range(250):
        request = make_mocked_request("GET", "/hls/index.m3u8",
                                      headers={"User-Agent": f"flood-{i}-" + "x" * 10_000})
        metrics.seen(request, "playlist")
    assert metrics.clients() == 100 and len(metrics._clients) == 100
    assert all(len(agent) <= 120 for _, agent in metrics._clients)
    assert any(agent.startswith("flood-249-") for _, agent in metrics._clients)  # newest kept
    now[0] += hls_web.CLIENT_WINDOW_S + 1
    assert metrics.clients() == 0 and not metrics._clients
    assert metrics.requests["playlist"] == 250
