"""Decisions as values (`hivemux.matching.decisions`): joined in publication order."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from hivemux.matching.decisions import Decisions, Waiting

T0 = datetime(2026, 3, 2, tzinfo=UTC)


def test_joined_decisions_keep_order_and_the_last_plan_weight() -> None:
    a, b = Waiting(uuid.UUID(int=1), T0, "a", "x"), Waiting(uuid.UUID(int=2), T0, "b", "y")
    joined = Decisions((a,), 1.5) + Decisions((b,), None)
    assert joined == Decisions((a, b), 1.5)
    assert (joined + Decisions((), 0.25)).round_weight == 0.25
    assert Decisions() + Decisions() == Decisions((), None)
