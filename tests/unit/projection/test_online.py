"""The pure folding of online services' latency and SLO protection (`projection.online`):
latest window per replica in any order, duplicates, late and far-dated reports, SLO states,
and one service's view (worst replica, last step, masking of other tenants' neighbours)."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from hivemux.events import JobKind, JobSubmission, OnlineLatencyReport, SloProtectionAction, WorkloadSpec
from hivemux.projection import OnlineServiceSubmitted, Position, ProtectionStep, ReplicaLatency, fold_latency, project, slo_state
from hivemux.projection.online import OTHER_TENANT, latency, service_view

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
AT = Position("online.latency", 0, 7)


def report(end_s: float, p99: float, *, gpu: str = "n1/gpu-0", service: str = "svc", written_s: float | None = None,
           seed: str = "") -> OnlineLatencyReport:  # fmt: skip
    end = T0 + timedelta(seconds=end_s)
    return OnlineLatencyReport(
        event_id=uuid.uuid5(uuid.NAMESPACE_OID, f"{service}{gpu}{end_s}{p99}{seed}"), source="executor-n1",
        occurred_at=T0 + timedelta(seconds=end_s if written_s is None else written_s), node_id="n1", gpu_id=gpu, service=service,
        p50_ms=p99 / 2, p99_ms=p99, slo_p99_ms=50.0, request_rate=100.0, window_start=end - timedelta(seconds=5), window_end=end,
        offline_job_id="o1", sm_share=40.0, launch_target=0.6,
    )  # fmt: skip


def test_a_report_projects_to_its_replica_row() -> None:
    [row] = project(report(5, 42.0), AT)
    assert isinstance(row, ReplicaLatency)
    assert (row.service, row.gpu_id, row.node_id, row.p99_ms, row.p50_ms, row.slo_p99_ms, row.request_rate) == (
        "svc", "n1/gpu-0", "n1", 42.0, 21.0, 50.0, 100.0)
    assert (row.offline_job_id, row.sm_share, row.launch_target, row.window_end) == ("o1", 40.0, 0.6, T0 + timedelta(seconds=5))


def test_latest_window_per_replica_in_any_order_with_duplicates() -> None:
    reports = [latency(report(s, p)) for s, p in ((5, 40.0), (10, 45.0), (15, 30.0))]
    reports += [latency(report(5, 40.0)), latency(report(10, 45.0, gpu="n1/gpu-1"))]
    for order in itertools.permutations(reports):
        latest = fold_latency(list(order))
        assert latest[("svc", "n1/gpu-0")].p99_ms == 30.0
        assert latest[("svc", "n1/gpu-1")].p99_ms == 45.0


def test_a_report_dated_ahead_cannot_pin_the_row() -> None:
    ahead = latency(report(10 * 365 * 86400, 999.0, written_s=20))  # window "ends" in ten years, written at 20 s
    assert ahead.window_end == T0 + timedelta(seconds=20)
    assert ahead.window_start <= ahead.window_end
    assert fold_latency([ahead, latency(report(25, 30.0))])[("svc", "n1/gpu-0")].p99_ms == 30.0


def test_equal_windows_are_decided_by_event_id_whatever_the_order() -> None:
    a, b = latency(report(5, 40.0, seed="a")), latency(report(5, 41.0, seed="b"))
    assert fold_latency([a, b]) == fold_latency([b, a])


@pytest.mark.parametrize(
    ("p99", "slo", "state"),
    [(40.0, 50.0, "within"), (45.0, 50.0, "within"), (45.1, 50.0, "approaching"), (50.0, 50.0, "approaching"),
     (50.1, 50.0, "over"), (None, 50.0, "unknown"), (40.0, None, "unknown")],
    ids=["well-inside", "at-90%", "above-90%", "at-slo", "over", "no-p99", "no-slo"],
)  # fmt: skip
def test_slo_state(p99: float | None, slo: float | None, state: str) -> None:
    assert slo_state(p99, slo) == state


def test_an_online_submission_names_its_slo_and_rate() -> None:
    spec = WorkloadSpec(model="bert", batch_size=1, iterations=1, slo_p99_ms=50.0, request_rate=200.0)
    sub = JobSubmission(source="cli", occurred_at=T0, job_id="svc", vc="vc-a", kind=JobKind.ONLINE, workload=spec, pods=2,
                        gpu_type="T4")
    changes = project(sub, Position("jobs.submitted", 0, 1))
    assert OnlineServiceSubmitted("svc", "bert", 2, 50.0, 200.0, T0) in changes


def test_a_protection_step_is_a_step_and_history_of_the_job_and_gpu() -> None:
    step = SloProtectionAction(source="health-processor", occurred_at=T0, gpu_id="n1/gpu-0", node_id="n1", service="svc",
                               offline_job_id="o1", step="lower_launch_target", level=1, p99_ms=47.0, slo_p99_ms=50.0,
                               launch_target=0.5, sm_share=40.0, reason="p99 47.0 ms is 94 % of the SLO")  # fmt: skip
    changes = project(step, Position("sharing.protection", 0, 3))
    [taken] = [c for c in changes if isinstance(c, ProtectionStep)]
    assert (taken.step, taken.level, taken.launch_target, taken.offline_job_id) == ("lower_launch_target", 1, 0.5, "o1")
    assert {(type(c).__name__, getattr(c, "job_id", getattr(c, "gpu_id", None))) for c in changes} >= {
        ("JobEventRow", "o1"), ("GpuEventRow", "n1/gpu-0")}


def test_service_view_worst_replica_last_step_and_masking() -> None:
    service = {"job_id": "svc", "vc": "vc-a", "state": "running", "model": "bert", "replicas": 2, "slo_p99_ms": 50.0, "request_rate": 200.0}
    replicas = [
        {"pod": "svc/0", "gpu_id": "g0", "node_id": "n1", "p99_ms": 30.0, "offline_job_id": "o-b", "offline_vc": "vc-b"},
        {"pod": "svc/1", "gpu_id": "g1", "node_id": "n1", "p99_ms": 47.0, "offline_job_id": "o-a", "offline_vc": "vc-a"},
    ]
    steps = [{"event_id": "1", "gpu_id": "g0", "occurred_at": "2026-11-26T10:00:00+00:00", "step": "lower_launch_target",
              "offline_job_id": "o-b", "offline_vc": "vc-b"},
             {"event_id": "2", "gpu_id": "g1", "occurred_at": "2026-11-26T10:00:09+00:00", "step": "lower_sm_share",
              "offline_job_id": "o-b", "offline_vc": "vc-b"}]  # fmt: skip
    view = service_view(service, replicas, steps, {"lower_sm_share": 1, "lower_launch_target": 2}, scope=["vc-a"])
    assert (view["worst_p99_ms"], view["worst_gpu_id"], view["slo_state"]) == (47.0, "g1", "approaching")
    assert [r["slo_state"] for r in view["replica_latency"]] == ["within", "approaching"]
    assert [r["offline_job_id"] for r in view["replica_latency"]] == [OTHER_TENANT, "o-a"]
    assert view["last_protection"]["step"] == "lower_sm_share" and view["last_protection"]["offline_job_id"] == OTHER_TENANT
    assert "offline_vc" not in view["last_protection"]
    assert view["protection_steps"] == {"lower_launch_target": 2, "lower_sm_share": 1}
    admin = service_view(service, replicas, steps, {}, scope=None)
    assert admin["replica_latency"][0]["offline_job_id"] == "o-b"
    idle = service_view(service, [], [], {})
    assert (idle["worst_p99_ms"], idle["slo_state"], idle["last_protection"], idle["replicas_bound"]) == (None, "unknown", None, 0)


def test_latency_reports_write_no_history_row_the_change_feed_would_look_up() -> None:
    from hivemux.api.changes import _NO_HISTORY
    from hivemux.projection import GpuEventRow, JobEventRow

    assert "online.latency" in _NO_HISTORY
    assert not [c for c in project(report(5, 42.0), AT) if isinstance(c, JobEventRow | GpuEventRow)]


def test_a_ready_report_projects_its_endpoint_and_no_other_report_does() -> None:
    from hivemux.events import ExecutorReport, ReportState
    from hivemux.projection import ReplicaEndpoint

    def executor_report(step: str | None, endpoint: str | None) -> ExecutorReport:
        return ExecutorReport(source="executor-n1", occurred_at=T0, node_id="n1", job_id="svc", command_id="c", state=ReportState.RUNNING,
                              gpu_ids=("n1/gpu-0",), step=step, endpoint=endpoint)  # fmt: skip

    ready = executor_report("ready", "10.0.0.7:31001")
    assert [c for c in project(ready, AT) if isinstance(c, ReplicaEndpoint)] == [
        ReplicaEndpoint("svc", "n1/gpu-0", "n1", "10.0.0.7:31001", T0, ready.event_id)]
    for other in (executor_report(None, None), executor_report("launched", None), executor_report("metrics", "10.0.0.7:31001")):
        assert not [c for c in project(other, AT) if isinstance(c, ReplicaEndpoint)]
