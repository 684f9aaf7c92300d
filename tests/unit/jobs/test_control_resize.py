"""`hivemux.jobs.control`: which resizes the job controller refuses and which it leaves to their decider."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.events import JobAction, JobState, outcome_id
from hivemux.jobs.control import Command, JobControl, Refused

AT = datetime(2026, 1, 1, tzinfo=UTC)


def resize(*footprint: str, job_id: str = "j1") -> Command:
    return Command("c1", "alice", job_id, JobAction.RESIZE, "", AT, None, footprint)


def control(kind: str, state: JobState = JobState.RUNNING) -> JobControl:
    core = JobControl()
    core.submitted("j1", "vc-a", kind, 100)
    core.lifecycle(outcome_id("setup"), "j1", state)
    return core


CASES = [
    ("online", ("replicas",), JobState.RUNNING, None),
    ("offline", ("sm_share",), JobState.RUNNING, None),
    ("offline", ("sm_share", "memory_mib"), JobState.PLACED, None),
    ("online", ("sm_share",), JobState.RUNNING, "an online job's footprint is its replicas, not sm_share"),
    ("offline", ("replicas",), JobState.RUNNING, "footprint is its sm_share and memory_mib, not replicas"),
    ("training", ("replicas",), JobState.RUNNING, "training jobs are not resized"),
    ("online", ("replicas",), JobState.SUSPENDED, "it is suspended"),
    ("offline", ("sm_share",), JobState.COMPLETED, "it is completed (finished)"),
]


@pytest.mark.parametrize(("kind", "footprint", "state", "refused"), CASES, ids=[f"{k}-{'+'.join(f)}-{s.value}" for k, f, s, _ in CASES])
def test_resize_rules(kind: str, footprint: tuple[str, ...], state: JobState, refused: str | None) -> None:
    core = control(kind, state)
    outcome = core.decide(resize(*footprint))
    if refused is None:
        assert outcome is None  # left to the cell allocator (replicas) or the matcher (SM share, memory)
        assert outcome_id("c1") not in core.outcomes  # the decider's outcome marks it decided
    else:
        assert isinstance(outcome, Refused) and refused in outcome.reason, outcome
        assert outcome.event_id == outcome_id("c1")


def test_unknown_job_is_refused() -> None:
    outcome = JobControl().decide(resize("replicas", job_id="nope"))
    assert isinstance(outcome, Refused) and outcome.reason == "unknown job nope"


def test_a_decider_refusal_folded_back_marks_the_command_decided() -> None:
    core = control("online")
    assert core.decide(resize("replicas")) is None
    core.refused(outcome_id("c1"))
    assert core.decide(resize("replicas")) is None and outcome_id("c1") in core.outcomes
