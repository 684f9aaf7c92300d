"""Event models, the topic registry, the record codec and the generated schemas
(`hivemux.events`, `hivemux.topics`, `hivemux.bus.codec`, `hivemux.schemas`)."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from hivemux.bus import decode_key, decode_value, encode_key, encode_value
from hivemux.errors import InvalidEvent
from hivemux.events import (
    CellBinding,
    CellConfig,
    ClockTick,
    JobLogChunk,
    ConsumedRange,
    ConsumptionJournal,
    CommandAction,
    DeadLetter,
    Event,
    ExecutorCommand,
    ExecutorReport,
    Fault,
    FaultKind,
    DeviceControl,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    NodeAgent,
    NodePressure,
    SysMonitorSnapshot,
    HealthState,
    HealthTransition,
    JobKind,
    JobCommand,
    JobCommandRefused,
    JobLifecycleEvent,
    JobPriorityChanged,
    JobResized,
    JobState,
    JobSubmission,
    LeaderElected,
    NodeTelemetry,
    PartitionsAssigned,
    Placement,
    PredictorModel,
    Priority,
    Profile,
    ReportState,
    SharingObservation,
    OnlineLatencyReport,
    SloProtectionAction,
    WorkloadSpec,
    derived_id,
)
from hivemux.schemas import stale
from hivemux.topics import ALL_TOPICS, DEAD_LETTER_SUFFIX, GPU_TELEMETRY, JOBS_SUBMITTED, TOPICS, by_name, topic_for

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
AT = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
ENVELOPE: dict[str, Any] = {"occurred_at": AT, "source": "test"}
WORKLOAD = WorkloadSpec(model="resnet50", batch_size=32, iterations=100)


# -- builders: one valid event of every model ------------------------------------------
def gpu_sample(**overrides: Any) -> GpuTelemetrySample:
    fields: dict[str, Any] = dict(
        ENVELOPE, gpu_id="node-00/gpu-0", node_id="node-00", gpu_type="T4", gpu_util=40.0, sm_activity=30.0,
        sm_occupancy=14.0, memory_used_mib=4000.0, memory_total_mib=15360.0, sm_clock_mhz=1590.0,
        max_sm_clock_mhz=1590.0, power_w=40.0, temperature_c=50.0, online_workload="infer-bert-00",
    )  # fmt: skip
    fields.update(overrides)
    return GpuTelemetrySample(**fields)


def job_submission(**overrides: Any) -> JobSubmission:
    fields: dict[str, Any] = dict(
        ENVELOPE, job_id="train-1", vc="vc-a", kind=JobKind.TRAINING, pods=2, gpus_per_pod=4,
        priority=Priority.GUARANTEED, priority_value=100, affinity_cell_type="node", workload=WORKLOAD,
    )  # fmt: skip
    fields.update(overrides)
    return JobSubmission(**fields)


def gpu_batch(**overrides: Any) -> GpuTelemetryBatch:
    return GpuTelemetryBatch.from_samples((gpu_sample(**overrides),), source=ENVELOPE["source"])


BUILDERS: dict[type[Event], Callable[[], Event]] = {
    ClockTick: lambda: ClockTick(**ENVELOPE, ticker="health-processor/0"),
    JobLogChunk: lambda: JobLogChunk(**ENVELOPE, job_id="job-1", node_id="node-1", pod=0, offset=0, length=6, text="hello\n",
                                     head_bytes=1024, tail_bytes=1024),
    ConsumptionJournal: lambda: ConsumptionJournal(
        **ENVELOPE, service="matcher", incarnation=uuid.UUID(int=7), seq=1, emitted=(uuid.UUID(int=9),),
        entries=(ConsumedRange(kind="records", loop="fold", replaying=False, topic="telemetry.gpu", partition=2, first=10, last=12),
                 PartitionsAssigned(kind="assigned", topic="telemetry.gpu", partitions=(0, 2))),
    ),  # fmt: skip
    GpuTelemetryBatch: gpu_batch,
    DeviceControl: lambda: DeviceControl(**ENVELOPE, gpu_id="node-00/gpu-0", node_id="node-00", action="drain"),
    NodePressure: lambda: NodePressure(**ENVELOPE, node_id="node-00", pressured=True, reason="memory", metrics={"cpu_util": 3.0}),
    SysMonitorSnapshot: lambda: SysMonitorSnapshot(
        **ENVELOPE, gpu_id="node-00/gpu-0", node_id="node-00", gpu_type="T4", state=HealthState.OVERLIMIT,
        as_of=12.5, overlimit_entries=(10.0, 12.5), backoff_s=120.0, partition=3,
    ),
    NodeTelemetry: lambda: NodeTelemetry(
        **ENVELOPE, node_id="node-00", gpu_type="T4", gpu_ids=("node-00/gpu-0",), cpu_util=10.0,
        memory_used_mib=6144.0, memory_total_mib=49152.0,
    ),
    HealthTransition: lambda: HealthTransition(
        **ENVELOPE, gpu_id="node-00/gpu-0", node_id="node-00", gpu_type="T4", from_state=HealthState.INIT,
        to_state=HealthState.HEALTHY, reason="all metrics below their Unhealthy thresholds", metrics={"gpu_util": 40.0},
    ),
    Fault: lambda: Fault(
        **ENVELOPE, gpu_id="node-00/gpu-0", node_id="node-00", kind=FaultKind.XID, detail="XID 79", xid=79,
        remediation="drain",
    ),
    JobSubmission: job_submission,
    JobLifecycleEvent: lambda: JobLifecycleEvent(**ENVELOPE, job_id="train-1", state=JobState.BOUND, gpu_ids=("a",)),
    JobCommand: lambda: JobCommand(**ENVELOPE, command_id="c-1", principal="alice", job_id="train-1", action="cancel"),
    JobPriorityChanged: lambda: JobPriorityChanged(**ENVELOPE, job_id="train-1", priority_value=200, previous=100),
    JobResized: lambda: JobResized(**ENVELOPE, command_id="c-1", principal="alice", job_id="svc-1", vc="vc-a", replicas=3, previous_replicas=2),
    JobCommandRefused: lambda: JobCommandRefused(
        **ENVELOPE, command_id="c-1", principal="alice", job_id="train-1", action="resume", reason="not suspended", job_state="running",
    ),
    Profile: lambda: Profile(
        **ENVELOPE, job_id="off-1", signature="0123456789abcdef", gpu_type="T4", method="simulated",
        iteration_time_ms=350.0, gpu_util=90.0, sm_activity=82.0, sm_occupancy=45.0, memory_peak_mib=3589.0,
        persistent_memory_mib=293.0,
    ),
    SharingObservation: lambda: SharingObservation(
        **ENVELOPE, gpu_id="node-00/gpu-0", node_id="node-00", gpu_type="T4", offline_job_id="off-1", sm_share=60.0,
        normalized_throughput=0.6, online_slowdown=0.1, window_start=AT - timedelta(seconds=1), window_end=AT,
    ),
    OnlineLatencyReport: lambda: OnlineLatencyReport(
        **ENVELOPE, node_id="node-00", gpu_id="node-00/gpu-0", service="infer-bert-00", p50_ms=12.0, p99_ms=30.0,
        slo_p99_ms=40.0, request_rate=120.0, window_start=AT - timedelta(seconds=5), window_end=AT, offline_job_id="off-1",
        sm_share=60.0, launch_target=0.7,
    ),
    SloProtectionAction: lambda: SloProtectionAction(
        **ENVELOPE, gpu_id="node-00/gpu-0", node_id="node-00", service="infer-bert-00", offline_job_id="off-1",
        step="lower_launch_target", level=1, p99_ms=34.0, slo_p99_ms=40.0, launch_target=0.5, sm_share=60.0,
        reason="p99 34.0 ms is 85 % of the SLO 40.0 ms (> 80 %)", inputs={"report": "r-1"},
    ),
    PredictorModel: lambda: PredictorModel(
        **ENVELOPE, gpu_type="T4", version=1, kind="analytic", parameters={"contention": 0.3, "interference": 0.7},
    ),
    CellBinding: lambda: CellBinding(
        **ENVELOPE, job_id="train-1", vc="vc-a", state="bound", priority=Priority.GUARANTEED, cell_type="node",
        node_ids=("node-02",), gpu_ids=("node-02/gpu-0",), reason="bound", inputs={"pods": 1, "vc": "vc-a"},
    ),
    CellConfig: lambda: CellConfig(
        **ENVELOPE, version=3, config={"physicalCluster": {"cellTypes": {}, "physicalCells": []}, "virtualClusters": {"vc-a": {}}},
    ),
    Placement: lambda: Placement(
        **ENVELOPE, job_id="off-1", action="place", gpu_id="node-00/gpu-0", node_id="node-00", sm_share=60.0,
        policy="matching", predicted_normalized_throughput=0.88, reason="best match", inputs={"round": 1, "x": None},
    ),
    ExecutorCommand: lambda: ExecutorCommand(
        **ENVELOPE, node_id="node-00", action=CommandAction.START_OFFLINE, job_id="off-1", gpu_ids=("node-00/gpu-0",),
        sm_share=60.0, memory_quota_mib=6144.0, workload=WORKLOAD, solo_iteration_time_ms=350.0,
    ),
    NodeAgent: lambda: NodeAgent(**ENVELOPE, node_id="node-00", address="10.0.0.7", checkpoint_store="/mnt/checkpoints"),
    ExecutorReport: lambda: ExecutorReport(
        **ENVELOPE, node_id="node-00", job_id="off-1", command_id="c-1", state=ReportState.RUNNING,
        iterations_done=10, iterations_total=100, throughput_it_s=1.5,
    ),
    LeaderElected: lambda: LeaderElected(**ENVELOPE, service="matcher", records_caught_up=12, catch_up_s=0.04),
}


def dead_letter() -> DeadLetter:
    return DeadLetter(
        **ENVELOPE, original_topic="telemetry.gpu", partition=0, offset=7, key="node-00/gpu-0", value="{",
        value_b64="ew==", reason="bad JSON", error_type="InvalidEvent", consumer_group="hivemux.matcher",
    )  # fmt: skip


# -- the registry -----------------------------------------------------------------------
def test_topic_names_are_unique() -> None:
    names = [t.name for t in ALL_TOPICS]
    assert len(names) == len(set(names)) == 2 * len(TOPICS)


def test_every_model_has_exactly_one_topic() -> None:
    assert {t.model for t in TOPICS} == set(BUILDERS)
    assert len(TOPICS) == len(BUILDERS)


@pytest.mark.parametrize("topic", TOPICS, ids=[t.name for t in TOPICS])
def test_topic_declaration(topic: Any) -> None:
    assert topic.key_field in topic.model.model_fields
    assert topic.partitions >= 1
    assert topic.cleanup_policy in ("delete", "compact")
    assert topic.description
    dlq = topic.dead_letter
    assert dlq.name == topic.name + DEAD_LETTER_SUFFIX == topic.name + ".dlq"
    assert (dlq.model, dlq.key_field, dlq.cleanup_policy, dlq.retention) == (DeadLetter, "original_topic", "delete", "bounded")
    assert by_name(dlq.name) == dlq and by_name(topic.name) is topic


def test_the_record_is_kept_for_ever_and_only_raw_telemetry_logs_and_dead_letters_are_bounded() -> None:
    # jobs.logs carries workloads' output to a read model that keeps it for its own time (issue 29): no decision reads it
    bounded = {t.name for t in ALL_TOPICS if t.retention == "bounded"}
    assert bounded == {"telemetry.gpu", "telemetry.node", "jobs.logs"} | {t.dead_letter.name for t in TOPICS}
    assert by_name("jobs.submitted").configs == {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
    assert by_name("telemetry.gpu").configs == {"cleanup.policy": "delete"}  # the broker's default retention
    assert by_name("health.state").configs["cleanup.policy"] == "compact"


def test_bindings_are_a_history_not_compacted_by_job() -> None:
    """One record per pod, keyed by job: compaction would keep one pod of a gang."""
    assert (by_name("cells.bindings").cleanup_policy, by_name("cells.bindings").retention) == ("delete", "unlimited")


@pytest.mark.parametrize("model", list(BUILDERS), ids=[m.__name__ for m in BUILDERS])
def test_topic_for_each_model(model: type[Event]) -> None:
    event = BUILDERS[model]()
    topic = topic_for(event)
    assert topic.model is model
    assert topic.key_of(event) == str(getattr(event, topic.key_field))


def test_topic_for_dead_letter_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="DeadLetter has no topic of its own"):
        topic_for(dead_letter())


def test_unknown_topic_name() -> None:
    with pytest.raises(KeyError, match="unknown topic 'nope'"):
        by_name("nope")


# -- model validation -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpu_util", 101.0),
        ("gpu_util", -0.1),
        ("gpu_util", math.nan),
        ("sm_activity", math.nan),
        ("sm_activity", 100.5),
        ("memory_used_mib", -1.0),
        ("memory_used_mib", math.nan),
        ("memory_total_mib", 0.0),
        ("max_sm_clock_mhz", 0.0),
        ("temperature_c", 500.0),
        ("temperature_c", -41.0),
        ("temperature_c", math.nan),
        ("power_w", -5.0),
        ("xid_errors", -1),
        ("last_xid", -1),
        ("gpu_id", ""),
        ("gpu_id", "gpu 0"),
        ("source", ""),
    ],
    ids=[
        "util-over-100", "util-negative", "util-nan", "sm-nan", "sm-over-100", "memory-negative", "memory-nan",
        "total-memory-zero", "max-clock-zero", "temperature-500", "temperature-below-range", "temperature-nan",
        "power-negative", "xid-negative", "last-xid-negative", "empty-gpu-id", "gpu-id-with-space", "empty-source",
    ],
)  # fmt: skip
def test_bad_telemetry_is_rejected(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as error:
        gpu_sample(**{field: value})
    assert [e["loc"] for e in error.value.errors()] == [(field,)]


def test_infinite_telemetry_is_rejected() -> None:
    with pytest.raises(ValidationError):
        gpu_sample(power_w=math.inf)


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError) as error:
        gpu_sample(fan_speed=30)
    assert error.value.errors()[0]["type"] == "extra_forbidden"
    with pytest.raises(ValidationError):
        WorkloadSpec(model="resnet50", batch_size=32, iterations=1, epochs=3)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "when",
    [datetime(2026, 3, 2, 12, 0), "2026-03-02T12:00:00"],
    ids=["naive-datetime", "naive-iso-string"],
)
def test_naive_datetimes_are_rejected(when: Any) -> None:
    with pytest.raises(ValidationError) as error:
        gpu_sample(occurred_at=when)
    assert error.value.errors()[0]["type"] == "timezone_aware"


def test_aware_datetimes_in_any_zone_are_accepted() -> None:
    cest = timezone(timedelta(hours=2))
    assert gpu_sample(occurred_at=AT.astimezone(cest)).occurred_at == AT


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kind": JobKind.OFFLINE, "pods": 2}, "offline jobs share one GPU"),
        ({"pods": 0}, "greater than or equal to 1"),
        ({"priority_value": 1001}, "less than or equal to 1000"),
        ({"kind": "batch"}, "Input should be 'online', 'offline' or 'training'"),
    ],
    ids=["offline-two-pods", "zero-pods", "priority-too-high", "unknown-kind"],
)
def test_bad_submissions_are_rejected(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        job_submission(**overrides)


def test_start_commands_need_a_workload_and_a_gpu() -> None:
    with pytest.raises(ValidationError, match="start_training needs a workload and at least one GPU"):
        ExecutorCommand(**ENVELOPE, node_id="node-00", action=CommandAction.START_TRAINING, job_id="t", workload=WORKLOAD)
    evict = ExecutorCommand(**ENVELOPE, node_id="node-00", action=CommandAction.EVICT, job_id="t")
    assert evict.workload is None and evict.gpu_ids == ()


@pytest.mark.parametrize("model", list(BUILDERS), ids=[m.__name__ for m in BUILDERS])
def test_events_are_frozen(model: type[Event]) -> None:
    event = BUILDERS[model]()
    with pytest.raises(ValidationError, match="frozen"):
        event.source = "someone else"  # type: ignore[misc]
    assert event.source == "test"


def test_event_ids_are_unique_by_default_and_derived_ids_are_stable() -> None:
    assert gpu_batch().event_id != gpu_batch().event_id
    assert gpu_sample().event_id is None  # samples travel inside a batch, which carries the id
    assert derived_id("health", "x", 1) == derived_id("health", "x", 1) != derived_id("health", "x", 2)
    assert derived_id("a").version == 5


# -- the codec ----------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["node-00/gpu-0", "train-1", "ü-key", ""], ids=["gpu", "job", "unicode", "empty"])
def test_key_round_trip(key: str) -> None:
    raw = encode_key(key)
    assert raw == json.dumps(key).encode()
    assert decode_key(raw) == key


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (None, None),
        (b"plain-key", "plain-key"),
        (b"42", "42"),
        (b'{"a": 1}', '{"a": 1}'),
        (b"\xffbad", "\ufffdbad"),
    ],
    ids=["none", "not-json", "json-number", "json-object", "not-utf8"],
)
def test_decode_key_of_foreign_keys(raw: bytes | None, key: str | None) -> None:
    assert decode_key(raw) == key


@pytest.mark.parametrize("model", list(BUILDERS), ids=[m.__name__ for m in BUILDERS])
def test_value_round_trip(model: type[Event]) -> None:
    event = BUILDERS[model]()
    assert decode_value(topic_for(event), encode_value(event)) == event


def test_dead_letter_round_trip() -> None:
    dlq = GPU_TELEMETRY.dead_letter
    letter = dead_letter()
    assert decode_value(dlq, encode_value(letter)) == letter


def _valid_json() -> dict[str, Any]:
    return json.loads(encode_value(gpu_batch()))


def _with_columns(**columns: Any) -> bytes:
    return json.dumps({**_valid_json(), **columns}).encode()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "telemetry.gpu: record has no value (tombstone)"),
        (b"{not json", "telemetry.gpu: invalid GpuTelemetryBatch: <record>: Invalid JSON"),
        (b"[1, 2]", "telemetry.gpu: invalid GpuTelemetryBatch: <record>: Input should be an object"),
        (_with_columns(gpu_util=[101]), "gpu_util.0: Input should be less than or equal to 100"),
        (json.dumps({**_valid_json(), "fan": 1}).encode(), "fan: Extra inputs are not permitted"),
        (json.dumps({k: v for k, v in _valid_json().items() if k != "node_id"}).encode(), "node_id: Field required"),
        (json.dumps({**_valid_json(), "occurred_at": "2026-03-02T12:00:00"}).encode(), "occurred_at: Input should have timezone info"),
        (_with_columns(gpu_util=[40, 41]), "column memory_used_mib holds 1 entries for 2 GPUs (gpu_util holds 2)"),
        (_with_columns(power_w=[40, None]), "column power_w holds 2 entries for 1 GPUs (gpu_util holds 1)"),
        (_with_columns(gpu_util=[]), "gpu_util: Tuple should have at least 1 item"),
        (_with_columns(memory_total_mib=[15360, 15360]), "column memory_total_mib holds 2 entries for 1 GPUs (gpu_util holds 1)"),
        (_with_columns(gpus=[-1]), "gpus.0.constrained-int: Input should be greater than or equal to 0"),
    ],
    ids=["tombstone", "bad-json", "not-an-object", "out-of-range", "unknown-field", "missing-field", "naive-time",
         "short-column", "long-sparse-column", "empty", "long-shared-column", "negative-index"],
)  # fmt: skip
def test_decode_value_failures_are_invalid_events(raw: bytes | None, reason: str) -> None:
    with pytest.raises(InvalidEvent) as error:
        decode_value(GPU_TELEMETRY, raw)
    assert reason in str(error.value)
    assert error.value.retriable is False


def test_decode_reason_is_bounded() -> None:
    empty = json.dumps({"occurred_at": AT.isoformat(), "gpus": [{}]}).encode()  # many missing fields
    with pytest.raises(InvalidEvent, match=r"; and \d+ more$"):
        decode_value(GPU_TELEMETRY, empty)


def test_decode_value_with_the_wrong_topic() -> None:
    with pytest.raises(InvalidEvent, match="jobs.submitted: invalid JobSubmission"):
        decode_value(JOBS_SUBMITTED, encode_value(gpu_batch()))


# -- the generated schemas -----------------------------------------------------------------
def test_schemas_are_up_to_date() -> None:
    assert stale(SCHEMAS) == [], "schemas/ is stale: run `hivemux schemas export`"


def test_schema_files_are_exactly_the_topics() -> None:
    assert sorted(p.name for p in SCHEMAS.glob("*.json")) == sorted(f"{t.name}.json" for t in ALL_TOPICS)


def _keys(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key
            yield from _keys(value)
    elif isinstance(node, list):
        for value in node:
            yield from _keys(value)


@pytest.mark.parametrize("topic", ALL_TOPICS, ids=[t.name for t in ALL_TOPICS])
def test_schema_has_no_refs(topic: Any) -> None:
    """The embedded broker does not enforce a schema holding `$ref`: they are inlined."""
    schema = json.loads((SCHEMAS / f"{topic.name}.json").read_text())
    keys = set(_keys(schema))
    assert "$ref" not in keys and "$defs" not in keys
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["key"]["type"] == "string"


def _submission_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / "jobs.submitted.json").read_text())
    return jsonschema.Draft202012Validator(schema["properties"]["value"])


def test_example_submission_validates_against_its_schema() -> None:
    value = json.loads(encode_value(job_submission()))
    assert list(_submission_validator().iter_errors(value)) == []


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"kind": "batch"}, ["kind"]),
        ({"pods": 0}, ["pods"]),
        ({"job_id": "has space"}, ["job_id"]),
        ({"workload": {"model": "resnet50", "batch_size": 0, "iterations": 1}}, ["workload", "batch_size"]),
        ({"colour": "blue"}, []),
    ],
    ids=["unknown-kind", "zero-pods", "bad-job-id", "nested-batch-size", "unknown-field"],
)
def test_bad_submission_fails_its_schema(change: dict[str, Any], path: list[str]) -> None:
    value = {**json.loads(encode_value(job_submission())), **change}
    errors = list(_submission_validator().iter_errors(value))
    assert [list(e.absolute_path) for e in errors] == [path]


def test_submission_without_required_fields_fails_its_schema() -> None:
    value = json.loads(encode_value(job_submission()))
    del value["workload"], value["occurred_at"]
    errors = list(_submission_validator().iter_errors(value))
    assert sorted(e.message for e in errors) == ["'occurred_at' is a required property", "'workload' is a required property"]


def test_every_event_validates_against_its_topic_schema() -> None:
    for model, build in BUILDERS.items():
        event = build()
        schema = json.loads((SCHEMAS / f"{topic_for(event).name}.json").read_text())
        record = {"key": topic_for(event).key_of(event), "value": json.loads(encode_value(event))}
        assert list(jsonschema.Draft202012Validator(schema).iter_errors(record)) == [], model.__name__


def test_uuid_event_id_travels_as_a_string() -> None:
    event = gpu_batch().model_copy(update={"event_id": uuid.UUID(int=1)})
    assert json.loads(encode_value(event))["event_id"] == "00000000-0000-0000-0000-000000000001"


def test_job_commands_are_validated_at_decode() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        JobCommand(**ENVELOPE, command_id="c-1", principal="alice", job_id="train-1", action="explode")
    with pytest.raises(ValidationError):
        JobCommand(**ENVELOPE, command_id="c 1", principal="alice", job_id="train-1", action="cancel")
    with pytest.raises(ValidationError):  # set_priority needs a value in HiveD's range, the others none
        JobCommand(**ENVELOPE, command_id="c-1", principal="alice", job_id="train-1", action="set_priority")
    with pytest.raises(ValidationError):
        JobCommand(**ENVELOPE, command_id="c-1", principal="alice", job_id="train-1", action="set_priority", priority_value=1001)
    with pytest.raises(ValidationError):
        JobCommand(**ENVELOPE, command_id="c-1", principal="alice", job_id="train-1", action="cancel", priority_value=5)
    # resize: replicas (online), or sm_share and/or memory_mib (offline); nothing else takes them
    JobCommand(**ENVELOPE, command_id="c-1", principal="alice", job_id="svc-1", action="resize", replicas=3)
    JobCommand(**ENVELOPE, command_id="c-1", principal="alice", job_id="off-1", action="resize", sm_share=30, memory_mib=4096)
    for bad in ({}, {"replicas": 2, "sm_share": 30}, {"replicas": 0}, {"sm_share": 0}, {"sm_share": 101}):
        with pytest.raises(ValidationError):
            JobCommand(**ENVELOPE, command_id="c-1", principal="alice", job_id="j", action="resize", **bad)
    with pytest.raises(ValidationError):
        JobCommand(**ENVELOPE, command_id="c-1", principal="alice", job_id="train-1", action="cancel", replicas=2)
