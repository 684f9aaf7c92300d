"""The event times a consumer accepts (`hivemux.event_time`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hivemux.event_time import EventTimeBounds

NOW = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)
BOUNDS = EventTimeBounds(max_future_s=300)


def test_the_present_and_the_past_since_2000_are_accepted() -> None:
    for at in (NOW, NOW + timedelta(seconds=299), NOW - timedelta(days=400), datetime(2000, 1, 1, tzinfo=UTC)):
        assert BOUNDS.refusal(at, NOW) is None


def test_the_far_future_is_refused() -> None:
    why = BOUNDS.refusal(datetime(2100, 1, 1, tzinfo=UTC), NOW)
    assert why is not None and "ahead of this consumer's clock (at most 300 s)" in why


def test_before_2000_is_refused() -> None:
    why = BOUNDS.refusal(datetime(1970, 1, 1, tzinfo=UTC), NOW)
    assert why is not None and "before 2000" in why
