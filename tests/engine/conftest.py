"""Fixtures for engine tests: a real synthetic camera, a real engine on 127.0.0.1, and real
aiortc client peers (offerers, as a browser would be) that decode what they receive with PyAV."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aioice.ice
import aiortc.rtcrtpreceiver
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.codecs.h264 import H264Decoder

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.stamp import read_stamp
from ruseon_appliance.config import CameraConfig, HostPort, WebRtcConfig
from ruseon_appliance.engine import Engine

FPS = 30
GOP = 60


def camera_config(**overrides: Any) -> CameraConfig:
    """A small, cheap synthetic camera: 320x240, 30 fps, 2 s GOP."""
    values: dict[str, Any] = dict(source="synthetic", width=320, height=240, framerate=FPS,
                                  bitrate=300_000, keyframe_interval=GOP, profile="baseline",
                                  keyframe_request_interval_ms=500)
    values.update(overrides)
    return CameraConfig(**values)


def webrtc_config(**overrides: Any) -> WebRtcConfig:
    """Listen and advertise on loopback only; port 0 lets the kernel choose."""
    values: dict[str, Any] = dict(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",))
    values.update(overrides)
    return WebRtcConfig(**values)


# --- client side: record what each decoder is fed ------------------------------------------


def nal_types(annexb: bytes) -> list[int]:
    """NAL unit types in an Annex B buffer."""
    types: list[int] = []
    i = 0
    while True:
        i = annexb.find(b"\x00\x00\x01", i)
        if i < 0 or i + 3 >= len(annexb):
            return types
        types.append(annexb[i + 3] & 0x1F)
        i += 3


class RecordingDecoder(H264Decoder):  # type: ignore[misc]
    """aiortc's H.264 decoder (PyAV), remembering the NAL types of the first access unit."""

    instances: list[RecordingDecoder] = []

    def __init__(self) -> None:
        super().__init__()
        self.first_nal_types: list[int] | None = None
        self.decoded = 0
        RecordingDecoder.instances.append(self)

    def decode(self, encoded_frame: Any) -> list[Any]:
        if self.first_nal_types is None:
            self.first_nal_types = nal_types(encoded_frame.data)
        frames = super().decode(encoded_frame)
        self.decoded += len(frames)
        return frames  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def loopback_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Client peers gather only a 127.0.0.1 host candidate (aioice skips loopback by default),
    and record what their H.264 decoder is fed."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses",
                        lambda use_ipv4, use_ipv6: ["127.0.0.1"])
    original = aiortc.rtcrtpreceiver.get_decoder

    def get_decoder(codec: Any) -> Any:
        if codec.mimeType.lower() == "video/h264":
            return RecordingDecoder()
        return original(codec)

    monkeypatch.setattr(aiortc.rtcrtpreceiver, "get_decoder", get_decoder)
    RecordingDecoder.instances = []
    yield


@dataclass(eq=False)
class Viewer:
    """A client peer connection and what it decoded."""

    pc: RTCPeerConnection
    session_id: str = ""
    answer: str = ""
    frames: int = 0
    # (capture_time_us from the stamp, decode wall-clock µs) per decoded frame with a stamp.
    stamps: list[tuple[int, int]] = field(default_factory=list)
    # The stamped frame numbers, in decoding order.
    numbers: list[int] = field(default_factory=list)
    first_frame: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    async def consume(self, track: Any) -> None:
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            now_us = time.time_ns() // 1000
            self.frames += 1
            stamp = read_stamp(frame)
            if stamp is not None:
                self.stamps.append((stamp[0], now_us))
                self.numbers.append(stamp[1])
            self.first_frame.set()

    async def close(self) -> None:
        await self.pc.close()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def make_offer(*, audio_first: bool = False) -> tuple[RTCPeerConnection, str]:
    """A recvonly offer from an aiortc client peer, candidates gathered (127.0.0.1 only)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    if audio_first:
        pc.addTransceiver("audio", direction="recvonly")
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def connect_viewer(engine: Engine, *, audio_first: bool = False,
                         munge: Any = None) -> Viewer:
    """Offer to the engine and apply its answer; video frames are consumed in a task."""
    pc, offer = await make_offer(audio_first=audio_first)
    viewer = Viewer(pc)

    def on_track(track: Any) -> None:
        if track.kind == "video":
            viewer.task = asyncio.ensure_future(viewer.consume(track))

    pc.on("track", on_track)

    session, answer = await engine.offer(munge(offer) if munge else offer)
    viewer.session_id, viewer.answer = session.id, answer
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    return viewer


async def wait_for(predicate: Any, timeout: float = 20.0, interval: float = 0.05) -> None:
    """Poll ``predicate()`` until true; fail the test after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


@pytest.fixture
async def feed() -> AsyncIterator[CapturePipeline]:
    """A running synthetic camera pipeline."""
    pipeline = CapturePipeline(camera_config())
    await pipeline.start()
    assert await pipeline.wait_first_frame(10)
    yield pipeline
    await pipeline.stop()


@pytest.fixture
async def engine(feed: CapturePipeline, tmp_path: Path) -> AsyncIterator[Engine]:
    """A started engine on 127.0.0.1 with a fresh state directory."""
    eng = Engine(webrtc_config(), tmp_path / "state", feed)
    await eng.start()
    yield eng
    await eng.stop()
