"""The device as the harness sees it: a base URL, an optional Bearer token and HTTP.

Nothing here imports the appliance's code; it reads only what any client could: the page,
``/healthz``, ``/api/status`` (JSON) and ``/metrics`` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

# A Prometheus sample line: name, optional {labels}, value (timestamps are not used by the device).
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")

# The metric names the harness relies on (exported by the device's /metrics).
RSS_METRIC = "process_resident_memory_bytes"
CPU_METRIC = "process_cpu_seconds_total"
VIEWERS_METRIC = "ruseon_viewers"


def parse_prometheus(text: str) -> dict[str, float]:
    """``{"name{labels}": value}`` for every sample line (labels kept verbatim)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.group(1), match.group(2) or "", match.group(3)
        try:
            out[name + labels] = float(value)
        except ValueError:
            out[name + labels] = math.nan
    return out


@dataclass
class ProcessSample:
    """Device RSS and CPU at one moment, read from ``/metrics``."""

    at: float
    rss_bytes: float | None
    cpu_seconds: float | None
    viewers: float | None

    @staticmethod
    def cpu_percent(before: ProcessSample, after: ProcessSample) -> float | None:
        """CPU use between two samples, in percent of one core."""
        if before.cpu_seconds is None or after.cpu_seconds is None or after.at <= before.at:
            return None
        return 100.0 * (after.cpu_seconds - before.cpu_seconds) / (after.at - before.at)


@dataclass
class HttpAnswer:
    """One HTTP exchange as measured: status, headers, body and the time it took."""

    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float

    def header(self, name: str) -> str | None:
        """A response header, case-insensitively."""
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (lossy)."""
        return self.body.decode("utf-8", "replace")


class Device:
    """HTTP access to one device; use as ``async with Device(url, token) as dev``."""

    def __init__(self, base_url: str, token: str = "", *, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Device:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def url(self, path: str) -> str:
        """Absolute URL of ``path`` (which may already be absolute, e.g. a ``Location``)."""
        if path.startswith(("http://", "https://")):
            return path
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def auth_headers(self) -> dict[str, str]:
        """``Authorization: Bearer`` when a token is configured."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | str | None = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> HttpAnswer:
        """One request; never raises for an HTTP status (network errors do raise)."""
        assert self._session is not None, "use Device as an async context manager"
        all_headers = dict(self.auth_headers() if auth else {})
        all_headers.update(headers or {})
        data = body.encode() if isinstance(body, str) else body
        t0 = time.monotonic()
        async with self._session.request(
            method, self.url(path), data=data, headers=all_headers, allow_redirects=False
        ) as resp:
            payload = await resp.read()
            return HttpAnswer(resp.status, dict(resp.headers), payload, time.monotonic() - t0)

    async def status(self) -> dict[str, Any]:
        """``GET /api/status`` as JSON (raises on a non-200 answer)."""
        import json

        answer = await self.request("GET", "/api/status")
        if answer.status != 200:
            raise RuntimeError(f"/api/status answered {answer.status}: {answer.text[:200]}")
        doc: dict[str, Any] = json.loads(answer.body)
        return doc

    async def metrics(self) -> dict[str, float]:
        """``GET /metrics`` parsed into samples (raises on a non-200 answer)."""
        answer = await self.request("GET", "/metrics")
        if answer.status != 200:
            raise RuntimeError(f"/metrics answered {answer.status}: {answer.text[:200]}")
        return parse_prometheus(answer.text)

    async def process_sample(self) -> ProcessSample:
        """Device RSS, CPU seconds and viewer count from ``/metrics`` right now."""
        samples = await self.metrics()
        return ProcessSample(
            at=time.monotonic(),
            rss_bytes=samples.get(RSS_METRIC),
            cpu_seconds=samples.get(CPU_METRIC),
            viewers=samples.get(VIEWERS_METRIC),
        )

    async def wait_healthy(self, timeout_s: float, *, interval_s: float = 0.2) -> float | None:
        """Seconds until ``/healthz`` answers 200, or None if it does not within ``timeout_s``."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            try:
                if (await self.request("GET", "/healthz")).status == 200:
                    return time.monotonic() - t0
            except (TimeoutError, aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(interval_s)
        return None
