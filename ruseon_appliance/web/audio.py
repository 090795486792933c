"""A camera's sound on the API: ``GET``/``PATCH /api/camera/<camera>/audio`` (admin: mute and
gain, live) and ``ruseon_audio_*`` in ``/metrics``."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ruseon_appliance.web.metrics import Families
from ruseon_appliance.web.problem import Problem, json_changes

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ruseon_appliance.audio.pipeline import AudioPipeline

EXPECTED = '{"muted": true|false, "gain_db": -60..30}'

# (stats key, metric suffix, kind, help)
AUDIO_METRICS = (
    ("level_dbfs", "level_dbfs", "gauge", "The sound's RMS level after gain (dBFS; -90 silence)"),
    ("muted", "muted", "gauge", "1 while muted"),
    ("running", "up", "gauge", "1 while the audio source delivers"),
    ("chunks_in", "chunks_total", "counter", "PCM chunks read from the source"),
    ("source_failures", "source_failures_total", "counter",
     "Times the source could not be opened or went away (retried)"),
    ("drift_corrections", "drift_corrections_total", "counter",
     "Times the sample clock was stepped back onto the capture clock"),
    ("chunks_resampled", "chunks_resampled_total", "counter",
     "Chunks resampled to keep a drifting device on the capture clock"),
)


class AudioControlResource:
    """``GET``/``PATCH`` one camera's mute and gain (applied to the next 20 ms; not saved:
    ``audio_muted``/``audio_gain_db`` in the configuration are what a restart comes back to)."""

    def __init__(self, audio: AudioPipeline, path: str) -> None:
        self.audio = audio
        self.path = path

    def add_routes(self, app: web.Application) -> None:
        """Register GET (and HEAD) and PATCH."""
        app.router.add_get(self.path, self.get)
        app.router.add_patch(self.path, self.patch)

    def describe(self) -> dict[str, Any]:
        """What is in force and the level."""
        stats = self.audio.stats()
        return {key: stats[key] for key in ("source", "running", "problem", "muted", "gain_db",
                                            "level_dbfs", "peak_dbfs")}

    async def get(self, request: web.Request) -> web.Response:
        """Mute, gain and the level now."""
        return web.json_response(self.describe(), headers={"Cache-Control": "no-store"})

    async def patch(self, request: web.Request) -> web.Response:
        """``{"muted": bool, "gain_db": number}`` (either), checked whole before either
        applies."""
        changes = await json_changes(request, EXPECTED)
        unknown = set(changes) - {"muted", "gain_db"}
        if unknown:
            raise Problem(422, f"unknown setting {', '.join(sorted(unknown))}: muted and "
                               "gain_db can be changed")
        muted, gain = changes.get("muted"), changes.get("gain_db")
        if "muted" in changes and not isinstance(muted, bool):
            raise Problem(422, f"muted = {str(muted)[:40]!r} must be true or false")
        if "gain_db" in changes and (isinstance(gain, bool) or not isinstance(gain, int | float)
                                     or not math.isfinite(gain) or not -60 <= gain <= 30):
            raise Problem(422, f"gain_db = {str(gain)[:40]!r} must be a number -60 to 30")
        if "gain_db" in changes:
            self.audio.set_gain_db(float(gain or 0.0))
        if "muted" in changes:
            self.audio.set_muted(bool(muted))
        return web.json_response(self.describe(), headers={"Cache-Control": "no-store"})


def audio_metrics(pipelines: Mapping[str, AudioPipeline]) -> Iterator[Metric]:
    """``ruseon_audio_*{camera=...}`` and the encoders' packets
    (``ruseon_audio_packets_total{camera, codec}``)."""
    out = Families()
    stats = {name: audio.stats() for name, audio in pipelines.items()}
    for key, suffix, kind, help_text in AUDIO_METRICS:
        name = f"ruseon_audio_{suffix}"
        family = (out.counter(name, help_text, ["camera"]) if kind == "counter"
                  else out.gauge(name, help_text, ["camera"]))
        for camera, figures in stats.items():
            family.add_metric([camera], float(figures[key]))
    packets = out.counter("ruseon_audio_packets_total", "Packets encoded, per codec (one encode "
                          "per camera, shared by every output)", ["camera", "codec"])
    for camera, figures in stats.items():
        for codec in ("opus", "aac"):
            packets.add_metric([camera, codec], float(figures[codec]["packets"]))
    return out.collect()
