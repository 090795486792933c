"""Issue 31, goal 5 (fresh RSS): ``import aiortc`` without PyAV and dnspython
(``ruseon_appliance/deferred_imports.py``).

Each test runs a fresh process that starts the whole appliance on the file source, motion off,
and reports which of ``av``/``dns`` is absent, a stand-in or the real package; then uses them
for real (aiortc's H.264 decoder on a keyframe of the test clip, a snapshot JPEG, a VideoFrame,
isinstance, subclassing, an ``import av.container``, aioice's mDNS constant) and reports what
came out. The same probe with ``EAGER_IMPORTS=1`` is the reference: everything must come out
the same, and there the packages are real from the start.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.tooling import free_port

DATA = Path(__file__).resolve().parent / "capture" / "data" / "cam_320x240_baseline.h264"
ROOT = Path(__file__).resolve().parent.parent

PROBE = textwrap.dedent("""
    import asyncio, hashlib, json, sys

    def state(name):
        module = sys.modules.get(name)
        if module is None:
            return "absent"
        return "real" if getattr(module, "__file__", None) else "stand-in"

    def states():
        return {name: state(name) for name in ("av", "dns")}

    from ruseon_appliance.app import Appliance
    from ruseon_appliance.config import (CameraConfig, Config, HostPort, HttpConfig,
                                         StateConfig, WebRtcConfig)

    report = {}

    async def main():
        config = Config(
            cameras=(CameraConfig(source="file:" + DATA, width=320, height=240, motion=False),),
            http=HttpConfig(listen=HostPort("127.0.0.1", PORT)),
            webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
            state=StateConfig(dir=STATE),
        )
        app = Appliance(config)
        await app.start()
        report["started"] = states()
        print("started", flush=True)
        # The test may connect a viewer now; it says when it is done.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        report["after_viewer"] = states()
        await app.stop()

    asyncio.run(main())

    import aiortc.codecs.h264 as aiortc_h264
    import aiortc.mediastreams as mediastreams
    import aiortc.rtcrtpsender as rtcrtpsender
    import aioice.mdns as mdns
    from ruseon_appliance import deferred_imports
    from ruseon_appliance.capture.h264 import AccessUnitSplitter

    # Held before any use: a stand-in kept outside a module's globals.
    held_frame_class = mediastreams.__dict__["VideoFrame"]
    report["mdns_hostname"] = [mdns.is_mdns_hostname("abc.local"),
                               mdns.is_mdns_hostname("127.0.0.1")]
    report["after_mdns_hostname"] = states()

    data = open(DATA, "rb").read()
    units = AccessUnitSplitter(max_au_bytes=len(data) + 16).split_all(data)
    keyframe = next(unit for unit, idr in units if idr)

    # A decode through aiortc's own codec (JitterFrame as its depacketizer hands it over).
    from aiortc.jitterbuffer import JitterFrame
    frames = aiortc_h264.H264Decoder().decode(JitterFrame(data=keyframe, timestamp=0))
    frame = frames[0]
    report["decoded"] = [len(frames), frame.width, frame.height, frame.format.name,
                         hashlib.sha256(bytes(frame.planes[0])).hexdigest()]
    report["after_decode"] = states()

    import av
    import av.frame
    built = mediastreams.VideoFrame(width=64, height=48, format="yuv420p")
    report["identity"] = {
        "mediastreams.VideoFrame is av.VideoFrame": mediastreams.VideoFrame is av.VideoFrame,
        "rtcrtpsender.Frame is av.frame.Frame": rtcrtpsender.Frame is av.frame.Frame,
        "h264 module's av is av": aiortc_h264.av is av,
        "isinstance decoded, av.VideoFrame": isinstance(frame, av.VideoFrame),
        "isinstance built, held stand-in": isinstance(built, held_frame_class),
        "issubclass av.VideoFrame, held stand-in": issubclass(av.VideoFrame, held_frame_class),
        "real(held stand-in) is av.VideoFrame":
            deferred_imports.real(held_frame_class) is av.VideoFrame,
        "held stand-in builds a real frame":
            type(held_frame_class(width=8, height=8)) is av.VideoFrame,
    }

    class Subclass(held_frame_class):
        pass

    report["subclass_base"] = Subclass.__mro__[1].__qualname__
    report["subclass_is_real"] = Subclass.__mro__[1] is av.VideoFrame

    from ruseon_appliance.web.snapshot import keyframe_to_jpeg
    jpeg, width, height = keyframe_to_jpeg(keyframe)
    report["snapshot"] = [jpeg[:2].hex(), width, height]

    import aiortc.contrib.media  # imports av.container etc. itself
    report["contrib_media"] = aiortc.contrib.media.MediaPlayer.__name__
    report["av.container real"] = state("av.container")

    import dns.rdataclass
    # A real use first (type() of a value computed from stand-ins at import time sees the
    # stand-in until its package is resolved: deferred_imports.py's docstring).
    expected = dns.rdataclass.RdataClass.make(dns.rdataclass.IN | 0x8000)
    report["mdns_rdclass"] = [type(mdns.MDNS_RDCLASS).__name__, int(mdns.MDNS_RDCLASS),
                              mdns.MDNS_RDCLASS == expected]
    report["end"] = states()
    report["finder_left"] = [type(f).__name__ for f in sys.meta_path
                             if type(f).__module__ == "ruseon_appliance.deferred_imports"]
    print("report:" + json.dumps(report), flush=True)
""")


async def _watch(port: int) -> tuple[int, int, str]:
    from tests.e2e.whep_viewer import watch

    return await watch(f"http://127.0.0.1:{port}", frames=3, timeout=30)


def probe(tmp_path: Path, *, eager: bool, viewer: bool = False) -> dict[str, Any]:
    """Run :data:`PROBE` in a fresh interpreter (this worktree's package), a viewer connected
    to it between start and the real uses when ``viewer``."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("EAGER_IMPORTS", None)
    if eager:
        env["EAGER_IMPORTS"] = "1"
    script = f"DATA = {str(DATA)!r}\nPORT = {port}\nSTATE = {str(tmp_path / 'state')!r}\n"
    proc = subprocess.Popen([sys.executable, "-c", script + PROBE], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if line.strip() != "started":
            proc.kill()
            err = proc.communicate()[1]
            raise AssertionError(f"the probe did not start: {line!r} {err[-3000:]}")
        if viewer:
            width, height, _ = asyncio.run(_watch(port))
            assert (width, height) == (320, 240)
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("report:")]
    assert lines, out + err[-3000:]
    report: dict[str, Any] = json.loads(lines[-1].removeprefix("report:"))
    return report


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import aioice.ice

    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


def test_a_started_appliance_has_no_pyav_or_dnspython_until_used(tmp_path: Path) -> None:
    report = probe(tmp_path, eager=False)
    assert report["started"] == {"av": "stand-in", "dns": "stand-in"}
    assert report["after_viewer"] == {"av": "stand-in", "dns": "stand-in"}
    # aioice's hostname check is a regular expression: no dnspython for it.
    assert report["mdns_hostname"] == [True, False]
    assert report["after_mdns_hostname"] == {"av": "stand-in", "dns": "stand-in"}
    # The decode used PyAV for real: it is the real package now, dnspython still is not.
    assert report["after_decode"] == {"av": "real", "dns": "stand-in"}
    assert report["end"] == {"av": "real", "dns": "real"}
    assert report["finder_left"] == []


def test_eager_imports_imports_them_at_start(tmp_path: Path) -> None:
    report = probe(tmp_path, eager=True)
    assert report["started"] == {"av": "real", "dns": "real"}
    assert report["finder_left"] == []


def test_real_uses_come_out_exactly_as_with_eager_imports(tmp_path: Path) -> None:
    deferred = probe(tmp_path / "deferred", eager=False)
    eager = probe(tmp_path / "eager", eager=True)
    for key in ("decoded", "identity", "subclass_base", "subclass_is_real", "snapshot",
                "contrib_media", "av.container real", "mdns_rdclass", "mdns_hostname"):
        assert deferred[key] == eager[key], key
    assert deferred["decoded"][:4] == [1, 320, 240, "yuv420p"]
    assert all(deferred["identity"].values()), deferred["identity"]
    assert deferred["subclass_is_real"] is True
    assert deferred["snapshot"] == ["ffd8", 320, 240]  # a JPEG's SOI marker
    assert deferred["mdns_rdclass"] == ["RdataClass", 0x8001, True]


def test_a_viewer_on_the_fanout_path_does_not_load_pyav(tmp_path: Path,
                                                        loopback_only: None) -> None:
    # What the first viewer costs: the appliance's own sender path needs no PyAV (the viewer
    # here, in this process, decodes with it).
    report = probe(tmp_path, eager=False, viewer=True)
    assert report["started"] == {"av": "stand-in", "dns": "stand-in"}
    assert report["after_viewer"] == {"av": "stand-in", "dns": "stand-in"}
    assert report["end"] == {"av": "real", "dns": "real"}
