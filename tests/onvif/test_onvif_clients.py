"""Home Assistant's ONVIF config flow replayed with its own client (onvif-zeep-async) against
a running Appliance on loopback, step by step as homeassistant/components/onvif does it."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import os
from typing import Any

import aiohttp
import av
import pytest
import zeep.exceptions
from onvif import ONVIFCamera
from onvif.exceptions import ONVIFError

from ruseon_appliance.app import Appliance
from ruseon_appliance.onvif.interfaces import derived_mac
from tests.onvif.conftest import SECRET, SIZES, appliance_config
from tests.onvif.test_onvif_soap import ENV, token
from tests.rtsp.test_rtsp_clients import decode_rtsp

WSDL = f"{os.path.dirname(__import__('onvif').__file__)}/wsdl/"


def camera_of(app: Appliance, user: str | None = "admin", password: str | None = SECRET,
              **kwargs: Any) -> ONVIFCamera:
    port = app.config.http.listen.port
    # As Home Assistant's get_device(): no adjust_time.
    return ONVIFCamera("127.0.0.1", port, user, password, WSDL, no_cache=True, **kwargs)


async def test_home_assistant_config_flow_adopts_every_camera(appliance: Appliance) -> None:
    cam = camera_of(appliance)
    try:
        # config_flow.async_setup_profiles: update_xaddrs (GetSystemDateAndTime unless
        # adjust_time is off, then GetServices), GetCapabilities, GetNetworkInterfaces.
        await cam.update_xaddrs()
        assert cam.xaddrs["http://www.onvif.org/ver10/media/wsdl"].endswith("/onvif/media_service")
        capabilities = await cam.get_capabilities()
        assert capabilities is not None
        assert capabilities["Media"]["StreamingCapabilities"]["RTP_RTSP_TCP"] is True
        devicemgmt = await cam.create_devicemgmt_service()
        interfaces = await devicemgmt.GetNetworkInterfaces()
        enabled = [i for i in interfaces if i.Enabled and i.Info]
        assert len(enabled) == 1
        mac = enabled[0].Info.HwAddress
        serial = appliance.onvif.identity.serial if appliance.onvif else ""
        # Loopback has no MAC: a stable locally administered one from the serial stands in.
        assert enabled[0].Info.Name == "lo" and mac == derived_mac(serial)
        assert int(mac.split(":")[0], 16) & 0x02 and mac != "00:00:00:00:00:00"
        # The H264 check (else no_h264).
        media = await cam.create_media_service()
        profiles = await media.GetProfiles()
        assert [p.token for p in profiles] == list(SIZES)
        for profile in profiles:
            encoder = profile.VideoEncoderConfiguration
            assert encoder.Encoding == "H264"
            assert (encoder.Resolution.Width, encoder.Resolution.Height) == SIZES[profile.token]
            assert encoder.RateControl.FrameRateLimit == 15
            assert encoder.RateControl.BitrateLimit == 400
            assert profile.VideoSourceConfiguration.Bounds.width == SIZES[profile.token][0]
        # device.async_setup: the clock, the device, capabilities, profiles, stream URIs.
        when = await devicemgmt.GetSystemDateAndTime()
        utc = when.UTCDateTime
        device_time = dt.datetime(utc.Date.Year, utc.Date.Month, utc.Date.Day, utc.Time.Hour,
                                  utc.Time.Minute, utc.Time.Second, tzinfo=dt.UTC)
        assert abs((device_time - dt.datetime.now(dt.UTC)).total_seconds()) < 60
        assert when.DateTimeType == "NTP"  # HA would try SetSystemDateAndTime on "Manual"
        info = await devicemgmt.GetDeviceInformation()
        assert info.SerialNumber == serial and info.Manufacturer == "RUSEON"
        media_capabilities = await media.GetServiceCapabilities()
        assert media_capabilities.SnapshotUri is True
        scopes = [s.ScopeItem for s in await devicemgmt.GetScopes()]
        assert "onvif://www.onvif.org/Profile/Streaming" in scopes
        assert (await devicemgmt.GetHostname()).Name
        for name in SIZES:
            uri = await media.GetStreamUri({
                "StreamSetup": {"Stream": "RTP-Unicast", "Transport": {"Protocol": "RTSP"}},
                "ProfileToken": name})
            assert appliance.rtsp is not None
            assert uri.Uri == f"rtsp://127.0.0.1:{appliance.rtsp.port}/{name}"
        # FFmpeg decodes the stream URI over RTSP/TCP, at the profile's size.
        result = await asyncio.to_thread(_decode_size, uri.Uri)
        assert result == SIZES["back"]
        for transport in ("tcp", "udp"):  # RTP over the RTSP connection, and over UDP
            decoded = await asyncio.to_thread(decode_rtsp, uri.Uri, transport, 5)
            assert decoded["first_key"] is True and len(decoded["stamps"]) >= 5, transport
            assert decoded["errors"] == [], transport
        # The snapshot as Home Assistant fetches it (its snapshot client, digest middleware).
        jpeg = await cam.get_snapshot("front")
        assert jpeg is not None and jpeg[:2] == b"\xff\xd8"
        with av.open(io.BytesIO(jpeg)) as picture:
            frame = next(picture.decode(video=0))
            assert (frame.width, frame.height) == SIZES["front"]
        # Options a client asks for before it would change anything.
        options = await media.GetVideoEncoderConfigurationOptions({"ProfileToken": "front"})
        assert options.H264.FrameRateRange.Max == 15
        # Nothing changes over ONVIF, even for the admin account.
        with pytest.raises(zeep.exceptions.Fault, match="changes nothing"):
            await devicemgmt.SystemReboot()
    finally:
        await cam.close()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {SECRET}"}) as http:
        base = f"http://127.0.0.1:{appliance.config.http.listen.port}"
        async with http.get(f"{base}/api/status") as response:
            status = (await response.json())["onvif"]
    assert status["profiles"] == list(SIZES)
    assert status["requests"]["GetProfiles"] == 1 and status["auth_failures"] == 0
    assert status["faults"] == {"ActionNotSupported": 1}


def _decode_size(url: str) -> tuple[int, int]:
    with av.open(url, options={"rtsp_transport": "tcp", "timeout": "10000000"},
                 timeout=20) as container:
        for frame in container.decode(video=0):
            return frame.width, frame.height
    raise AssertionError("no frame")


async def test_a_stranger_gets_the_clock_and_nothing_else(appliance: Appliance) -> None:
    stranger = camera_of(appliance)  # its authless_ calls carry no UsernameToken
    try:
        devicemgmt = await stranger.create_devicemgmt_service()
        when = await devicemgmt.authless_GetSystemDateAndTime()  # cameras answer it to anyone
        assert when.UTCDateTime.Date.Year >= 2024
        for name, args in (("GetDeviceInformation", ()), ("GetNetworkInterfaces", ()),
                           ("GetCapabilities", ()), ("GetScopes", ()),
                           ("GetServices", ({"IncludeCapability": False},)),
                           ("SystemReboot", ())):
            with pytest.raises(zeep.exceptions.Fault, match="needs a WS-Security UsernameToken"):
                await getattr(devicemgmt, f"authless_{name}")(*args)
        # It cannot learn the media service's address; told it, it gets no profile either.
        port = appliance.config.http.listen.port
        stranger.xaddrs["http://www.onvif.org/ver10/media/wsdl"] = \
            f"http://127.0.0.1:{port}/onvif/media_service"
        media = await stranger.create_media_service()
        for name in ("GetProfiles", "GetVideoSources"):
            with pytest.raises(zeep.exceptions.Fault, match="needs a WS-Security UsernameToken"):
                await getattr(media, f"authless_{name}")()
    finally:
        await stranger.close()
    assert appliance.credentials.throttle.failures.get("onvif", 0) == 0  # no credential, no try


async def test_wrong_credentials_are_refused_and_throttled(appliance: Appliance) -> None:
    throttle = appliance.credentials.throttle
    throttle.base_wait_s = 600.0  # the wait outlasts any slow step of this test
    for attempt in range(throttle.free_failures):
        cam = camera_of(appliance, "admin", f"guess-{attempt}")
        try:
            devicemgmt = await cam.create_devicemgmt_service()
            with pytest.raises((zeep.exceptions.Fault, ONVIFError), match="wrong user"):
                await devicemgmt.GetDeviceInformation()
        finally:
            await cam.close()
    assert throttle.failures["onvif"] == throttle.free_failures
    # Now even the right password waits (429, Retry-After) from this address.
    cam = camera_of(appliance)
    try:
        devicemgmt = await cam.create_devicemgmt_service()
        with pytest.raises((zeep.exceptions.Fault, ONVIFError), match="too many wrong"):
            await devicemgmt.GetDeviceInformation()
    finally:
        await cam.close()
    assert throttle.throttled["onvif"] == 1
    url = f"http://127.0.0.1:{appliance.config.http.listen.port}/onvif/device_service"
    request = ENV.format(header=token(SECRET), body="<tds:GetDeviceInformation/>")
    async with aiohttp.ClientSession() as http, http.post(url, data=request) as response:
        assert response.status == 429 and 0 < int(response.headers["Retry-After"]) <= 300
        assert "NotAuthorized" in await response.text()
    # The clock stays open to a waiting address (it presents nothing).
    request = ENV.format(header="", body="<tds:GetSystemDateAndTime/>")
    async with aiohttp.ClientSession() as http, http.post(url, data=request) as response:
        assert response.status == 200
    # A wrong user name with the right password is wrong too; PasswordText works as well.
    throttle._entries.clear()
    # (the address no longer waits, so its admin Bearer is served)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {SECRET}"}) as http:
        base = f"http://127.0.0.1:{appliance.config.http.listen.port}"
        async with http.get(f"{base}/metrics") as response:
            metrics = await response.text()
    assert f'ruseon_auth_failures_total{{protocol="onvif"}} {throttle.free_failures}.0' in metrics
    assert 'ruseon_auth_throttled_total{protocol="onvif"} 2.0' in metrics  # zeep's + the raw one
    for user, password, encrypt, ok in (("root", SECRET, True, False),
                                        ("admin", SECRET, False, True)):
        cam = camera_of(appliance, user, password, encrypt=encrypt)
        try:
            devicemgmt = await cam.create_devicemgmt_service()
            if ok:
                assert (await devicemgmt.GetDeviceInformation()).Model
            else:
                with pytest.raises((zeep.exceptions.Fault, ONVIFError), match="wrong user"):
                    await devicemgmt.GetDeviceInformation()
        finally:
            await cam.close()


async def test_with_rtsp_off_the_stream_uri_says_why(tmp_path: Any) -> None:
    app = Appliance(appliance_config(tmp_path, rtsp=False, username="nvr", password="p4ss"))
    await app.start()
    try:
        cam = camera_of(app, "nvr", "p4ss")
        try:
            await cam.update_xaddrs()
            media = await cam.create_media_service()
            assert len(await media.GetProfiles()) == 2
            with pytest.raises(zeep.exceptions.Fault, match=r"RTSP is off.*\[rtsp\] enable"):
                await media.GetStreamUri({"StreamSetup": {"Stream": "RTP-Unicast",
                                                          "Transport": {"Protocol": "RTSP"}},
                                          "ProfileToken": "front"})
            uri = await media.GetSnapshotUri({"ProfileToken": "back"})
            assert uri.Uri.endswith("/snapshot/back.jpg")
        finally:
            await cam.close()
        # The override replaces the admin secret for ONVIF.
        cam = camera_of(app, "admin", SECRET)
        try:
            devicemgmt = await cam.create_devicemgmt_service()
            with pytest.raises((zeep.exceptions.Fault, ONVIFError), match="wrong user"):
                await devicemgmt.GetDeviceInformation()
        finally:
            await cam.close()
    finally:
        await app.stop()


def _motion(messages: Any) -> list[tuple[str, str, str, str]]:
    """(topic, operation, source, state) of each notification, read as Home Assistant's
    onvif/parsers.py reads them."""
    out = []
    for msg in messages.NotificationMessage:
        topic = msg.Topic._value_1.rstrip("/.")
        payload = msg.Message._value_1
        out.append((topic, payload.PropertyOperation, payload.Source.SimpleItem[0].Value,
                    payload.Data.SimpleItem[0].Value))
    return out


async def test_a_pullpoint_delivers_motion_alarm_true_and_false(appliance: Appliance) -> None:
    assert appliance.onvif is not None
    events = appliance.onvif.events
    cam = camera_of(appliance)
    try:
        await cam.update_xaddrs()
        capabilities = await cam.get_capabilities()
        assert capabilities is not None and capabilities["Events"]["WSPullPointSupport"] is True
        # Home Assistant's event.py: a PullPoint manager, a synchronization point, then pulls.
        manager = await cam.create_pullpoint_manager(dt.timedelta(seconds=60), lambda: None)
        await manager.set_synchronization_point()
        service = manager.get_service()
        pull = {"MessageLimit": 100, "Timeout": dt.timedelta(seconds=5)}
        first = _motion(await service.PullMessages(pull))
        # The subscription's start and the synchronization point: every camera, no motion.
        initialized = [m for m in first if m[0] == "tns1:VideoSource/MotionAlarm"]
        assert {(m[2], m[3]) for m in initialized} == {("src_front", "false"),
                                                       ("src_back", "false")}
        assert all(m[1] == "Initialized" for m in first)
        # A pull that waits is woken by the motion event: published on the appliance's event
        # bus as a camera's motion detector publishes it (app.py hands it to ONVIF).
        waiting = asyncio.ensure_future(service.PullMessages(
            {"MessageLimit": 100, "Timeout": dt.timedelta(seconds=20)}))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        appliance.events.publish("motion_started", camera="front", event_id="e1", score=0.2)
        started = _motion(await asyncio.wait_for(waiting, 15))
        assert ("tns1:VideoSource/MotionAlarm", "Changed", "src_front", "true") in started
        assert ("tns1:RuleEngine/CellMotionDetector/Motion", "Changed", "vsc_front",
                "true") in started
        appliance.events.publish("motion_ended", camera="front", event_id="e1", score=0.2)
        ended = _motion(await service.PullMessages(pull))
        assert ("tns1:VideoSource/MotionAlarm", "Changed", "src_front", "false") in ended
        assert events.stats()["subscriptions"] == 1
        await manager.shutdown()  # Unsubscribe
        assert events.stats()["subscriptions"] == 0
        with pytest.raises(zeep.exceptions.Fault, match="no such subscription"):
            await service.PullMessages(pull)
    finally:
        await cam.close()


async def test_the_onvif_account_plays_the_stream_uri_it_was_given(tmp_path: Any) -> None:
    """An NVR adopts the camera with ``[onvif] username``/``password`` (not the admin secret)
    and plays the URI GetStreamUri gave it with the same account; viewing needs a credential
    here, so RTSP refuses that URI without it or with a wrong password."""
    import dataclasses
    import urllib.parse

    from ruseon_appliance.config import AuthConfig

    user, password = "nvr", "nvr-password-0123456789"
    config = appliance_config(tmp_path, username=user, password=password)
    config = dataclasses.replace(config, auth=AuthConfig(token=SECRET, viewing="credential"))
    app = Appliance(config)
    await app.start()
    try:
        cam = camera_of(app, user, password)
        try:
            await cam.update_xaddrs()
            media = await cam.create_media_service()
            uri = (await media.GetStreamUri({
                "StreamSetup": {"Stream": "RTP-Unicast", "Transport": {"Protocol": "RTSP"}},
                "ProfileToken": "back"})).Uri
        finally:
            await cam.close()
        parts = urllib.parse.urlsplit(uri)

        def with_login(secret: str) -> str:
            return parts._replace(netloc=f"{user}:{secret}@{parts.netloc}").geturl()

        decoded = await asyncio.to_thread(decode_rtsp, with_login(password), "tcp", 5)
        assert decoded["first_key"] is True and len(decoded["stamps"]) >= 5
        assert decoded["errors"] == []
        for refused in (uri, with_login("wrong-password")):
            with pytest.raises(av.error.FFmpegError):  # 401 Unauthorized
                await asyncio.to_thread(decode_rtsp, refused, "tcp", 1)
    finally:
        await app.stop()
