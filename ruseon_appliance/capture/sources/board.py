"""Whether this machine is one where a camera is expected: a Raspberry Pi, or the RUSEON image.

There, ``camera.source = "auto"`` never falls back to the synthetic test picture when no camera
answers: a moving test pattern on a Pi with a loose ribbon cable looks like a working camera,
feeds the watchdog and keeps Home Assistant's problem sensor off. On a developer machine
(``make run``) the test picture stays the default.

The device tree is read under ``/sys/firmware/devicetree/base`` first: ``ruseon.service`` runs
with ``ProcSubset=pid``, which hides ``/proc/device-tree`` (a symlink to it) from the service.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

DEVICE_TREE_MODELS = (Path("/sys/firmware/devicetree/base/model"),
                      Path("/proc/device-tree/model"))
# Installed by image/layer/apply.sh on every image (Debian and Raspberry Pi OS targets).
IMAGE_MARKER = Path("/usr/lib/ruseon/image-release")


def device_tree_model(paths: Sequence[Path] = DEVICE_TREE_MODELS) -> str:
    """The board's model string ("Raspberry Pi 4 Model B Rev 1.5"), or "" when none says."""
    for path in paths:
        try:
            return path.read_bytes().rstrip(b"\0\n").decode("utf-8", "replace")
        except OSError:
            continue
    return ""


def camera_expected(models: Sequence[Path] = DEVICE_TREE_MODELS,
                    marker: Path = IMAGE_MARKER) -> str:
    """Why a real camera is expected here ("a Raspberry Pi 4 Model B ...", "the RUSEON image
    (/usr/lib/ruseon/image-release)"), or "" on any other machine (the test picture may stand
    in)."""
    model = device_tree_model(models)
    if "Raspberry Pi" in model:
        return model
    if marker.exists():
        return f"the RUSEON image ({marker})"
    return ""
