"""``/metrics`` in the Prometheus text exposition format (version 0.0.4), through prometheus-client.

The web layer counts what it sees itself (offers answered and refused, session events from the
engine, HTTP errors) and times offer -> answer and POST -> connected in the library's
histograms; the engine's and the capture pipeline's ``stats()`` are exported as they are,
numbers as gauges, ``{name: {label: number}}`` as one labelled family, so a counter added there
shows up here without a change in this file. Process metrics (memory, CPU, file descriptors,
start time) come from the library's process collector. Every family is a prometheus-client
``Metric`` and the text is the library's ``generate_latest``; :class:`Exposition` keeps the
family-by-family interface the other rooms' sections (relay, HLS, recording) were written
against.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Offer → answer is a few ms; POST → connected is tens to hundreds of ms.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_]")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}

# The library would add a "<name>_created" gauge beside every histogram and counter object: a
# family nobody had before and no dashboard reads.
prometheus_client.disable_created_metrics()


class WebMetrics:
    """What the web layer counts itself, partly from the engine's session events.

    ``registry`` holds the two latency histograms and the process collector; it is this app's
    own (not the library's global one), so several apps in one process (tests) do not clash.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.offers_answered = 0
        self.offers_refused: Counter[str] = Counter()
        # POST received → answer sent.
        self.answer_seconds = Histogram(
            "ruseon_whep_answer_seconds", "Time from POST /whep to the SDP answer.",
            buckets=LATENCY_BUCKETS_S, registry=self.registry)
        # Session created (at the POST) → ICE and DTLS connected.
        self.handshake_seconds = Histogram(
            "ruseon_handshake_seconds", "Time from session creation to ICE and DTLS connected.",
            buckets=LATENCY_BUCKETS_S, registry=self.registry)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
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
        if session.connected_monotonic is None or session.id in self._handshakes_seen:
            return
        self._handshakes_seen.add(session.id)
        self.handshake_seconds.observe(
            max(0.0, session.connected_monotonic - session.created_monotonic))


def metric_name(*parts: str) -> str:
    """A valid Prometheus metric name from ``parts`` joined by ``_``."""
    name = _INVALID_NAME_CHARS.sub("_", "_".join(p for p in parts if p)).strip("_")
    return name if not name[:1].isdigit() else "_" + name


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _parse_labels(text: str) -> dict[str, str]:
    """``{a="x",b="y"}`` (as the callers of :meth:`Exposition.family` write it) as a dict."""
    return {key: re.sub(r'\\[\\n"]', lambda m: _UNESCAPE[m.group(0)], value)
            for key, value in _LABEL.findall(text)}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, complex)


class _Collected:
    """Any iterable of metric families as a collector for ``generate_latest``."""

    def __init__(self, *sources: Any) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Metric]:
        for source in self._sources:
            yield from source.collect()


class Exposition:
    """Builds the body family by family (each name once) as prometheus-client metrics."""

    def __init__(self) -> None:
        self._metrics: list[Metric] = []
        self._seen: set[str] = set()

    def family(
        self, name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]
    ) -> None:
        """One metric family; ``samples`` are ``(label-set text or "", value)``. A counter's
        name ends in ``_total``; one that does not is exported as a gauge, so its sample name
        stays what it was."""
        if name in self._seen:
            return
        self._seen.add(name)
        if kind == "counter" and name.endswith("_total"):
            metric = Metric(name.removesuffix("_total"), help_text, "counter")
        else:
            metric = Metric(name, help_text, "gauge" if kind == "counter" else kind)
        for labels, value in samples:
            if _is_number(value):
                metric.add_sample(name, _parse_labels(labels), float(value))
        self._metrics.append(metric)

    def histogram(self, name: str, help_text: str, histogram: Histogram) -> None:
        """A histogram family from a prometheus-client ``Histogram``."""
        self._seen.add(name)
        self._metrics.extend(histogram.collect())

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

    def collect(self) -> list[Metric]:
        """The families so far."""
        return list(self._metrics)

    def text(self, *more: Any) -> str:
        """The finished body (plus the families of any ``more`` collectors, first)."""
        body: bytes = generate_latest(_Collected(*more, self))  # type: ignore[arg-type]
        return body.decode()


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
    out.family("ruseon_sent_bytes_total", "counter", "RTP bytes sent to viewers.",
               [("", bytes_sent)])
    out.family("ruseon_sent_packets_total", "counter", "RTP packets sent to viewers.",
               [("", packets_sent)])
    out.family(
        "ruseon_keyframe_requests_total", "counter", "Keyframe requests from viewers, by kind.",
        _labelled("reason", engine_stats.get("keyframe_requests") or {}),
    )
    out.family(
        "ruseon_keyframe_refreshes_total", "counter",
        "Viewers' keyframe requests answered from the ring (source without IDR on demand).",
        [("", engine_stats.get("keyframe_refreshes") or 0)],
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
    out.stats("ruseon_engine", engine_stats, "WebRTC engine")
    out.stats("ruseon_capture", capture_stats, "Capture pipeline")
    # The histograms and the process/platform collectors live in the app's registry.
    return out.text(web.registry)
