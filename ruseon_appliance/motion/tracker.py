"""From per-frame scores to events: a minimum duration before an event starts, an off-delay
before it ends, a minimum gap between events (a storm is bounded and counted)."""

from __future__ import annotations

from dataclasses import dataclass

from .detector import Analysis, MotionSettings


@dataclass(slots=True)
class MotionEvent:
    """One event as the tracker knows it: times in seconds of the frames' clock (the capture
    wall clock in the appliance), ``end`` None while it lasts."""

    start: float
    peak_score: float
    peak_time: float
    end: float | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """``kind`` "started" or "ended" (or "peak": a new highest score while it lasts), ``at``
    the time of the frame that caused it."""

    kind: str
    event: MotionEvent
    at: float


class MotionTracker:
    """Feed it every analysed frame (:meth:`update`); it says when an event starts and ends."""

    def __init__(self, settings: MotionSettings) -> None:
        self.settings = settings
        self.event: MotionEvent | None = None
        self._run_start: float | None = None
        self._last_motion: float | None = None
        self._last_end: float | None = None
        self._held = False
        self.events = 0
        self.storm_held = 0  # motion runs that would have started an event inside min_gap

    def update(self, t: float, analysis: Analysis) -> list[Transition]:
        """The transitions frame ``t`` causes (usually none)."""
        s = self.settings
        out: list[Transition] = []
        event = self.event
        if analysis.motion:
            self._last_motion = t
            if event is not None:
                if analysis.score > event.peak_score:
                    event.peak_score, event.peak_time = analysis.score, t
                    out.append(Transition("peak", event, t))
                return out
            if self._run_start is None:
                self._run_start = t
                self._held = False
            if t - self._run_start + 1e-9 < s.min_duration_s:
                return out
            if self._last_end is not None and t - self._last_end < s.min_gap_s:
                if not self._held:
                    self._held = True
                    self.storm_held += 1
                return out
            self.event = MotionEvent(self._run_start, analysis.score, t)
            self.events += 1
            self._run_start = None
            out.append(Transition("started", self.event, t))
            return out
        if event is None:
            self._run_start = None  # a still frame breaks a run that has not started an event
            return out
        if self._last_motion is not None and t - self._last_motion >= s.off_delay_s:
            out.append(self.finish(self._last_motion, now=t))
        return out

    def finish(self, end: float | None = None, *, now: float | None = None) -> Transition:
        """End the current event at ``end`` (default: the last motion); ``now`` (default
        ``end``) is when it ended, where the minimum gap to the next one counts from."""
        event = self.event
        assert event is not None
        event.end = end if end is not None else (self._last_motion or event.start)
        self.event = None
        self._last_end = now if now is not None else event.end
        return Transition("ended", event, self._last_end)
