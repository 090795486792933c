"""ONVIF test helpers: a running Appliance with two synthetic cameras, RTSP and ONVIF on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HostPort,
    HttpConfig,
    OnvifConfig,
    RtspConfig,
    StateConfig,
    WebRtcConfig,
)
from tests.tooling import free_port

SECRET = "onvif-test-admin-secret-42"
SIZES = {"front": (320, 240), "back": (256, 144)}


def appliance_config(tmp_path: Path, *, host: str = "127.0.0.1", rtsp: bool = True,
                     discovery: bool = False, **onvif: Any) -> Config:
    # The motion detectors stay off: the ONVIF tests publish motion themselves, through the
    # event bus as a detector does (the synthetic picture's moving stamp must not add events).
    common: dict[str, Any] = {"source": "synthetic", "framerate": 15, "bitrate": 400_000,
                              "keyframe_interval": 30, "motion": False}
    return Config(
        cameras=tuple(CameraConfig(name=n, width=w, height=h, **common)
                      for n, (w, h) in SIZES.items()),
        http=HttpConfig(listen=HostPort(host, free_port())),
        webrtc=WebRtcConfig(listen=HostPort(host, 0), advertise=(host,)),
        state=StateConfig(dir=str(tmp_path / "state")),
        auth=AuthConfig(token=SECRET),
        rtsp=RtspConfig(enable=rtsp, listen=HostPort(host, free_port())),
        onvif=OnvifConfig(enable=True, discovery=discovery, **onvif),
    )


@pytest.fixture
async def appliance(tmp_path: Path) -> AsyncIterator[Appliance]:
    app = Appliance(appliance_config(tmp_path))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()
