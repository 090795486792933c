"""``/metrics`` in the Prometheus text exposition format (version 0.0.4), written by hand.

The web layer counts what it sees itself (offers answered and refused, answer latency, session
events from the engine, HTTP errors); the engine's and the capture pipeline's ``stats()`` are
exported as they are, numbers as gauges, ``{name: {label: number}}`` as one labelled family, so a
counter added there shows up here without a change in this file. Process RSS and CPU come from
``/proc`` and ``getrusage``.
"""

from __future__ import annotations

import bisect
import math
import os
import re
import resource
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Offer → answer is a few ms; POST → connected is tens to hundreds of ms.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_]")


class Histogram:
    """A cumulative Prometheus histogram with fixed upper bounds (seconds)."""

    def __init__(self, buckets: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Record one observation."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        """The ``_bucket``, ``_sum`` and ``_count`` sample lines."""
        out: list[str] = []
        cumulative = 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            cumulative += count
            le = "+Inf" if bound == math.inf else _number(bound)
            out.append(f'{name}_bucket{{le="{le}"}} {cumulative}')
        out.append(f"{name}_sum {_number(self.total)}")
        out.append(f"{name}_count {self.count}")
        return out


class WebMetrics:
    """What the web layer counts itself, partly from the engine's session events."""

    def __init__(self) -> None:
        self.offers_answered = 0
        self.offers_refused: Counter[str] = Counter()
        # POST received → answer sent.
        self.answer_seconds = Histogram()
        # Session created → ICE and DTLS connected.
        self.handshake_seconds = Histogram()
        self.sessions_started = 0
        self.sessions_ended: Counter[str] = Counter()
        # Bytes and packets sent by sessions that have ended (live ones are added at render).
        self.ended_bytes_sent = 0
        self.ended_packets_sent = 0
        self._handshakes_seen: set[str] = set()

    def on_session_event(self, event: str, session: Any) -> None:
        """Engine listener: ``session-started`` / ``session-ended``."""
        if event == "session-started":
            self.sessions_started += 1
        elif event == "session-ended":
            self.observe_handshake(session)
            self._handshakes_seen.discard(session.id)
            self.sessions_ended[session.end_reason or "unknown"] += 1
            stats = session.stats()
            self.ended_bytes_sent += int(stats.get("bytes_sent") or 0)
            self.ended_packets_sent += int(stats.get("packets_sent") or 0)

    def observe_handshake(self, session: Any) -> None:
        """Record a session's time to connect, once, as soon as it has connected."""
        if session.connected_at is None or session.id in self._handshakes_seen:
            return
        self._handshakes_seen.add(session.id)
        self.handshake_seconds.observe(max(0.0, session.connected_at - session.created))


def metric_name(*parts: str) -> str:
    """A valid Prometheus metric name from ``parts`` joined by ``_``."""
    name = _INVALID_NAME_CHARS.sub("_", "_".join(p for p in parts if p)).strip("_")
    return name if not name[:1].isdigit() else "_" + name


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, complex)


class Exposition:
    """Builds the text body family by family (each family's HELP/TYPE once)."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._seen: set[str] = set()

    def family(
        self, name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]
    ) -> None:
        """One metric family; ``samples`` are ``(label-set text or "", value)``."""
        if name in self._seen:
            return
        self._seen.add(name)
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self._lines.append(f"{name}{labels} {_number(value)}")

    def histogram(self, name: str, help_text: str, histogram: Histogram) -> None:
        """A histogram family."""
        self._seen.add(name)
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} histogram")
        self._lines.extend(histogram.lines(name))

    def stats(self, prefix: str, stats: Mapping[str, Any], help_text: str) -> None:
        """Export a component's ``stats()``: numbers as gauges, a dict of numbers as one family
        labelled by ``key``, other dicts recursively under a longer name."""
        for key, value in sorted(stats.items()):
            name = metric_name(prefix, key)
            if _is_number(value):
                self.family(name, "gauge", f"{help_text}: {key}", [("", value)])
            elif isinstance(value, Mapping) and value:
                if all(_is_number(v) for v in value.values()):
                    samples = [
                        (f'{{key="{_label_value(str(k))}"}}', v)
                        for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
                    ]
                    self.family(name, "gauge", f"{help_text}: {key} by key", samples)
                else:
                    self.stats(name, value, help_text)

    def text(self) -> str:
        """The finished body."""
        return "\n".join(self._lines) + "\n"


def process_samples() -> tuple[int, float]:
    """(resident set size in bytes, CPU seconds user+system) of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = usage.ru_maxrss * 1024  # peak, not current: better than nothing off Linux
    return rss, cpu


def _labelled(label: str, counts: Mapping[Any, Any]) -> list[tuple[str, float]]:
    return [
        (f'{{{label}="{_label_value(str(k))}"}}', v)
        for k, v in sorted(counts.items(), key=lambda kv: str(kv[0]))
        if _is_number(v)
    ]


def render(
    web: WebMetrics,
    *,
    sessions: Sequence[Any],
    engine_stats: Mapping[str, Any],
    capture_stats: Mapping[str, Any],
    http_errors: Mapping[int, int],
) -> str:
    """The whole ``/metrics`` body."""
    for session in sessions:
        web.observe_handshake(session)
    live = [s.stats() for s in sessions]
    bytes_sent = web.ended_bytes_sent + sum(int(s.get("bytes_sent") or 0) for s in live)
    packets_sent = web.ended_packets_sent + sum(int(s.get("packets_sent") or 0) for s in live)
    mux = engine_stats.get("mux")
    dropped = mux.get("dropped", {}) if isinstance(mux, Mapping) else {}

    out = Exposition()
    out.family("ruseon_viewers", "gauge", "Live WHEP viewer sessions.", [("", len(sessions))])
    out.family(
        "ruseon_sessions_started_total", "counter", "Viewer sessions created.",
        [("", web.sessions_started)],
    )
    out.family(
        "ruseon_sessions_ended_total", "counter", "Viewer sessions ended, by reason.",
        _labelled("reason", web.sessions_ended),
    )
    out.family(
        "ruseon_whep_offers_answered_total", "counter", "Offers answered with 201.",
        [("", web.offers_answered)],
    )
    out.family(
        "ruseon_whep_offers_refused_total", "counter", "Offers refused, by engine error.",
        _labelled("error", web.offers_refused),
    )
    out.histogram(
        "ruseon_whep_answer_seconds", "Time from POST /whep to the SDP answer.", web.answer_seconds
    )
    out.histogram(
        "ruseon_handshake_seconds",
        "Time from session creation to ICE and DTLS connected.",
        web.handshake_seconds,
    )
    out.family("ruseon_sent_bytes_total", "counter", "RTP bytes sent to viewers.",
               [("", bytes_sent)])
    out.family("ruseon_sent_packets_total", "counter", "RTP packets sent to viewers.",
               [("", packets_sent)])
    out.family(
        "ruseon_keyframe_requests_total", "counter", "Keyframe requests from viewers, by kind.",
        _labelled("reason", engine_stats.get("keyframe_requests") or {}),
    )
    out.family(
        "ruseon_frames_captured_total", "counter", "Access units from the camera.",
        [("", capture_stats.get("frames_in") or 0)],
    )
    out.family(
        "ruseon_frames_dropped_total", "counter", "Access units dropped before the ring.",
        [("", capture_stats.get("frames_dropped") or 0)],
    )
    out.family(
        "ruseon_ring_overruns_total", "counter", "Ring readers lapped by the writer.",
        [("", capture_stats.get("readers_overrun") or 0)],
    )
    out.family(
        "ruseon_udp_packets_dropped_total", "counter", "UDP datagrams dropped, by reason.",
        _labelled("reason", dropped if isinstance(dropped, Mapping) else {}),
    )
    out.family(
        "ruseon_http_errors_total", "counter", "HTTP error answers, by status.",
        _labelled("status", http_errors),
    )
    rss, cpu = process_samples()
    out.family("process_resident_memory_bytes", "gauge", "Resident memory size.", [("", rss)])
    out.family("process_cpu_seconds_total", "counter", "User and system CPU time.", [("", cpu)])
    out.stats("ruseon_engine", engine_stats, "WebRTC engine")
    out.stats("ruseon_capture", capture_stats, "Capture pipeline")
    return out.text()
