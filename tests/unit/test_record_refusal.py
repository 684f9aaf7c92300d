"""A record the broker's schema registry would refuse is named before it is published
(`schemas.refusal`, `commands.check_records`): the broker itself answers only "UnknownError -1"
(issue 28 item 7)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from hivemux.bus.codec import encode_key, encode_value
from hivemux.commands import RecordRefused, check_records
from hivemux.events import JobKind, JobSubmission, WorkloadSpec
from hivemux.schemas import refusal
from hivemux.topics import JOBS_SUBMITTED

AT = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
JOB = JobSubmission(occurred_at=AT, source="cli", job_id="j-1", vc="vc-a", kind=JobKind.OFFLINE,
                    workload=WorkloadSpec(model="resnet50", batch_size=8, iterations=10))  # fmt: skip


def body(**changes: object) -> bytes:
    return json.dumps({**json.loads(encode_value(JOB)), **changes}).encode()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (body(), None),
        (body(pods="two"), "value.pods: 'two' is not of type 'integer'"),
        (body(kind="batch"), "value.kind: 'batch' is not one of"),
        (body(workload={"model": "resnet50", "batch_size": 8, "iterations": 10, "command": ["x" * 5000]}),
         "value.workload.command.0: breaks maxLength 4096"),
        (b"{not json", "not JSON"),
    ],
    ids=["valid", "wrong-type", "unknown-kind", "too-long-named-without-its-value", "not-json"],
)  # fmt: skip
def test_the_refusal_names_the_field(value: bytes, expected: str | None) -> None:
    why = refusal(JOBS_SUBMITTED, encode_key("j-1").decode(), value)
    assert (why is None) if expected is None else (why is not None and why.startswith(expected)), why


def test_every_valid_event_passes_its_topics_schema() -> None:
    check_records([JOB])  # nothing raised


def test_a_record_the_schema_refuses_is_named_before_publishing() -> None:
    # Built past pydantic's checks (a bug, or another version's model): the schema still says no.
    forged = JOB.model_copy(update={"vc": ""})
    with pytest.raises(RecordRefused, match=r"jobs.submitted record j-1 does not match the topic's schema: value.vc: '' should be non-empty"):
        check_records([forged])


def test_a_record_over_its_topics_limit_is_refused_with_its_size() -> None:
    huge = JOB.model_copy(update={"source": "s" * JOBS_SUBMITTED.max_record_bytes})
    with pytest.raises(RecordRefused, match=rf"jobs.submitted record j-1: \d+ bytes, more than the {JOBS_SUBMITTED.max_record_bytes} the topic takes"):
        check_records([huge])
