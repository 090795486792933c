"""web/metrics.py on its own: the family builder, the registry that joins collectors, and the text
prometheus-client writes from them, read back with the library's own parser."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
from prometheus_client import Histogram
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from ruseon_appliance.web.metrics import Families, MetricsRegistry


class Section:
    """A collector yielding what ``build`` puts in a fresh :class:`Families` at each scrape."""

    def __init__(self, build: Callable[[Families], None]) -> None:
        self.build = build

    def collect(self) -> Iterable[Metric]:
        out = Families()
        self.build(out)
        return out.collect()


def scrape(*collectors: object) -> str:
    registry = MetricsRegistry()
    for collector in collectors:
        registry.register(collector)
    return registry.text()


def test_counter_and_gauge_are_typed_and_labelled() -> None:
    def build(out: Families) -> None:
        out.counter("demo_requests_total", "Requests.", ["method"]).add_metric(["GET"], 3)
        out.gauge("demo_clients", "Clients.").add_metric([], 2)
    text = scrape(Section(build))
    assert "# TYPE demo_requests_total counter\n" in text
    assert 'demo_requests_total{method="GET"} 3.0\n' in text
    assert "# TYPE demo_clients gauge\ndemo_clients 2.0\n" in text
    assert "_created" not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["demo_requests"].type == "counter"
    assert families["demo_requests"].samples[0].labels == {"method": "GET"}


def test_stats_dicts_keys_ending_in_total_are_counters_and_labels_go_on_every_sample() -> None:
    def build(out: Families) -> None:
        for camera, frames in (("front", 10), ("back", 20)):
            out.stats("demo", {"writes_total": frames, "fps": 30, "drops": {"late": 1},
                               "name": "text is left out", "none": None,
                               "nested": {"inner_total": 4, "other": "x"}},
                      "Demo", {"camera": camera})
    families = {f.name: f for f in text_string_to_metric_families(scrape(Section(build)))}
    assert {n: f.type for n, f in families.items()} == {
        "demo_drops": "gauge", "demo_fps": "gauge", "demo_nested_inner": "counter",
        "demo_writes": "counter"}
    writes = {s.labels["camera"]: (s.name, s.value) for s in families["demo_writes"].samples}
    assert writes == {"front": ("demo_writes_total", 10), "back": ("demo_writes_total", 20)}
    assert {tuple(sorted(s.labels.items())) for s in families["demo_drops"].samples} == {
        (("camera", "back"), ("key", "late")), (("camera", "front"), ("key", "late"))}


def test_a_counter_name_ends_in_total_and_a_name_keeps_its_type_and_labels() -> None:
    out = Families()
    with pytest.raises(ValueError, match="_total"):
        out.counter("demo_requests", "Requests.")
    first = out.gauge("demo_fps", "Frame rate.", ["camera"])
    assert out.gauge("demo_fps", "Frame rate.", ["camera"]) is first
    with pytest.raises(ValueError, match="already a gauge"):
        out.gauge("demo_fps", "Frame rate.", ["relay"])
    out.counter("demo_frames_total", "Frames.")
    with pytest.raises(ValueError, match="already a counter"):
        out.gauge("demo_frames_total", "Frames.")


def test_registry_joins_one_name_from_several_collectors() -> None:
    """Each camera may be its own collector: one family, one TYPE line, both samples."""
    def camera(name: str, fps: float) -> Section:
        return Section(lambda out: out.gauge("demo_fps", "Frame rate.", ["camera"]).add_metric(
            [name], fps))
    text = scrape(camera("front", 30), camera("back", 15))
    assert text.count("# TYPE demo_fps gauge") == 1
    [family] = text_string_to_metric_families(text)
    assert {s.labels["camera"]: s.value for s in family.samples} == {"front": 30, "back": 15}
    # The same series from two collectors, or one name with two types, is a bug: loud.
    with pytest.raises(ValueError, match="twice"):
        scrape(camera("front", 30), camera("front", 15))
    counter = Section(lambda out: out.counter("demo_fps_total", "Frames.").add_metric([], 1))
    with pytest.raises(ValueError, match="a gauge and a counter"):
        scrape(camera("front", 30), counter)


def test_registry_leaves_out_the_librarys_created_samples() -> None:
    histogram = Histogram("demo_seconds", "Latency.", buckets=(0.1, 1.0), registry=None)
    histogram.observe(0.5)
    # What the library yields by default (unless PROMETHEUS_DISABLE_CREATED_SERIES is set).
    [metric] = histogram.collect()
    assert "demo_seconds_created" in {s.name for s in metric.samples}

    class Histograms:
        def collect(self) -> Iterable[Metric]:
            return histogram.collect()
    text = scrape(Histograms())
    assert "_created" not in text
    [family] = text_string_to_metric_families(text)
    assert family.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("demo_seconds_bucket", "1.0")] == 1
    assert samples[("demo_seconds_count", None)] == 1


@pytest.mark.parametrize("value", ['yard "north"', "back\\slash", "two\nlines", "ünï ☃"])
def test_label_values_are_escaped_by_the_library(value: str) -> None:
    text = scrape(Section(lambda out: out.gauge("demo_up", "Up.", ["camera"]).add_metric(
        [value], 1)))
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    assert f'demo_up{{camera="{escaped}"}} 1.0\n' in text
    [family] = text_string_to_metric_families(text)
    assert family.samples[0].labels == {"camera": value}
