"""`hivemux.sharing.slo_edge`: latency reports in; protection steps and the executor commands
that apply them out, with ids derived from the report; folding the steps back resumes a GPU."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hivemux.events import CommandAction, ExecutorCommand, OnlineLatencyReport, SloProtectionAction, derived_id
from hivemux.sharing.slo_edge import SloEdge
from hivemux.sharing.slo_protection import SloPolicy

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
GPU = "node-00/gpu-0"


def report(p99: float, k: int, *, slo: float | None = 50.0, job: str | None = "off-1") -> OnlineLatencyReport:
    end = T0 + timedelta(seconds=5 * k)
    return OnlineLatencyReport(
        occurred_at=end, source="executor/node-00", node_id="node-00", gpu_id=GPU, service="infer-bert-00", p99_ms=p99,
        slo_p99_ms=slo, window_start=end - timedelta(seconds=5), window_end=end, offline_job_id=job, sm_share=60.0,
        launch_target=None, request_rate=120.0,
    )  # fmt: skip


def test_a_step_and_its_command_carry_the_p99_the_slo_and_derived_ids() -> None:
    edge = SloEdge(SloPolicy(), "health-processor/0")
    r = report(47.0, 0)
    step, command = edge.on_report(r)
    assert isinstance(step, SloProtectionAction) and isinstance(command, ExecutorCommand)
    assert (step.step, step.level, step.p99_ms, step.slo_p99_ms, step.launch_target, step.nominal_sm_share) == (
        "lower_launch_target", 1, 47.0, 50.0, 0.6, 60.0)
    assert step.event_id == derived_id("slo", r.event_id, "lower_launch_target") and step.occurred_at == r.window_end
    assert step.inputs["report"] == str(r.event_id) and step.inputs["request_rate"] == 120.0
    assert (command.action, command.job_id, command.gpu_ids, command.launch_target, command.sm_share) == (
        CommandAction.ADJUST, "off-1", (GPU,), 0.6, None)
    assert command.event_id == derived_id("slo-command", r.event_id, "lower_launch_target")
    # the same report again (a redelivery to a fresh edge, as a replay): the same ids
    assert [e.event_id for e in SloEdge(SloPolicy(), "health-processor/0").on_report(r)] == [step.event_id, command.event_id]


def test_share_steps_carry_the_share_and_a_breach_evicts() -> None:
    edge = SloEdge(SloPolicy(breach_reports=3, breach_s=10.0), "health-processor/0")
    out = [e for k in range(7) for e in edge.on_report(report(49.0, k))]
    commands = [e for e in out if isinstance(e, ExecutorCommand)]
    assert [(c.launch_target, c.sm_share) for c in commands] == [(0.6, None), (0.5, None), (0.4, None), (0.4, 30.0)]
    evicted = [e for k in range(7, 10) for e in edge.on_report(report(60.0, k))]
    assert [type(e) for e in evicted[-2:]] == [SloProtectionAction, ExecutorCommand] and evicted[-2].step == "evict"
    evicted = evicted[-2:]
    assert evicted[1].action is CommandAction.EVICT and evicted[1].launch_target is None and "sustained breach" in evicted[1].reason


def test_no_slo_or_no_neighbour_decides_nothing() -> None:
    edge = SloEdge(SloPolicy(), "health-processor/0")
    assert edge.on_report(report(500.0, 0, slo=None)) == []
    assert edge.on_report(report(500.0, 1, job=None)) == []


def test_folding_the_steps_resumes_the_level_and_can_restore() -> None:
    first = SloEdge(SloPolicy(), "health-processor/a")
    steps = [e for k in range(5) for e in first.on_report(report(49.0, k)) if isinstance(e, SloProtectionAction)]
    assert steps[-1].level == 3
    second = SloEdge(SloPolicy(), "health-processor/b")  # a new owner folds the topic
    for s in steps:
        second.on_action(s)
    assert second.protector.level(GPU) == 3
    restores = [e for k in range(5, 8) for e in second.on_report(report(10.0, k)) if isinstance(e, ExecutorCommand)]
    assert [(c.launch_target, c.sm_share) for c in restores] == [(0.5, None)]
    for s in steps:  # folding its own steps back changes nothing
        first.on_action(s)
    assert first.protector.level(GPU) == 3
