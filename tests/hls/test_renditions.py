"""A camera's HLS renditions (issue 29): the multivariant playlist lists the main stream and the
sub-stream with their real figures, passes the strict parser, and FFmpeg decodes each rendition
it names at its own size; the media playlist URLs players already use are unchanged; a camera
without a sub-stream lists its one rendition. Through the real appliance (``Appliance``), real
synthetic cameras (libx264), real HTTP, FFmpeg as the player.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import aiohttp
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    StateConfig,
    WebRtcConfig,
)
from ruseon_appliance.hls.playlist import Variant, render_multivariant
from tests.hls.m3u8 import MultivariantPlaylist, Violation, parse, parse_multivariant
from tests.substream import SUB_BITRATE, SUB_SIZE, cameras_with_substreams
from tests.tooling import free_port, require_tool

MAIN_SIZE = (1280, 720)
MAIN_BITRATE = 1_500_000
FPS = 15
TOKEN = "renditions-viewer-token"
ADMIN = {"Authorization": "Bearer renditions-admin-secret-0123456789"}


@contextlib.asynccontextmanager
async def appliance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, viewing: str = "open",
                    ) -> AsyncIterator[str]:
    """"front" (1280x720, with a 640x360 sub-stream; the default camera) and "side" (small,
    no sub-stream); the base URL."""
    cameras_with_substreams(monkeypatch, names=["front"])
    common: dict[str, Any] = {"source": "synthetic", "framerate": FPS, "keyframe_interval": FPS}
    port = free_port()
    config = Config(
        cameras=(CameraConfig(name="front", width=MAIN_SIZE[0], height=MAIN_SIZE[1],
                              bitrate=MAIN_BITRATE, **common),
                 CameraConfig(name="side", width=160, height=96, bitrate=200_000, **common)),
        http=HttpConfig(listen=HostPort("127.0.0.1", port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        auth=AuthConfig(token=ADMIN["Authorization"][7:], viewing=viewing, viewer_token=TOKEN),
        hls=HlsConfig(part_duration_s=0.5, window_s=6.0),
    )
    app = Appliance(config)
    await app.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await app.stop()


async def get_multivariant(http: aiohttp.ClientSession, url: str) -> MultivariantPlaylist:
    async with http.get(url) as response:
        text = await response.text()
        assert response.status == 200, text
        assert response.content_type == "application/vnd.apple.mpegurl"
        assert response.headers["Cache-Control"].startswith("public, max-age=1")
    return parse_multivariant(text)


async def ffmpeg_frames(url: str, frames: int = 6) -> tuple[int, bytes]:
    """FFmpeg plays ``url`` (HLS) and hands ``frames`` decoded luma planes; (rc, bytes)."""
    ffmpeg = require_tool("ffmpeg", "apt-get install ffmpeg")
    proc = await asyncio.create_subprocess_exec(
        ffmpeg, "-nostdin", "-v", "error", "-i", url, "-frames:v", str(frames), "-f", "rawvideo",
        "-pix_fmt", "gray", "-", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")
    return proc.returncode, out


async def test_multivariant_lists_both_renditions_and_ffmpeg_decodes_each_at_its_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with appliance(tmp_path, monkeypatch) as base, aiohttp.ClientSession() as http:
        url = f"{base}/hls/front/multivariant.m3u8"
        playlist = await get_multivariant(http, url)
        assert playlist.independent_segments
        assert [v.uri for v in playlist.variants] == ["index.m3u8", "sub/index.m3u8"]
        main, sub = playlist.variants
        assert (main.width, main.height) == MAIN_SIZE
        assert (sub.width, sub.height) == SUB_SIZE
        assert main.frame_rate == sub.frame_rate == FPS
        # The encoder's target is the floor of BANDWIDTH; the sub-stream is the cheaper one.
        assert main.bandwidth >= MAIN_BITRATE and sub.bandwidth >= SUB_BITRATE
        assert main.bandwidth > sub.bandwidth
        assert main.average_bandwidth is not None and sub.average_bandwidth is not None
        assert main.average_bandwidth > sub.average_bandwidth
        # Each rendition's media playlist passes the strict media playlist parser and FFmpeg
        # decodes it at its own size (the URI resolved as a player does).
        for variant, section in zip(playlist.variants, ("cameras", "sub_streams"), strict=True):
            media_url = urljoin(url, variant.uri)
            async with http.get(media_url) as response:
                assert response.status == 200
                media = await response.text()
            # A busy machine skips frames: the parts the stream says it split or stretched
            # are allowed, as in tests/web/test_hls.py.
            async with http.get(f"{base}/api/status") as response:
                stats = (await response.json())["hls"][section]["front"]
            parse(media, split_parts=stats["parts_split_at_target"],
                  stalled_parts=stats["parts_over_target"])
            frames = 6
            _, planes = await ffmpeg_frames(media_url, frames)
            assert len(planes) == frames * variant.width * variant.height, (
                variant, len(planes))
            # The codec string is the SPS's (what FFmpeg found in the init segment).
            assert variant.codecs[0].startswith("avc1.")
        # The sub-stream's media playlist is served on its own ring (its own run of names).
        async with http.get(f"{base}/hls/front/index.m3u8") as a, \
                http.get(f"{base}/hls/front/sub/index.m3u8") as b:
            assert a.status == b.status == 200
            main_names = {ln for ln in (await a.text()).splitlines() if ln.startswith("seg-")}
            sub_names = {ln for ln in (await b.text()).splitlines() if ln.startswith("seg-")}
            assert main_names and sub_names and not main_names & sub_names

        # The unnamed routes are the default camera's: its multivariant playlist names the
        # sub-stream's under the camera's name (there is no /hls/sub/: that is a camera name).
        default = await get_multivariant(http, f"{base}/hls/multivariant.m3u8")
        assert [v.uri for v in default.variants] == ["index.m3u8", "front/sub/index.m3u8"]
        async with http.get(urljoin(f"{base}/hls/", default.variants[1].uri)) as response:
            assert response.status == 200
            assert "#EXT-X-PART-INF" in await response.text()
        async with http.get(f"{base}/api/status") as response:
            status = await response.json()
        assert status["hls"]["requests"]["multivariant"] >= 2, status["hls"]
        assert status["hls"]["sub_streams"]["front"]["parts_added"] > 0, status["hls"]
        async with http.get(f"{base}/metrics", headers=ADMIN) as response:
            metrics = await response.text()
        assert 'ruseon_camera_sub_hls_parts_added{camera="front"}' in metrics
        assert 'ruseon_camera_sub_hls_parts_added{camera="side"}' not in metrics
        assert 'ruseon_hls_requests_total{kind="multivariant"}' in metrics


async def test_a_camera_without_a_substream_lists_its_one_rendition_and_bad_queries_are_400(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with appliance(tmp_path, monkeypatch) as base, aiohttp.ClientSession() as http:
        playlist = await get_multivariant(http, f"{base}/hls/side/multivariant.m3u8")
        assert [(v.uri, v.width, v.height) for v in playlist.variants] == [
            ("index.m3u8", 160, 96)]
        async with http.get(f"{base}/hls/side/sub/index.m3u8") as response:
            assert response.status == 404
            assert "nothing at /hls/side/sub/index.m3u8" in (await response.json())["detail"]
        # The media playlist URL players already use is a media playlist, as before.
        async with http.get(f"{base}/hls/side/index.m3u8") as response:
            assert "#EXT-X-TARGETDURATION" in await response.text()
        for query, status in (("?_HLS_msn=1", 400), ("?_HLS_part=0", 400),
                              ("?x=" + "a" * 600, 414)):
            async with http.get(f"{base}/hls/front/multivariant.m3u8{query}") as response:
                assert response.status == status, query
                assert response.content_type == "application/problem+json", query
        async with http.get(f"{base}/hls/nobody/multivariant.m3u8") as response:
            assert response.status == 404
            assert "no camera named 'nobody'" in (await response.json())["detail"]


async def test_a_token_in_the_query_goes_on_every_variant_uri_and_strangers_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with appliance(tmp_path, monkeypatch, viewing="credential") as base, \
            aiohttp.ClientSession() as http:
        url = f"{base}/hls/front/multivariant.m3u8"
        for headers in ({}, {"Authorization": "Bearer wrong-token-entirely"}):
            async with http.get(url, headers=headers) as response:
                assert response.status == 401
                assert "EXT-X-STREAM-INF" not in await response.text()
        async with http.get(f"{base}/hls/front/sub/index.m3u8") as response:
            assert response.status == 401
        # A native player given ?token= needs it on each URI that follows; a Bearer client
        # does not get it written into the playlist.
        playlist = await get_multivariant(http, f"{url}?token={TOKEN}")
        assert [v.uri for v in playlist.variants] == [
            f"index.m3u8?token={TOKEN}", f"sub/index.m3u8?token={TOKEN}"]
        _, planes = await ffmpeg_frames(urljoin(url, playlist.variants[1].uri), 2)
        assert len(planes) == 2 * SUB_SIZE[0] * SUB_SIZE[1]
        async with http.get(url, headers={"Authorization": f"Bearer {TOKEN}"}) as response:
            assert response.status == 200
            text = await response.text()
        assert "token" not in text and "sub/index.m3u8" in text


def test_the_rendered_multivariant_passes_and_the_parser_refuses_what_breaks_the_rules() -> None:
    variants = [Variant("index.m3u8", 2_100_000, 1_600_000, "avc1.64001f", 1280, 720, 30.0),
                Variant("sub/index.m3u8", 600_000, 480_000, "avc1.42c01e", 640, 360, 29.97)]
    text = render_multivariant(variants, query="?token=a%2Fb")
    parsed = parse_multivariant(text)
    assert [(v.uri, v.bandwidth, v.average_bandwidth, v.codecs, v.width, v.height, v.frame_rate)
            for v in parsed.variants] == [
        ("index.m3u8?token=a%2Fb", 2_100_000, 1_600_000, ["avc1.64001f"], 1280, 720, 30.0),
        ("sub/index.m3u8?token=a%2Fb", 600_000, 480_000, ["avc1.42c01e"], 640, 360, 29.97)]
    inf = text.splitlines()[3]
    broken = {
        "a media playlist tag": text + "#EXT-X-TARGETDURATION:2\n",
        "without BANDWIDTH": text.replace("BANDWIDTH=2100000,", "", 1),
        "above the peak": text.replace("AVERAGE-BANDWIDTH=1600000", "AVERAGE-BANDWIDTH=3000000"),
        "CODECS missing": text.replace(',CODECS="avc1.64001f"', "", 1),
        "not H.264's": text.replace("avc1.64001f", "mp4a.40.2", 1),
        "not WxH": text.replace("RESOLUTION=1280x720", "RESOLUTION=1280", 1),
        "FRAME-RATE missing": text.replace(",FRAME-RATE=30.000", "", 1),
        "followed by its URI": text.replace("\nindex.m3u8?token=a%2Fb\n", "\n", 1),
        "appears twice": text.replace(inf, inf + ",BANDWIDTH=1", 1),
        "without EXT-X-STREAM-INF": text + "stray.m3u8\n",
        "#EXTM3U": text.replace("#EXTM3U\n", "", 1),
    }
    for rule, playlist in broken.items():
        with pytest.raises(Violation, match=rule):
            parse_multivariant(playlist)
    # With sound (issue 30): the H.264 first, then AAC-LC; anything else is refused.
    with_sound = text.replace('"avc1.64001f"', '"avc1.64001f,mp4a.40.2"', 1)
    assert parse_multivariant(with_sound).variants[0].codecs == ["avc1.64001f", "mp4a.40.2"]
    for codecs in ("mp4a.40.2,avc1.64001f", "avc1.64001f,opus", "avc1.64001f,avc1.42c01e"):
        with pytest.raises(Violation, match=r"not H\.264's"):
            parse_multivariant(text.replace('"avc1.64001f"', f'"{codecs}"', 1))
