"""How an RTSP client joins, seen by the clients NVRs use: FFmpeg's command line (Frigate
records with ``-c copy``, detects by decoding) and GStreamer's rtspsrc.

A join mid-GOP sends the cached keyframe and the frames after it at once (the burst). Stamped
1/90000 s apart (the viewers' squeeze), FFmpeg's muxer rewrote every burst frame ("Non-monotonous
DTS ... changing to") and a recording's first second had frames without duration. The burst now
keeps the frames' own timestamps: the recording is spaced as the camera captured it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ruseon_appliance.config import HostPort, RtspConfig
from ruseon_appliance.rtsp import RtspServer, RtspSource
from tests.rtsp.conftest import FPS, RawClient, Rig, start_rig, stop_rig, wait_for
from tests.tooling import require_tool

GOP = 300  # 10 s: a client that starts within it surely joins mid-GOP
FRAME_TICKS = 90_000 // FPS


@pytest.fixture
async def burst_rig() -> AsyncIterator[tuple[Rig, RtspServer]]:
    """A camera with a long GOP and an RTSP server that always sends the GOP so far at PLAY
    (as for a file source), so every join mid-GOP is a burst."""
    rig = await start_rig(keyframe_interval=GOP)
    source = RtspSource("cam", rig.capture, rig.fanout, framerate=FPS,
                        catch_up_max_frames=3, keyframe_interval_frames=GOP,
                        catch_up_max_bytes=16 << 20)
    server = RtspServer(RtspConfig(enable=True, listen=HostPort("127.0.0.1", 0)), [source])
    await server.start()
    rig.servers.append(server)
    try:
        yield rig, server
    finally:
        await stop_rig(rig)


async def mid_gop(rig: Rig, frames: int = 12) -> None:
    """Wait until the newest keyframe is ``frames`` frames old (so the join is a burst), and
    not more than a third of the GOP (so a slow client still joins in this GOP, however
    loaded the machine: a next keyframe would make its join "on-keyframe")."""
    ring = rig.capture.ring

    def behind() -> int:
        key = ring.newest_keyframe_seq
        return -1 if key is None else ring.newest_seq - key

    await wait_for(lambda: frames <= behind() <= GOP // 3, 60,
                   f"{frames} to {GOP // 3} frames after a keyframe")


async def run(*args: str, timeout: float = 90) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(*args, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, (out + err).decode(errors="replace")


async def client_run(server: RtspServer, *args: str) -> tuple[int, str, set[str]]:
    """Run a client; returns its exit code, output and how its sessions joined."""
    before = dict(server.stats()["joins"])
    code, text = await run(*args)
    after = server.stats()["joins"]
    return code, text, {mode for mode, n in after.items() if n > before.get(mode, 0)}


# FFmpeg 5.1's parser drops the timestamps of the first packet any RTP demuxer hands it (its
# position is -1, which av_parser_parse2's first-frame check does not match; reproduced with
# FFmpeg's own RTP muxer as the sender): `-c copy` then notes that packet once, whatever the
# server sends. Those two lines (and only those) are FFmpeg's own, not this server's.
FIRST_PACKET_NOTES = (
    re.compile(r"Timestamps are unset in a packet for stream 0\."),
    re.compile(r"Non-monotonous DTS in output stream 0:0; previous: 0, current: 0; "
               r"changing to 1\."),
)


def warning_lines(text: str, *, first_packet_notes: bool = False) -> list[str]:
    lines = [line for line in text.splitlines() if line.strip()]
    if first_packet_notes:
        lines = [line for line in lines if not any(p.search(line) for p in FIRST_PACKET_NOTES)]
    return lines


@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_ffmpeg_records_and_decodes_a_burst_join_without_a_timestamp_warning(
        burst_rig: tuple[Rig, RtspServer], transport: str, tmp_path: Path) -> None:
    ffmpeg = require_tool("ffmpeg", "apt-get install ffmpeg")
    ffprobe = require_tool("ffprobe", "apt-get install ffmpeg")
    rig, server = burst_rig
    url = f"rtsp://127.0.0.1:{server.port}/cam"
    base = [ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "warning", "-rtsp_transport",
            transport, "-buffer_size", str(4 << 20), "-i", url]

    # Decoding (Frigate's detect input): every frame decodes, not one warning line.
    await mid_gop(rig)
    code, text, modes = await client_run(
        server, *base, "-frames:v", "60", "-f", "null", "-")
    assert code == 0, text[-3000:]
    assert modes == {"catch-up-gop"}, modes
    assert warning_lines(text) == [], text[-3000:]

    # Recording (Frigate's record input, -c copy): the burst keeps the camera's spacing.
    await mid_gop(rig)
    out = tmp_path / "recording.mp4"
    code, text, modes = await client_run(
        server, *base, "-frames:v", "60", "-c", "copy", "-f", "mp4", str(out))
    assert code == 0, text[-3000:]
    assert modes == {"catch-up-gop"}, modes
    assert warning_lines(text, first_packet_notes=True) == [], text[-3000:]
    code, probed = await run(ffprobe, "-v", "error", "-select_streams", "v", "-show_entries",
                             "packet=dts,duration,flags:stream=time_base", "-of", "json",
                             str(out))
    assert code == 0, probed
    info = json.loads(probed)
    num, den = (int(x) for x in info["streams"][0]["time_base"].split("/"))
    packets = info["packets"]
    assert len(packets) >= 60 and packets[0]["flags"].startswith("K"), packets[:3]
    dts = [int(p["dts"]) * 90_000 * num // den for p in packets]
    # From the second packet on (the first is FFmpeg's own, above): whole frame intervals as
    # the camera made them (it may skip a slot when the machine is busy), never squeezed.
    gaps = [b - a for a, b in itertools.pairwise(dts[1:])]
    assert all(gap >= FRAME_TICKS // 2 for gap in gaps), gaps
    assert server.stats()["frames_skipped"] == 0, repr(server.stats())


async def test_gstreamer_decodes_a_burst_join_with_timestamps_never_going_back(
        burst_rig: tuple[Rig, RtspServer]) -> None:
    gst = require_tool("gst-launch-1.0", "apt-get install gstreamer1.0-tools gstreamer1.0-libav")
    rig, server = burst_rig
    await mid_gop(rig)
    url = f"rtsp://127.0.0.1:{server.port}/cam"
    code, text, modes = await client_run(
        server, gst, "-v", "rtspsrc", f"location={url}", "protocols=udp", "!", "rtph264depay", "!",
        "h264parse", "!", "avdec_h264", "!", "identity", "eos-after=45", "silent=false", "!",
        "fakesink", "sync=false")
    assert code == 0, text[-3000:]
    assert modes == {"catch-up-gop"}, modes
    assert not [line for line in text.splitlines() if "WARNING" in line], text[-3000:]
    # Every decoded picture reached the sink, stamps never going back. Only that: beyond a
    # burst's first second rtpjitterbuffer gives one timestamp to what leads arrival by more
    # than ~1 s (see RecorderCursor), and this test's bursts are 0.4-3 s long.
    stamps = []
    for line in text.splitlines():
        match = re.search(r"identity0.*chain.*pts: (\d+):(\d+):([\d.]+)", line)
        if match:
            h, m, s = match.groups()
            stamps.append(int(h) * 3600 + int(m) * 60 + float(s))
    assert len(stamps) >= 44, text[-3000:]
    assert all(b >= a for a, b in itertools.pairwise(stamps)), stamps
    assert stamps[-1] > stamps[0]


async def test_a_play_after_pause_within_the_gop_goes_on_forward_in_time(
        burst_rig: tuple[Rig, RtspServer]) -> None:
    """The burst of a PLAY after PAUSE starts at the GOP's keyframe, older than what the client
    got before the pause: its stamps must still come after those."""
    rig, server = burst_rig
    await mid_gop(rig, 3)
    client = await RawClient.connect(server.port)
    try:
        await client.play_tcp()
        await wait_for(lambda: client.frames >= 20, what="20 frames")
        assert (await client.request("PAUSE")).status == 200
        before = client.frames
        ring = rig.capture.ring
        paused_at = ring.newest_seq
        await wait_for(lambda: ring.newest_seq >= paused_at + 5, what="5 frames while paused")
        assert (await client.request("PLAY")).status == 200
        await wait_for(lambda: client.frames >= before + 20, what="20 frames after PLAY")
        joins = server.stats()["joins"]
        # Both PLAYs were bursts; the second (25 frames or more into the GOP) a GOP burst.
        assert set(joins) <= {"catch-up", "catch-up-gop"} and sum(joins.values()) == 2, joins
        assert joins.get("catch-up-gop", 0) >= 1, joins
        assert client.sequence_gaps == 0
        # The resumed burst is not taken for a client that fell behind (it was, over TCP:
        # skipped to a fresh keyframe, 30 frames dropped).
        assert server.stats()["keyframe_skips"] == 0, server.stats()
        stamps = client.frame_timestamps
        steps = [((b - a + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
                 for a, b in itertools.pairwise(stamps)]
        assert all(step > 0 for step in steps), (before, steps)
    finally:
        await client.close()
