"""What ``[[camera]] audio`` means for a camera (no numpy here: a camera without sound never
imports the audio pipeline)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import CameraConfig

ASOUND_PCM = Path("/proc/asound/pcm")


def first_capture_device(pcm_list: Path = ASOUND_PCM) -> str | None:
    """The first ALSA capture device (``hw:C,D``) in ``/proc/asound/pcm``, or None."""
    try:
        lines = pcm_list.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        # "01-00: USB Audio : USB Audio : capture 1"
        ident, _, rest = line.partition(":")
        card, _, device = ident.strip().partition("-")
        if "capture" in rest and card.isdigit() and device.isdigit():
            return f"hw:{int(card)},{int(device)}"
    return None


def resolve_audio(cam: CameraConfig, *, pcm_list: Path = ASOUND_PCM) -> tuple[str, str]:
    """What ``audio`` means for this camera: ``(kind, why)`` with kind "none", "tone",
    "source" or "alsa:DEVICE"; ``why`` says why for "none" (the status page shows it)."""
    audio = cam.audio
    if audio != "auto":
        return audio, "audio = \"none\"" if audio == "none" else ""
    kind = cam.source_kind
    if kind == "synthetic":
        return "tone", ""
    if cam.source.startswith("rtsp"):
        return "source", ""
    if kind in ("picamera", "rpicam", "auto"):
        device = first_capture_device(pcm_list)
        if device is not None:
            return f"alsa:{device}", ""
        return "none", "no ALSA capture device (set audio = \"alsa:DEVICE\")"
    return "none", f"a {kind} source has no sound"

