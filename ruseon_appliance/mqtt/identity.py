"""The appliance's MQTT device id: stable across restarts, so Home Assistant's ``unique_id``s
(and the user's dashboards and automations that point at them) survive a reboot."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

DEVICE_ID_FILE = "mqtt-device-id"


def load_device_id(state_dir: Path, configured: str = "") -> str:
    """``configured`` if set, else the id kept in ``state_dir`` (created 0600 on first use)."""
    if configured:
        return configured
    path = state_dir / DEVICE_ID_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
        if text and text.isalnum():
            return text
    except (OSError, UnicodeDecodeError):
        pass
    device_id = "ruseon" + secrets.token_hex(4)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a .tmp left by a crash keeps its own mode otherwise
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(device_id + "\n")
    os.replace(tmp, path)
    return device_id
