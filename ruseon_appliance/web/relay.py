"""``GET /relay/<name>.sdp`` and the relays' part of ``/api/status`` and ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ruseon_appliance.relay import parameter_sets, relay_sdp
from ruseon_appliance.relay.rtp_relay import RESOLVE_RETRY_S
from ruseon_appliance.web.metrics import Families, metric_name
from ruseon_appliance.web.problem import Problem

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from ruseon_appliance.capture.pipeline import CapturePipeline
    from ruseon_appliance.relay import RtpRelay

# Per-relay counters exported to /metrics: (stats key, metric suffix, help).
_COUNTERS = (
    ("packets_sent", "packets_sent_total", "RTP packets sent to the relay target."),
    ("bytes_sent", "bytes_sent_total", "RTP/SRTP bytes sent to the relay target."),
    ("keyframe_requests_received", "keyframe_requests_total",
     "PLI/FIR received from the relay target."),
    ("sender_reports", "sender_reports_total", "RTCP sender reports sent."),
    ("outages", "outages_total", "Times the target refused (ICMP unreachable) and media paused."),
)
# The audio's (stats["audio"]), counted apart from the video's.
_AUDIO_COUNTERS = (
    ("packets_sent", "audio_packets_sent_total", "Opus RTP packets sent to the relay target."),
    ("bytes_sent", "audio_bytes_sent_total", "Opus RTP/SRTP bytes sent to the relay target."),
    ("outages", "audio_outages_total",
     "Times the target's audio port refused (ICMP unreachable) and the audio paused."),
)


def audio_sdp(relay: RtpRelay) -> dict[str, int]:
    """The SDP's audio arguments: none for a relay without sound."""
    audio = relay.audio
    if audio is None:
        return {}
    return {"audio_port": relay.config.audio_port,
            "audio_rtcp_port": relay.config.audio_rtcp_target_port,
            "audio_payload_type": audio.payload_type, "audio_ssrc": audio.ssrc}


class RelayResource:
    """The relays as the web layer shows them."""

    def __init__(self, relays: Sequence[RtpRelay], capture: CapturePipeline, *,
                 captures: Mapping[str, CapturePipeline] | None = None) -> None:
        self.relays: Mapping[str, RtpRelay] = {r.name: r for r in relays}
        self.capture = capture
        # Each relay's camera pipeline (by relay name) when there are several cameras.
        self.captures: Mapping[str, CapturePipeline] = captures or {}

    def add_routes(self, app: web.Application) -> None:
        """Register ``GET /relay/{name}.sdp`` (behind the token, like the API: with SRTP the SDP
        carries the key)."""
        app.router.add_get("/relay/{name}.sdp", self.sdp)

    async def sdp(self, request: web.Request) -> web.Response:
        """The SDP of relay ``name``: 404 for an unknown name, 503 before the first SPS or while
        the target's name does not resolve."""
        relay = self.relays.get(request.match_info["name"])
        if relay is None:
            raise Problem(404, "no relay has that name")
        if relay.state == "unresolved":
            # The SDP needs the target's address; its name has not resolved yet (DNS at boot).
            retry = f"{RESOLVE_RETRY_S:.0f}"
            raise Problem(503, f"the relay target {relay.target[0]} does not resolve yet; "
                               f"the relay retries every {retry} s", headers={"Retry-After": retry})
        capture = self.captures.get(relay.name, self.capture)
        info = capture.stream_info
        sets = parameter_sets(capture.ring)
        if info is None or sets is None:
            raise Problem(503, "no keyframe from the camera yet", headers={"Retry-After": "1"})
        host, port = relay.target
        body = relay_sdp(
            name=relay.name, host=host, port=port, rtcp_port=relay.config.rtcp_target_port,
            payload_type=relay.payload_type, ssrc=relay.ssrc, cname=relay.cname,
            profile_level_id=info.profile_level_id, sps=sets[0], pps=sets[1],
            srtp_key=relay.config.srtp_key, **audio_sdp(relay))
        return web.Response(body=body.encode(), content_type="application/sdp",
                            headers={"Cache-Control": "no-store"})

    def status(self) -> list[dict[str, Any]]:
        """Each relay's figures, for ``/api/status``."""
        return [relay.stats() for relay in self.relays.values()]

    def metrics(self) -> Iterator[Metric]:
        """Each relay's counters, labelled ``relay="<name>"``."""
        out = Families()
        counters = [(out.counter(metric_name("ruseon_relay", suffix), help_text, ["relay"]), key)
                    for key, suffix, help_text in _COUNTERS]
        audio_counters = [
            (out.counter(metric_name("ruseon_relay", suffix), help_text, ["relay"]), key)
            for key, suffix, help_text in _AUDIO_COUNTERS]
        audio_up = out.gauge("ruseon_relay_audio_up",
                             "1 while the relay sends the camera's sound.", ["relay"])
        errors = out.counter("ruseon_relay_errors_total", "Relay errors, by kind.",
                             ["relay", "kind"])
        up = out.gauge("ruseon_relay_up", "1 while the relay target accepts packets.", ["relay"])
        for stats in self.status():
            for family, key in counters:
                family.add_metric([stats["name"]], stats[key])
            for kind, n in sorted(stats["errors"].items()):
                errors.add_metric([stats["name"], kind], n)
            up.add_metric([stats["name"]], int(stats["state"] == "sending"))
            audio = stats["audio"]
            for family, key in audio_counters:
                family.add_metric([stats["name"]], audio[key])
            audio_up.add_metric([stats["name"]], int(audio["state"] == "sending"))
        return out.collect()
