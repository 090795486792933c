"""Issue 19 (memory): a serve without ``[mqtt]`` never imports the Home Assistant integration
(paho-mqtt and aiomqtt, about 1 MiB of RSS). Issue 31, goal 5: nor, with motion detection off,
PyAV, numpy and dnspython (``deferred_imports.py``: a stand-in is not the package). Not an RSS
assertion: which modules load, in a fresh process that starts the whole appliance on a file
source."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.tooling import free_port

DATA = Path(__file__).resolve().parent / "capture" / "data" / "cam_320x240_baseline.h264"
WATCHED = ("ruseon_appliance.mqtt", "paho", "aiomqtt")
MEDIA = ("av", "numpy", "dns")


def modules_loaded_by_serve(state_dir: Path, mqtt_url: str, *, motion: bool = True,
                            watched: tuple[str, ...] = WATCHED,
                            wait_for: tuple[str, ...] = ()) -> list[str]:
    """Which of ``watched`` a process has loaded for real (a stand-in module has no
    ``__file__``) once the appliance has started (first frame in the ring, HTTP listening,
    integrations started) on the file source, and each of ``wait_for`` has loaded (at most
    20 s: what a worker thread loads when it gets to it)."""
    script = textwrap.dedent(f"""
        import asyncio, sys
        from ruseon_appliance.app import Appliance
        from ruseon_appliance.config import (CameraConfig, Config, HostPort, HttpConfig,
                                             MqttConfig, StateConfig, WebRtcConfig)

        async def main():
            config = Config(
                cameras=(CameraConfig(source={f"file:{DATA}"!r}, width=320, height=240,
                                      motion={motion!r}),),
                http=HttpConfig(listen=HostPort("127.0.0.1", {free_port()})),
                webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
                state=StateConfig(dir={str(state_dir)!r}),
                mqtt=MqttConfig(url={mqtt_url!r}),
            )
            app = Appliance(config)
            await app.start()
            def real(m):
                return getattr(sys.modules.get(m), "__file__", None) is not None
            for _ in range(200):
                if all(real(m) for m in {wait_for!r}):
                    break
                await asyncio.sleep(0.1)
            loaded = [m for m in {watched!r} if real(m)]
            await app.stop()
            print("loaded:" + ",".join(loaded))

        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("loaded:"), out.stdout
    return [m for m in line.removeprefix("loaded:").split(",") if m]


def test_a_serve_without_mqtt_imports_no_mqtt_client(tmp_path: Path) -> None:
    assert modules_loaded_by_serve(tmp_path / "state", "") == []


def test_a_serve_with_mqtt_loads_it(tmp_path: Path) -> None:
    # The other side: the watched modules are real and load when configured (nothing listens
    # on the port; a broker being down does not stop start-up).
    loaded = modules_loaded_by_serve(tmp_path / "state", f"mqtt://127.0.0.1:{free_port()}")
    assert set(loaded) == set(WATCHED)


def test_a_serve_with_motion_off_loads_no_pyav_numpy_or_dnspython(tmp_path: Path) -> None:
    assert modules_loaded_by_serve(tmp_path / "state", "", motion=False, watched=MEDIA) == []


def test_motion_detection_loads_pyav_and_numpy(tmp_path: Path) -> None:
    # The other side, and the default config: the motion analyser decodes with PyAV (from the
    # first keyframe, on its worker thread) into numpy, by design; dnspython still waits for an
    # mDNS candidate.
    loaded = modules_loaded_by_serve(tmp_path / "state", "", motion=True, watched=MEDIA,
                                     wait_for=("av",))
    assert set(loaded) == {"av", "numpy"}


def test_the_lores_path_loads_pyav_only_for_an_events_snapshot() -> None:
    # A Pi camera's motion detection on the ISP's lores plane decodes nothing: with the whole
    # appliance imported, analysing planes leaves PyAV unloaded; the JPEG of an event's peak
    # picture loads it (the other side: the check sees a real import).
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import ruseon_appliance.app  # everything ``ruseon serve`` imports
        from ruseon_appliance.motion.analyser import LoresAnalyser, luma_to_jpeg
        from ruseon_appliance.motion.detector import MotionSettings

        def real(m):
            return getattr(sys.modules.get(m), "__file__", None) is not None

        analyser = LoresAnalyser(MotionSettings())
        rng = np.random.default_rng(1)
        for n in range(40):
            analyser.feed(rng.integers(0, 255, (240, 320), dtype=np.uint8), n / 10)
        print("analysed", analyser.analysed, "av", real("av"))
        jpeg = luma_to_jpeg(np.zeros((240, 320), dtype=np.uint8))
        print("jpeg", jpeg[:2].hex(), "av", real("av"))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["analysed 40 av False", "jpeg ffd8 av True"], out.stdout
