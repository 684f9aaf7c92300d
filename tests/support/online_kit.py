"""Online services on the embedded broker (issue 19): the cluster with serving cells, what the
simulated fleet's telemetry says a service serves on, and the records a test of an online
service shared with an offline job starts from."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

from support.buskit import read_all

from hivemux.bus.authorization import as_writer
from hivemux.events import Event, GpuTelemetryBatch, JobKind, JobSubmission, PredictorModel, Profile, WorkloadSpec
from hivemux.prediction.analytic import default_analytic_model
from hivemux.topics import GPU_TELEMETRY

CLUSTER = Path(str(resources.files("hivemux.cells") / "demo_cluster_online.yaml"))


async def serving(bootstrap: str, service: str) -> set[str]:
    """The GPUs the newest telemetry shows serving ``service`` (once every GPU reported)."""
    latest: dict[str, str | None] = {}
    for _, batch in await read_all(bootstrap, GPU_TELEMETRY):
        if isinstance(batch, GpuTelemetryBatch):
            latest.update({s.gpu_id: s.online_workload for s in batch.samples})
    return {g for g, name in latest.items() if name == service} if len(latest) == 16 else set()


def service_and_offline_job(service: str, offline: str, *, iterations: int) -> list[Event]:
    """The predictor's model, a 2-replica bert service of vc-b and a resnet50 offline job of vc-a
    with its profile, as their writers publish them."""
    base = {"source": "test", "occurred_at": datetime.now(UTC)}
    return [as_writer(e) for e in (
        PredictorModel(**base, gpu_type="T4", version=1, kind="analytic", parameters=default_analytic_model("T4").parameters()),
        JobSubmission.model_validate({**base, "job_id": service, "vc": "vc-b", "kind": "online", "replicas": 2, "gpu_type": "T4",
                                      "workload": {"model": "bert", "batch_size": 8, "slo_p99_ms": 50, "request_rate": 100}}),
        JobSubmission(**base, job_id=offline, vc="vc-a", kind=JobKind.OFFLINE,
                      workload=WorkloadSpec(model="resnet50", batch_size=32, iterations=iterations)),
        Profile(**base, job_id=offline, signature="0123456789abcdef", gpu_type="T4", method="simulated", iteration_time_ms=120.0,
                gpu_util=60.0, sm_activity=50.0, sm_occupancy=30.0, memory_peak_mib=2000.0, persistent_memory_mib=500.0),
    )]  # fmt: skip
