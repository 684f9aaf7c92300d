"""The telemetry-ingester shell (`hivemux.services.telemetry_ingester.service.TelemetryIngester`):
samples the simulated fleet; offline jobs placed by the matcher add their load to their GPU
until an executor report says they are gone."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.bus import RecordContext, decode_value, encode_value
from hivemux.events import (
    CommandAction,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    NodeTelemetry,
    ReportState,
    WorkloadSpec,
)
from hivemux.services.telemetry_ingester.service import IngesterSettings, TelemetryIngester
from hivemux.topics import topic_for

T0 = datetime(2026, 3, 2, 20, 30, tzinfo=UTC)
GPU = "node-00/gpu-1"
CTX = RecordContext("executor.commands", 0, 0, "node-00")


def ingester() -> TelemetryIngester:
    """2 nodes x 3 T4 GPUs; node-00 serves online inference, node-01 is free for training."""
    return TelemetryIngester(IngesterSettings(nodes=2, gpus_per_node=3, serving_nodes=1, hot_gpus=0, seed=11))


def start(job_id: str = "offline-vgg16", gpu_id: str = GPU) -> ExecutorCommand:
    return ExecutorCommand(
        occurred_at=T0, source="matcher/test", node_id=gpu_id.split("/")[0], action=CommandAction.START_OFFLINE,
        job_id=job_id, gpu_ids=(gpu_id,), sm_share=70.0,
        workload=WorkloadSpec(model="vgg16", batch_size=16, iterations=1000),
    )  # fmt: skip


def report(state: ReportState, job_id: str = "offline-vgg16") -> ExecutorReport:
    return ExecutorReport(
        occurred_at=T0, source="executor/test", node_id="node-00", job_id=job_id, command_id="c", state=state
    )


def gpus(events: list) -> dict[str, GpuTelemetrySample]:
    return {s.gpu_id: s for e in events if isinstance(e, GpuTelemetryBatch) for s in e.samples}


def without_id(event: GpuTelemetrySample) -> dict:
    return event.model_dump(exclude={"event_id"})


def test_sample_covers_every_gpu_and_node() -> None:
    out = ingester().sample(T0)
    assert [type(e) for e in out] == [GpuTelemetryBatch] * 2 + [NodeTelemetry] * 2
    assert [len(e.samples) for e in out if isinstance(e, GpuTelemetryBatch)] == [3, 3]
    samples = gpus(out)
    assert sorted(samples) == [f"node-0{n}/gpu-{i}" for n in range(2) for i in range(3)]
    nodes = {e.node_id: e for e in out if isinstance(e, NodeTelemetry)}
    assert nodes["node-00"].gpu_ids == ("node-00/gpu-0", "node-00/gpu-1", "node-00/gpu-2")
    assert len(nodes["node-00"].online_workloads) == 3 and nodes["node-01"].online_workloads == ()
    assert all(s.online_workload for s in samples.values() if s.node_id == "node-00")
    assert all(s.online_workload is None for s in samples.values() if s.node_id == "node-01")
    assert all(s.offline_workloads == () for s in samples.values())
    assert {(e.occurred_at, e.source) for e in out} == {(T0, "telemetry-ingester/0")}
    assert {(s.occurred_at, s.source, s.event_id) for s in samples.values()} == {(T0, None, None)}
    assert {s.gpu_type for s in samples.values()} == {"T4"}
    assert len({e.event_id for e in out}) == len(out)


def test_samples_are_valid_events_on_the_wire() -> None:
    for event in ingester().sample(T0):
        topic = topic_for(event)
        assert decode_value(topic, encode_value(event)) == event
        assert topic.key_of(event) == event.node_id


def test_sampling_is_a_function_of_event_time() -> None:
    a, b = ingester().sample(T0), ingester().sample(T0)
    assert [without_id(x) for x in gpus(a).values()] == [without_id(x) for x in gpus(b).values()]


def test_started_offline_job_loads_its_gpu() -> None:
    baseline = gpus(ingester().sample(T0))
    loaded = ingester()
    loaded.on_command(start(), CTX)
    shared = gpus(loaded.sample(T0))
    assert shared[GPU].offline_workloads == ("offline-vgg16",)
    assert shared[GPU].online_workload == baseline[GPU].online_workload
    assert shared[GPU].sm_activity > baseline[GPU].sm_activity
    assert shared[GPU].memory_used_mib > baseline[GPU].memory_used_mib
    for gpu_id in set(shared) - {GPU}:  # every other GPU is untouched
        assert without_id(shared[gpu_id]) == without_id(baseline[gpu_id])


@pytest.mark.parametrize(
    ("state", "gone"),
    [
        (ReportState.COMPLETED, True),
        (ReportState.FAILED, True),
        (ReportState.EVICTED, True),
        (ReportState.STOPPED, True),
        (ReportState.REFUSED, True),
        (ReportState.RUNNING, False),
        (ReportState.ACCEPTED, False),
    ],
    ids=["completed", "failed", "evicted", "stopped", "refused", "running", "accepted"],
)
def test_report_removes_the_offline_load(state: ReportState, gone: bool) -> None:
    baseline = gpus(ingester().sample(T0))[GPU]
    ing = ingester()
    ing.on_command(start(), CTX)
    ing.on_report(report(state), RecordContext("executor.reports", 0, 0, "node-00"))
    after = gpus(ing.sample(T0))[GPU]
    if gone:
        assert without_id(after) == without_id(baseline)
    else:
        assert after.offline_workloads == ("offline-vgg16",)


def test_report_for_another_job_keeps_the_load() -> None:
    ing = ingester()
    ing.on_command(start(), CTX)
    ing.on_report(report(ReportState.COMPLETED, job_id="someone-else"), RecordContext("executor.reports", 0, 0, "node-00"))
    assert gpus(ing.sample(T0))[GPU].offline_workloads == ("offline-vgg16",)


def test_evict_command_removes_the_offline_load() -> None:
    ing = ingester()
    ing.on_command(start(), CTX)
    ing.on_command(
        ExecutorCommand(occurred_at=T0, source="matcher/test", node_id="node-00", action=CommandAction.EVICT,
                        job_id="offline-vgg16", gpu_ids=(GPU,)),
        CTX,
    )  # fmt: skip
    assert gpus(ing.sample(T0))[GPU].offline_workloads == ()
