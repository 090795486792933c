"""Suite-wide settings: Hypothesis profiles, so a local run and CI generate examples the same way.

No example database anywhere: a failure a developer once saw would otherwise be replayed first in
their runs only (from .hypothesis/), and a local run and CI would disagree about the same commit.
Regressions that matter are pinned with ``@example`` or a deterministic test instead. In CI
(``CI=true``) generation is also derandomized, so a red CI run is reproducible from the commit
alone; locally it stays random, which is where new cases are found (``print_blob`` prints the
reproduction). ``HYPOTHESIS_PROFILE=ci`` runs the CI examples locally.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests import background_prepare, shards

settings.register_profile("ci", database=None, derandomize=True, print_blob=True)
settings.register_profile("dev", database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") == "true" else "dev"))


# -- shards (tests/shards.py): scripts/test runs the whole suite as parallel pytest processes ----
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shard", metavar="K/N", default=None,
                     help="run only shard K of N (whole modules, balanced on tests/durations.json)")


def _keep_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.getoption("--shard")
    if not spec:
        return
    try:
        k, n = shards.parse(spec)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    counts: dict[str, int] = {}
    for item in items:
        module = shards.module_of(item.nodeid)
        counts[module] = counts.get(module, 0) + 1
    shard_of = shards.assign(counts, n, shards.known_durations())
    kept = [item for item in items if shard_of[shards.module_of(item.nodeid)] == k]
    dropped = [item for item in items if shard_of[shards.module_of(item.nodeid)] != k]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


# -- the failed tests' ids, for scripts/test's one re-run of a few failures alone -----------------
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("TEST_FAILED_IDS")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as out:
            out.write(report.nodeid + "\n")


# -- preparation steps running in the background (tests/background_prepare.py) -------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "background_prepare(name): needs tests/prepare.d/NAME, which scripts/test runs in the "
        "background; such tests run last and wait for it",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that wait for a background preparation go last (stable otherwise), so the rest of
    the suite runs while the preparation does."""
    _keep_shard(config, items)
    items.sort(key=lambda item: item.get_closest_marker("background_prepare") is not None)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Wait for the test's background preparation before its protocol starts: this wrapper is
    outside pytest-timeout's, so the wait is not counted against the test's timeout."""
    marker = item.get_closest_marker("background_prepare")
    if marker is not None:
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")

        def report(line: str) -> None:
            if reporter is not None:
                reporter.ensure_newline()
                reporter.write_line(f"[{item.nodeid}] {line}")

        background_prepare.wait(marker.args[0], report)
    yield
