"""One WHEP viewer as a browser would be: an aiortc offerer with a receive-only video transceiver.

It POSTs its offer, applies the answer, receives and decodes the video for a while, then DELETEs
its session. Every moment a viewer notices is timed from the POST: the 201, ICE+DTLS connected,
the first RTP packet and the first decoded picture. Each decoded picture's stamp gives the
capture-to-decode latency: the one the device's synthetic source draws at a fixed place or, with
``--glass``, the glass pattern that a display in front of a real camera shows, found wherever it
is in the picture (:class:`~ruseon_appliance.capture.stamp.GlassStampReader`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription

from hil.receive_tap import (
    FREEZE_GAP_S,
    NAL_IDR,
    NAL_PPS,
    NAL_SPS,
    FrameDecoder,
    FrameRecord,
    LossRecovery,
    TapFigures,
)
from hil.receive_tap import install as install_tap
from hil.report import percentiles
from hil.starvation import StarvationProbe
from ruseon_appliance.capture.stamp import GlassStampReader, read_stamp

# Freezes described one by one in a viewer's result (the first ones).
FREEZE_DETAIL_MAX = 20
# How long a viewer waits for each milestone before it gives up.
CONNECT_TIMEOUT_S = 20.0
# POSTs of one offer when the device answers 429 (this address holds its share of places).
POST_ATTEMPTS = 4
FIRST_FRAME_TIMEOUT_S = 20.0


@dataclass
class ViewerPlan:
    """What one viewer does: when it starts, how long it watches, whether it decodes everything."""

    index: int
    device: str
    token: str = ""
    start_delay_s: float = 0.0
    # Seconds of watching after the first decoded picture (or after giving up waiting for it).
    watch_s: float = 10.0
    decode_all: bool = True
    # Keep every per-frame latency sample in the result (large; for --report only).
    keep_samples: bool = False
    # The camera films `hil glass`: find the glass pattern anywhere in the picture instead of
    # reading the synthetic source's stamp at its fixed place.
    glass: bool = False


def _h264_preferences() -> list[Any]:
    caps = RTCRtpReceiver.getCapabilities("video")
    h264 = [c for c in caps.codecs if c.mimeType.lower() == "video/h264"]
    rtx = [c for c in caps.codecs if c.mimeType.lower() == "video/rtx"]
    return h264 + rtx


def _fingerprint(sdp: str) -> str | None:
    for line in sdp.splitlines():
        if line.startswith("a=fingerprint:"):
            return line[len("a=fingerprint:") :].strip()
    return None


async def watch(
    plan: ViewerPlan,
    http: aiohttp.ClientSession,
    *,
    live: Callable[[TapFigures | None], None] | None = None,
) -> dict[str, Any]:
    """Run one viewer to the end and return its figures (JSON-ready; never raises).

    ``live`` is called with the viewer's running counters when it starts and with None when it
    ends (for progress lines).
    """
    await asyncio.sleep(plan.start_delay_s)
    result: dict[str, Any] = {"index": plan.index, "ok": False, "error": None}
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    figures = TapFigures()
    if live is not None:
        live(figures)
    read = GlassStampReader().read if plan.glass else read_stamp
    decoder = FrameDecoder(figures, lambda: None, decode_all=plan.decode_all, read=read)
    connected = asyncio.Event()
    failed = asyncio.Event()
    starvation = StarvationProbe()
    starvation_task = asyncio.ensure_future(starvation.run())
    t_connected: list[float] = []

    def _on_state() -> None:
        if pc.connectionState == "connected" and not t_connected:
            t_connected.append(time.monotonic())
            # Wall clock too: pictures captured before this moment were cached on the device.
            result["connected_wall_us"] = time.time_ns() // 1000
            connected.set()
        elif pc.connectionState in ("failed", "closed"):
            failed.set()

    pc.add_listener("connectionstatechange", _on_state)
    location: str | None = None
    recovery_task: asyncio.Future[None] | None = None
    t_post = time.monotonic()
    try:
        transceiver = pc.addTransceiver("video", direction="recvonly")
        transceiver.setCodecPreferences(_h264_preferences())
        recovery = LossRecovery(transceiver.receiver, figures)
        set_answer = install_tap(transceiver.receiver, figures, decoder, recovery)
        recovery_task = asyncio.ensure_future(recovery.run())
        await pc.setLocalDescription(await pc.createOffer())
        headers = {"Content-Type": "application/sdp"}
        if plan.token:
            headers["Authorization"] = f"Bearer {plan.token}"
        result["post_wall_us"] = time.time_ns() // 1000
        t_post = time.monotonic()
        for attempt in range(POST_ATTEMPTS):
            async with http.post(
                plan.device.rstrip("/") + "/whep", data=pc.localDescription.sdp, headers=headers
            ) as resp:
                answer = await resp.text()
                t_answer = time.monotonic()
                result["post_status"] = resp.status
                location = resp.headers.get("Location")
                retry_after = resp.headers.get("Retry-After", "")
            # 429: this client address already holds its share of places (the device caps them per
            # address); like the device page, come back when Retry-After says.
            if resp.status == 429 and attempt + 1 < POST_ATTEMPTS:
                result["post_retries"] = attempt + 1
                await asyncio.sleep(float(retry_after) if retry_after.isdigit() else 2.0)
                continue
            break
        if result["post_status"] != 201:
            raise ViewerError(f"POST /whep answered {result['post_status']}: {answer[:160]}")
        result["answer_s"] = t_answer - t_post
        result["fingerprint"] = _fingerprint(answer)
        set_answer(answer)
        await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        await _wait_either(connected, failed, CONNECT_TIMEOUT_S, "ICE+DTLS connected")
        result["connected_s"] = t_connected[0] - t_post
        deadline = time.monotonic() + FIRST_FRAME_TIMEOUT_S
        while not figures.frames and time.monotonic() < deadline and not failed.is_set():
            await asyncio.sleep(0.01)
        if not figures.frames:
            raise ViewerError("no decoded picture within "
                              f"{FIRST_FRAME_TIMEOUT_S:.0f} s of connecting")
        await asyncio.sleep(plan.watch_s)
        result["ok"] = True
    except ViewerError as exc:
        result["error"] = str(exc)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # the harness reports a crashed viewer instead of dying with it
        result["error"] = f"viewer crashed: {type(exc).__name__}: {exc}"
    finally:
        # The end of watching: a stall that lasts until here is a freeze too.
        t_end = time.monotonic()
        result["watched_s"] = t_end - t_post
        starvation_task.cancel()
        if recovery_task is not None:
            recovery_task.cancel()
        if location:
            result["delete_status"] = await _delete(http, plan, location)
        await pc.close()
        decoder.close()
        if live is not None:
            live(None)
    result.update(_summarize(figures, t_post, t_end, plan, result.get("connected_wall_us"),
                             starvation))
    if result["ok"] and result.get("first_au_keyframe") is False and not result.get("start_lost"):
        result["error"] = "first access unit is not an IDR with SPS and PPS"
    return result


def _freezes(frames: list[FrameRecord], t_post: float, t_end: float,
             starvation: StarvationProbe | None) -> dict[str, Any]:
    """Freezes (gaps between pictures > FREEZE_GAP_S, the last one up to the end of watching),
    judged on what the device is answerable for.

    A picture's time is when its complete access unit reached this viewer's decoder (left the
    jitter buffer), not when the decoder here got round to it: a decoder thread that falls
    behind is the rig's doing. And while the rig's own process waited for a CPU it could not
    receive pictures either, so that part of a gap is left out too (``rig_starved_s``). A device
    that stops sending, sends late or sends what cannot be decoded is caught all the same: the
    next decoded picture's access unit then arrives late, and a rig waiting for it is idle, not
    starved. ``freezes``, ``freeze_s`` and ``max_gap_s`` are these; ``freeze_s_raw`` and
    ``max_gap_s_raw`` are the gaps between decoded pictures as timed here; ``observed_s`` is the
    time watched less the rig's starvation (what a frozen share is of). ``freeze_detail`` tells
    each freeze apart: ``capture_gap_s`` (stamps of the pictures on both sides: a camera that
    captured nothing shows the gap there too), ``arrival_gap_s`` and ``rig_starved_s``.
    """
    def starved(start: float, end: float) -> float:
        return starvation.starved_s(start, end) if starvation is not None else 0.0

    def arrived(frame: FrameRecord) -> float:
        return frame.arrived if frame.arrived is not None else frame.monotonic

    ends: list[tuple[FrameRecord, FrameRecord | None]] = [
        *itertools.pairwise(frames), (frames[-1], None)]
    raw: list[float] = []
    net: list[float] = []
    detail: list[dict[str, Any]] = []
    for a, b in ends:
        gap = (b.monotonic if b is not None else t_end) - a.monotonic
        start = arrived(a)
        end = max(start, arrived(b) if b is not None else t_end)
        rig = min(end - start, starved(start, end)) if end - start > FREEZE_GAP_S else 0.0
        raw.append(gap)
        net.append(end - start - rig)
        if max(gap, end - start) <= FREEZE_GAP_S or len(detail) >= FREEZE_DETAIL_MAX:
            continue
        row: dict[str, Any] = {"at_s": round(a.monotonic - t_post, 3), "gap_s": round(gap, 3),
                               "arrival_gap_s": round(end - start, 3),
                               "rig_starved_s": round(rig, 3)}
        if b is not None and a.stamp is not None and b.stamp is not None:
            row["capture_gap_s"] = round((b.stamp[0] - a.stamp[0]) / 1e6, 3)
        detail.append(row)
    rig_total = starved(t_post, t_end)
    return {
        "freezes": sum(1 for g in net if g > FREEZE_GAP_S),
        "freeze_s": sum(g for g in net if g > FREEZE_GAP_S),
        "max_gap_s": max(net, default=0.0),
        "freeze_s_raw": sum(g for g in raw if g > FREEZE_GAP_S),
        "max_gap_s_raw": max(raw, default=0.0),
        "rig_starved_s": rig_total,
        "observed_s": max(0.0, t_end - t_post - rig_total),
        "freeze_detail": detail,
    }


def _latency(frame: FrameRecord, starvation: StarvationProbe | None) -> float:
    """A stamped picture's latency as the device is answerable for it: from its capture to
    when its access unit reached this viewer's decoder (not when the decoder here got round to
    it: a decoder thread that falls behind is the rig's doing), less the time the rig's own
    process waited for a CPU meanwhile (it could not receive the picture then). A device that
    sends late is caught all the same: the access unit then arrives late, and a rig waiting for
    it is idle, not starved. Pictures without an arrival time are timed at decoding."""
    assert frame.stamp is not None
    arrived_us = frame.wall_us
    if frame.arrived is not None:
        arrived_us -= round(max(0.0, frame.monotonic - frame.arrived) * 1e6)
    latency = (arrived_us - frame.stamp[0]) / 1e6
    if starvation is None or latency <= 0:
        return latency
    arrived = frame.arrived if frame.arrived is not None else frame.monotonic
    return latency - min(latency, starvation.starved_s(arrived - latency, arrived))


class ViewerError(Exception):
    """A viewer could not reach a milestone; the message says which."""


async def _wait_either(ok: asyncio.Event, bad: asyncio.Event, timeout_s: float, what: str) -> None:
    waiters = [asyncio.ensure_future(ok.wait()), asyncio.ensure_future(bad.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
    if not ok.is_set():
        state = "failed" if bad.is_set() else f"not within {timeout_s:.0f} s"
        raise ViewerError(f"{what}: {state}")


async def _delete(http: aiohttp.ClientSession, plan: ViewerPlan, location: str) -> int | None:
    url = location if location.startswith("http") else plan.device.rstrip("/") + location
    headers = {"Authorization": f"Bearer {plan.token}"} if plan.token else {}
    try:
        async with http.delete(url, headers=headers) as resp:
            return resp.status
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None


def _summarize(fig: TapFigures, t_post: float, t_end: float, plan: ViewerPlan,
               connected_wall_us: int | None = None,
               starvation: StarvationProbe | None = None) -> dict[str, Any]:
    """The per-viewer figures from what the tap recorded.

    Latency is split in two. A joining viewer first gets the device's cached keyframe and the
    frames after it (the GOP catch-up burst): those pictures were captured before the viewer's
    transport was even up, so they are old by design and their age says how stale the first
    picture is, not how late the live stream runs. ``latency_s`` covers only pictures captured
    after the viewer connected; ``catch_up_latency_s`` the ones before; ``latency_all_s`` both.
    Each is judged as :func:`_latency` says (to the decoder's input, net of the rig's own
    starvation); ``latency_decoded_s`` is the live one timed at decoding, for comparison.

    Gaps between pictures are judged net of the time ``starvation`` says the rig itself was
    starved of CPU (see :func:`_freezes`).
    """
    frames = fig.frames
    out: dict[str, Any] = {
        "first_rtp_s": fig.first_rtp - t_post if fig.first_rtp is not None else None,
        "first_frame_s": frames[0].monotonic - t_post if frames else None,
        "frames": len(frames),
        "access_units": fig.access_units,
        "decode_errors": fig.decode_errors,
        "rtp_packets": fig.rtp_packets,
        "rtp_bytes": fig.rtp_bytes,
        "rtx_packets": fig.rtx_packets,
        "packets_lost": fig.packets_lost,
        "packets_unrecovered": fig.packets_unrecovered,
        "packets_expected": fig.media.expected,
        "nacks_sent": fig.nacks_sent,
        "nacked_packets": fig.nacked_packets,
        "plis_sent": fig.plis_sent,
        "nack_retries": fig.nack_retries,
        "packets_abandoned": fig.packets_abandoned,
        "first_au_nals": fig.first_au_nals,
        "first_decoded_au_nals": fig.first_decoded_au_nals,
        "first_rtp_nal": fig.first_rtp_nal,
        # The stream's first packets were lost on the way: its first access unit cannot be
        # whole, and the viewer waited for the keyframe it asked for (as a browser does).
        "start_lost": fig.start_lost,
        "aus_before_keyframe": fig.aus_before_keyframe,
        "idr_capture_us": fig.idr_capture_us[:64],
    }
    if fig.first_au_nals:
        nals = set(fig.first_au_nals)
        out["first_au_keyframe"] = {NAL_IDR, NAL_SPS, NAL_PPS} <= nals
    if frames:
        out["first_frame_keyframe"] = frames[0].keyframe
        # Rates over the whole time watched after the first picture, not just until the last
        # one: a stream that stops early must not look healthy.
        span = t_end - frames[0].monotonic
        out["fps"] = (len(frames) - 1) / span if span > 0 else None
        out["bitrate_bps"] = 8 * fig.rtp_bytes / span if span > 0 else None
        out.update(_freezes(frames, t_post, t_end, starvation))
        stamped = [f for f in frames if f.stamp is not None]
        out["stamps_read"] = len(stamped)
        judged = {id(f): _latency(f, starvation) for f in stamped}
        latencies = [judged[id(f)] for f in stamped]
        # Without a connect time (the viewer never connected) nothing counts as catch-up.
        live_from = connected_wall_us if connected_wall_us is not None else 0
        catch_up = [judged[id(f)] for f in stamped
                    if f.stamp is not None and f.stamp[0] < live_from]
        live = [judged[id(f)] for f in stamped
                if f.stamp is not None and f.stamp[0] >= live_from]
        out["latency_s"] = percentiles(live)
        # The same pictures timed when this rig decoded them, starvation and all.
        out["latency_decoded_s"] = percentiles(
            [(f.wall_us - f.stamp[0]) / 1e6 for f in stamped
             if f.stamp is not None and f.stamp[0] >= live_from])
        out["catch_up_latency_s"] = percentiles(catch_up)
        out["catch_up_frames"] = len(catch_up)
        out["latency_all_s"] = percentiles(latencies)
        if stamped and stamped[0].stamp is not None:
            out["first_frame_latency_s"] = (stamped[0].wall_us - stamped[0].stamp[0]) / 1e6
            out["first_frame_number"] = stamped[0].stamp[1]
        if plan.keep_samples:
            out["latency_samples_s"] = [round(x, 6) for x in latencies]
    return out
