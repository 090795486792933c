"""Which Raspberry Pi SoC this is, from the device tree (for sources that do not ask a library).

BCM2712 boards (Pi 5, Compute Module 5, Pi 500) have no hardware H.264 encoder: rpicam-vid and
picamera2 fall back to libx264 there. The model string does not say so reliably ("Raspberry Pi
Compute Module 5 Rev 1.0" has no "Pi 5" in it); the SoC entry of ``compatible`` does.
"""

from __future__ import annotations

from pathlib import Path

# Under /sys, not /proc/device-tree (a symlink to it): ruseon.service runs with ProcSubset=pid,
# which hides /proc/device-tree, so a Pi 5 read there looked like a board with an encoder.
DEVICE_TREE_COMPATIBLE = Path("/sys/firmware/devicetree/base/compatible")

# The SoC without a hardware H.264 encoder.
BCM2712 = "brcm,bcm2712"


def compatible_strings(path: Path = DEVICE_TREE_COMPATIBLE) -> list[str]:
    """The device tree root's ``compatible`` list (NUL-separated in the file); [] if absent."""
    try:
        raw = path.read_bytes()
    except OSError:
        return []
    return [part.decode("ascii", "replace") for part in raw.split(b"\0") if part]


def is_bcm2712(path: Path = DEVICE_TREE_COMPATIBLE) -> bool:
    """True on every BCM2712 board (Pi 5, CM5, Pi 500): H.264 is software (libx264) there."""
    return BCM2712 in compatible_strings(path)
