"""What issue 24's clock steps mean for the rooms added after it: motion events are aged out only
while the wall clock is trusted, and an ONVIF subscription's life runs on the monotonic clock."""

from __future__ import annotations

from pathlib import Path

from ruseon_appliance.motion.store import EventStore, StoredEvent
from ruseon_appliance.onvif.events import EventService

DAY = 86400.0


def test_motion_events_survive_a_clock_set_400_days_forward_until_it_is_trusted(
        tmp_path: Path) -> None:
    wall, trusted = [1_700_000_000.0], [False]
    store = EventStore(tmp_path / "events", "cam", max_age_s=7 * DAY,
                       clock=lambda: wall[0], trusted=lambda: trusted[0])
    start = wall[0]
    store.put(StoredEvent("e1", "cam", "motion", start, start + 3, 0.4, start + 1))
    wall[0] += 400 * DAY  # NTP answers at last: the clock steps
    store.prune()
    assert store.get("e1") is not None  # not judged on a clock nobody vouches for
    trusted[0] = True
    store.prune()
    assert store.get("e1") is None  # once it is trusted, a week is a week


def test_an_onvif_subscription_outlives_a_wall_clock_step_and_ends_on_time() -> None:
    wall, mono = [1_700_000_000.0], [1000.0]
    service = EventService(["cam"], clock=lambda: wall[0], monotonic=lambda: mono[0])
    service.create(lambda sub_id: f"/pullpoint/{sub_id}", "PT60S")
    assert len(service._live()) == 1
    wall[0] += 400 * DAY  # forward: it would have ended at once on the wall clock
    assert len(service._live()) == 1
    wall[0] -= 800 * DAY  # backward: it must not live 400 days more either
    mono[0] += 61
    assert service._live() == []
