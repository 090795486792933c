"""Appliance events: one in-process bus that MQTT, webhooks and anything else subscribe to.

Producers are wired in ``app.py``: the engine's session listener (viewer joined/left), the
:class:`StallWatcher` over the capture pipeline's frame flow (camera stalled/recovered) and the
recorder (recording started/stopped). Subscribers must not block: they queue and return.
"""

from .bus import Event, EventBus, Subscriber
from .producers import RecordingWatcher, StallWatcher, recording_listener, session_listener

__all__ = ["Event", "EventBus", "RecordingWatcher", "StallWatcher", "Subscriber",
           "recording_listener", "session_listener"]
