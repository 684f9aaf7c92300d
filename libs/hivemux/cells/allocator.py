"""The cell allocator's deciding core: HiveD's scheduler over event time, as a pure state object.

It folds what the cell-allocator consumes, as domain inputs (training jobs, job ends, GPU
health, cell configurations, the recorded bindings), and returns what each input decided as an
`Allocation`: the decisions (`cells.job_allocator`: pods bound, released, preempted, jobs
waiting or refused, each with its reason), the jobs whose every pod is now bound, the event
time they are stamped with and the id of the input that caused them. `cells.allocator_events`
turns that into the events the service publishes; nothing here knows the bus.

What it holds, and the HiveD section each part follows:

- the jobs and their pods on a `CellScheduler` (`job_allocator`: one affinity group per job,
  preemption, weighted max-min fairness for opportunistic capacity, §3.3);
- bad nodes (`bad_hardware`: a node is bad while any of its GPUs is Disabled, §4 "Handling
  faulty hardware"); they are applied again to the scheduler a reconfiguration builds;
- the configuration version: a newer cell configuration builds a new scheduler
  (`schedulers.build_scheduler`) and keeps every placement (§4 "Reconfiguration");
- the latest event time consumed, which stamps the retry pass, and the last pass's time;
- the lane GPUs and the lane jobs packed on them (`lane_gpus`, Salus §3.3 across a VC's
  1-GPU cells, issue 20): every decision list of the `JobAllocator` goes through
  `LaneGpus.after`, which turns a lane GPU's binding, preemption and waiting into the
  consequences for its lane jobs.

Determinism (ARCHITECTURE.md "Determinism"). Nothing here reads a clock: every decision is a
function of the inputs folded so far and their event time. A decision caused by an input is
stamped with that input's event time and derives its ids from that input's id. The retry pass
has no input of its own: it runs when the shell consumes a clock tick from the bus
(`events/clock.py`; `tick`), once `retry_interval` of event time has passed since the last
pass, stamped with the latest event time consumed (`latest`, which the tick moved), its ids
derived from that time. So where a pass falls in the input sequence is on the log too (the
tick's position), and a pass's decisions and ids are a function of the inputs consumed before
it; a pass that finds nothing new decides nothing. Before issue 14 the pass was triggered by a
local timer and stamped with the wall clock when that was later than the latest event, so two
replays of one log stamped and identified its decisions differently.

What updates `latest`: every input the allocator acts on (training submissions, job ends, GPU
health, clock ticks and, since the retry pass uses it, cell configurations); the recorded bindings folded
after a restart do not (they are its own output). Limit: a retry pass's ids derive from (pod or
job, latest event time), so a pod bound by two passes at the same latest time would get one id
twice; that needs it preempted in between by an input stamped before the latest (out-of-order
event times), and is left as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hivemux.errors import ConfigurationError
from hivemux.events.versions import version_jump

from . import api
from .bad_hardware import BadNodes, NodeHealth
from .job_allocator import Decision, JobAllocator, PodBound, TrainingJob
from .lane_choice import LaneDecision, LaneJobRefused, LaneJobSpec, LaneSettings
from .lane_gpus import LaneGpus
from .resize import ReplicasFit, ReplicasRefused
from .schedulers import build_scheduler

NEVER = datetime.min.replace(tzinfo=UTC)  # the latest event time before any event


@dataclass(frozen=True)
class JobPlaced:
    """A job whose every pod is bound, and where: ``node[leaf indices]`` per pod."""

    job_id: str
    placement: str


@dataclass(frozen=True)
class Allocation:
    """What one input (or one retry pass) decided."""

    at: datetime  # event time the decisions are stamped with
    cause: str  # the causing input's event id; for a retry pass, its event time (ISO 8601)
    decisions: tuple[Decision | LaneDecision, ...] = ()
    placed: tuple[JobPlaced, ...] = ()  # jobs fully placed by these decisions, in decision order
    node_health: NodeHealth | None = None  # the node this input turned bad or healthy, if any


class CellAllocator:
    """Single-threaded; every input goes through one of the methods below."""

    def __init__(
        self,
        scheduler: api.CellScheduler,
        kind: str = "hived",
        weights: Mapping[str, float] | None = None,
        retry_interval: timedelta = timedelta(seconds=5),
        lanes: LaneSettings | None = None,
    ) -> None:
        self.jobs = JobAllocator(scheduler, dict(weights or {}))
        self.lanes = LaneGpus(self.jobs, lanes)
        self.kind = kind  # which scheduler a reconfiguration builds
        self.config_version = 0  # 0: the configuration the allocator started with
        self.bad_nodes = BadNodes()
        self.latest = NEVER  # latest event time consumed
        self.retry_interval = retry_interval  # event time between two retry passes on ticks
        self.last_retry = NEVER  # event time of the last retry pass a tick ran

    @property
    def scheduler(self) -> api.CellScheduler:
        return self.jobs.scheduler

    # -- inputs -------------------------------------------------------------------------------
    def submit(self, job: TrainingJob, *, at: datetime, cause: str) -> Allocation:
        """A training job submitted: schedule it now."""
        self._saw(at)
        return self._allocation(self.lanes.after(self.jobs.submit(job)), at, cause)

    def submit_lane(self, job: LaneJobSpec, *, at: datetime, cause: str) -> Allocation:
        """A lane job submitted (`lane_choice.choose`): packed on a lane GPU of its VC, or waits."""
        self._saw(at)
        return self._allocation(self.lanes.submit(job), at, cause)

    def refuse_lane(self, refused: LaneJobRefused, *, at: datetime, cause: str) -> Allocation:
        """A lane job that cannot run in lanes (`lane_choice.choose`): refused with the reason."""
        self._saw(at)
        return self._allocation(self.lanes.refuse(refused), at, cause)

    def lane_start_refused(self, job_id: str, node: str, gpu_id: str, reason: str, *, at: datetime, cause: str,
                           evicted: bool = False) -> Allocation:  # fmt: skip
        """The executor refused a lane job's start in its lane, or (``evicted``) ended its run
        there on its own (`LaneGpus.executor_refused`, `LaneGpus.executor_evicted`)."""
        self._saw(at)
        return self._allocation(self.lanes.executor_refused(job_id, node, gpu_id, reason, evicted=evicted), at, cause)

    def enqueue_lane(self, job: LaneJobSpec, *, at: datetime) -> None:
        """A lane job's submission replayed after a restart (`LaneGpus.go_live` places it)."""
        self._saw(at)
        self.lanes.enqueue(job)

    def enqueue(self, job: TrainingJob, *, at: datetime) -> None:
        """A submission from the job log replayed after a restart: take it in, decide nothing
        (its bindings, already recorded, are restored by `restore`)."""
        self._saw(at)
        self.jobs.enqueue(job)

    def restore(self, job_id: str, pod: api.Pod, bind_info: api.BindInfo) -> None:
        """A recorded binding (crash recovery, HiveD §4 "Fault tolerance")."""
        self.jobs.restore(job_id, pod, bind_info)

    def heard(self, job_id: str, waiting_reason: str | None, at: datetime | None = None) -> None:
        """A job's lifecycle step on the log: a waiting reason this allocator published at `at`,
        or another step (None). Its own output: it does not move `latest` (`JobAllocator.heard`)."""
        self.jobs.heard(job_id, waiting_reason, at)

    def forget(self, job_id: str, pod_name: str) -> None:
        """A recorded release or preemption of one pod (crash recovery)."""
        self.jobs.forget(job_id, pod_name)

    def end(self, job_id: str, *, at: datetime, cause: str) -> Allocation:
        """The job completed, failed or was stopped: its cells are free, the queue is retried."""
        self._saw(at)
        return self._allocation([*self.lanes.after(self.jobs.end(job_id)), *self.lanes.end(job_id)], at, cause)

    def restart(self, job_id: str, *, at: datetime, cause: str) -> Allocation:
        """A gang's run ended on a pod's failure or eviction (`gang`): its cells are freed and it
        is bound again as a new run."""
        self._saw(at)
        return self._allocation(self.lanes.after(self.jobs.restart(job_id)), at, cause)

    def suspend(self, job_id: str, *, at: datetime, cause: str) -> Allocation:
        """The job was suspended by its user: its cells are free, the queue is retried."""
        self._saw(at)
        return self._allocation([*self.lanes.after(self.jobs.suspend(job_id)), *self.lanes.suspend(job_id)], at, cause)

    def resume(self, job_id: str, *, at: datetime, cause: str) -> Allocation:
        """The job was resumed: back at the end of the queue, tried at once."""
        self._saw(at)
        return self._allocation([*self.lanes.after(self.jobs.resume(job_id)), *self.lanes.resume(job_id)], at, cause)

    def reprioritize(self, job_id: str, priority: int, *, at: datetime, cause: str) -> Allocation:
        """A user changed the job's HiveD priority (`JobAllocator.reprioritize`), or a lane job's
        (`LaneGpus.reprioritize`)."""
        self._saw(at)
        return self._allocation([*self.lanes.after(self.jobs.reprioritize(job_id, priority)), *self.lanes.reprioritize(job_id, priority)], at, cause)

    def resize(self, job_id: str, replicas: int, *, at: datetime, cause: str) -> tuple[ReplicasFit | ReplicasRefused, Allocation]:
        """A user's resize of an online service (`JobAllocator.resize`): the verdict and what it changed."""
        self._saw(at)
        verdict, decisions = self.jobs.resize(job_id, replicas)
        return verdict, self._allocation(self.lanes.after(decisions), at, cause)

    def gpu_health(self, node: str, gpu: str, *, disabled: bool, at: datetime, cause: str) -> Allocation:
        """A GPU entered or left Disabled: its node may turn bad or healthy (`bad_hardware`)."""
        self._saw(at)
        change = self.bad_nodes.observe(node, gpu, disabled=disabled)
        decisions: list[Decision | LaneDecision] = []
        if change is not None and change.bad:
            self.jobs.set_node_bad(node)
        elif change is not None:
            decisions = self.lanes.after(self.jobs.set_node_healthy(node))  # cells came back: retry the queue
        return self._allocation(decisions, at, cause, change)

    def reconfigure(self, version: int, config: Mapping[str, Any], *, at: datetime, cause: str) -> Allocation:
        """A cell configuration: a newer version replaces the scheduler, keeping every placement
        and every bad node; an older or equal one changes nothing. Raises `ConfigurationError`
        (and keeps the current configuration) when the new one is invalid or its version jumps
        implausibly far (`events.versions`)."""
        self._saw(at)
        if version <= self.config_version:
            return Allocation(at, cause)
        jump = version_jump(self.config_version, version, at=at)  # a forged 2^63-1 would win for ever
        if jump is not None:
            raise ConfigurationError(jump)
        scheduler = build_scheduler(self.kind, config)
        self.config_version = version
        decisions = self.lanes.after(self.jobs.reconfigure(scheduler))
        for node in self.bad_nodes.bad():
            self.jobs.set_node_bad(node)
        return self._allocation(decisions, at, cause)

    def folding(self, replaying: bool) -> None:
        """Records handled while catching up (or on standby) are folded, never decided on: no
        job is tried until records are handled live (`JobAllocator.deciding`); the lane
        placer is rebuilt from what was folded at the first live record (`LaneGpus.go_live`)."""
        self.jobs.deciding = not replaying
        if not replaying:
            self.lanes.go_live()

    def saw(self, at: datetime) -> None:
        """Time passed without a decision (a clock tick replayed after a restart)."""
        self._saw(at)

    def tick(self, at: datetime) -> Allocation:
        """A clock tick on the bus (`events/clock.py`): time moves to `at`, and once
        `retry_interval` of event time has passed since the last pass, the waiting jobs are
        tried again (`retry`), stamped with that time."""
        self._saw(at)
        if self.latest - self.last_retry < self.retry_interval:
            return Allocation(self.latest, self.latest.isoformat())
        self.last_retry = self.latest
        return self.retry()

    def retry(self) -> Allocation:
        """Try the waiting jobs again, stamped with the latest event time consumed (see the
        module docstring: never the wall clock)."""
        self.lanes.tidy()
        decisions = [*self.lanes.after(self.jobs.retry_waiting()), *self.lanes.retry()]
        return self._allocation(decisions, self.latest, self.latest.isoformat())

    # -- helpers ------------------------------------------------------------------------------
    def _saw(self, at: datetime) -> None:
        """Each input starts here (`retry` too): the lane GPU requests the previous one retired go."""
        self.latest = self.jobs.now = max(self.latest, at)  # a waiting reason is told at `latest` (`JobAllocator._tell`)
        self.lanes.tidy()

    def _allocation(self, decisions: list[Decision | LaneDecision], at: datetime, cause: str, change: NodeHealth | None = None) -> Allocation:
        placed = tuple(
            JobPlaced(job_id, self._placement(job_id))
            for job_id in dict.fromkeys(d.job_id for d in decisions if isinstance(d, PodBound))
            if self.jobs.fully_placed(job_id) and self.lanes.request(job_id) is None  # a lane GPU is no user's job
        )
        return Allocation(at, cause, tuple(decisions), placed, change)

    def _placement(self, job_id: str) -> str:
        return ", ".join(f"{info.node}{list(info.leaf_cell_isolation)}" for _, info in self.jobs.placed[job_id].values())
