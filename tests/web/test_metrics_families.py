"""``/metrics`` through prometheus-client: parses with the library's own parser, and carries every
family the hand-written exposition had. ``metrics_families_before.txt`` was written by this test
(``RUSEON_DUMP_FAMILIES=1``) on main just before the change, against the whole appliance with one
connected viewer, a relay, HLS and recording on: the core families, the ones exported from the
components' ``stats()`` dicts, and the other rooms' sections."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ruseon_appliance.config import CameraConfig, HostPort, RelayConfig, RtspConfig
from tests.tooling import free_port
from tests.web.conftest import ADMIN, Viewer, running_device, web_config
from tests.web.test_controls import AUTH, appliance_at, config_for

BEFORE = Path(__file__).with_name("metrics_families_before.txt")


def families(text: str) -> dict[str, str]:
    """``{family name: type}`` as prometheus_client's parser reads them."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


async def test_metrics_parse_and_keep_every_family(tmp_path: Path) -> None:
    relay = RelayConfig(name="test", url=f"rtp://127.0.0.1:{free_port()}")
    config = dataclasses.replace(config_for(tmp_path), relay=(relay,))
    async with appliance_at(config) as (_, http, url):
        base = url.removesuffix("/api/camera/controls")
        viewer = Viewer()
        try:
            async with http.post(base + "/whep", data=await viewer.offer(), headers={
                    **AUTH, "Content-Type": "application/sdp"}) as resp:
                assert resp.status == 201
                await viewer.accept(await resp.text())
            await viewer.track
            for _ in range(100):
                async with http.get(base + "/api/status", headers=AUTH) as resp:
                    if (await resp.json())["viewers"]["sessions"][0]["state"] == "connected":
                        break
                await asyncio.sleep(0.1)
            async with http.get(base + "/metrics", headers=AUTH) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                text = await resp.text()
        finally:
            await viewer.close()
    found = families(text)
    # The body joins several sections; a family twice is a failed scrape for Prometheus
    # ("second TYPE line for metric name"), though the Python parser merges it quietly.
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), sorted(t for t in types if types.count(t) > 1)
    # Label values are reasons, statuses, names: never a session id or a viewer's address,
    # which would add series for ever.
    values = {v for f in text_string_to_metric_families(text) for s in f.samples
              for v in s.labels.values()}
    assert not [v for v in values if "127.0.0.1" in v or len(v) > 40], values
    if os.environ.get("RUSEON_DUMP_FAMILIES"):
        BEFORE.write_text("".join(f"{n} {t}\n" for n, t in sorted(found.items())))
    before = dict(line.split() for line in BEFORE.read_text().splitlines() if line.strip())
    missing = sorted(set(before) - set(found))
    assert not missing, f"families lost: {missing}"
    changed = {n: (before[n], found[n]) for n in before if before[n] != found[n]}
    assert not changed, f"families whose type changed: {changed}"
    # Histograms for offer -> answer and POST -> connected, with data.
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
               if not s.labels}
    assert found["ruseon_whep_answer_seconds"] == "histogram"
    assert samples["ruseon_whep_answer_seconds_count"] == 1
    assert samples["ruseon_handshake_seconds_count"] == 1
    # Process metrics from the library's process collector.
    assert {"process_resident_memory_bytes", "process_cpu_seconds", "process_open_fds",
            "process_start_time_seconds"} <= set(found)
    # stats() dicts still flow in: engine, capture, and this integrations.
    assert samples["ruseon_engine_offers_accepted"] == 1
    # The connected viewer under the SRTP profile its handshake settled on.
    srtp = [(s.labels, s.value) for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "ruseon_engine_srtp_sessions"]
    assert len(srtp) == 1 and srtp[0][1] == 1 and srtp[0][0]["key"].startswith("SRTP_"), srtp
    assert samples["ruseon_engine_srtp_hardware_aes"] in (-1, 0, 1)
    assert samples["ruseon_capture_frames_in"] > 0
    assert "ruseon_events_published" in found


def assert_typed(text: str) -> dict[str, str]:
    """Every family once, counters exactly the ``*_total`` samples, no ``_created``; returns
    ``{family name: type}``."""
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), sorted(t for t in types if types.count(t) > 1)
    parsed = list(text_string_to_metric_families(text))
    assert len(parsed) == len({f.name for f in parsed})
    wrong = []
    for family in parsed:
        names = {s.name for s in family.samples}
        if family.type == "counter":
            if names - {family.name + "_total"}:
                wrong.append((family.name, family.type, names))
        elif family.type == "histogram":
            if names - {family.name + s for s in ("_bucket", "_sum", "_count")}:
                wrong.append((family.name, family.type, names))
        elif names - {family.name} or family.name.endswith("_total"):
            # A gauge named ..._total is a counter exported as a gauge.
            wrong.append((family.name, family.type, names))
    assert not wrong, wrong
    assert "_created" not in text
    return {f.name: f.type for f in parsed}


async def test_every_family_is_typed_once_and_the_same_at_each_scrape(tmp_path: Path) -> None:
    """Two cameras, RTSP, a relay, HLS and recording: every section of /metrics (admin only)."""
    cameras = tuple(CameraConfig(name=name, source="synthetic", width=320, height=240,
                                 keyframe_interval=30) for name in ("front", "back"))
    config = dataclasses.replace(
        config_for(tmp_path), cameras=cameras,
        relay=(RelayConfig(name="test", url=f"rtp://127.0.0.1:{free_port()}"),),
        rtsp=RtspConfig(enable=True, listen=HostPort("127.0.0.1", free_port())))
    async with appliance_at(config) as (_, http, url):
        base = url.removesuffix("/api/camera/controls")
        async with http.get(base + "/metrics") as resp:
            assert resp.status == 401
        # A figure that is None until something happens (the HLS window's newest capture
        # time before its first part) is no family yet: on a loaded machine it may arrive
        # between two scrapes. Families that a scrape itself added would differ every time.
        pairs = []
        for _ in range(3):
            scrapes = []
            for _ in range(2):
                async with http.get(base + "/metrics", headers=AUTH) as resp:
                    assert resp.status == 200
                    scrapes.append(await resp.text())
            first, second = (assert_typed(text) for text in scrapes)
            pairs.append(sorted(set(first.items()) ^ set(second.items())))
            if first == second:
                break
        assert first == second, pairs
    # Counters from stats() dicts (keys ending in _total) and from the sections' own families.
    for name in ("ruseon_recording_segments_closed", "ruseon_clock_steps",
                 "ruseon_rtsp_frames_sent", "ruseon_rtsp_requests", "ruseon_relay_packets_sent",
                 "ruseon_camera_frames_captured", "ruseon_auth_failures", "ruseon_hls_requests",
                 "ruseon_sessions_started", "process_cpu_seconds"):
        assert first[name] == "counter", name
    up = [s for f in text_string_to_metric_families(scrapes[1]) for s in f.samples
          if s.name == "ruseon_camera_up"]
    assert sorted(s.labels["camera"] for s in up) == ["back", "front"]
    # Every camera's recorder, HLS stream, stall sensor and control counters, labelled.
    samples = [s for f in text_string_to_metric_families(scrapes[1]) for s in f.samples]
    for family in ("ruseon_camera_recording_segments_closed_total",
                   "ruseon_camera_recording_recording", "ruseon_camera_hls_parts_added",
                   "ruseon_camera_stalled", "ruseon_camera_control_changes_total"):
        cams = sorted(s.labels.get("camera", "") for s in samples if s.name == family)
        assert cams == ["back", "front"], (family, cams)
    assert first["ruseon_camera_recording_segments_closed"] == "counter"


async def test_label_values_with_quotes_and_backslashes(tmp_path: Path) -> None:
    """A name the config would refuse, straight to the web app: the library escapes it in the
    text and the parser gets the name back."""
    name = 'yard "north" \\ 2'
    config = web_config(camera={"name": name})
    async with running_device(config, tmp_path) as (_, _, client):
        text = await (await client.get("/metrics", headers=ADMIN)).text()
    assert 'ruseon_camera_up{camera="yard \\"north\\" \\\\ 2"} 1.0\n' in text, text
    up = [s for f in text_string_to_metric_families(text) for s in f.samples
          if s.name == "ruseon_camera_up"]
    assert [s.labels for s in up] == [{"camera": name}]
    assert_typed(text)
