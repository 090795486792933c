"""The device page in a real browser: Debian's Chromium, headless, driven by Playwright, against a
real ``ruseon serve`` with the synthetic source, all inside a private network namespace.

Each test re-runs itself in a fresh namespace (see :mod:`tests.e2e.browser_netns`).
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser_netns import (
    ARTIFACTS,
    SOURCE_HEIGHT,
    SOURCE_WIDTH,
    Server,
    chromium,
    in_browser_netns,
    inbound_totals,
    poll_page,
    record_browser_stats,
    running_server,
    save_screenshot,
    stream_stats,
    stream_window,
    udp_loss_dropped,
    udp_loss_from_port,
    viewing_needs_a_credential,
    wait_for_page,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FRAMES = 60


def playing(stats: dict[str, Any]) -> bool:
    return bool(stats["state"] == "live" and stats["framesDecoded"] > FRAMES)


def assert_plays_the_source(page: Any, server_status: dict[str, Any]) -> dict[str, Any]:
    """The page plays: more than 60 frames decoded, the source's size, H.264."""
    stats = wait_for_page(page, f"live with more than {FRAMES} frames decoded", playing)
    source = server_status["source"]
    assert (source["width"], source["height"]) == (SOURCE_WIDTH, SOURCE_HEIGHT)
    assert (stats["videoWidth"], stats["videoHeight"]) == (source["width"], source["height"])
    assert stats["codec"] == "video/H264"
    return stats


def test_device_page_plays_the_stream(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not in_browser_netns(request):
        return
    with running_server(tmp_path) as server, chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        opened = time.monotonic()
        page.goto(server.url)
        wait_for_page(page, "the first decoded frame", lambda s: s["framesDecoded"] > 0)
        # Recorded, not asserted (shared machine): how soon the picture appears.
        first_frame_s = time.monotonic() - opened
        assert_plays_the_source(page, server.status())
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "browser-first-frame.json").write_text(
            json.dumps({"page_open_to_first_decoded_frame_s": round(first_frame_s, 3)})
        )
        # The overlay shows what getStats says (the stats tick runs once a second).
        page.wait_for_function(
            "document.getElementById('stat-resolution').textContent.includes('\\u00d7')"
        )
        page.wait_for_function("document.getElementById('stat-viewers').textContent === '1'")
        assert page.text_content("#state-text") == "Live"
        save_screenshot(page, "browser-device-page.png")
        phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
        phone.goto(server.url)
        wait_for_page(phone, "live on a phone-sized page", playing)
        save_screenshot(phone, "browser-device-page-phone.png")
        page.close()
        phone.close()
        landscape = browser.new_page(viewport={"width": 844, "height": 390},
                                     device_scale_factor=2)
        landscape.goto(server.url)
        wait_for_page(landscape, "live on a phone turned sideways", playing)
        save_screenshot(landscape, "browser-device-page-phone-landscape.png")
        # Sideways the bars float over the picture, so they fade out while nobody touches it...
        landscape.wait_for_function("document.getElementById('stage').classList.contains('idle')")
        landscape.wait_for_function(
            "getComputedStyle(document.querySelector('.bar-top')).opacity === '0'"
        )
        save_screenshot(landscape, "browser-device-page-phone-landscape-idle.png")
        # ...and come back at a touch.
        landscape.mouse.move(200, 200)
        landscape.wait_for_function(
            "getComputedStyle(document.querySelector('.bar-top')).opacity === '1'"
        )


def test_device_page_plays_over_ipv6(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Chromium over IPv6 only: the page from http://[::1], the one UDP port on ::1 with ::1
    as the only candidate, Chromium's checks from the veth's ULA address."""
    if not in_browser_netns(request, ipv6=True):
        return
    with running_server(tmp_path, host="::1") as server, chromium() as browser:
        page = browser.new_page()
        page.goto(server.url)
        assert_plays_the_source(page, server.status())
        (session,) = server.status()["viewers"]["sessions"]
        remotes = session["stats"]["remote_addresses"]
        # "host:port" with an IPv6 host: the media flows over IPv6.
        assert remotes and all(":" in r.rpartition(":")[0] for r in remotes), remotes
        page.close()


SRTP_CIPHER_JS = """async () => {
  const report = await window.ruseon.pc.getStats();
  const ciphers = [];
  report.forEach((s) => {
    if (s.type === 'transport' && s.srtpCipher) ciphers.push(s.srtpCipher);
  });
  return ciphers;
}"""


def test_chromium_plays_with_the_aes_cm_profile_a_board_without_aes_offers(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Issue 19: what a Pi 4 offers (webrtc.srtp_profiles "auto" without AES instructions:
    only SRTP_AES128_CM_SHA1_80) Chromium accepts and plays. (The engine is the DTLS server
    for Chromium's actpass and picks the first profile of its list Chromium has: AES-256-GCM
    with "auto" on a CPU with AES instructions, tests/engine/test_srtp_profiles.py.)"""
    if not in_browser_netns(request):
        return
    config = tmp_path / "ruseon.toml"
    config.write_text('[webrtc]\nsrtp_profiles = ["SRTP_AES128_CM_SHA1_80"]\n')
    with running_server(tmp_path / "state", extra_args=["--config", str(config)]) as server, \
            chromium() as browser:
        page = browser.new_page()
        page.goto(server.url)
        assert_plays_the_source(page, server.status())
        assert page.evaluate(SRTP_CIPHER_JS) == ["SRTP_AES128_CM_HMAC_SHA1_80"]
        assert viewer_session_stats(server)["srtp_profile"] == "SRTP_AES128_CM_SHA1_80"
        page.close()


# How long the browser plays while we watch its receive statistics.
WATCH_S = 4
LOSS_WATCH_S = 8
LOSS_PERCENT = 3
# The decoded frame rate from getStats may differ from the source's by at most this fraction.
FPS_TOLERANCE = 0.2
# A mean jitter-buffer delay above this means the browser is replaying a backlog (e.g. a GOP
# sent in a burst), not playing live: generous, since live on loopback is a few tens of ms.
MAX_JITTER_BUFFER_DELAY_MS = 500


def viewer_session_stats(server: Server) -> dict[str, Any]:
    """The one viewer's session counters from ``/api/status``."""
    sessions = server.status()["viewers"]["sessions"]
    assert len(sessions) == 1, sessions
    stats: dict[str, Any] = sessions[0]["stats"]
    return stats


def decoded_all_received(page: Any, received: int) -> dict[str, Any]:
    """Wait until Chromium has decoded the ``received`` frames it had received by the last
    sample; the stream stats then. At the moment of a sample a frame or three may be between
    the jitter buffer and the decoder (more when the machine is busy: seen 3 under load); what
    matters is that none of them stays undecoded, which waiting for the condition shows."""
    return poll_page(page, stream_stats, f"{received} frames decoded",
                     lambda s: s["inbound"]["framesDecoded"] >= received)


def camera_frames_late(server: Server) -> int:
    """Frame slots the synthetic camera skipped so far (a busy machine made it late)."""
    return int(server.status()["source"]["stats"]["source_frames_late"])


def source_fps(server: Server) -> float:
    """The source's measured frame rate, as the server reports it."""
    fps = server.status()["source"]["fps"]
    assert fps, "the server reports no measured source frame rate"
    return float(fps)


def test_chromium_decodes_every_frame_the_fanout_path_sends(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Issue 9: with the fan-out send path Chromium decodes every frame cleanly and sees the
    sender reports."""
    if not in_browser_netns(request):
        return
    with running_server(tmp_path) as server, chromium() as browser:
        page = browser.new_page()
        page.goto(server.url)
        wait_for_page(page, "the first decoded frame", lambda s: s["framesDecoded"] > 0)
        assert viewer_session_stats(server)["send_path"] == "fanout"
        # Chromium offers actpass: the engine answered as the DTLS server (one round trip
        # sooner to the first picture) and everything below holds with it.
        assert viewer_session_stats(server)["dtls_role"] == "server"
        first = stream_stats(page)
        # The first second after the first frame, in quarters: a join that shows a stale
        # keyframe and then waits for a fresh one would show here as a stall (Chromium's
        # freezeCount only starts counting after its first few frames).
        join_samples = [first]
        for quarter in range(4):
            page.wait_for_timeout(250)
            if quarter == 3:  # the camera's count from before the steady watch begins
                late_before = camera_frames_late(server)
            join_samples.append(stream_stats(page))
        joined = [stream_window(a, b)["frames_decoded"]
                  for a, b in itertools.pairwise(join_samples)]
        page.wait_for_timeout((WATCH_S - 1) * 1000)
        last = stream_stats(page)
        late = camera_frames_late(server) - late_before
        steady = stream_window(join_samples[-1], last)
        fps = source_fps(server)
        session = viewer_session_stats(server)

        window = stream_window(first, last)
        totals = inbound_totals(last)
        record_browser_stats("clean", {
            "source_fps": fps, "window": window, "totals": totals,
            "camera_frames_late": late, "steady_freezes": steady["freezes"],
            "first_second_decoded_per_quarter": joined,
            "first_sample_frames_decoded": first["inbound"]["framesDecoded"],
            "server_session": {k: session.get(k) for k in (
                "frames_sent", "keyframes_sent", "packets_sent", "nacks", "retransmitted",
                "keyframes_requested", "sender_reports", "receiver_reports", "rtt_ms",
                "packets_lost", "jitter_ms", "frames_skipped", "keyframe_skips")},
        })
        inbound = last["inbound"]
        assert inbound["framesDecoded"] > FRAMES, totals
        # No stall right after joining (a stale keyframe, then a wait for a fresh one).
        assert min(joined) > 0, joined
        # Every frame received was decoded: none dropped, none left undecoded.
        assert inbound["framesDropped"] == 0, totals
        # Once live (after the first second; the join's first second is judged by the quarters
        # above: right after a catch-up burst Chromium's freeze threshold is a few ms + 150 ms,
        # see the mid-GOP test; seen: a 0.17 s freeze there, load 6), at most one freeze, plus
        # one per 3 slots the camera skipped. A freeze is a picture 183 ms or more after the one
        # before (at 30 fps), so a single stall of the server, the browser or the whole machine
        # makes one (seen: one of 0.325 s, camera on time, load 9, 1 run in 8); a sender that
        # paces badly makes them again and again (a keyframe each second here). The synthetic
        # camera skips the slots a busy machine made it miss (frames_late): 3 skipped slots are
        # a 133 ms gap before the up to 66 ms it may run late uncounted (seen: one 0.225 s
        # freeze in a watch where it skipped 4, load 7).
        assert steady["freezes"] <= 1 + late // 3, (steady, {"camera_frames_late": late}, totals)
        decoded_all_received(page, inbound["framesReceived"])
        # Chromium may ask for one keyframe when it joins; a clean stream needs no more.
        assert inbound["pliCount"] <= 1, totals
        assert "nackCount" in inbound and "packetsLost" in inbound, totals
        assert window["decoded_fps"] is not None
        assert abs(window["decoded_fps"] / fps - 1) <= FPS_TOLERANCE, (window, fps)
        assert totals["mean_jitter_buffer_delay_ms"] < MAX_JITTER_BUFFER_DELAY_MS, totals
        # The fan-out path's RTCP sender reports reach the browser, and keep coming.
        remote = last["remoteOutbound"]
        assert remote is not None, "no remote-outbound-rtp: no sender report arrived"
        assert remote["remoteTimestamp"] > 0
        assert first["remoteOutbound"] is None or (
            remote["reportsSent"] > first["remoteOutbound"]["reportsSent"]
        ), (first["remoteOutbound"], remote)
        assert remote["reportsSent"] >= 2, remote
        assert session["sender_reports"] >= remote["reportsSent"], (session, remote)
        # ...and the browser's receiver reports answer them: the server knows the round trip.
        assert session["receiver_reports"] > 0 and session["rtt_ms"] is not None, session


def test_chromium_recovers_lost_packets_by_nack_and_retransmission(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Issue 9: with about 3 % of the server's datagrams dropped, Chromium NACKs, the fan-out
    path retransmits, and the picture keeps moving."""
    if not in_browser_netns(request):
        return
    with running_server(tmp_path) as server, chromium() as browser:
        page = browser.new_page()
        page.goto(server.url)
        wait_for_page(page, f"more than {FRAMES} frames decoded", playing)
        fps = source_fps(server)
        before_server = viewer_session_stats(server)
        late_before = camera_frames_late(server)
        samples = [stream_stats(page)]
        with udp_loss_from_port(server.rtc_port, LOSS_PERCENT):
            for _ in range(LOSS_WATCH_S):
                page.wait_for_timeout(1000)
                samples.append(stream_stats(page))
            dropped = udp_loss_dropped()
        late = camera_frames_late(server) - late_before
        session = viewer_session_stats(server)

        window = stream_window(samples[0], samples[-1])
        seconds = [stream_window(a, b) for a, b in itertools.pairwise(samples)]
        retransmitted = session["retransmitted"] - before_server["retransmitted"]
        record_browser_stats("loss", {
            "loss_percent": LOSS_PERCENT, "datagrams_dropped_by_nft": dropped,
            "source_fps": fps, "window": window,
            "decoded_per_second": [s["frames_decoded"] for s in seconds],
            "server_retransmitted": retransmitted, "camera_frames_late": late,
            "server_nacks": session["nacks"] - before_server["nacks"],
            "server_keyframes_requested": (
                session["keyframes_requested"] - before_server["keyframes_requested"]),
            "totals": inbound_totals(samples[-1]),
        })
        assert dropped > 0, "the nft rule dropped nothing"
        assert window["nacks"] > 0, window
        assert retransmitted > 0, session
        # The picture keeps moving: frames decoded in every second, and a near-normal rate.
        slowest = min(s["frames_decoded"] for s in seconds)
        assert slowest >= fps / 3, [s["frames_decoded"] for s in seconds]
        assert window["decoded_fps"] is not None
        assert window["decoded_fps"] >= fps * (1 - FPS_TOLERANCE), (window, fps)
        # One freeze is tolerated for the loss (a packet and its retransmission both dropped
        # until Chromium gave up on it), plus, as in the clean test, one per 3 slots the camera
        # skipped (seen: 2 freezes in 8 s at load 8).
        assert window["freezes"] <= 1 + late // 3, (window, {"camera_frames_late": late})
        # Retransmission repairs the loss; a keyframe should not be needed (one is tolerated, if
        # a packet and its retransmission were both dropped until Chromium gave up on it).
        assert window["plis"] <= 1, window


def test_three_pages_play_at_once(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not in_browser_netns(request):
        return
    with running_server(tmp_path) as server, chromium() as browser:
        pages = [browser.new_context().new_page() for _ in range(3)]
        for page in pages:
            page.goto(server.url)
        status = server.status()
        for page in pages:
            assert_plays_the_source(page, status)
        status = server.status()
        assert status["viewers"]["count"] == 3
        # The pages' offers have one shape: the first answered by aiortc, at least one other
        # from its template (the pages may offer at once, before the first is answered), each
        # built on its first STUN check, as the answer promised.
        lazy = status["webrtc"]["stats"]["lazy"]
        assert lazy["answered"] >= 1 and lazy["built"] == lazy["answered"], lazy
        assert (lazy["answer_mismatch"], lazy["build_failed"], lazy["pending"]) == (0, 0, 0)


def test_page_reconnects_by_itself_after_a_server_restart(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if not in_browser_netns(request):
        return
    with chromium() as browser:
        server_cm = running_server(tmp_path)
        server = server_cm.__enter__()
        try:
            page = browser.new_page()
            page.goto(server.url)
            before = assert_plays_the_source(page, server.status())

            server.stop()
            wait_for_page(page, "noticing the server went away",
                          lambda s: s["state"] != "live", timeout_s=60)
            # Down for longer than the page's HLS fallback waits for a picture (5 s): a board
            # that does not answer at all is no reason to give up on WebRTC (HLS would not
            # play either, and the page stayed on HLS, seconds behind, once the board was back).
            time.sleep(8)
            assert page.evaluate("() => window.ruseonHls.mode") == "webrtc"
            assert page.evaluate("() => window.ruseon.reachable") is False
            server.start()  # same ports and state directory, as systemd would restart it

            after = wait_for_page(
                page, "a new connection playing again",
                lambda s: s["generation"] > before["generation"] and playing(s), timeout_s=90,
            )
            assert after["codec"] == "video/H264"
            assert page.evaluate("() => window.ruseonHls.mode") == "webrtc"
            assert server.status()["viewers"]["count"] == 1
        finally:
            server_cm.__exit__(None, None, None)


def test_page_logs_in_with_the_viewer_token_when_viewing_needs_one(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if not in_browser_netns(request):
        return
    viewer = "correct-horse-battery-staple"
    args = viewing_needs_a_credential(tmp_path, viewer)
    with running_server(tmp_path, extra_args=args) as server, chromium() as browser:
        page = browser.new_page()
        page.goto(server.url)
        page.wait_for_selector("#token-dialog[open]")
        assert page.text_content("#state-text") == "Locked"
        assert not page.is_visible("#access-note")  # viewing is not open to everyone here
        save_screenshot(page, "browser-token-prompt.png")

        page.fill("#token-input", "wrong")
        page.click("#token-form button[type=submit]")
        page.wait_for_function(
            "document.getElementById('token-hint').textContent === 'That secret is not valid.'"
        )
        assert page.is_visible("#token-dialog")
        page.fill("#token-input", viewer)
        page.click("#token-form button[type=submit]")
        assert_plays_the_source(page, server.status())
        assert page.evaluate("() => window.ruseonSession.role") == "viewer"
        # The page keeps no secret: the login is the server's HttpOnly cookie.
        assert viewer not in json.dumps(page.evaluate("({...sessionStorage, ...localStorage})"))

        page.reload()  # the cookie outlives the page: no prompt
        assert_plays_the_source(page, server.status())
        assert not page.is_visible("#token-dialog")

        # Watching is all the viewer token does: Settings asks for the admin secret.
        page.click("#btn-settings")
        page.wait_for_selector("#admin-dialog[open]")
        page.fill("#admin-input", viewer)
        page.click("#admin-submit")
        page.wait_for_function("document.getElementById('admin-error').textContent === "
                               "'That is the viewer token: this needs the admin secret.'")
        assert not page.is_visible("#ctl-panel")


def long_gop_recording(frames: int = 240, fps: int = 30) -> bytes:
    """320x240 Constrained Baseline with one IDR per ``frames`` (libx264 through PyAV) and a
    picture that moves every frame: a file source that cannot make a keyframe on demand."""
    from fractions import Fraction

    import av
    import numpy as np

    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = 320, 240, "yuv420p"
    ctx.time_base, ctx.framerate = Fraction(1, fps), Fraction(fps, 1)
    ctx.bit_rate = 400_000
    ctx.options = {"preset": "ultrafast", "tune": "zerolatency", "profile": "baseline",
                   "x264-params": f"keyint={frames}:min-keyint={frames}:scenecut=0:"
                                  "repeat-headers=1:bframes=0"}
    x = np.arange(320, dtype=np.uint16)
    out = bytearray()
    for i in range(frames):
        row = ((x + 4 * i) % 256).astype(np.uint8)
        picture = np.broadcast_to(row, (240, 320)).copy()
        frame = av.VideoFrame.from_ndarray(np.stack([picture] * 3, axis=-1), format="rgb24")
        frame.pts = i
        for packet in ctx.encode(frame.reformat(format="yuv420p")):
            out += bytes(packet)
    for packet in ctx.encode(None):
        out += bytes(packet)
    return bytes(out)


def test_chromium_joining_a_file_source_mid_gop_sees_motion_at_once(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Issue 19: a file source cannot make a keyframe on demand. A page joining a second or more
    after the IDR is sent the GOP so far (paced, squeezed into the last RTP ticks) instead of a
    still keyframe until the next IDR: Chromium decodes it all at once, pictures move in every
    quarter of the first second, no long freeze, no keyframe request, nothing left undecoded."""
    if not in_browser_netns(request):
        return
    recording = tmp_path / "long-gop.h264"
    recording.write_bytes(long_gop_recording())
    with running_server(tmp_path / "state", extra_args=["--source", f"file:{recording}"]) as \
            server, chromium() as browser:
        # Join well into the 8 s GOP: its IDR older than the 15-frame catch-up window.
        deadline = time.monotonic() + 30
        while not 1.0 <= (server.status()["source"]["keyframe_age_s"] or 0) <= 4.0:
            assert time.monotonic() < deadline, server.status()["source"]
            time.sleep(0.05)
        page = browser.new_page()
        page.goto(server.url)
        wait_for_page(page, "the first decoded frame", lambda s: s["framesDecoded"] > 0)
        samples = [stream_stats(page)]
        for _ in range(4):
            page.wait_for_timeout(250)
            if len(samples) == 4:
                session = viewer_session_stats(server)  # before the last sample
            samples.append(stream_stats(page))
        quarters = [stream_window(a, b)["frames_decoded"]
                    for a, b in itertools.pairwise(samples)]
        inbound = samples[-1]["inbound"]
        record_browser_stats("gop_catch_up", {
            "join_mode": session.get("join_mode"), "frames_sent": session.get("frames_sent"),
            "first_sample_frames_decoded": samples[0]["inbound"]["framesDecoded"],
            "first_second_decoded_per_quarter": quarters,
            "freezes_per_quarter": [stream_window(a, b)["freezes"]
                                    for a, b in itertools.pairwise(samples)],
            "totals": inbound_totals(samples[-1]),
        })
        assert session["join_mode"] == "catch-up-gop", session
        # The burst was more than a keyframe, and Chromium decodes all of it (and what came
        # after): nothing of the GOP is left undecoded, nothing dropped.
        assert session["frames_sent"] > 30, session
        decoded_all_received(page, max(inbound["framesReceived"], session["frames_sent"]))
        assert inbound["framesDropped"] == 0, inbound
        # Pictures moved in the first second after the first one: the still keyframe this join
        # replaced would stand until the next IDR, 4 s or more after this join, with nothing
        # decoded. (Not "in every quarter": under load 10-11 one run decoded [0, 0, 33, 8], half
        # a second in which the starved machine advanced nothing, burst or not.)
        assert sum(quarters) > 0, quarters
        # No freeze of the kind a join can cause (the burst stalls, or the still picture until
        # the next IDR when it ends within the watch): under 2 s of freezes in all. Short
        # freezes right after the burst are not judged here. Chromium counts a freeze when a
        # picture comes 150 ms later than the mean spacing of the last ones; after a burst that
        # mean is a few ms, so any 150 ms pause of the server, the browser or the machine
        # counts. Under load 8-13 on 2 cores, 3 joins in 12 had a freeze right after the burst
        # (0.2 s, 0.2 s, two making 0.53 s) with the paced burst stamps, and 3 in 5 (0.22-0.32 s)
        # with stamps squeezed into the last ticks, the defect the paced ones fixed; the half
        # second stall above made 0.885 s. That is a rate over many joins, which bench/join.py
        # chromium measures; one join cannot tell the two apart.
        assert inbound["totalFreezesDuration"] < 2.0, inbound_totals(samples[-1])
        assert inbound["pliCount"] == 0 and inbound["firCount"] == 0, inbound
