"""One webhook target: a bounded queue of events and one worker that POSTs them in order.

Nothing here can slow the stream: :meth:`WebhookSender.offer` only appends to a ``deque`` (when
full the oldest event is dropped and counted), and the worker's requests have a timeout. A target
that answers 5xx, 408, 429 or not at all is retried with doubling back-off; any other 4xx means
the target refuses this event and retrying would not help.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections import deque
from typing import Any

import aiohttp

from .. import __version__
from ..config import WEBHOOK_EVENTS, WebhookConfig
from ..events import Event
from ..logs import RateLimit
from ..tasks import cancel_and_wait

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Ruseon-Signature"
# Unix seconds when this attempt was sent; signed with the body, so a receiver can refuse a
# captured request replayed later (older than a few minutes) without trusting any clock but its
# own and ours.
TIMESTAMP_HEADER = "X-Ruseon-Timestamp"
# Longest wait between two attempts, whatever retry_delay_s doubles to.
MAX_RETRY_DELAY_S = 60.0
# A failing target is logged at most this often.
LOG_INTERVAL_S = 60.0
_RETRY_STATUSES = frozenset({408, 425, 429})


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header's value: ``sha256=`` + hex HMAC-SHA256 of ``<timestamp>.<body>``
    (the timestamp header's exact text, a dot, the exact body bytes)."""
    message = timestamp.encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


class WebhookSender:
    """POSTs the events ``config.events`` names (all when empty) to ``config.url``."""

    def __init__(self, config: WebhookConfig) -> None:
        self.config = config
        self._events = frozenset(config.events or WEBHOOK_EVENTS)
        self._queue: deque[Event] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._failure_log = RateLimit(LOG_INTERVAL_S)
        self.sent = 0
        self.failed = 0
        self.retries = 0
        self.dropped = 0
        self.last_status: int | None = None
        self.last_error = ""

    # -- the producer side (event loop thread, never blocks) ---------------------------------

    def offer(self, event: Event) -> None:
        """An event bus subscriber: queue ``event`` if this target wants it."""
        if event.name not in self._events:
            return
        if len(self._queue) >= self.config.queue_size:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(event)
        self._wake.set()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the worker."""
        if self._task is None:
            timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
            context = self.config.tls_context()
            self._session = aiohttp.ClientSession(
                timeout=timeout, headers={"User-Agent": f"ruseon/{__version__}"},
                connector=aiohttp.TCPConnector(ssl=context) if context is not None else None)
            self._task = asyncio.create_task(self._run(), name="webhook")

    async def stop(self) -> None:
        """Stop at once; what is still queued is lost (counted as dropped)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self.dropped += len(self._queue)
        self._queue.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def stats(self) -> dict[str, Any]:
        """Counters for ``/api/status`` and ``/metrics`` (the URL's host only: paths may hold
        a secret)."""
        return {
            "queued": len(self._queue),
            "sent": self.sent,
            "failed": self.failed,
            "retries": self.retries,
            "dropped": self.dropped,
            "last_status": self.last_status,
            "last_error": self.last_error,
        }

    # -- the worker --------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            event = self._queue.popleft()
            if await self._deliver(event):
                self.sent += 1
            else:
                self.failed += 1

    def body(self, event: Event, delivery: str) -> bytes:
        """The exact bytes POSTed (and signed) for ``event``; ``delivery`` is in the body so
        the id a receiver drops duplicates by is signed too."""
        document = {**event.to_json(), "delivery": delivery}
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    async def _deliver(self, event: Event) -> bool:
        """POST ``event`` with retries; True once the target answered 2xx."""
        delivery = secrets.token_hex(8)
        body = self.body(event, delivery)
        headers = {
            "Content-Type": "application/json",
            "X-Ruseon-Event": event.name,
            # The same id on every attempt, so a receiver can drop a duplicate.
            "X-Ruseon-Delivery": delivery,
        }
        delay = self.config.retry_delay_s
        for attempt in range(self.config.retries + 1):
            if attempt:
                self.retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY_S)
            retry = await self._post(body, headers, event.name)
            if retry is None:
                return True
            if not retry:
                return False
        return False

    async def _post(self, body: bytes, headers: dict[str, str], name: str) -> bool | None:
        """One attempt: None on success, True when worth retrying, False when not."""
        assert self._session is not None
        if self.config.secret:  # signed per attempt: a retry carries its own send time
            timestamp = str(int(time.time()))
            headers = {**headers, TIMESTAMP_HEADER: timestamp,
                       SIGNATURE_HEADER: sign(self.config.secret, timestamp, body)}
        try:
            # No redirects: a 307/308 would re-POST the signed event wherever the receiver (or
            # whoever answers at its address) points, e.g. at a service on the appliance's own
            # network. The answer's body is not read: only its status matters, and a receiver
            # answering with gigabytes must not make us hold them.
            async with self._session.post(self.config.url, data=body, headers=headers,
                                          allow_redirects=False) as resp:
                self.last_status = resp.status
                if 200 <= resp.status < 300:
                    return None
                self._log_failure(name, f"HTTP {resp.status}")
                return resp.status >= 500 or resp.status in _RETRY_STATUSES
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._log_failure(name, str(exc) or type(exc).__name__)
            return True

    def _log_failure(self, name: str, why: str) -> None:
        self.last_error = why
        if self._failure_log.ready():
            host = self.config.url.split("://", 1)[-1].split("/", 1)[0]
            log.warning("webhook to %s failed (%s) on %s; retrying with back-off, %d dropped so "
                        "far", host, why, name, self.dropped)
