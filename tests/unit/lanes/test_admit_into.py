"""`LaneManager.admit_into` (issue 20): a lane the cluster's lane placer chose, admitted after the
safety condition ``Σ P_i + Σ L_j ≤ C`` is checked, or refused with the figures (never queued)."""

from __future__ import annotations

import pytest

from hivemux.lanes.lane_assignment import LaneAssigned, LaneManager, Refused


@pytest.mark.parametrize(
    ("grants", "expect"),
    [
        ([("a", 1000, 6000, 0, 6000)], ["new_lane"]),
        ([("a", 1000, 6000, 0, 6000), ("b", 1000, 4000, 0, 6000)], ["new_lane", "existing_lane"]),
        ([("a", 1000, 4000, 0, 4000), ("b", 1000, 6000, 0, 6000)], ["new_lane", "resized_lane"]),
        ([("a", 4000, 8000, 0, 8000), ("b", 2000, 4000, 1, 4000)],
         ["new_lane", "Σ P_i + Σ L_j = 6000 + 12000 = 18000 MiB > C = 16384 MiB"]),
        ([("a", 1000, 5000, 0, 4000)], ["E = 5000 MiB does not fit lane 0 of L = 4000 MiB"]),
        ([("a", 1000, 100, 0, 100), ("a", 1000, 100, 1, 100)], ["new_lane", "already known"]),
        ([("a", float("nan"), 100, 0, 100)], ["persistent_mib must be a finite number"]),
    ],
    ids=["new", "existing", "grown", "over-capacity", "ephemeral-over-lane", "twice", "nan"],
)
def test_admit_into(grants: list[tuple[str, float, float, int, float]], expect: list[str]) -> None:
    lanes = LaneManager(16384)
    for (job, p, e, lane, size), want in zip(grants, expect, strict=True):
        [event] = lanes.admit_into(job, p, e, lane, size)
        if isinstance(event, LaneAssigned):
            assert event.step == want and event.lane_id == lane
        else:
            assert isinstance(event, Refused) and want in event.reason
    lanes.check_safety()


def test_a_granted_job_leaves_like_any_other() -> None:
    lanes = LaneManager(16384)
    lanes.admit_into("a", 1000, 4000, 2, 4000)
    lanes.admit_into("b", 1000, 4000, 2, 4000)
    lanes.job_finish("a")
    assert [(ln.lane_id, ln.jobs) for ln in lanes.lanes] == [(2, ("b",))] and lanes.persistent_total_mib == 1000
    lanes.job_finish("b")
    assert lanes.lanes == () and lanes.persistent_total_mib == 0
    [event] = lanes.job_arrive("c", 100, 100)  # Algorithm 1 numbers new lanes past the granted ones
    assert isinstance(event, LaneAssigned) and event.lane_id == 3
