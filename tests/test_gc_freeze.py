"""Issue 31 (GC pauses): once started, the appliance moves what start-up made (modules,
classes, configuration) out of the collector's generations (``gc.freeze``), so a full
collection walks only what came after. In a fresh process that starts the whole appliance on a
file source: what a full collection has to walk then, against what start-up froze, and the
collector's thresholds then in force."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from ruseon_appliance.app import GC_THRESHOLDS
from tests.tooling import free_port

DATA = Path(__file__).resolve().parent / "capture" / "data" / "cam_320x240_baseline.h264"


def test_a_started_appliance_has_frozen_what_start_up_made(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import asyncio, gc, time
        from ruseon_appliance.app import Appliance
        from ruseon_appliance.config import (CameraConfig, Config, HostPort, HttpConfig,
                                             StateConfig, WebRtcConfig)

        async def main():
            config = Config(
                cameras=(CameraConfig(source={f"file:{DATA}"!r}, width=320, height=240),),
                http=HttpConfig(listen=HostPort("127.0.0.1", {free_port()})),
                webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
                state=StateConfig(dir={str(tmp_path / "state")!r}),
            )
            app = Appliance(config)
            await app.start()
            await asyncio.sleep(1.0)  # frames, HLS parts: what a running service makes
            frozen, walked = gc.get_freeze_count(), len(gc.get_objects())
            threshold = gc.get_threshold()
            await app.stop()
            print(f"frozen:{{frozen}} walked:{{walked}}")
            print("threshold:" + ",".join(map(str, threshold)))

        asyncio.run(main())
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("frozen:"))
    frozen, walked = (int(part.split(":")[1]) for part in line.split())
    # Tens of thousands of start-up objects out of every full collection; what is left to
    # walk is a small part of it.
    assert frozen > 20_000 and walked < frozen / 4, (frozen, walked)
    # And the young generation collected far less often than CPython's default (700): most of
    # a running appliance's allocations die young by reference counting (app.GC_THRESHOLDS).
    threshold = next(x for x in result.stdout.splitlines() if x.startswith("threshold:"))
    assert tuple(int(t) for t in threshold.split(":")[1].split(",")) == GC_THRESHOLDS
    assert GC_THRESHOLDS[0] >= 10_000
