"""recording.max_bytes bounds the whole recording disk, however many cameras record."""

from __future__ import annotations

from pathlib import Path

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import CameraConfig, Config, RecordingConfig, StateConfig
from ruseon_appliance.recording import Recorder


def recorders(app: Appliance) -> list[Recorder]:
    """Every camera's recorder (each has one)."""
    found = [c.recorder for c in app.cameras]
    assert all(r is not None for r in found)
    return [r for r in found if r is not None]


def test_max_bytes_is_shared_by_the_cameras(tmp_path: Path) -> None:
    cameras = tuple(CameraConfig(name=n, source="synthetic") for n in ("a", "b", "c"))
    config = Config(cameras=cameras, state=StateConfig(dir=str(tmp_path)),
                    recording=RecordingConfig(continuous=True, max_bytes=3_000_000))
    app = Appliance(config)
    shares = [r.settings.max_bytes for r in recorders(app)]
    assert len(shares) == 3 and all(s > 0 for s in shares) and sum(shares) <= 3_000_000
    # 0 stays "no limit" for every camera.
    unlimited = Appliance(Config(cameras=cameras, state=StateConfig(dir=str(tmp_path)),
                                 recording=RecordingConfig(max_bytes=0)))
    assert [r.settings.max_bytes for r in recorders(unlimited)] == [0, 0, 0]
