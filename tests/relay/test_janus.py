"""The relay with a real Janus (Debian's ``janus``): viewers watch THROUGH Janus's Streaming plugin.

Each test re-runs itself in a private network namespace (veth address for Janus's ICE); inside,
it starts Janus with a generated minimal config, an in-process appliance (synthetic camera) that
relays to a mountpoint, and aiortc viewers that use Janus's HTTP API like a browser page would.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import re
import socket
import time
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    CameraConfig,
    Config,
    HostPort,
    HttpConfig,
    RelayConfig,
    StateConfig,
    WebRtcConfig,
)
from ruseon_appliance.relay import RtpRelay
from tests.e2e.browser_netns import inside_browser_netns, prepare_namespace
from tests.engine.test_audio import LIP_SYNC_LIMIT_US, lip_sync_errors_us
from tests.relay.conftest import assert_the_tone, wait_for
from tests.relay.janus import Janus, JanusViewer, rerun_in_janus_netns, running_janus
from tests.tooling import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FPS = 15
GOP = 150  # 10 s: a picture within a fraction of this came from a forced keyframe
VIEWERS = 12


def in_janus_netns(request: pytest.FixtureRequest) -> bool:
    """True inside the namespace (set up); outside, re-runs the test there and returns False."""
    if inside_browser_netns():
        prepare_namespace()
        return True
    rerun_in_janus_netns(request.node.nodeid)
    return False


def appliance_config(tmp_path: Path, relays: tuple[RelayConfig, ...]) -> Config:
    return Config(
        cameras=(CameraConfig(source="synthetic", width=320, height=240, framerate=FPS,
                            bitrate=300_000, keyframe_interval=GOP,
                            keyframe_request_interval_ms=300),),
        http=HttpConfig(listen=HostPort("127.0.0.1", free_port())),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        relay=relays,
    )


@contextlib.asynccontextmanager
async def running_appliance(config: Config) -> AsyncIterator[Appliance]:
    appliance = Appliance(config)
    await appliance.start()
    try:
        yield appliance
    finally:
        await appliance.stop()


def frames_in(appliance: Appliance) -> int:
    return int(appliance.capture.stats()["frames_in"])


async def watch(janus: Janus, mountpoint: int, count: int) -> list[JanusViewer]:
    viewers = [JanusViewer(janus, mountpoint) for _ in range(count)]
    await asyncio.gather(*(v.watch() for v in viewers))
    return viewers


async def close_all(viewers: list[JanusViewer]) -> None:
    await asyncio.gather(*(v.close() for v in viewers), return_exceptions=True)


async def no_keyframe_requests_for(appliance: Appliance, relay: RtpRelay, frames: int) -> None:
    """Wait until ``frames`` frames passed without a keyframe request reaching the relay (so the
    next keyframe can only come from what happens next)."""
    for _ in range(30):
        requests, start = relay.keyframe_requests_received, frames_in(appliance)
        until = start + frames
        await wait_for(lambda: frames_in(appliance) >= until, what="frames")  # noqa: B023
        if relay.keyframe_requests_received == requests:
            return
    raise AssertionError("keyframe requests never stopped")


def assert_live(viewer: JanusViewer, since_frame: int) -> None:
    """Stamps read back from decoded pictures count up and are newer than ``since_frame``."""
    numbers = [n for _, n in viewer.stamps]
    assert numbers, "no stamped picture decoded"
    assert numbers == sorted(numbers), "pictures out of order"
    assert numbers[-1] > since_frame, f"stale picture {numbers[-1]} <= {since_frame}"


async def test_viewers_watch_through_janus_keyframes_on_join_and_janus_restart(
        request: pytest.FixtureRequest, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    if not in_janus_netns(request):
        return
    caplog.set_level(logging.INFO, logger="ruseon_appliance.relay")
    rtp_port, rtcp_port = free_port(kind=socket.SOCK_DGRAM), free_port(kind=socket.SOCK_DGRAM)
    relay_config = RelayConfig(name="janus", url=f"rtp://127.0.0.1:{rtp_port}",
                               rtcp_port=rtcp_port, bind=HostPort("127.0.0.1", 0))
    with running_janus(tmp_path / "janus") as janus:
        async with running_appliance(appliance_config(tmp_path, (relay_config,))) as appliance:
            (relay,) = appliance.relays
            info = appliance.capture.stream_info
            assert info is not None
            mountpoint = dict(port=rtp_port, rtcp_port=rtcp_port,
                              profile_level_id=info.profile_level_id)
            await asyncio.to_thread(janus.create_mountpoint, 1, **mountpoint)

            # Many viewers through Janus: every one decodes live, stamped pictures.
            start = frames_in(appliance)
            viewers = await watch(janus, 1, VIEWERS)
            await wait_for(lambda: all(len(v.stamps) >= 15 for v in viewers), timeout=90,
                           what=f"{VIEWERS} viewers decoding through Janus")
            for viewer in viewers:
                assert_live(viewer, start)
            assert relay.stats()["state"] == "sending"

            # A viewer joining mid-GOP: Janus's PLI reaches the relay and the camera, and the
            # picture comes long before the next scheduled keyframe.
            await no_keyframe_requests_for(appliance, relay, 2 * FPS)
            requests_before = relay.keyframe_requests_received
            joined_at = frames_in(appliance)
            (late,) = await watch(janus, 1, 1)
            await wait_for(lambda: len(late.stamps) >= 1, timeout=60, what="the late viewer")
            # Janus sends at most one PLI a second (a later one waits): the join's PLI may land
            # just after a keyframe the earlier viewers' requests brought.
            await wait_for(lambda: relay.keyframe_requests_received > requests_before,
                           timeout=30, what="Janus's PLI at the relay")
            first = late.stamps[0][1]
            assert first - joined_at < GOP // 2, (first, joined_at)
            viewers.append(late)

            # Janus dies: the relay notices (ICMP), logs once, keeps running.
            janus.kill()
            await wait_for(lambda: relay.state == "unreachable", what="the relay to notice")
            frames = frames_in(appliance)
            await wait_for(lambda: frames_in(appliance) > frames + FPS, what="the camera")
            assert relay.state == "unreachable"
            await close_all(viewers)

            # Janus is back (a fresh mountpoint, as after any restart): new viewers watch.
            janus.start()
            await asyncio.to_thread(janus.create_mountpoint, 1, **mountpoint)
            await wait_for(lambda: relay.state == "sending", what="the relay to resume")
            back = frames_in(appliance)
            viewers = await watch(janus, 1, 3)
            await wait_for(lambda: all(len(v.stamps) >= 5 for v in viewers), timeout=60,
                           what="viewers after the restart")
            for viewer in viewers:
                assert_live(viewer, back)
            await close_all(viewers)
            stats = relay.stats()
            assert stats["outages"] >= 1 and stats["errors"]["unreachable"] >= 1
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                        and r.name.startswith("ruseon_appliance.relay")]
            assert len(warnings) == stats["outages"], warnings


def docs_mountpoint() -> tuple[str, dict[str, Any], dict[str, dict[str, str]]]:
    """The SRTP mountpoint config from docs/janus.md, exactly as written there, its values and
    those of each of its media (by type); checks the board's ``[[relay]]`` there agrees."""
    text = (REPO / "docs" / "janus.md").read_text()
    block = re.search(r"```[a-z]*\n(ruseon-srtp: \{.*?\n\})\n```", text, re.S)
    assert block, "docs/janus.md lost its ruseon-srtp mountpoint block"
    config = block.group(1)

    def values_of(part: str) -> dict[str, str]:
        return {k: v for k, v in re.findall(r'(\w+) = "?([^"\n]+)"?', part)}

    media = {m["type"]: m for m in map(values_of, re.findall(r"\{([^{}]*)\}", config))}
    values = values_of(re.sub(r"media = \(.*?\n\t\)", "", config, flags=re.S))
    board = re.search(r"```toml\n(\[\[relay\]\].*?)```", text, re.S)
    assert board, "docs/janus.md lost the board's [[relay]] table"
    (relay,) = tomllib.loads(board.group(1))["relay"]
    assert relay["url"].endswith(f":{media['video']['port']}")
    assert relay["rtcp_port"] == int(media["video"]["rtcpport"])
    assert relay["srtp_key"] == values["srtpcrypto"]
    assert relay["audio_port"] == int(media["audio"]["port"])
    assert relay["audio_port"] + 1 == int(media["audio"]["rtcpport"])  # audio_rtcp_port left out
    return config, values, media


async def test_srtp_mountpoint_from_the_docs_decodes_and_a_wrong_key_does_not(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not in_janus_netns(request):
        return
    config, values, media = docs_mountpoint()
    key = values["srtpcrypto"]
    port, rtcp = int(media["video"]["port"]), int(media["video"]["rtcpport"])
    audio_port = int(media["audio"]["port"])
    wrong_port, wrong_rtcp = free_port(kind=socket.SOCK_DGRAM), free_port(kind=socket.SOCK_DGRAM)
    wrong_key = base64.b64encode(os.urandom(30)).decode()
    relays = (
        RelayConfig(name="right", url=f"rtp://127.0.0.1:{port}", rtcp_port=rtcp,
                    srtp_key=key, audio_port=audio_port, bind=HostPort("127.0.0.1", 0)),
        RelayConfig(name="wrong", url=f"rtp://127.0.0.1:{wrong_port}", rtcp_port=wrong_rtcp,
                    srtp_key=wrong_key, bind=HostPort("127.0.0.1", 0)),
    )
    with running_janus(tmp_path / "janus", streaming=config) as janus:
        async with running_appliance(appliance_config(tmp_path, relays)) as appliance:
            info = appliance.capture.stream_info
            assert info is not None
            # The second mountpoint has the docs' key too; its relay uses another.
            await asyncio.to_thread(janus.create_mountpoint, 2, port=wrong_port,
                                    rtcp_port=wrong_rtcp,
                                    profile_level_id=info.profile_level_id, srtp_key=key)
            mountpoint_id = int(values["id"])
            start = frames_in(appliance)
            right, wrong = await watch(janus, mountpoint_id, 1) + await watch(janus, 2, 1)
            right_relay: RtpRelay
            right_relay, wrong_relay = appliance.relays
            await wait_for(lambda: len(right.stamps) >= 30 and len(right.sound) >= 100,
                           timeout=60, what="SRTP decoding, the picture and the sound")
            assert_live(right, start)
            assert_the_tone(right.sound)  # the audio of the mountpoint, the same key
            # The wrong key's relay started before its mountpoint existed: give it as many
            # packets again as the right one needed, then its viewer still has nothing.
            sent = wrong_relay.packets_sent
            await wait_for(lambda: wrong_relay.packets_sent > sent + 300, timeout=60,
                           what="the wrong-key relay to send")
            assert wrong.decoded == 0 and not wrong.sound
            assert right_relay.stats()["state"] == wrong_relay.stats()["state"] == "sending"
            # Janus is still up and answering.
            await asyncio.to_thread(janus.attach)
            await close_all([right, wrong])


async def test_late_joiners_get_janus_cached_keyframe_without_a_new_one(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """``bufferkf`` (docs/janus.md): with no RTCP back to the camera (so no forced keyframe) and
    a 10 s GOP, viewers joining mid-GOP decode a picture from BEFORE they joined: Janus's cached
    keyframe, with no new keyframe made for them."""
    if not in_janus_netns(request):
        return
    rtp_port = free_port(kind=socket.SOCK_DGRAM)
    relay_config = RelayConfig(name="janus", url=f"rtp://127.0.0.1:{rtp_port}", rtcp_port=0,
                               bind=HostPort("127.0.0.1", 0))
    with running_janus(tmp_path / "janus") as janus:
        async with running_appliance(appliance_config(tmp_path, (relay_config,))) as appliance:
            (relay,) = appliance.relays
            info = appliance.capture.stream_info
            assert info is not None
            await asyncio.to_thread(janus.create_mountpoint, 1, port=rtp_port,
                                    rtcp_port=free_port(kind=socket.SOCK_DGRAM),
                                    profile_level_id=info.profile_level_id, bufferkf=True)
            # The first viewer waits for a periodic keyframe (Janus caches it as it passes).
            (first,) = await watch(janus, 1, 1)
            try:
                await wait_for(lambda: len(first.stamps) >= 1, timeout=60,
                               what="the first viewer")
            except AssertionError as exc:  # what it got: packets, pictures, the camera's IDRs
                raise AssertionError(f"{exc}\nviewer: decoded {first.decoded}, stamps "
                                     f"{len(first.stamps)}, received {await inbound(first)}; "
                                     f"relay: {relay.stats()}; camera: "
                                     f"{appliance.capture.stats()}") from None
            forced = appliance.capture.stats()["keyframes_forced"]
            late: list[JanusViewer] = []
            for _ in range(3):
                # By capture time (the picture's stamp is on this machine's wall clock): a
                # frame count would not do, the synthetic camera skips numbers when late.
                joined_at_us = time.time_ns() // 1000
                (viewer,) = await watch(janus, 1, 1)
                await wait_for(lambda: len(viewer.stamps) >= 1, timeout=60,  # noqa: B023
                               what="a late viewer")
                captured_us = viewer.stamps[0][0]
                # Older than the join: only Janus's buffer could have given it.
                assert captured_us < joined_at_us, (captured_us, joined_at_us)
                late.append(viewer)
            assert appliance.capture.stats()["keyframes_forced"] == forced
            assert relay.keyframe_requests_received == 0
            await close_all([first, *late])


def lip_sync(viewer: JanusViewer, since_us: int) -> list[int]:
    """:func:`tests.engine.test_audio.lip_sync_errors_us` for a viewer through Janus (empty
    until Janus has sent a sender report of each stream)."""
    if not all(viewer.reports.get(viewer.ssrcs.get(k, -1)) for k in ("audio", "video")):
        return []
    timed = SimpleNamespace(pictures=list(viewer.pictures), to_wall_us=viewer.to_wall_us,
                            sound=list(zip(viewer.sound_pts, viewer.sound, strict=True)))
    try:
        return lip_sync_errors_us(timed, since_us)  # type: ignore[arg-type]
    except AssertionError:  # no picture in the window yet
        return []


async def inbound(viewer: JanusViewer) -> list[tuple[str, int]]:
    """(kind, packets received) of each stream a viewer receives (aiortc's stats)."""
    report = await viewer.pc.getStats()
    return [(s.kind, s.packetsReceived) for s in report.values() if s.type == "inbound-rtp"]


async def test_viewers_hear_the_camera_through_janus_beside_the_picture(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A mountpoint with audio and video: the relay sends the synthetic camera's tone (Opus,
    encoded once) beside the picture, and viewers through Janus decode both (the tone at its
    level, the beeps, live pictures); the camera's Opus ring has one reader, the relay's."""
    if not in_janus_netns(request):
        return
    rtp, rtcp, audio_rtp, audio_rtcp = (free_port(kind=socket.SOCK_DGRAM) for _ in range(4))
    relay_config = RelayConfig(name="janus", url=f"rtp://127.0.0.1:{rtp}", rtcp_port=rtcp,
                               audio_port=audio_rtp, audio_rtcp_port=audio_rtcp,
                               bind=HostPort("127.0.0.1", 0))
    with running_janus(tmp_path / "janus") as janus:
        async with running_appliance(appliance_config(tmp_path, (relay_config,))) as appliance:
            (relay,) = appliance.relays
            sound = appliance.cameras.default.audio
            assert relay.audio is not None and sound is not None
            info = appliance.capture.stream_info
            assert info is not None
            await asyncio.to_thread(janus.create_mountpoint, 1, port=rtp, rtcp_port=rtcp,
                                    profile_level_id=info.profile_level_id,
                                    audio_port=audio_rtp, audio_rtcp_port=audio_rtcp)
            start = frames_in(appliance)
            synced = JanusViewer(janus, 1, sync=True)
            await synced.watch()
            viewers = [synced, *await watch(janus, 1, 2)]
            try:
                await wait_for(lambda: all(len(v.stamps) >= 15 and len(v.sound) >= 150
                                           for v in viewers), timeout=90,
                               what="3 viewers hearing and seeing through Janus")
            except AssertionError as exc:
                exc.add_note(f"(pictures, sound frames) per viewer: "
                             f"{[(len(v.stamps), len(v.sound), v.kinds) for v in viewers]}; "
                             f"relay {relay.stats()}; inbound "
                             f"{[await inbound(v) for v in viewers]}")
                raise
            for viewer in viewers:
                assert_live(viewer, start)
                assert_the_tone(viewer.sound)
            stats = relay.stats()
            assert stats["state"] == stats["audio"]["state"] == "sending"
            assert stats["audio"]["packets_sent"] >= 150
            assert sound.opus_ring.reader_count == 1
            # Lip sync as a browser behind Janus sees it: each beep (captured at a whole second)
            # and the picture of the same capture instant, each placed on the wall clock by its
            # own stream's sender reports from Janus.
            since_us = time.time_ns() // 1000
            await wait_for(lambda: len(lip_sync(synced, since_us)) >= 4, timeout=60,
                           what="4 beeps heard with Janus's sender reports of both streams")
            errors = lip_sync(synced, since_us)
            # Measured 0.5-2.5 ms (Janus 1.1.2 writes its own reports to its viewers, from when
            # it forwards; the same with the relay's reports placed by send time).
            assert all(abs(e) < LIP_SYNC_LIMIT_US for e in errors), errors
            await close_all(viewers)
