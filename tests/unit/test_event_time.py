"""The event times a consumer accepts (`hivemux.event_time`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hivemux.event_time import EventTimeBounds

NOW = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)
BOUNDS = EventTimeBounds(max_future_s=300, max_past_s=30 * 86400)


def test_the_present_and_the_recent_past_are_accepted_live_and_catching_up() -> None:
    for at in (NOW, NOW + timedelta(seconds=299), NOW - timedelta(days=29)):
        assert BOUNDS.refusal(at, NOW, live=True) is None
        assert BOUNDS.refusal(at, NOW, live=False) is None


def test_the_far_future_is_refused_always() -> None:
    for live in (True, False):
        why = BOUNDS.refusal(datetime(2100, 1, 1, tzinfo=UTC), NOW, live=live)
        assert why is not None and "ahead of this consumer's clock (at most 300 s)" in why


def test_before_2000_is_refused_always() -> None:
    for live in (True, False):
        why = BOUNDS.refusal(datetime(1970, 1, 1, tzinfo=UTC), NOW, live=live)
        assert why is not None and "before 2000" in why


def test_an_old_record_is_refused_live_but_history_is_accepted_while_catching_up() -> None:
    old = NOW - timedelta(days=31)
    why = BOUNDS.refusal(old, NOW, live=True)
    assert why is not None and "for a live record" in why
    assert BOUNDS.refusal(old, NOW, live=False) is None
