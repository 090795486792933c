"""ONVIF events by PullPoint (what Home Assistant uses): motion as ``tns1:VideoSource/MotionAlarm``
and ``tns1:RuleEngine/CellMotionDetector/Motion``, one property per camera.

A client creates a subscription on the events service (``CreatePullPointSubscription``) and gets
its own address, ``/onvif/pullpoint/<id>``, where it long-polls ``PullMessages`` and calls
``Renew``, ``Unsubscribe`` and ``SetSynchronizationPoint`` (which re-sends every camera's current
state, as a new subscription gets first). Subscriptions are few (:data:`MAX_SUBSCRIPTIONS`),
expire unless renewed (at most :data:`MAX_TERMINATION_S` ahead), and hold a bounded queue (the
oldest message is dropped). Push subscriptions (``Subscribe``: the device would POST to any URL a
client names) are refused. The motion detector calls :meth:`EventService.publish_motion`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ruseon_appliance.onvif.soap import SoapFault, el, value

MAX_SUBSCRIPTIONS = 8
MAX_QUEUE = 100
DEFAULT_TERMINATION_S = 60.0
MAX_TERMINATION_S = 3600.0
MAX_PULL_WAIT_S = 60.0
PULLPOINT_PATH = "/onvif/pullpoint/{id}"
CONCRETE_SET = "http://www.onvif.org/ver10/tev/topicExpression/ConcreteSet"
_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def parse_duration(text: str) -> float | None:
    """An xsd:duration of days/hours/minutes/seconds (``PT60S``, ``PT1M``) in seconds."""
    match = _DURATION.match(text.strip())
    if not match or text.strip() in ("P", "PT"):
        return None
    days, hours, minutes, seconds = match.groups()
    return (int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60
            + float(seconds or 0))


def _utc(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class _Message:
    at: float
    camera: str
    state: bool
    operation: str  # "Initialized" or "Changed"


@dataclass(slots=True)
class Subscription:
    """One PullPoint: its queue and when it ends (wall time, as the client sees it)."""

    id: str
    terminates: float
    queue: deque[_Message] = field(default_factory=lambda: deque(maxlen=MAX_QUEUE))
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class EventService:
    """The events service's state: subscriptions and every camera's motion property."""

    def __init__(self, cameras: Iterable[str], *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        # Wall time is what the protocol speaks (CurrentTime, UtcTime, TerminationTime); a
        # subscription's life runs on the monotonic clock, so a clock step (a Pi's NTP setting
        # it 400 days forward, or back) neither ends every subscription nor keeps one for ever.
        self.clock = clock
        self.monotonic = monotonic
        self.motion: dict[str, bool] = dict.fromkeys(cameras, False)
        self.subscriptions: dict[str, Subscription] = {}
        self.published = 0
        self.closed = False

    # --- what the appliance calls -------------------------------------------------------

    def publish_motion(self, camera: str, state: bool) -> None:
        """``camera``'s motion started (True) or ended (False): to every subscription."""
        if camera not in self.motion or self.motion[camera] == state:
            return
        self.motion[camera] = state
        self.published += 1
        message = _Message(self.clock(), camera, state, "Changed")
        for sub in self._live():
            sub.queue.append(message)
            sub.wake.set()

    def close(self) -> None:
        """Wake every held PullMessages (the server is stopping)."""
        self.closed = True
        for sub in self.subscriptions.values():
            sub.wake.set()

    # --- subscriptions ------------------------------------------------------------------

    def _live(self) -> list[Subscription]:
        now = self.monotonic()
        for sub_id in [s.id for s in self.subscriptions.values() if s.terminates <= now]:
            del self.subscriptions[sub_id]
        return list(self.subscriptions.values())

    def _wall(self, deadline: float) -> float:
        """A monotonic deadline as the wall-clock time it is at now."""
        return self.clock() + (deadline - self.monotonic())

    def _termination(self, text: str) -> float:
        """The monotonic deadline a requested TerminationTime (a duration, or a wall-clock
        time in the client's words) asks for, bounded."""
        if not text:
            return self.monotonic() + DEFAULT_TERMINATION_S
        seconds = parse_duration(text)
        if seconds is None:
            try:
                when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                raise SoapFault("InvalidArgVal", f"termination time {text!r} cannot be read",
                                detail="InvalidTerminationTime") from None
            if when.tzinfo is None:
                when = when.replace(tzinfo=dt.UTC)
            seconds = _seconds_until(when, self.clock())
        if seconds <= 0:
            raise SoapFault("InvalidArgVal", "termination time in the past",
                            detail="InvalidTerminationTime")
        return self.monotonic() + min(seconds, MAX_TERMINATION_S)

    def _initial(self, sub: Subscription) -> None:
        now = self.clock()
        for camera, state in self.motion.items():
            sub.queue.append(_Message(now, camera, state, "Initialized"))
        sub.wake.set()

    def subscription(self, sub_id: str) -> Subscription:
        """The live subscription ``sub_id``; a fault when it ended or never was."""
        self._live()
        sub = self.subscriptions.get(sub_id)
        if sub is None:
            raise SoapFault("InvalidArgVal", "no such subscription (ended or never created)",
                            detail="ResourceUnknownFault")
        return sub

    # --- operations ---------------------------------------------------------------------

    def create(self, address: Callable[[str], str], termination: str) -> str:
        """``CreatePullPointSubscription``; ``address(id)`` is its URL."""
        live = self._live()
        if len(live) >= MAX_SUBSCRIPTIONS:
            raise SoapFault("InvalidArgVal", f"at most {MAX_SUBSCRIPTIONS} subscriptions at once",
                            code="Receiver", detail="MaxPullPoints")
        terminates = self._termination(termination)
        sub = Subscription(secrets.token_urlsafe(12), terminates)
        self.subscriptions[sub.id] = sub
        self._initial(sub)
        return el("tev:CreatePullPointSubscriptionResponse",
                  el("tev:SubscriptionReference", value("wsa5:Address", address(sub.id)))
                  + value("wsnt:CurrentTime", _utc(self.clock()))
                  + value("wsnt:TerminationTime", _utc(self._wall(terminates))))

    async def pull(self, sub_id: str, timeout: str, limit: str) -> str:
        """``PullMessages``: what is queued, or wait for it up to the timeout."""
        sub = self.subscription(sub_id)
        wait = min(parse_duration(timeout) or 0.0, MAX_PULL_WAIT_S)
        try:
            count = max(1, min(int(limit or MAX_QUEUE), MAX_QUEUE))
        except ValueError:
            raise SoapFault("InvalidArgVal", "MessageLimit is not a number") from None
        if not sub.queue and wait > 0 and not self.closed:
            sub.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await sub.wake.wait()
        messages = [sub.queue.popleft() for _ in range(min(count, len(sub.queue)))]
        if not sub.queue:
            sub.wake.clear()
        return el("tev:PullMessagesResponse",
                  value("tev:CurrentTime", _utc(self.clock()))
                  + value("tev:TerminationTime", _utc(self._wall(sub.terminates)))
                  + "".join(self._notifications(m) for m in messages))

    def renew(self, sub_id: str, termination: str) -> str:
        """``Renew``."""
        sub = self.subscription(sub_id)
        sub.terminates = self._termination(termination)
        return el("wsnt:RenewResponse", value("wsnt:TerminationTime",
                                              _utc(self._wall(sub.terminates)))
                  + value("wsnt:CurrentTime", _utc(self.clock())))

    def unsubscribe(self, sub_id: str) -> str:
        """``Unsubscribe``."""
        sub = self.subscription(sub_id)
        del self.subscriptions[sub.id]
        sub.wake.set()
        return el("wsnt:UnsubscribeResponse", "")

    def synchronize(self, sub_id: str) -> str:
        """``SetSynchronizationPoint``: every property's current state again."""
        self._initial(self.subscription(sub_id))
        return el("tev:SetSynchronizationPointResponse", "")

    # --- messages -----------------------------------------------------------------------

    @staticmethod
    def _notifications(message: _Message) -> str:
        at, state = _utc(message.at), message.state
        source = f"src_{message.camera}"
        alarm = _notification(
            "tns1:VideoSource/MotionAlarm", at, message.operation,
            el("tt:SimpleItem", "", Name="Source", Value=source),
            el("tt:SimpleItem", "", Name="State", Value=state))
        cell = _notification(
            "tns1:RuleEngine/CellMotionDetector/Motion", at, message.operation,
            el("tt:SimpleItem", "", Name="VideoSourceConfigurationToken",
               Value=f"vsc_{message.camera}")
            + el("tt:SimpleItem", "", Name="VideoAnalyticsConfigurationToken",
                 Value=f"va_{message.camera}")
            + el("tt:SimpleItem", "", Name="Rule", Value="MotionDetector"),
            el("tt:SimpleItem", "", Name="IsMotion", Value=state))
        return alarm + cell

    def properties(self) -> str:
        """``GetEventPropertiesResponse``: the two topics this device raises."""
        def described(source: str, data: str) -> str:
            return el("tt:MessageDescription", el("tt:Source", source) + el("tt:Data", data),
                      IsProperty=True)

        def item(name: str, kind: str) -> str:
            return el("tt:SimpleItemDescription", "", Name=name, Type=kind)

        topics = (el("tns1:VideoSource", el("MotionAlarm", described(
            item("Source", "tt:ReferenceToken"), item("State", "xs:boolean")),
            **{"wstop:topic": True}))
            + el("tns1:RuleEngine", el("CellMotionDetector", el("Motion", described(
                item("VideoSourceConfigurationToken", "tt:ReferenceToken")
                + item("VideoAnalyticsConfigurationToken", "tt:ReferenceToken")
                + item("Rule", "xs:string"), item("IsMotion", "xs:boolean")),
                **{"wstop:topic": True}))))
        return el("tev:GetEventPropertiesResponse",
                  value("tev:TopicNamespaceLocation",
                        "http://www.onvif.org/onvif/ver10/topics/topicns.xml")
                  + value("wsnt:FixedTopicSet", True) + el("wstop:TopicSet", topics)
                  + value("wsnt:TopicExpressionDialect", CONCRETE_SET)
                  + value("tev:MessageContentFilterDialect",
                          "http://www.onvif.org/ver10/tev/messageContentFilter/ItemFilter")
                  + value("tev:MessageContentSchemaLocation",
                          "http://www.onvif.org/onvif/ver10/schema/onvif.xsd"))

    def stats(self) -> dict[str, int]:
        """For ``/api/status``."""
        return {"subscriptions": len(self._live()), "published": self.published}


def _notification(topic: str, at: str, operation: str, source: str, data: str) -> str:
    return el("wsnt:NotificationMessage",
              el("wsnt:Topic", topic, Dialect=CONCRETE_SET)
              + el("wsnt:Message", el("tt:Message", el("tt:Source", source)
                                      + el("tt:Data", data), UtcTime=at,
                                      PropertyOperation=operation)))


def _seconds_until(when: dt.datetime, now: float) -> float:
    """Seconds from the wall-clock ``now`` to a client's absolute TerminationTime (both are
    wall-clock times: the protocol's own comparison)."""
    return when.timestamp() - now
