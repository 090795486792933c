"""A USB microphone unplugged mid-stream and plugged back (issue 30, "bad input"), through the
running appliance: a WebRTC viewer (a real aiortc peer over real UDP, ``POST /whep/<camera>``)
of a synthetic camera with ``audio = "alsa:hw:1,0"`` keeps decoding pictures while the sound is
gone, ``/api/status`` says why there is no sound, and the sound comes back by itself with the
device. The ALSA device is the one stand-in (there is none here: no snd-aloop without kernel
modules): its opener gives recorded PCM played out in real time (44.1 kHz stereo, as a USB
microphone may), whose end is the unplug; opening it then fails as a missing device does.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import aiohttp
import aioice.ice
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.audio.sources import alsa
from ruseon_appliance.config import (
    CameraConfig,
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    StateConfig,
    WebRtcConfig,
)
from tests.audio.test_pipeline import PacedRecording, write_recording
from tests.audio.whep_peer import WhepPeer
from tests.engine.conftest import wait_for
from tests.tooling import free_port

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


@pytest.fixture(autouse=True)
def loopback_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client peer gathers one host candidate, 127.0.0.1."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


class Microphone:
    """Plugged in (plays ``path``), then unplugged for ``missing_opens`` opens, then back."""

    def __init__(self, path: Path, missing_opens: int) -> None:
        self.path = path
        self.missing_opens = missing_opens
        self.opens: list[str] = []  # "played" or "missing", in order

    def open(self, device: str) -> Any:
        assert device == "hw:1,0"
        plugged = not self.opens or self.opens.count("missing") >= self.missing_opens
        self.opens.append("played" if plugged else "missing")
        if not plugged:
            raise OSError(19, "No such device")
        return PacedRecording(self.path)


async def test_an_unplugged_microphone_leaves_the_pictures_alone_and_comes_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    microphone = Microphone(write_recording(tmp_path / "mic.wav", 2.0), missing_opens=3)
    monkeypatch.setattr(alsa, "open_alsa", microphone.open)
    port = free_port()
    config = Config(
        cameras=(CameraConfig(name="desk", source="synthetic", audio="alsa:hw:1,0",
                              framerate=15, keyframe_interval=15, width=320, height=240),),
        http=HttpConfig(listen=HostPort("127.0.0.1", port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        hls=HlsConfig(enable=False),
    )
    base = f"http://127.0.0.1:{port}"
    app = Appliance(config)
    peer = WhepPeer()
    try:
        await app.start()
        camera = app.cameras.resolve("desk")
        assert camera is not None and camera.audio is not None
        await peer.connect(base, "desk")
        async with aiohttp.ClientSession() as http:
            await wait_for(lambda: len(peer.audio_pts) > 20 and len(peer.video) > 5, timeout=30)

            # The recording ends: the microphone is unplugged, and stays so for three opens.
            await wait_for(lambda: "missing" in microphone.opens, timeout=30)
            async with http.get(f"{base}/api/status") as response:
                status = await response.json()
            [desk] = [c for c in status["cameras"] if c["name"] == "desk"]
            audio = desk["audio"]
            assert audio["running"] is False and "hw:1,0" in (audio["problem"] or ""), audio
            pictures, sound = len(peer.video), len(peer.audio_pts)
            # The pictures go on meanwhile (liveness: frames decoded while the sound is gone).
            await wait_for(lambda: len(peer.video) >= pictures + 10, timeout=30)
            assert microphone.opens.count("played") == 1  # still unplugged then

            # Plugged back: the sound comes back by itself, the same session, no restart.
            await wait_for(lambda: microphone.opens.count("played") == 2, timeout=60)
            await wait_for(lambda: len(peer.audio_pts) > sound + 20, timeout=30)
            assert camera.audio.problem() is None
            async with http.get(f"{base}/api/status") as response:
                [desk] = [c for c in (await response.json())["cameras"] if c["name"] == "desk"]
        # The camera itself never noticed: up, no stall restart.
        assert desk["up"] is True and desk["stall_restarts"] == 0, desk
        stats = camera.audio.stats()
        assert stats["source_failures"] >= 4  # the end, then three missing opens
        assert stats["chunks_bad"] == 0
        # The video never stopped: its decoded frames' pts only grow, without a hole of a
        # second anywhere (15 fps on a 90 kHz clock), across the unplug and the replug.
        video = peer.video
        steps = [b - a for a, b in itertools.pairwise(video)]
        assert min(steps) > 0 and max(steps) < 90_000, steps
    finally:
        await peer.close()
        await app.stop()
