"""The event bus: named events with a small JSON-able payload, delivered synchronously."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened: ``name`` (e.g. ``viewer_joined``), wall-clock ``time`` and
    ``data`` (JSON-able values only; never a secret such as a full WHEP session id)."""

    name: str
    time: float
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The event as webhooks and MQTT send it."""
        return {"event": self.name, "time": round(self.time, 3), **self.data}


Subscriber = Callable[[Event], None]


class EventBus:
    """Fan an event out to every subscriber, on the event loop thread, in order.

    A subscriber that raises is logged and skipped; the others still get the event. Subscribers
    only enqueue (webhook queues, MQTT state kicks), so publishing never blocks the loop.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._subscribers: list[Subscriber] = []
        self._clock = clock
        self.published: Counter[str] = Counter()
        self.subscriber_errors = 0

    def subscribe(self, subscriber: Subscriber) -> None:
        """Call ``subscriber(event)`` for every event published from now on."""
        self._subscribers.append(subscriber)

    def publish(self, name: str, **data: Any) -> Event:
        """Build the event and hand it to every subscriber; returns it."""
        event = Event(name, self._clock(), data)
        self.published[name] += 1
        for subscriber in list(self._subscribers):
            try:
                subscriber(event)
            except Exception:
                self.subscriber_errors += 1
                log.exception("event subscriber failed on %s", name)
        return event

    def stats(self) -> dict[str, Any]:
        """Counters for ``/api/status`` and ``/metrics``."""
        return {"published": dict(self.published), "subscriber_errors": self.subscriber_errors}
