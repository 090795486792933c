"""The HIL harness's own parts: report rendering, figures, RTP accounting, aiortc reach, netns."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import av
import pytest
from aiortc import RTCPeerConnection, RTCRtpReceiver

from hil import receive_tap, starvation, whep_conformance
from hil.battery import (
    Battery,
    Expectation,
    RigOptions,
    analyse_viewers,
    device_count_figures,
    power_command,
    same_fingerprint,
)
from hil.cli import build_parser, rig_options
from hil.device import parse_prometheus
from hil.report import CheckResult, Progress, Report, Verdict, percentiles
from hil.simulated_rig import SimulatedRig, _max_viewers, _strip_sim_flags, loss_ruleset, switch
from hil.starvation import StarvationProbe
from hil.viewer import ViewerPlan, _summarize
from tests.tooling import require_root, require_tool


def _report() -> Report:
    report = Report(device="http://198.18.100.1:8080", settings={"viewers": 5})
    report.add(CheckResult("healthz", Verdict.PASS, "200", {"status": 200}, 0.01))
    report.add(CheckResult("viewers", Verdict.FAIL, "2 of 5 decoded no picture",
                           {"fps": {"p50": 29.9, "min": 0.0}, "per_viewer": [{}, {}]}, 3.0))
    report.add(CheckResult("restart", Verdict.SKIP, "needs --ssh user@host"))
    report.add(CheckResult("churn", Verdict.ERROR, "RuntimeError: boom"))
    return report


def test_a_failed_or_errored_check_fails_the_run_and_a_skip_does_not() -> None:
    report = _report()
    assert not report.passed
    assert report.counts() == {"pass": 1, "fail": 1, "skip": 1, "error": 1}
    only_skip = Report(device="d")
    only_skip.add(CheckResult("restart", Verdict.SKIP, "no ssh"))
    assert only_skip.passed


def test_json_report_keeps_every_figure(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    _report().write_json(path)
    doc = json.loads(path.read_text())
    viewers = next(c for c in doc["checks"] if c["name"] == "viewers")
    assert viewers["verdict"] == "fail"
    assert viewers["figures"]["fps"] == {"p50": 29.9, "min": 0.0}
    assert len(viewers["figures"]["per_viewer"]) == 2
    assert doc["passed"] is False and doc["settings"] == {"viewers": 5}


def test_junit_maps_verdicts_to_failure_error_skipped() -> None:
    suite = ET.fromstring(_report().junit_xml().split("\n", 1)[1])
    assert suite.get("tests") == "4" and suite.get("failures") == "1"
    assert suite.get("errors") == "1" and suite.get("skipped") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["viewers"].find("failure") is not None
    assert cases["churn"].find("error") is not None
    assert cases["restart"].find("skipped") is not None
    assert cases["healthz"].find("failure") is None
    props = {p.get("name"): p.get("value") for p in cases["viewers"].iter("property")}
    assert props["fps.p50"] == "29.9" and props["per_viewer.count"] == "2"


def test_summary_table_and_progress_lines() -> None:
    table = _report().summary_table()
    assert "viewers" in table and "FAIL" in table and "HIL FAILED" in table
    out = io.StringIO()
    progress = Progress(out)
    progress.verdict(CheckResult("healthz", Verdict.PASS, "200"))
    assert "healthz: PASS — 200" in out.getvalue()


def test_percentiles_nearest_rank() -> None:
    summary = percentiles(float(i) for i in range(1, 101))
    assert summary == {"n": 100, "p50": 50.0, "p95": 95.0, "max": 100.0}
    assert percentiles([])["n"] == 0


def test_prometheus_text_is_parsed_with_labels() -> None:
    text = ("# HELP ruseon_viewers x\n# TYPE ruseon_viewers gauge\nruseon_viewers 3\n"
            'ruseon_http_errors_total{status="404"} 2\nprocess_resident_memory_bytes 1.5e+08\n')
    samples = parse_prometheus(text)
    assert samples["ruseon_viewers"] == 3
    assert samples['ruseon_http_errors_total{status="404"}'] == 2
    assert samples["process_resident_memory_bytes"] == 1.5e8


def test_sequence_tracker_unwraps_and_counts_gaps() -> None:
    tracker = receive_tap.SequenceTracker()
    for seq in [65533, 65534, 65535, 0, 2, 3]:  # 1 is missing, across the wrap
        tracker.add(seq)
    assert tracker.expected == 7
    assert tracker.expected - len(tracker.seen) == 1
    assert not tracker.add(3)  # a duplicate is not new


def test_nal_types_of_a_real_libx264_keyframe() -> None:
    codec = av.CodecContext.create("libx264", "w")
    codec.width, codec.height, codec.pix_fmt = 64, 64, "yuv420p"
    codec.options = {"x264-params": "repeat-headers=1", "tune": "zerolatency"}
    packets = [p for i in range(3) for p in codec.encode(_frame(i))]
    packets += codec.encode(None)
    first = receive_tap.nal_types(bytes(packets[0]))
    assert {receive_tap.NAL_SPS, receive_tap.NAL_PPS, receive_tap.NAL_IDR} <= set(first)
    assert receive_tap.NAL_IDR not in receive_tap.nal_types(bytes(packets[1]))


def test_first_rtp_nal_tells_a_lost_start_from_a_whole_one() -> None:
    sps, pps, idr = bytes([0x67, 0x42]), bytes([0x68, 0xCE]), bytes([0x65, 0x88, 0x84])
    stap_a = bytes([0x78]) + len(sps).to_bytes(2, "big") + sps + len(pps).to_bytes(2, "big") + pps
    assert receive_tap.first_nal_type(stap_a) == receive_tap.NAL_SPS
    assert receive_tap.first_nal_type(sps) == receive_tap.NAL_SPS
    fu_start = bytes([0x7C, 0x80 | 5]) + idr[1:]
    fu_middle = bytes([0x7C, 5]) + idr[1:]
    assert receive_tap.first_nal_type(fu_start) == receive_tap.NAL_IDR
    assert receive_tap.first_nal_type(fu_middle) == -1
    assert receive_tap.first_nal_type(b"") == -1
    whole, lost = receive_tap.TapFigures(), receive_tap.TapFigures()
    whole.first_rtp_nal = receive_tap.first_nal_type(stap_a)
    lost.first_rtp_nal = receive_tap.first_nal_type(fu_middle)
    assert not whole.start_lost and lost.start_lost
    assert not receive_tap.TapFigures().start_lost  # nothing received: nothing to say


def test_access_units_before_the_first_keyframe_are_dropped_and_a_keyframe_asked_for() -> None:
    """As a browser's frame buffer: what cannot decode before a keyframe is not decoded (no
    decode errors for it), one keyframe request is made, and decoding starts at the IDR."""
    codec = av.CodecContext.create("libx264", "w")
    codec.width, codec.height, codec.pix_fmt = 64, 64, "yuv420p"
    codec.options = {"x264-params": "repeat-headers=1:keyint=4:min-keyint=4:scenecut=0",
                     "tune": "zerolatency"}
    units = [bytes(p) for i in range(8) for p in codec.encode(_frame(i))]
    units += [bytes(p) for p in codec.encode(None)]
    # A stream whose first GOP's start was lost: two P pictures, then the next GOP.
    fed = units[2:4] + units[4:8]
    assert receive_tap.NAL_IDR not in receive_tap.nal_types(fed[0])
    asked: list[int] = []
    figures = receive_tap.TapFigures()
    decoder = receive_tap.FrameDecoder(figures, lambda: asked.append(1), read=lambda p: None)
    for unit in fed:
        decoder.feed(unit)
    decoder.close()
    assert figures.aus_before_keyframe == 2 and asked == [1]
    assert figures.decode_errors == 0
    assert receive_tap.NAL_IDR in figures.first_decoded_au_nals
    assert len(figures.frames) >= 1


def _frame(i: int) -> av.VideoFrame:
    frame = av.VideoFrame(64, 64, "yuv420p")
    for plane in frame.planes:
        plane.update(bytes([i * 40 % 256]) * plane.buffer_size)
    frame.pts = i
    return frame


async def test_aiortc_receiver_still_has_what_the_tap_reaches_into() -> None:
    """Fails loudly when an aiortc upgrade renames what hil/receive_tap.py relies on."""
    pc = RTCPeerConnection()
    try:
        receiver = pc.addTransceiver("video", direction="recvonly").receiver
        assert isinstance(receiver, RTCRtpReceiver)
        figures = receive_tap.TapFigures()
        decoder = receive_tap.FrameDecoder(figures, lambda: None)
        receive_tap.install(receiver, figures, decoder)  # raises if an attribute is gone
        assert isinstance(receiver._RTCRtpReceiver__decoder_queue, receive_tap.TapQueue)
        decoder.close()
    finally:
        await pc.close()


def test_mid_gop_joiners_are_dated_from_the_idr_capture_times() -> None:
    opts = RigOptions(device="d", expect=Expectation(fps=30, keyframe_interval=30))
    idrs = [1_000_000, 2_000_000, 3_000_000]
    results = [
        {"index": 0, "post_wall_us": 2_500_000, "idr_capture_us": idrs,
         "latency_s": {"n": 10, "p50": 0.04, "p95": 0.05, "max": 0.06}},
        {"index": 1, "post_wall_us": 3_010_000, "idr_capture_us": idrs,
         "latency_s": {"n": 10, "p50": 0.04, "p95": 0.07, "max": 0.08}},
    ]
    analysis = analyse_viewers(results, opts)
    assert results[0]["join_phase"] == 0.5
    assert analysis["mid_gop"]["viewers"] == 1  # viewer 1 joined right after an IDR
    assert analysis["latency_s"]["p95"] == 0.07


def test_loss_rules_and_flags_for_the_inner_run() -> None:
    assert "numgen random mod 1000 < 20 counter drop" in loss_ruleset(2.0)
    inner = _strip_sim_flags(["run", "--simulate", "--loss", "2", "--viewers", "5",
                              "--fault=stop-source", "--report", "r.json", "--duration", "20"])
    assert inner == ["run", "--viewers", "5", "--duration", "20"]


def test_simulated_rig_namespaces_are_built_and_always_removed() -> None:
    require_root("creates network namespaces")
    require_tool("ip", "apt install iproute2")
    require_tool("nft", "apt install nftables")
    rig = SimulatedRig(loss_pct=5.0, tag=f"t{__import__('os').getpid()}")
    try:
        rig.build()
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert rig.dev_ns in names and rig.rig_ns in names
        # The veth pair carries traffic between the namespaces and nowhere else.
        ping = subprocess.run(
            ["ip", "netns", "exec", rig.rig_ns, "python3", "-c",
             "import socket; s=socket.socket(); s.settimeout(2)\n"
             "try: s.connect(('198.18.100.1', 9))\n"
             "except ConnectionRefusedError: print('refused')\n"],
            capture_output=True, text=True)
        assert "refused" in ping.stdout  # reached the device namespace, nothing listens there
        rules = subprocess.run(["ip", "netns", "exec", rig.dev_ns, "nft", "list", "ruleset"],
                               capture_output=True, text=True).stdout
        assert "numgen random mod 1000 < 50" in rules
    finally:
        rig.teardown()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert rig.dev_ns not in names and rig.rig_ns not in names


@pytest.mark.parametrize("value", [0.5, 2.0, 10.0])
def test_loss_per_mille_resolution(value: float) -> None:
    assert f"< {round(value * 10)} " in loss_ruleset(value)


def test_live_latency_excludes_pictures_captured_before_the_viewer_connected() -> None:
    figures = receive_tap.TapFigures()
    connected_us = 10_000_000
    # The cached keyframe (900 ms old) and two catch-up frames, then live frames 40 ms late.
    for i, (captured, decoded) in enumerate(
            [(9_100_000, 10_000_000), (9_133_000, 10_010_000), (9_166_000, 10_020_000),
             (10_030_000, 10_070_000), (10_063_000, 10_103_000), (10_096_000, 10_136_000)]):
        figures.frames.append(receive_tap.FrameRecord(decoded / 1e6, decoded, i == 0,
                                                      (captured, i)))
    out = _summarize(figures, 9.9, 10.2, ViewerPlan(index=0, device="d"), connected_us)
    assert out["catch_up_frames"] == 3
    assert out["first_frame_latency_s"] == pytest.approx(0.9)
    assert out["latency_s"]["n"] == 3 and out["latency_s"]["max"] == pytest.approx(0.04)
    assert out["latency_all_s"]["n"] == 6 and out["latency_all_s"]["max"] == pytest.approx(0.9)


def test_live_latency_is_the_devices_part_not_the_rigs_decoder_or_starvation() -> None:
    plan = ViewerPlan(index=0, device="d")

    def stream(network_s: float, decoder_s: float) -> receive_tap.TapFigures:
        """30 live pictures each reaching the decoder ``network_s`` after capture and decoded
        ``decoder_s`` after that (monotonic and wall clock the same here)."""
        figures = receive_tap.TapFigures()
        for i in range(30):
            captured = 10.0 + i / 30
            arrived, decoded = captured + network_s, captured + network_s + decoder_s
            figures.frames.append(receive_tap.FrameRecord(
                decoded, round(decoded * 1e6), i == 0, (round(captured * 1e6), i), arrived))
        return figures

    # This rig's decoder thread ran 0.6 s behind: the device's latency is still 40 ms.
    behind = _summarize(stream(0.04, 0.6), 9.9, 11.5, plan, 9_000_000, StarvationProbe())
    assert behind["latency_s"]["p95"] == pytest.approx(0.04, abs=0.001)
    assert behind["latency_decoded_s"]["p95"] == pytest.approx(0.64, abs=0.001)
    # Pictures reached the decoder 0.6 s after capture while the rig was starved throughout:
    # the rig's doing, not the device's.
    starved = _summarize(stream(0.6, 0.0), 9.9, 11.5, plan, 9_000_000,
                         StarvationProbe([(9.0, 12.0, 1.0)]))
    assert starved["latency_s"]["p95"] == pytest.approx(0.0, abs=0.001)
    # The same while the rig ran (waiting, not starved): the device sent late, and it shows.
    late = _summarize(stream(0.6, 0.0), 9.9, 11.5, plan, 9_000_000, StarvationProbe())
    assert late["latency_s"]["p95"] == pytest.approx(0.6, abs=0.001)
    # Starved half of the time: half of it is left out.
    half = _summarize(stream(0.6, 0.0), 9.9, 11.5, plan, 9_000_000,
                      StarvationProbe([(9.0, 12.0, 0.5)]))
    assert half["latency_s"]["p95"] == pytest.approx(0.3, abs=0.001)


def _stream_with_a_hole(hole: tuple[float, float]) -> receive_tap.TapFigures:
    """20 s of 30 fps pictures from t=10 s, none between ``hole``'s ends (seconds); the device
    captured nothing then either (the stamps jump too)."""
    figures = receive_tap.TapFigures()
    for i in range(600):
        at = 10.0 + i / 30
        if hole[0] < at < hole[1]:
            continue
        us = round(at * 1e6)
        figures.frames.append(receive_tap.FrameRecord(at, us + 40_000, i % 30 == 0, (us, i), at))
    return figures


def test_a_gap_while_the_rig_was_starved_is_the_rigs_one_while_it_ran_the_devices() -> None:
    plan = ViewerPlan(index=0, device="d")
    figures = _stream_with_a_hole((15.0, 15.6))
    # The rig's own process waited for a CPU throughout the hole: no freeze of the device's.
    starved = _summarize(figures, 9.9, 30.1, plan, None,
                         StarvationProbe([(14.9, 15.8, 1.0)]))
    assert starved["freezes"] == 0 and starved["max_gap_s"] < 0.2
    assert starved["freeze_s_raw"] == pytest.approx(0.6, abs=0.04)
    assert starved["max_gap_s_raw"] == pytest.approx(0.6, abs=0.04)
    assert starved["rig_starved_s"] == pytest.approx(0.9)
    assert starved["observed_s"] == pytest.approx(20.2 - 0.9)
    # Starved half the time: half the gap is still the device's.
    half = _summarize(figures, 9.9, 30.1, plan, None, StarvationProbe([(14.9, 15.8, 0.5)]))
    assert half["freezes"] == 1 and half["freeze_s"] == pytest.approx(0.3, abs=0.04)
    # The rig ran: the whole gap is the device's, and it is told apart as a capture gap.
    ran = _summarize(figures, 9.9, 30.1, plan, None, StarvationProbe())
    assert ran["freezes"] == 1 and ran["freeze_s"] == pytest.approx(0.6, abs=0.04)
    (row,) = ran["freeze_detail"]
    assert row["rig_starved_s"] == 0 and row["capture_gap_s"] == pytest.approx(0.6, abs=0.04)
    # Every picture arrived on time, but this rig's decoder fell 0.5 s behind and caught up:
    # the rig's doing (only the gaps as timed here show it).
    late = receive_tap.TapFigures()
    for i in range(600):
        at = 10.0 + i / 30
        decoded = 10.0 + 315 / 30 if 300 <= i < 315 else at  # held up, then all at once
        late.frames.append(receive_tap.FrameRecord(decoded, round(decoded * 1e6), False,
                                                   (round(at * 1e6), i), at))
    behind = _summarize(late, 9.9, 30.1, plan, None, StarvationProbe())
    assert behind["freezes"] == 0 and behind["max_gap_s_raw"] > 0.5


def test_steady_state_fails_on_a_device_stall_and_errs_when_the_rig_starved() -> None:
    opts = RigOptions(device="d", expect=Expectation(fps=30, keyframe_interval=30))
    battery = Battery(opts, Progress(quiet=True))
    plan = ViewerPlan(index=0, device="d")

    def verdict(hole: tuple[float, float], probe: StarvationProbe) -> CheckResult:
        result = {"index": 0, "ok": True, "watched_s": 20.2,
                  **_summarize(_stream_with_a_hole(hole), 9.9, 30.1, plan, None, probe)}
        return battery._steady_result([result], analyse_viewers([result], opts), None, None)

    # A 1 s stall of the device while the rig ran: caught (gap > 1 s, frozen > 5 %).
    stall = verdict((15.0, 16.05), StarvationProbe())
    assert stall.verdict == Verdict.FAIL and "gap between pictures" in stall.reason
    # The same stall while the rig was starved for a moment elsewhere: still caught.
    elsewhere = verdict((15.0, 16.05), StarvationProbe([(20.0, 21.0, 1.0)]))
    assert elsewhere.verdict == Verdict.FAIL
    # A short hole during a short starvation of the rig: a pass that says so.
    short = verdict((15.0, 15.6), StarvationProbe([(14.9, 15.8, 1.0)]))
    assert short.verdict == Verdict.PASS and "starved" in short.reason
    # A rig starved for a third of the watch cannot vouch for the device: an error, not a pass.
    starved = verdict((15.0, 15.6), StarvationProbe([(12.0, 19.0, 1.0)]))
    assert starved.verdict == Verdict.ERROR and "starved" in starved.reason


def test_latency_and_freeze_limits_default_to_the_release_gates_and_can_be_set() -> None:
    parser = build_parser()
    strict = rig_options(parser.parse_args(["run", "--device", "http://d"]))
    gate = RigOptions(device="d")
    assert (strict.max_latency_ms, strict.max_freeze_ratio, strict.max_gap_s) == (
        gate.max_latency_ms, gate.max_freeze_ratio, gate.max_gap_s) == (400.0, 0.05, 1.0)
    shared = rig_options(parser.parse_args(
        ["run", "--device", "http://d", "--max-latency-ms", "2000", "--max-freeze-ratio", "0.25",
         "--max-gap", "1.5"]))
    assert (shared.max_latency_ms, shared.max_freeze_ratio, shared.max_gap_s) == (2000, 0.25, 1.5)
    # Judged by the shared machine's freeze share, a 1 s stall of the device still fails (the gap).
    shared.expect = Expectation(fps=30, keyframe_interval=30)
    shared.max_gap_s = 1.0
    result = {"index": 0, "ok": True, "watched_s": 20.2,
              **_summarize(_stream_with_a_hole((15.0, 16.05)), 9.9, 30.1,
                           ViewerPlan(index=0, device="d"), None, StarvationProbe())}
    stall = Battery(shared, Progress(quiet=True))._steady_result(
        [result], analyse_viewers([result], shared), None, None)
    assert stall.verdict == Verdict.FAIL and "gap between pictures" in stall.reason
    assert stall.figures["limits"] == {"max_gap_s": 1.0, "max_freeze_ratio": 0.25}


@pytest.mark.parametrize("starved", [True, False])
async def test_the_probe_charges_a_late_tick_to_starvation_only_by_run_queue_wait(
        monkeypatch: pytest.MonkeyPatch, starved: bool) -> None:
    waited = [0.0]
    monkeypatch.setattr(starvation, "run_delay_s", lambda: waited[0])
    probe = StarvationProbe()
    task = asyncio.ensure_future(probe.run())
    await asyncio.sleep(0.2)
    # The loop cannot run for 0.3 s: waiting for a CPU (starved), or busy with its own work.
    if starved:
        waited[0] += 0.3
    time.sleep(0.3)
    await asyncio.sleep(0.2)
    task.cancel()
    if starved:
        assert len(probe.spans) == 1 and probe.total_s() == pytest.approx(0.3)
    else:
        assert probe.spans == []


def test_run_delay_is_read_from_this_process_schedstat() -> None:
    first = starvation.run_delay_s()
    assert first is not None and first >= 0
    second = starvation.run_delay_s()
    assert second is not None and second >= first


def test_fingerprints_compare_by_digest_and_power_commands_expand() -> None:
    assert same_fingerprint("sha-256 AB:CD:EF", "ab:cd:ef")
    assert same_fingerprint("sha-256 AB:CD:EF", "sha-256 AB:CD:00") is False
    assert same_fingerprint(None, "sha-256 AB") is None
    assert power_command("crelay 1 {on|off}", "off") == "crelay 1 off"
    assert power_command("relay --state {}", "on") == "relay --state on"


def test_device_viewer_count_mismatches_are_counted() -> None:
    good = device_count_figures([(8.0, 5), (9.0, 5)], (7.5, 19.5), 5)
    assert good["mismatches"] == 0 and good["counts"] == [5, 5]
    bad = device_count_figures([(8.0, 5), (9.0, 7), (10.0, None)], (7.5, 19.5), 5)
    assert bad["mismatches"] == 2


def test_whep_request_builders() -> None:
    offer = "v=0\r\na=ice-ufrag:abcd\r\na=ice-pwd:secretsecretsecret\r\nm=video 9 x\r\na=mid:0\r\n"
    fresh = whep_conformance.with_fresh_ice_credentials(offer)
    assert "a=ice-ufrag:abcd" not in fresh and "a=ice-ufrag:" in fresh and "m=video" in fresh
    fragment = whep_conformance.trickle_fragment(offer)
    assert fragment.startswith("a=ice-ufrag:abcd\r\na=ice-pwd:secretsecretsecret\r\n")
    assert "a=mid:0" in fragment and "a=end-of-candidates" in fragment
    assert whep_conformance.retry_after_ok("3")
    assert whep_conformance.retry_after_ok("Wed, 21 Oct 2015 07:28:00 GMT")
    assert not whep_conformance.retry_after_ok("0")
    assert not whep_conformance.retry_after_ok(None)
    assert not whep_conformance.retry_after_ok("soon")


def test_simulated_max_viewers_leaves_room_for_the_battery() -> None:
    assert _max_viewers([], 5) == ["--max-viewers", "8"]
    assert _max_viewers([], 20) == ["--max-viewers", "23"]
    assert _max_viewers(["--max-viewers=50"], 5) == []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_simulated_switch_cuts_restores_and_restarts_the_device(tmp_path: Path) -> None:
    """The switch the inner run calls: off kills the device, on and restart start a new one."""
    rig = SimulatedRig(work_dir=tmp_path)
    rig._device_argv = ["sleep", "300"]  # a stand-in device process; the switch does not care
    rig._spawn_device()
    rig.serve_control()
    try:
        assert rig.device_proc is not None
        first = rig.device_proc.pid
        assert switch(rig.control_path, "on") == 1  # already on: refused, with a reason
        assert switch(rig.control_path, "off") == 0
        assert not _alive(first)
        assert switch(rig.control_path, "on") == 0
        second = rig.device_proc.pid
        assert second != first and _alive(second)
        assert switch(rig.control_path, "restart") == 0
        third = rig.device_proc.pid
        assert third != second and _alive(third) and not _alive(second)
    finally:
        rig.teardown()
    assert not _alive(third)
    assert switch(tmp_path / "switch.sock", "on") == 1  # nobody answers after teardown
    assert os.path.exists(tmp_path / "device.log")
