"""ONVIF media profiles of a camera with a sub-stream (issue 29), through Home Assistant's own
client (onvif-zeep-async) against a running Appliance: two profiles for that camera, each with
its real video encoder configuration, its own stream URI (the sub-stream's is
``rtsp://HOST:PORT/<camera>/sub``, which FFmpeg decodes at the sub-stream's size), and the
configuration options of each; a camera without one keeps its single profile."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ruseon_appliance.app import Appliance
from tests.onvif.conftest import SIZES, appliance_config
from tests.onvif.test_onvif_clients import _decode_size, camera_of
from tests.rtsp.test_rtsp_clients import decode_rtsp
from tests.substream import cameras_with_substreams

SUB = (160, 96)
SUB_KBPS = 100
RTSP_SETUP = {"Stream": "RTP-Unicast", "Transport": {"Protocol": "RTSP"}}


@pytest.fixture
async def appliance(tmp_path: object, monkeypatch: pytest.MonkeyPatch
                    ) -> AsyncIterator[Appliance]:
    """The ONVIF tests' two cameras; "front" (320x240) has a 160x96 sub-stream at 100 kbit/s."""
    cameras_with_substreams(monkeypatch, names=["front"], size=SUB, bitrate=SUB_KBPS * 1000)
    app = Appliance(appliance_config(tmp_path))  # type: ignore[arg-type]
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


async def test_get_profiles_shows_main_and_sub_with_their_encoder_configurations(
        appliance: Appliance) -> None:
    cam = camera_of(appliance)
    try:
        await cam.update_xaddrs()
        media = await cam.create_media_service()
        profiles = await media.GetProfiles()
        # Every main profile first (their positions as before), then the sub-streams.
        assert [p.token for p in profiles] == ["front", "back", "front.sub"]
        expected = {"front": (SIZES["front"], 400), "front.sub": (SUB, SUB_KBPS),
                    "back": (SIZES["back"], 400)}
        for profile in profiles:
            size, kbps = expected[profile.token]
            encoder = profile.VideoEncoderConfiguration
            assert encoder.token == f"vec_{profile.token}"
            assert encoder.Encoding == "H264"
            assert (encoder.Resolution.Width, encoder.Resolution.Height) == size, profile.token
            assert encoder.RateControl.FrameRateLimit == 15  # UniFi needs it filled
            assert encoder.RateControl.BitrateLimit == kbps, profile.token
            assert encoder.H264.GovLength == 30
        # Both of front's profiles are one sensor: the same video source configuration.
        front, sub = profiles[0], profiles[2]
        assert sub.VideoSourceConfiguration.token == front.VideoSourceConfiguration.token
        assert sub.VideoSourceConfiguration.UseCount == 2
        assert sub.VideoSourceConfiguration.Bounds.width == SIZES["front"][0]
        capabilities = await media.GetServiceCapabilities()
        assert capabilities.ProfileCapabilities.MaximumNumberOfProfiles == 3

        # Stream and snapshot URIs per profile.
        assert appliance.rtsp is not None
        port = appliance.rtsp.port
        uris = {}
        for token in ("front", "front.sub", "back"):
            uris[token] = (await media.GetStreamUri({"StreamSetup": RTSP_SETUP,
                                                     "ProfileToken": token})).Uri
        assert uris == {"front": f"rtsp://127.0.0.1:{port}/front",
                        "front.sub": f"rtsp://127.0.0.1:{port}/front/sub",
                        "back": f"rtsp://127.0.0.1:{port}/back"}
        snapshot = await media.GetSnapshotUri({"ProfileToken": "front.sub"})
        assert snapshot.Uri.endswith("/snapshot/front.jpg?stream=sub")

        # The options cover both, by profile and by configuration token.
        for query in ({"ProfileToken": "front.sub"}, {"ConfigurationToken": "vec_front.sub"}):
            options = await media.GetVideoEncoderConfigurationOptions(query)
            available = options.H264.ResolutionsAvailable[0]
            assert (available.Width, available.Height) == SUB, query
            assert options.H264.FrameRateRange.Max == 15
        options = await media.GetVideoEncoderConfigurationOptions({"ProfileToken": "front"})
        available = options.H264.ResolutionsAvailable[0]
        assert (available.Width, available.Height) == SIZES["front"]
        source_options = await media.GetVideoSourceConfigurationOptions(
            {"ProfileToken": "front.sub"})
        assert source_options.BoundsRange.WidthRange.Max == SIZES["front"][0]
        encoder = await media.GetVideoEncoderConfiguration(
            {"ConfigurationToken": "vec_front.sub"})
        assert (encoder.Resolution.Width, encoder.Resolution.Height) == SUB
        encoders = await media.GetVideoEncoderConfigurations()
        assert [e.token for e in encoders] == ["vec_front", "vec_back", "vec_front.sub"]
        compatible = await media.GetCompatibleVideoEncoderConfigurations(
            {"ProfileToken": "front.sub"})
        assert [e.token for e in compatible] == ["vec_front.sub"]
        guaranteed = await media.GetGuaranteedNumberOfVideoEncoderInstances(
            {"ConfigurationToken": "vsc_front"})
        assert guaranteed.TotalNumber == 2
        one = await media.GetProfile({"ProfileToken": "front.sub"})
        assert one.token == "front.sub" and one.VideoEncoderConfiguration.Resolution.Width == 160
    finally:
        await cam.close()


async def test_ffmpeg_decodes_the_sub_profiles_stream_uri_over_rtsp(
        appliance: Appliance) -> None:
    """Needs the RTSP server's ``/<camera>/sub`` (the sub-stream core's branch)."""
    cam = camera_of(appliance)
    try:
        await cam.update_xaddrs()
        media = await cam.create_media_service()
        uri = (await media.GetStreamUri({"StreamSetup": RTSP_SETUP,
                                         "ProfileToken": "front.sub"})).Uri
    finally:
        await cam.close()
    assert await asyncio.to_thread(_decode_size, uri) == SUB
    for transport in ("tcp", "udp"):
        decoded = await asyncio.to_thread(decode_rtsp, uri, transport, 5)
        assert decoded["first_key"] is True and len(decoded["stamps"]) >= 5, transport
        assert decoded["errors"] == [], transport
