"""``/metrics``: the appliance's figures as typed Prometheus metric families, via prometheus-client.

Every part that has figures is a *collector* in prometheus-client's sense: something whose
``collect()`` yields metric families. The web layer's own counts and latency histograms
(:class:`WebMetrics`), the device API's core families (viewers, sessions, the engine and the
capture pipeline) and the sections the other rooms add (cameras, relays, HLS, recording, RTSP,
integrations, access) all build their families with :class:`Families`:

- a counter (what only grows) is a ``CounterMetricFamily``, named ``..._total``: the library
  writes that sample name and the ``# TYPE ... counter`` line;
- everything else is a ``GaugeMetricFamily``; offer -> answer and POST -> connected are the
  library's ``Histogram``;
- labels are label names and values, never text in a name: the library escapes them.

A component's ``stats()`` goes in whole with :meth:`Families.stats` (a number is a family of
its own, a counter when its key ends in ``_total``; ``{name: {label: number}}`` is one family
labelled ``key``), so a counter added there shows up here without a change in this file.

One :class:`MetricsRegistry` per app holds the collectors (never the library's global
registry: several apps in one process, as in the tests, keep their own figures) and
``generate_latest`` writes the body. The registry joins families of one name that several
collectors yield (each camera its own samples, as the Go client's ``Gatherers`` merges) and
leaves out the library's ``_created`` samples. Process metrics (memory, CPU, file descriptors,
start time) come from the library's process collector.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# What generate_latest writes with its default (legacy-name) escaping is the 0.0.4 text format;
# prometheus-client 0.26 advertises version=1.0.0 (CONTENT_TYPE_LATEST), the UTF-8-name variant.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Offer → answer is a few ms; POST → connected is tens to hundreds of ms.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_]")

# A section of /metrics: a function that yields its families when scraped.
Section = Callable[[], Iterable[Metric]]


def metric_name(*parts: str) -> str:
    """A valid Prometheus metric name from ``parts`` joined by ``_``."""
    name = _INVALID_NAME_CHARS.sub("_", "_".join(p for p in parts if p)).strip("_")
    return name if not name[:1].isdigit() else "_" + name


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, complex)


class Families:
    """Metric families built sample by sample, each name once, for a collector to yield.

    :meth:`counter` and :meth:`gauge` return the library's family of that name, made on first
    use and the same object after, so a loop over the cameras adds each camera's sample to one
    family::

        out = Families()
        for camera in cameras:
            out.gauge("ruseon_camera_fps", "Measured frame rate.", ["camera"]).add_metric(
                [camera.name], camera.fps)
            out.stats("ruseon_capture", camera.pipeline.stats(), "Capture pipeline",
                      {"camera": camera.name})
        return out.collect()
    """

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}
        self._labels: dict[str, tuple[str, ...]] = {}

    def counter(self, name: str, help_text: str,
                labels: Sequence[str] = ()) -> CounterMetricFamily:
        """The counter family ``name`` (which ends in ``_total``, the sample name scraped)."""
        if not name.endswith("_total"):
            raise ValueError(f"a counter's name ends in _total: {name!r}")
        family = self._existing(name, "counter", labels)
        if family is None:
            family = self._add(name, labels, CounterMetricFamily(name, help_text, labels=labels))
        return cast(CounterMetricFamily, family)

    def gauge(self, name: str, help_text: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
        """The gauge family ``name``."""
        family = self._existing(name, "gauge", labels)
        if family is None:
            family = self._add(name, labels, GaugeMetricFamily(name, help_text, labels=labels))
        return cast(GaugeMetricFamily, family)

    def family(self, name: str, help_text: str,
               labels: Sequence[str] = ()) -> CounterMetricFamily | GaugeMetricFamily:
        """A counter when ``name`` ends in ``_total`` (the convention of the ``stats()``
        dicts), a gauge otherwise."""
        if name.endswith("_total"):
            return self.counter(name, help_text, labels)
        return self.gauge(name, help_text, labels)

    def stats(self, prefix: str, stats: Mapping[str, Any], help_text: str,
              labels: Mapping[str, str] | None = None) -> None:
        """A component's ``stats()``: each number a family ``<prefix>_<key>`` (a counter when
        the key ends in ``_total``), a dict of numbers one family labelled ``key``, other dicts
        recursively under a longer name; anything else (text, None, lists) is left out.
        ``labels`` (e.g. ``{"camera": name}``) go on every sample, so several components'
        dicts fill the same families side by side."""
        names = list(labels or {})
        values = [str(v) for v in (labels or {}).values()]
        for key, value in sorted(stats.items()):
            name = metric_name(prefix, key)
            if _is_number(value):
                self.family(name, f"{help_text}: {key}", names).add_metric(values, float(value))
            elif isinstance(value, Mapping) and value:
                if all(_is_number(v) for v in value.values()):
                    family = self.family(name, f"{help_text}: {key} by key", [*names, "key"])
                    for k, v in sorted(value.items(), key=lambda kv: str(kv[0])):
                        family.add_metric([*values, str(k)], float(v))
                else:
                    self.stats(name, value, help_text, labels)

    def collect(self) -> Iterator[Metric]:
        """The families, in the order they were first asked for."""
        return iter(list(self._families.values()))

    def _existing(self, name: str, kind: str, labels: Sequence[str]) -> Metric | None:
        family = self._families.get(name)
        if family is not None and (family.type != kind or self._labels[name] != tuple(labels)):
            raise ValueError(f"{name!r} is already a {family.type} labelled "
                             f"{list(self._labels[name])}, not a {kind} labelled {list(labels)}")
        return family

    def _add(self, name: str, labels: Sequence[str], family: Metric) -> Metric:
        self._families[name] = family
        self._labels[name] = tuple(labels)
        return family


class MetricsRegistry(CollectorRegistry):
    """One app's collectors, for ``generate_latest``.

    Families of one name yielded by several collectors (say each camera its own) come out as
    one family: a second ``# TYPE`` line for a name fails the whole scrape in Prometheus. Two
    of one name but different types, or one series twice, are a bug and raise. The library's
    ``_created`` samples (a family beside every counter and histogram object, that nobody
    reads) are left out here rather than by its process-wide switch.
    """

    def __init__(self) -> None:
        super().__init__(auto_describe=False)

    def collect(self) -> Iterator[Metric]:
        """Every registered collector's families, joined by name."""
        families: dict[str, Metric] = {}
        series: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for metric in super().collect():
            family = families.get(metric.name)
            if family is None:
                family = families[metric.name] = Metric(
                    metric.name, metric.documentation, metric.type, metric.unit)
            elif family.type != metric.type:
                raise ValueError(f"two metric families named {metric.name!r}: "
                                 f"a {family.type} and a {metric.type}")
            for sample in metric.samples:
                if sample.name == metric.name + "_created":
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key in series:
                    raise ValueError(f"the series {sample.name}{sample.labels} twice")
                series.add(key)
                family.samples.append(sample)
        return iter(list(families.values()))

    def text(self) -> str:
        """The exposition body (text format 0.0.4)."""
        return generate_latest(self).decode()


def process_collectors(registry: CollectorRegistry) -> None:
    """The library's process (memory, CPU, descriptors, start time) and platform
    (``python_info``) collectors, in ``registry``."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)


class WebMetrics:
    """What the web layer counts itself, partly from the engine's session events."""

    def __init__(self) -> None:
        self.offers_answered = 0
        self.offers_refused: Counter[str] = Counter()
        # POST received → answer sent. Not in any registry: the core families yield them.
        self.answer_seconds = Histogram(
            "ruseon_whep_answer_seconds", "Time from POST /whep to the SDP answer.",
            buckets=LATENCY_BUCKETS_S, registry=None)
        # Session created (at the POST) → ICE and DTLS connected.
        self.handshake_seconds = Histogram(
            "ruseon_handshake_seconds", "Time from session creation to ICE and DTLS connected.",
            buckets=LATENCY_BUCKETS_S, registry=None)
        self.sessions_started = 0
        self.sessions_ended: Counter[str] = Counter()
        # Bytes and packets sent by sessions that have ended (live ones are added at scrape).
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


def _by(family: CounterMetricFamily | GaugeMetricFamily, counts: Mapping[Any, Any]) -> None:
    """One sample per entry of ``counts``, its key the family's one label."""
    for key, value in sorted(counts.items(), key=lambda kv: str(kv[0])):
        if _is_number(value):
            family.add_metric([str(key)], value)


def core_families(
    web: WebMetrics,
    *,
    sessions: Sequence[Any],
    engine_stats: Mapping[str, Any],
    capture_stats: Mapping[str, Any],
    http_errors: Mapping[int, int],
) -> Iterator[Metric]:
    """Viewers, sessions, offers, what was sent and captured, HTTP errors, the engine's and the
    capture pipeline's ``stats()``, and the two latency histograms."""
    for session in sessions:
        web.observe_handshake(session)
    live = [s.stats() for s in sessions]
    bytes_sent = web.ended_bytes_sent + sum(int(s.get("bytes_sent") or 0) for s in live)
    packets_sent = web.ended_packets_sent + sum(int(s.get("packets_sent") or 0) for s in live)
    mux = engine_stats.get("mux")
    dropped = mux.get("dropped", {}) if isinstance(mux, Mapping) else {}

    out = Families()
    out.gauge("ruseon_viewers", "Live WHEP viewer sessions.").add_metric([], len(sessions))
    out.counter("ruseon_sessions_started_total", "Viewer sessions created.").add_metric(
        [], web.sessions_started)
    _by(out.counter("ruseon_sessions_ended_total", "Viewer sessions ended, by reason.",
                    ["reason"]), web.sessions_ended)
    out.counter("ruseon_whep_offers_answered_total", "Offers answered with 201.").add_metric(
        [], web.offers_answered)
    _by(out.counter("ruseon_whep_offers_refused_total", "Offers refused, by engine error.",
                    ["error"]), web.offers_refused)
    out.counter("ruseon_sent_bytes_total", "RTP bytes sent to viewers.").add_metric(
        [], bytes_sent)
    out.counter("ruseon_sent_packets_total", "RTP packets sent to viewers.").add_metric(
        [], packets_sent)
    _by(out.counter("ruseon_keyframe_requests_total", "Keyframe requests from viewers, by kind.",
                    ["reason"]), engine_stats.get("keyframe_requests") or {})
    out.counter(
        "ruseon_keyframe_refreshes_total",
        "Viewers' keyframe requests answered from the ring (source without IDR on demand).",
    ).add_metric([], engine_stats.get("keyframe_refreshes") or 0)
    out.counter("ruseon_frames_captured_total", "Access units from the camera.").add_metric(
        [], capture_stats.get("frames_in") or 0)
    out.counter("ruseon_frames_dropped_total", "Access units dropped before the ring.").add_metric(
        [], capture_stats.get("frames_dropped") or 0)
    out.counter("ruseon_ring_overruns_total", "Ring readers lapped by the writer.").add_metric(
        [], capture_stats.get("readers_overrun") or 0)
    _by(out.counter("ruseon_udp_packets_dropped_total", "UDP datagrams dropped, by reason.",
                    ["reason"]), dropped if isinstance(dropped, Mapping) else {})
    _by(out.counter("ruseon_http_errors_total", "HTTP error answers, by status.", ["status"]),
        http_errors)
    out.stats("ruseon_engine", engine_stats, "WebRTC engine")
    out.stats("ruseon_capture", capture_stats, "Capture pipeline")
    yield from out.collect()
    yield from web.answer_seconds.collect()
    yield from web.handshake_seconds.collect()
