"""Lane jobs in the cell allocator (`cells.lane_gpus`, `cells.lane_events`, issue 20), at its
edges over the real HiveD scheduler and the demo cluster (vc-a: two 4-GPU T4 nodes guaranteed;
vc-b: none, opportunistic only): which jobs go to lanes, a lane GPU asked from the VC's cells
and given back, Algorithm 1's safety condition across admissions, waiting reasons, refusals,
preemption of a lane GPU, the VC's iteration policy in the LaneGrant, and crash recovery."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from importlib import resources

import pytest
import yaml

from hivemux.cells.allocator_events import AllocatorEvents, allocator_events
from hivemux.cells.lane_choice import LaneCandidate, LaneJobRefused, LaneJobSpec, LaneJobWaiting, LaneSettings, choose
from hivemux.cells.schedulers import build_scheduler
from hivemux.events import (
    CellBinding,
    CommandAction,
    Event,
    ExecutorCommand,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Priority,
    Profile,
    ResourceEstimates,
    WorkloadSpec,
)
from hivemux.lanes.iteration_scheduler import Policy

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
T4 = 16384.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def lane_job(job_id: str, p: float | None = 1024, e: float | None = 2048, *, vc: str = "vc-a", sharing: str | None = "lanes",
             opportunistic: bool = False, seconds: float = 1.0, gpus: int = 1) -> JobSubmission:  # fmt: skip
    return JobSubmission(
        occurred_at=at(seconds), source="cli", job_id=job_id, vc=vc, kind=JobKind.TRAINING, gpus_per_pod=gpus,
        priority=Priority.OPPORTUNISTIC if opportunistic else Priority.GUARANTEED, priority_value=-1 if opportunistic else 100,
        workload=WorkloadSpec(model="resnet50", batch_size=16, iterations=100), sharing=sharing,  # type: ignore[arg-type]
        estimates=ResourceEstimates(persistent_memory_mib=p, ephemeral_memory_mib=e),
    )  # fmt: skip


def gang(job_id: str, vc: str = "vc-a", gpus: int = 4, pods: int = 2, seconds: float = 1.0) -> JobSubmission:
    return JobSubmission(
        occurred_at=at(seconds), source="cli", job_id=job_id, vc=vc, kind=JobKind.TRAINING, pods=pods, gpus_per_pod=gpus,
        priority=Priority.GUARANTEED, priority_value=100, workload=WorkloadSpec(model="bert", batch_size=32, iterations=100),
    )  # fmt: skip


def lifecycle(job_id: str, state: JobState, seconds: float = 50.0, source: str = "executor/0") -> JobLifecycleEvent:
    return JobLifecycleEvent(occurred_at=at(seconds), source=source, job_id=job_id, state=state)


def of(events: list[Event], kind: type, state: object = None) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind) and (state is None or getattr(e, "state", None) == state)]


def config() -> dict:
    return yaml.safe_load((resources.files("hivemux.cells") / "demo_cluster.yaml").read_text())


def shell(lanes: LaneSettings | None = None) -> AllocatorEvents:
    return allocator_events(build_scheduler("hived", config()), "cell-allocator/test", "hived", lanes=lanes)


class Log:
    """What the allocator published, in order, with the inputs (to replay after a restart)."""

    def __init__(self, edge: AllocatorEvents) -> None:
        self.edge = edge
        self.inputs: list[Event] = []
        self.out: list[Event] = []

    def submit(self, job: JobSubmission) -> list[Event]:
        self.inputs.append(job)
        return self._keep(self.edge.on_submission(job, replaying=False))

    def life(self, change: JobLifecycleEvent) -> list[Event]:
        self.inputs.append(change)
        return self._keep(self.edge.on_lifecycle(change, replaying=False))

    def _keep(self, out: list[Event]) -> list[Event]:
        self.out += out
        for e in out:  # the allocator folds its own lifecycle events live too
            if isinstance(e, JobLifecycleEvent):
                self.edge.on_lifecycle(e, replaying=False)
        return out


def lane_state(edge: AllocatorEvents) -> dict:
    placer = edge.core.lanes.placer
    return {
        gpu.gpu_id: (gpu.cell, gpu.capacity_mib, [(lane.lane_id, lane.size_mib, lane.jobs) for lane in placer.manager(gpu.gpu_id).lanes])
        for gpu in placer.gpus()
    } | {"waiting": placer.waiting}


# -- which jobs ---------------------------------------------------------------------------------


def cand(sharing: str | None, p: float | None, e: float | None, pods: tuple[int, ...] = (1,), gpu_type: str = "") -> LaneCandidate:
    return LaneCandidate("j", "vc-a", 100, gpu_type, pods, sharing, p, e)


@pytest.mark.parametrize(
    ("c", "expect"),
    [
        (cand("lanes", 1024, 2048), "lanes"),
        (cand("lanes", None, 2048), "waits"),  # for its profile
        (cand("lanes", 10000, 8000), "refused"),  # P + E > C of a T4
        (cand("lanes", 1024, 2048, gpu_type="H100"), "refused"),  # no memory size known
        (cand(None, 1024, 2048), "lanes"),  # 3 GiB <= 0.25 x 16 GiB: the policy
        (cand(None, 2048, 4096), "exclusive"),  # 6 GiB > 4 GiB
        (cand(None, None, None), "exclusive"),
        (cand("exclusive", 10, 10), "exclusive"),
        (cand(None, 10, 10, pods=(2,)), "exclusive"),
        (cand(None, 4096, 4096, gpu_type="A100"), "lanes"),  # 8 GiB <= 10 GiB
    ],
    ids=["asked", "asked-no-P", "asked-too-big", "asked-unknown-type", "policy-small", "policy-large", "policy-no-figures",
         "exclusive", "two-gpus", "policy-a100"],  # fmt: skip
)
def test_which_jobs_run_in_lanes(c: LaneCandidate, expect: str) -> None:
    got = choose(c, LaneSettings())
    kind = "exclusive" if got is None else "refused" if isinstance(got, LaneJobRefused) else "waits" if isinstance(got, LaneJobWaiting) else "lanes"
    assert kind == expect, got
    if isinstance(got, LaneJobSpec) and c.sharing is None:
        assert "policy" in got.chosen_by


def test_the_policy_is_off_at_fraction_zero() -> None:
    assert choose(cand(None, 1, 1), LaneSettings(auto_fraction=0.0)) is None


# -- placement ----------------------------------------------------------------------------------


def test_two_lane_jobs_share_one_lane_gpu_of_their_vc_and_it_goes_back_when_both_end() -> None:
    log = Log(shell(LaneSettings(policies={"vc-a": Policy.SRTF})))
    first = log.submit(lane_job("j1"))
    gpu_binding = of(first, CellBinding, "bound")
    assert len(gpu_binding) == 1 and gpu_binding[0].job_id == "lane-gpu:vc-a:0" and gpu_binding[0].vc == "vc-a"
    assert gpu_binding[0].inputs["lane_capacity_mib"] == T4 and gpu_binding[0].inputs["lane_policy"] == "srtf"
    gpu = gpu_binding[0].gpu_ids[0]
    (start,) = of(first, ExecutorCommand)
    assert start.action is CommandAction.START_TRAINING and start.gpu_ids == (gpu,) and start.job_id == "j1"
    assert start.lane is not None and (start.lane.lane_id, start.lane.lane_size_mib, start.lane.persistent_mib, start.lane.policy) == (0, 2048, 1024, "srtf")
    (bound,) = of(first, JobLifecycleEvent, JobState.BOUND)
    assert bound.job_id == "j1" and "Σ P_i + Σ L_j = 3072 <= C = 16384" in bound.reason and bound.gpu_ids == (gpu,)
    assert not of(first, JobLifecycleEvent, JobState.WAITING) or True  # it waited for the GPU a moment

    second = log.submit(lane_job("j2", 512, 2048, seconds=2))
    assert not of(second, CellBinding)  # no new GPU: j2 fits the one vc-a has
    (start2,) = of(second, ExecutorCommand)
    assert start2.gpu_ids == (gpu,) and start2.lane is not None and start2.lane.lane_id == 1

    assert of(log.life(lifecycle("j1", JobState.COMPLETED, 10)), CellBinding) == []  # j2 still runs there
    done = log.life(lifecycle("j2", JobState.COMPLETED, 11))
    (released,) = of(done, CellBinding, "released")
    assert released.job_id == "lane-gpu:vc-a:0" and released.pod == "lane-gpu:vc-a:0/0"
    assert not log.edge.core.lanes.placer.gpus() and not log.edge.core.jobs.placed


def test_no_lifecycle_or_executor_command_for_a_lane_gpu_itself() -> None:
    out = Log(shell()).submit(lane_job("j1"))
    assert all(e.job_id == "j1" for e in of(out, JobLifecycleEvent) + of(out, ExecutorCommand))


def test_lane_jobs_of_two_priority_classes_get_two_lane_gpus() -> None:
    log = Log(shell())
    log.submit(lane_job("g1"))
    out = log.submit(lane_job("o1", vc="vc-a", opportunistic=True, seconds=2))
    (binding,) = of(out, CellBinding, "bound")
    assert binding.priority is Priority.OPPORTUNISTIC and binding.job_id == "lane-gpu:vc-a:1"
    assert len(log.edge.core.lanes.placer.gpus()) == 2


def test_safety_condition_holds_across_admissions_and_departures() -> None:
    """Seeded random arrivals and finishes: Σ P_i + Σ L_j ≤ C on every lane GPU after every input."""
    rng = random.Random(7)
    log = Log(shell())
    alive: list[str] = []
    for step in range(120):
        if alive and rng.random() < 0.4:
            job = alive.pop(rng.randrange(len(alive)))
            log.life(lifecycle(job, JobState.COMPLETED, step))
        else:
            name = f"r{step}"
            log.submit(lane_job(name, rng.choice([256, 1024, 3072]), rng.choice([512, 2048, 6144]), seconds=step))
            alive.append(name)
        placer = log.edge.core.lanes.placer
        for gpu in placer.gpus():
            m = placer.manager(gpu.gpu_id)
            assert m.persistent_total_mib + m.lanes_total_mib <= gpu.capacity_mib
            m.check_safety()
        # every bound lane GPU is a bound HiveD pod of vc-a
        assert {g.cell for g in placer.gpus()} <= set(log.edge.core.jobs.placed)
    starts = [c for c in of(log.out, ExecutorCommand) if c.action is CommandAction.START_TRAINING]
    assert starts and all(c.lane is not None for c in starts)
    assert len({c.gpu_ids[0] for c in starts}) <= 8


def test_a_job_that_does_not_fit_waits_with_the_numbers_and_a_second_gpu_is_asked() -> None:
    log = Log(shell())
    log.submit(lane_job("big1", 5000, 8192))
    out = log.submit(lane_job("big2", 5000, 8192, seconds=2))  # even sharing lane 0: 10000 + 8192 > C: a second GPU
    bindings = of(out, CellBinding, "bound")
    assert [b.job_id for b in bindings] == ["lane-gpu:vc-a:1"]
    (waiting,) = of(out, JobLifecycleEvent, JobState.WAITING)
    assert "no lane GPU of VC vc-a (guaranteed) stays safe" in waiting.reason and "C = 16384" in waiting.reason


def test_vc_without_cells_for_lanes_waits_for_opportunistic_capacity_with_hiveds_reason() -> None:
    log = Log(shell())
    log.submit(gang("fill-a", pods=2))  # vc-a holds all 8 GPUs
    out = log.submit(lane_job("ob", vc="vc-b", opportunistic=True, seconds=2))
    reasons = [e.reason for e in of(out, JobLifecycleEvent, JobState.WAITING)]
    assert any("waits for a lane GPU of vc-b (opportunistic)" in r for r in reasons), reasons
    assert not of(out, ExecutorCommand)
    # cells free up: the lane GPU is bound and the job starts
    out = log.life(lifecycle("fill-a", JobState.COMPLETED, 5))
    assert [b.job_id for b in of(out, CellBinding, "bound")] == ["lane-gpu:vc-b:0"]
    assert [c.job_id for c in of(out, ExecutorCommand) if c.action is CommandAction.START_TRAINING] == ["ob"]


def test_refusals_say_why() -> None:
    log = Log(shell())
    (rejected,) = of(log.submit(lane_job("nope", 10000, 8000)), JobLifecycleEvent, JobState.REJECTED)
    assert "exceeds C = 16384" in rejected.reason
    assert not log.edge.core.lanes.placer.gpus()


def test_cancel_stops_only_that_lane_job() -> None:
    log = Log(shell())
    log.submit(lane_job("j1"))
    log.submit(lane_job("j2", seconds=2))
    out = log.life(lifecycle("j1", JobState.CANCELLED, 5, source="job-controller/0"))
    stops = of(out, ExecutorCommand)
    assert [(c.action, c.job_id) for c in stops] == [(CommandAction.STOP, "j1")]
    assert log.edge.core.lanes.placer.gpu_of("j2") is not None and not of(out, CellBinding)


def test_suspend_and_resume_a_lane_job() -> None:
    log = Log(shell())
    log.submit(lane_job("j1"))
    out = log.life(lifecycle("j1", JobState.SUSPENDED, 5, source="job-controller/0"))
    assert [c.action for c in of(out, ExecutorCommand)] == [CommandAction.STOP]
    assert [b.state for b in of(out, CellBinding)] == ["released"]  # its GPU went back
    out = log.life(lifecycle("j1", JobState.RESUMED, 6, source="job-controller/0"))
    assert [c.job_id for c in of(out, ExecutorCommand) if c.action is CommandAction.START_TRAINING] == ["j1"]


def test_a_preempted_lane_gpu_evicts_its_lane_jobs_which_wait_again() -> None:
    log = Log(shell())
    log.submit(lane_job("o1", vc="vc-b", opportunistic=True))
    log.submit(lane_job("o2", vc="vc-b", opportunistic=True, seconds=2))
    out = log.submit(gang("fill-a", pods=2, seconds=3))  # vc-a takes its 8 guaranteed GPUs back
    assert [b.job_id for b in of(out, CellBinding, "preempted")] == ["lane-gpu:vc-b:0"]
    evicts = [c for c in of(out, ExecutorCommand) if c.action is CommandAction.EVICT]
    assert sorted(c.job_id for c in evicts) == ["o1", "o2"]
    assert sorted(e.job_id for e in of(out, JobLifecycleEvent, JobState.PREEMPTED)) == ["o1", "o2"]
    assert log.edge.core.lanes.placer.waiting == ("o1", "o2")
    out = log.life(lifecycle("fill-a", JobState.COMPLETED, 9))  # cells again: both run again on one GPU
    starts = [c for c in of(out, ExecutorCommand) if c.action is CommandAction.START_TRAINING]
    assert sorted(c.job_id for c in starts) == ["o1", "o2"] and len({c.gpu_ids[0] for c in starts}) == 1


# -- crash recovery -----------------------------------------------------------------------------


def restart(log: Log, lanes: LaneSettings | None = None) -> AllocatorEvents:
    """A new allocator folding the inputs and everything the old one published."""
    edge = shell(lanes)
    for e in [*log.inputs, *log.out]:
        match e:
            case JobSubmission():
                edge.on_submission(e, replaying=True)
            case JobLifecycleEvent():
                edge.on_lifecycle(e, replaying=True)
            case CellBinding():
                edge.on_binding(e, replaying=True)
    edge.core.folding(False)
    return edge


def test_restart_rebuilds_the_same_lane_state() -> None:
    rng = random.Random(3)
    log = Log(shell())
    alive: list[str] = []
    for step in range(60):
        if alive and rng.random() < 0.35:
            log.life(lifecycle(alive.pop(rng.randrange(len(alive))), JobState.COMPLETED, step))
        else:
            name = f"r{step}"
            vc, opp = rng.choice([("vc-a", False), ("vc-b", True)])
            log.submit(lane_job(name, rng.choice([256, 1024, 3072]), rng.choice([512, 2048, 6144]), vc=vc, opportunistic=opp, seconds=step))
            alive.append(name)
    before = lane_state(log.edge)
    after = restart(log)
    assert lane_state(after) == before
    assert {j for j, pods in after.core.jobs.placed.items() if pods} == {j for j, pods in log.edge.core.jobs.placed.items() if pods}
    # and it decides the same next: one more job, the same placement
    nxt = lane_job("next", 512, 512, seconds=100)
    a = [(type(e).__name__, getattr(e, "state", None), getattr(e, "gpu_ids", None)) for e in log.edge.on_submission(nxt, replaying=False)]
    b = [(type(e).__name__, getattr(e, "state", None), getattr(e, "gpu_ids", None)) for e in after.on_submission(nxt, replaying=False)]
    assert a == b


def test_restart_keeps_a_grown_lane_at_its_size() -> None:
    """Lanes only grow (Salus §3.3): lane 0 grown to 9000 MiB by c keeps that size after c left,
    and so after a restart (the largest size recorded for the lane)."""
    log = Log(shell())
    log.submit(lane_job("a", 1000, 4000))
    log.submit(lane_job("b", 1000, 4000, seconds=2))  # lane 1
    out = log.submit(lane_job("c", 1000, 9000, seconds=3))  # 3000 + 8000 + 9000 > C: lane 0 grows to 9000
    assert "lane 0 grows to E = 9000" in of(out, JobLifecycleEvent, JobState.BOUND)[0].reason
    log.life(lifecycle("c", JobState.COMPLETED, 4))
    before = lane_state(log.edge)
    assert before["node-02/gpu-0"][2][0] == (0, 9000.0, ("a",))
    after = restart(log)
    assert lane_state(after) == before
    assert after.core.lanes.placer.manager("node-02/gpu-0")._next_lane_id == 2


def test_a_refusal_folded_before_going_live_is_decided_at_the_next_pass_once() -> None:
    edge = shell()
    edge.on_submission(lane_job("nope", 10000, 8000), replaying=True)  # consumed while catching up
    edge.core.folding(False)
    (rejected,) = of(edge.retry(), JobLifecycleEvent, JobState.REJECTED)
    assert rejected.job_id == "nope" and "exceeds C" in rejected.reason
    assert not edge.retry()
    # a restart that folds that refusal does not refuse again
    again = shell()
    again.on_submission(lane_job("nope", 10000, 8000), replaying=True)
    again.on_lifecycle(rejected, replaying=True)
    again.core.folding(False)
    assert not again.retry()


def test_lane_jobs_folded_before_going_live_are_placed_at_the_next_pass() -> None:
    edge = shell()
    edge.on_submission(lane_job("j1"), replaying=True)
    edge.on_submission(lane_job("j2", seconds=2), replaying=True)
    edge.core.folding(False)
    out = edge.retry()
    starts = of(out, ExecutorCommand)
    assert sorted(c.job_id for c in starts) == ["j1", "j2"] and len({c.gpu_ids for c in starts}) == 1


def profile(job_id: str, persistent: float = 300, peak: float = 2100, seconds: float = 5) -> Profile:
    return Profile(occurred_at=at(seconds), source="profiler/0", job_id=job_id, signature="signature-0001", gpu_type="T4",
                   method="simulated", iteration_time_ms=189.0, gpu_util=80.0, sm_activity=70.0, sm_occupancy=40.0,
                   memory_peak_mib=peak, persistent_memory_mib=persistent)  # fmt: skip


def test_a_lane_job_without_estimates_waits_for_its_profile_then_runs_with_its_p_and_e() -> None:
    log = Log(shell())
    out = log.submit(lane_job("nofig", None, None))
    (waiting,) = of(out, JobLifecycleEvent, JobState.WAITING)
    assert "waits for its profile" in waiting.reason and not of(out, CellBinding)
    out = log.edge.on_profile(profile("nofig"), replaying=False)
    (start,) = of(out, ExecutorCommand)
    assert start.lane is not None and (start.lane.persistent_mib, start.lane.ephemeral_mib) == (300, 1800)
    assert log.edge.on_profile(profile("nofig"), replaying=False) == []  # redelivered
    too_big = log.submit(lane_job("huge", None, None, seconds=6))
    assert of(too_big, JobLifecycleEvent, JobState.WAITING)
    (rejected,) = of(log.edge.on_profile(profile("huge", 9000, 20000, 7), replaying=False), JobLifecycleEvent, JobState.REJECTED)
    assert "P + E = 20000 MiB exceeds C = 16384" in rejected.reason


def test_a_profile_folded_before_its_submission_counts() -> None:
    edge = shell()
    edge.on_profile(profile("nofig"), replaying=True)
    edge.on_submission(lane_job("nofig", None, None), replaying=True)
    edge.core.folding(False)
    (start,) = of(edge.retry(), ExecutorCommand)
    assert start.lane is not None and start.lane.ephemeral_mib == 1800


def test_a_job_with_sharing_unset_is_not_held_back_for_a_profile() -> None:
    out = Log(shell()).submit(lane_job("plain", None, None, sharing=None))
    assert [c.lane for c in of(out, ExecutorCommand)] == [None]  # an exclusive HiveD job


def test_a_lane_job_suspended_while_it_waits_for_its_profile_runs_after_resume() -> None:
    log = Log(shell())
    log.submit(lane_job("nofig", None, None))
    log.life(lifecycle("nofig", JobState.SUSPENDED, 2, source="job-controller/0"))
    assert not of(log.edge.on_profile(profile("nofig", seconds=3), replaying=False), ExecutorCommand)
    out = log.life(lifecycle("nofig", JobState.RESUMED, 4, source="job-controller/0"))
    assert [c.job_id for c in of(out, ExecutorCommand)] == ["nofig"]
