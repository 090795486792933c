"""Issue 19 (memory): a serve with a file source never imports the synthetic camera, nor numpy
(about 20 MiB of RSS), which only it needs, unless a camera detects motion (issue 28: on by
default; its detector works on numpy planes). Not a timing or RSS assertion: which modules load."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "cam_320x240_baseline.h264"
WATCHED = ("numpy", "ruseon_appliance.capture.sources.synthetic", "ruseon_appliance.capture.stamp")


def modules_loaded_by(source: str, *, motion: bool = False) -> list[str]:
    """Which of :data:`WATCHED` a process has loaded after importing the whole appliance and
    running a capture pipeline on ``source`` until its first frame."""
    script = textwrap.dedent(f"""
        import asyncio, sys
        import ruseon_appliance.app  # everything ``ruseon serve`` imports
        from ruseon_appliance.cameras.assembly import assemble_cameras
        from ruseon_appliance.clock import WallClock
        from ruseon_appliance.config import CameraConfig, Config, StateConfig
        from ruseon_appliance.events import EventBus

        async def main():
            # The cameras as ``ruseon serve`` builds them (motion = {motion!r}).
            config = Config(cameras=(CameraConfig(source={source!r}, width=320, height=240,
                                                  motion={motion!r}),),
                            state=StateConfig(dir="/nonexistent"))  # nothing is written
            feed = assemble_cameras(config, clock=WallClock(None), events=EventBus()).default
            await feed.pipeline.start()
            assert await feed.pipeline.wait_first_frame(20)
            await feed.pipeline.stop()

        asyncio.run(main())
        print("loaded:" + ",".join(m for m in {WATCHED!r} if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("loaded:"), out.stdout
    return [m for m in line.removeprefix("loaded:").split(",") if m]


def test_a_file_source_serve_imports_no_numpy_nor_the_synthetic_camera() -> None:
    assert modules_loaded_by(f"file:{DATA}") == []


def test_a_camera_that_detects_motion_loads_numpy_for_it() -> None:
    assert modules_loaded_by(f"file:{DATA}", motion=True) == ["numpy"]


def test_the_synthetic_source_still_loads_what_it_needs() -> None:
    # The other side of the check: the watched modules are real and do load when needed.
    assert set(modules_loaded_by("synthetic")) == set(WATCHED)
