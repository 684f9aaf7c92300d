"""The simulated backend of the executor: every node of the simulated fleet, no processes.

MuxFlow's local executor (preprint §3 "Local executor") runs the workloads the scheduler
placed and reports their progress; its efficiency metric is the offline *normalized
throughput* (§5.2) and the speed predictor learns from sharing observations (§5.2). Where there
are no GPUs (`hivemux up`, the demo, the end-to-end tests) one service instance plays every
node of its partitions: `SimulatedExecutor` keeps one `hivemux.simulated.node_agent.SimulatedNode`
per node, starts offline jobs with their SM share and training pods on whole GPUs, advances
them with the calibrated interference model (`hivemux.simulated.interference`) and returns
`executor.reports`, `jobs.lifecycle` events and `sharing.observations`.

The online service's own SM activity per GPU is folded from `telemetry.gpu` samples that show
no offline work on the GPU (the sample of a shared GPU is not the online service's alone).

Online services are jobs (issue 19): a ``start_online`` command (the cell allocator's, one per
bound replica) makes the node serve the service on its GPU until a ``stop`` or ``evict``: no
iterations, a ``running`` lifecycle event, and every ``latency_window_s`` a p99 report
(`online.latency`) with the service's SLO and request rate from its submission; the simulated
fleet, told by the same commands (telemetry-ingester), shows the service on that GPU.

Time: a simulated workload runs on the node's clock, like a real one: it starts when the start
command is handled (``now``) and advances by the time elapsed between ticks. What a command
decides carries the command's event time: the final ``stopped``/``evicted`` report and
lifecycle event. A re-delivered start or stop changes nothing (`SimulatedNode.start` refuses a
running or finished job; a stop of a job not running here returns nothing).

A restarted executor comes back with its work (`recovery`): `start` takes the ledger the log
gives, and `adopt` (called when the instance is given the nodes' command partitions) re-adopts
every run in progress there. A simulated workload, like a process, ran on while its agent was
down: it resumes from its last report, and the first tick advances it over the downtime (it
may complete then). Each adopted run is reported ``running`` at once, so the matcher hears it.

Salus lanes (issue 20): a ``start_training`` with a ``lane`` grant runs beside the GPU's other
lane jobs in `lane_gpu.LaneGpu` — the granted lane (Algorithm 1's safety condition checked
again before admission; a grant that breaks it, or a GPU a job holds whole, is refused with the
reason, step ``lane_refused``), the GPU's iteration scheduler under the grant's policy (Salus §4),
one iteration at a time per lane, in the event time the ticks pass in. Each lane job reports its
own iterations and throughput (``detail``: its lane and the policy); a stop or eviction of one
ends its lane session only, and its neighbours go on.

Logs (issue 29 item 6): each simulated workload prints what a real one would — its start, its
progress every 10 s of its clock, a service's latency windows, its end — shipped on every tick
(after `advance`) on ``jobs.logs`` through the process agent's bounded path (`simulated_logs`), one stream per pod
(``ExecutorCommand.pod``) on its node, so `hivemux jobs logs` reads a demo job's output.

Worked example: a start at 0 s of 100 iterations at 100 ms solo, 60 % of the SMs of a GPU with
no online activity (ResNet-50's shape: normalized 0.625, 6.25 it/s): ticks at 4 s and 8 s report
25 then 50 iterations, each with an observation of the window since the previous one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from hivemux.events import (
    CommandAction,
    Event,
    ExecutorCommand,
    ExecutorReport,
    GpuTelemetrySample,
    JobLifecycleEvent,
    JobState,
    OnlineLatencyReport,
    ReportState,
    SharingObservation,
    derived_id,
)
from hivemux.events.base import clip_reason
from hivemux.executor.admission import Refusal, beyond_the_node
from hivemux.executor.lane_gpu import LaneGpu, LaneJobSpec, LaneProgress, LaneStarted
from hivemux.executor.recovery import Ledger
from hivemux.executor.simulated_logs import SimulatedLogs, SimulatedPrints
from hivemux.jobs.log_bound import LogBound
from hivemux.simulated.catalog import solo_profile
from hivemux.simulated.gpu_types import GPU_TYPES
from hivemux.simulated.interference import shared_execution
from hivemux.simulated.online_latency import online_p99_ms, slo_p99_ms
from hivemux.simulated.node_agent import Progress, RunningWorkload, SimulatedNode

_STARTS = {CommandAction.START_OFFLINE: "offline", CommandAction.START_TRAINING: "training"}


def workload_key(command: ExecutorCommand) -> str:
    """What a start runs is known by on its node: its job; a gang pod by its job, run and rank (job
    ids hold no '/'), so two pods of one gang on one node run side by side, and the gang's next
    run starts there even where a pod of this one finished (issue 29)."""
    r = command.rendezvous
    return command.job_id if r is None else f"{command.job_id}/{r.run}/{r.rank}"
_CHECKED = frozenset({*_STARTS, CommandAction.START_ONLINE, CommandAction.ADJUST})  # against the fleet (`_beyond`)


class SimulatedExecutor:
    def __init__(self, *, source: str, default_gpu_type: str = "T4", clock: Callable[[], float] = time.time,
                 latency_window_s: float = 5.0, log_bound: LogBound | None = None) -> None:
        self.source = source
        self.default_gpu_type = default_gpu_type
        self.clock = clock
        self.nodes: dict[str, SimulatedNode] = {}
        self.commands: dict[tuple[str, str], ExecutorCommand] = {}  # (node, workload key) -> the command that started it (`workload_key`)
        self.gpu_types: dict[str, str] = {}
        self.gpu_memory: dict[str, float] = {}  # gpu_id -> its memory (MiB), from its samples
        self.node_gpus: dict[str, set[str]] = {}  # node -> the GPUs its samples named: the fleet it knows
        # The online service's own SM activity per GPU, measured while no offline job shares it.
        self.online_sm: dict[str, float] = {}
        # Online services per GPU (from the samples) and the end of each one's last latency window.
        self.online: dict[str, tuple[str, str]] = {}  # gpu_id -> (node_id, service)
        self.services: dict[str, ExecutorCommand] = {}  # gpu_id -> the start_online serving there (a submitted service)
        self.submitted: set[str] = set()  # submitted services (job ids): known from their commands, not from samples
        self.latency_until: dict[str, datetime] = {}
        self.latency_window_s = latency_window_s
        self.observed_until: dict[tuple[str, str], datetime] = {}  # (node, workload key) -> end of its last observation window
        self.ledger: Ledger | None = None
        self.adopted: set[str] = set()  # nodes whose runs were re-adopted
        # Salus lanes (issue 20): the lane jobs of each shared GPU, run by `lane_gpu.LaneGpu`
        self.lane_gpus: dict[str, LaneGpu] = {}
        self.lane_starts: dict[tuple[str, str], ExecutorCommand] = {}  # (node, job) -> its lane start
        self.lane_finished: set[tuple[str, str]] = set()
        self.logs = SimulatedLogs(log_bound or LogBound(), self.agent)  # what the workloads print (`simulated_logs`)
        self.prints = SimulatedPrints(self.logs)

    # -- NodeBackend ----------------------------------------------------------------------------
    async def start(self, ledger: Ledger | None = None) -> list[Event]:
        self.ledger = ledger
        return []

    def adopt(self, partitions: Iterable[int] | None = None, *, now: datetime | None = None) -> list[Event]:
        """Re-adopt the ledger's runs on the nodes whose commands are on ``partitions`` (None:
        every node), once per node; a ``running`` report per adopted run."""
        ledger = self.ledger
        if ledger is None:
            return []
        owned = None if partitions is None else set(partitions)
        nodes = {n for n, p in ledger.partitions.items() if n not in self.adopted and (owned is None or p in owned)}
        self.adopted |= nodes
        now = now or self.at()
        out: list[Event] = []
        for run in ledger.runs(nodes.__contains__):
            command, last = run.command, run.last
            assert command.workload is not None
            if command.action is CommandAction.START_ONLINE:  # a service serves on: it is its GPUs' again
                if not self._start_online(command, now):
                    continue
                self.prints.started(command, now, adopted=True)
                out.append(self._report(command, ReportState.RUNNING, now, detail="re-adopted after the executor restarted"))
                continue
            if command.lane is not None:  # a lane job resumes in its lane from its last report
                done = min(last.iterations_done, command.workload.iterations - 1)
                self._start_lane(command, now, done=done, report=False)
                if (command.node_id, command.job_id) in self.lane_starts:
                    self.prints.started(command, now, adopted=True)
                    out.append(self._report(command, ReportState.RUNNING, now, iterations=done, total=command.workload.iterations,
                                            detail="re-adopted in its lane after the executor restarted"))
                continue
            node = self.nodes.setdefault(command.node_id, SimulatedNode(command.node_id))
            gpu_type = self.gpu_types.get(command.gpu_ids[0], self.default_gpu_type)
            solo = solo_profile(command.workload.model, command.workload.batch_size, gpu_type)
            total = command.workload.iterations
            workload = RunningWorkload(
                job_id=workload_key(command), command_id=str(command.event_id), kind=_STARTS[command.action],
                gpu_ids=command.gpu_ids, iterations_total=total, iterations_done=float(min(last.iterations_done, total)),
                solo_iteration_time_ms=command.solo_iteration_time_ms or solo.iteration_time_ms,
                sm_share=command.sm_share if command.action is CommandAction.START_OFFLINE else None,
                started_at=command.occurred_at, last_progress_at=min(last.occurred_at, now), solo=solo,
            )  # fmt: skip
            if not node.start(workload):
                continue
            self.commands[(command.node_id, workload_key(command))] = command
            self.observed_until[(command.node_id, workload_key(command))] = now
            self.prints.started(command, now, adopted=True)
            detail = f"re-adopted after the executor restarted; last reported at {last.occurred_at.isoformat()}"
            out.append(self._report(command, ReportState.RUNNING, now, iterations=int(workload.iterations_done), total=total,
                                    detail=detail))
        return out

    async def stop(self) -> list[Event]:
        return []  # simulated workloads hold nothing to release

    def feed(self) -> int:
        return 0  # no xCUDA control blocks: the interference model stands in for the shim

    def on_sample(self, sample: GpuTelemetrySample) -> None:
        self.gpu_types[sample.gpu_id] = sample.gpu_type
        self.gpu_memory[sample.gpu_id] = sample.memory_total_mib
        self.node_gpus.setdefault(sample.node_id, set()).add(sample.gpu_id)
        if sample.online_workload is not None and sample.online_workload not in self.submitted:  # a fixed fleet service
            self.online[sample.gpu_id] = (sample.node_id, sample.online_workload)
        if not sample.offline_workloads:
            self.online_sm[sample.gpu_id] = sample.sm_activity if sample.sm_activity is not None else sample.gpu_util

    async def on_command(self, command: ExecutorCommand) -> list[Event]:
        return self.handle(command, now=self.at())

    async def tick(self) -> list[Event]:
        now = self.at()
        return [*self.advance(now), *self.logs.ship(at=now)]  # what the workloads printed up to now (`simulated_logs`)

    def at(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    # -- the node core, time passed in ----------------------------------------------------------
    def handle(self, command: ExecutorCommand, *, now: datetime) -> list[Event]:
        """Apply ``command``; ``now`` (the node's clock) is when a started workload begins."""
        if command.action in _CHECKED and (beyond := self._beyond(command)) is not None:
            report = self._report(command, ReportState.REFUSED, command.occurred_at, detail=clip_reason(beyond.reason))
            return [report.model_copy(update={"gpu_ids": (), "step": "beyond_the_node"})]
        node = self.nodes.setdefault(command.node_id, SimulatedNode(command.node_id))
        if command.action is CommandAction.START_TRAINING and command.lane is not None:
            return self._start_lane(command, now)
        if command.action in (CommandAction.STOP, CommandAction.EVICT) and (command.node_id, command.job_id) in self.lane_starts:
            return self._stop_lane(command, now)
        if command.action in _STARTS:
            return self._start(node, command, now)
        if command.action is CommandAction.START_ONLINE:
            return self._start_online(command, now)
        if command.action is CommandAction.ADJUST:
            return self._adjust(node, command)
        if self._serving(command.node_id, command.job_id, command.gpu_ids):
            return self._stop_online(command)
        at = command.occurred_at  # the stop is the command's decision: its event time
        evicted = command.action is CommandAction.EVICT
        state = ReportState.EVICTED if evicted else ReportState.STOPPED
        out: list[Event] = []
        for key in self._workloads_of(command.node_id, command.job_id):  # every pod of the job here (a gang's may be several)
            stopped = node.stop(key)
            started = self.commands.pop((command.node_id, key))
            self.observed_until.pop((command.node_id, key), None)
            if stopped is None:
                continue
            self.prints.ended(started, at, f"{'evicted' if evicted else 'stopped'} at iteration {int(stopped.iterations_done)}: {command.reason}")
            report = self._report(command, state, at, iterations=int(stopped.iterations_done), total=stopped.iterations_total,
                                  detail=command.reason)
            out.append(report if key == command.job_id else report.model_copy(update={
                "event_id": derived_id("report", command.event_id, state.value, key), "gpu_ids": started.gpu_ids}))
        if not out:
            return []  # not running here (finished, or a re-delivered stop)
        return [*out, self._lifecycle(command, JobState.EVICTED if evicted else JobState.STOPPED, at, command.reason)]

    def _workloads_of(self, node_id: str, job_id: str) -> list[str]:
        """The keys of ``job_id``'s workloads on the node (`workload_key`)."""
        return sorted(k for n, k in self.commands if n == node_id and (k == job_id or k.startswith(job_id + "/")))

    def _beyond(self, command: ExecutorCommand) -> Refusal | None:
        """A start or adjust no node of the fleet can have (`admission.beyond_the_node`): a GPU
        not of its node (of a node whose telemetry came: not one it named), or a memory quota
        above the GPU's memory (its samples', else its type's)."""
        def memory(gpu_id: str) -> float:
            if gpu_id in self.gpu_memory:
                return self.gpu_memory[gpu_id]
            kind = GPU_TYPES.get(self.gpu_types.get(gpu_id, self.default_gpu_type))
            return float(kind.memory_mib) if kind is not None else float("inf")

        running = self.commands.get((command.node_id, workload_key(command)))
        return beyond_the_node(command, memory, self.node_gpus.get(command.node_id), running.gpu_ids if running is not None else ())

    def _start(self, node: SimulatedNode, command: ExecutorCommand, now: datetime) -> list[Event]:
        assert command.workload is not None  # the model validator guarantees it for starts
        sharing = sorted(job for g in command.gpu_ids if g in self.lane_gpus for job in self.lane_gpus[g].runs)
        if sharing and workload_key(command) not in node.running:
            why = f"{', '.join(command.gpu_ids)} runs the lane jobs {', '.join(sharing)}: not to be had whole"
            return [self._lane_refused(command, why).model_copy(update={"step": "gpu_in_lanes"})]
        gpu_type = self.gpu_types.get(command.gpu_ids[0], self.default_gpu_type)
        solo = solo_profile(command.workload.model, command.workload.batch_size, gpu_type)
        workload = RunningWorkload(
            job_id=workload_key(command),
            command_id=str(command.event_id),
            kind=_STARTS[command.action],
            gpu_ids=command.gpu_ids,
            iterations_total=command.workload.iterations,
            iterations_done=0.0,
            solo_iteration_time_ms=command.solo_iteration_time_ms or solo.iteration_time_ms,
            sm_share=command.sm_share if command.action is CommandAction.START_OFFLINE else None,
            started_at=now,
            last_progress_at=now,
            solo=solo,
        )
        if not node.start(workload):
            return []  # already running or finished here: a re-delivered command changes nothing
        self.commands[(command.node_id, workload.job_id)] = command
        self.observed_until[(command.node_id, workload.job_id)] = now
        self.prints.started(command, now)
        share = f" with {command.sm_share:.0f} % of the SMs" if command.sm_share is not None else ""
        return [
            self._report(command, ReportState.ACCEPTED, now, total=workload.iterations_total),
            self._lifecycle(command, JobState.RUNNING, now, f"started on {command.node_id} {','.join(command.gpu_ids)}{share}"),
        ]

    def _serving(self, node_id: str, job_id: str, gpu_ids: tuple[str, ...] = ()) -> list[str]:
        """The GPUs serving ``job_id`` on the node (only those of ``gpu_ids``, one replica's, if given)."""
        return sorted(g for g, c in self.services.items() if c.node_id == node_id and c.job_id == job_id and (not gpu_ids or g in gpu_ids))

    def _start_online(self, command: ExecutorCommand, now: datetime) -> list[Event]:
        """Serve an online service's replica on its GPU(s); a re-delivered start changes nothing."""
        if all((c := self.services.get(g)) is not None and c.job_id == command.job_id for g in command.gpu_ids):
            return []  # serving there already (a re-delivered start)
        self.submitted.add(command.job_id)
        for gpu_id in command.gpu_ids:
            self.online.pop(gpu_id, None)
            self.services[gpu_id] = command
            self.latency_until.pop(gpu_id, None)  # its first window starts now
        assert command.workload is not None
        self.prints.started(command, now)
        rate = command.workload.request_rate
        what = f"serving {command.workload.model}" + (f" at {rate:g} req/s" if rate else "")
        return [
            self._report(command, ReportState.ACCEPTED, now, detail=what),
            self._lifecycle(command, JobState.RUNNING, now, f"{what} on {command.node_id} {','.join(command.gpu_ids)}"),
        ]

    def _stop_online(self, command: ExecutorCommand) -> list[Event]:
        """Stop the service's replicas on the node, each reported ended (its start's command and
        GPUs, as the process executor reports them: a replica nobody reports ended runs on for
        every reader of the reports); a stop naming GPUs (a resize's) stops only the replica
        serving there, and is reported without a lifecycle event (the service runs on)."""
        gpus = self._serving(command.node_id, command.job_id, command.gpu_ids)
        starts = list({self.services[g].event_id: self.services[g] for g in gpus}.values())  # one per replica, in GPU order
        evicted = command.action is CommandAction.EVICT
        for gpu_id in gpus:
            self.prints.ended(self.services[gpu_id], command.occurred_at, f"{'evicted' if evicted else 'stopped'}: {command.reason}")
            del self.services[gpu_id]
            self.latency_until.pop(gpu_id, None)
            self.online.pop(gpu_id, None)
        at = command.occurred_at
        state = ReportState.EVICTED if evicted else ReportState.STOPPED
        reports: list[Event] = [
            self._report(start, state, at, detail=command.reason).model_copy(
                update={"event_id": derived_id("report", command.event_id, state.value, str(start.event_id))}
            )
            for start in starts
        ]
        if command.gpu_ids:
            return reports  # one replica ended (a resize's stop), not the service: its state is unchanged
        return [*reports, self._lifecycle(command, JobState.EVICTED if evicted else JobState.STOPPED, at, command.reason)]

    # -- Salus lanes (issue 20) -------------------------------------------------------------------
    def _start_lane(self, command: ExecutorCommand, now: datetime, *, done: int = 0, report: bool = True) -> list[Event]:
        """A training job in the lane its grant names, beside the GPU's other lane jobs
        (`lane_gpu`); a grant the GPU cannot honour is refused with the reason."""
        assert command.workload is not None and command.lane is not None
        key, gpu_id, grant = (command.node_id, command.job_id), command.gpu_ids[0], command.lane
        if key in self.lane_starts or key in self.lane_finished:
            return []  # running or finished here: a re-delivered start changes nothing
        node = self.nodes.get(command.node_id)
        alone = next((w.job_id.split("/")[0] for w in (node.running.values() if node else ()) if gpu_id in w.gpu_ids), None)
        if alone is None and gpu_id in self.services:  # an online service's GPU, never a lane GPU
            alone = self.services[gpu_id].job_id
        if alone is not None:
            return [self._lane_refused(command, f"{gpu_id} runs {alone}, which is not a lane job: no lanes beside it")]
        gpu_type = self.gpu_types.get(gpu_id, self.default_gpu_type)
        solo = solo_profile(command.workload.model, command.workload.batch_size, gpu_type)
        gpu = self.lane_gpus.get(gpu_id)
        if gpu is None:
            kind = GPU_TYPES.get(gpu_type)
            gpu = self.lane_gpus[gpu_id] = LaneGpu(gpu_id, float(kind.memory_mib if kind else 16384), at=now)
        spec = LaneJobSpec(
            command.job_id, grant.lane_id, grant.lane_size_mib, grant.persistent_mib, grant.ephemeral_mib, grant.policy,
            iterations_total=command.workload.iterations, iterations_done=done,
            iteration_s=(command.solo_iteration_time_ms or solo.iteration_time_ms) / 1000.0,
            compute_share=min(1.0, max(0.05, solo.sm_activity / 100.0)),
        )  # fmt: skip
        started = gpu.start(spec, at=now)
        if not isinstance(started, LaneStarted):
            return [self._lane_refused(command, f"lane grant refused on {gpu_id}: {started.reason}")]
        self.lane_starts[key] = command
        if not report:
            return []  # re-adopted: `adopt` reports it
        self.prints.started(command, now)
        where = f"lane {started.lane_id} ({started.lane_size_mib:g} MiB, {started.step}) of {gpu_id}, policy {started.policy}"
        note = f"; {started.note}" if started.note else ""
        return [
            self._report(command, ReportState.ACCEPTED, now, total=command.workload.iterations,
                         detail=f"{where}: P {grant.persistent_mib:g} MiB, E {grant.ephemeral_mib:g} MiB{note}"),
            self._lifecycle(command, JobState.RUNNING, now, f"started on {command.node_id} in {where}"),
        ]

    def _lane_refused(self, command: ExecutorCommand, reason: str) -> ExecutorReport:
        """A lane start the GPU cannot run, at the command's event time: no GPU named (the others'
        lanes keep using it) and no lifecycle (the job is not this node's to judge)."""
        report = self._report(command, ReportState.REFUSED, command.occurred_at, detail=clip_reason(reason))
        return report.model_copy(update={"gpu_ids": (), "step": "lane_refused"})

    def _stop_lane(self, command: ExecutorCommand, now: datetime) -> list[Event]:
        """One lane job stopped or evicted: its lane session ends (lane reference, P and E
        released); its neighbours go on."""
        start = self.lane_starts.pop((command.node_id, command.job_id))
        gpu = self.lane_gpus[start.gpu_ids[0]]
        left = gpu.stop(command.job_id, at=now)
        at, evicted = command.occurred_at, command.action is CommandAction.EVICT
        self.prints.ended(start, at, f"{'evicted' if evicted else 'stopped'} at iteration {left.iterations_done if left else 0}: {command.reason}")
        state = ReportState.EVICTED if evicted else ReportState.STOPPED
        total = start.workload.iterations if start.workload else 0
        report = self._report(start, state, at, iterations=left.iterations_done if left else 0, total=total,
                              detail=command.reason)
        return [report.model_copy(update={"event_id": derived_id("report", command.event_id, state.value)}),
                self._lifecycle(command, JobState.EVICTED if evicted else JobState.STOPPED, at, command.reason)]

    def _advance_lanes(self, now: datetime) -> list[Event]:
        """Every lane GPU run to ``now``: each lane job's progress, completions at their own time."""
        out: list[Event] = []
        for gpu_id, gpu in sorted(self.lane_gpus.items()):
            for p in gpu.advance(now):
                out += self._lane_progress(gpu_id, gpu, p, now)
        return out

    def _lane_progress(self, gpu_id: str, gpu: LaneGpu, p: LaneProgress, now: datetime) -> list[Event]:
        command = next((c for (_, job), c in self.lane_starts.items() if job == p.job and c.gpu_ids[0] == gpu_id), None)
        if command is None:
            return []
        at = p.finished_at or now
        normalized = min(1.0, p.throughput_it_s * p.iteration_s)  # against its solo speed (the profile's)
        progress = Progress(p.job, str(command.event_id), p.iterations_done, p.iterations_total, p.throughput_it_s,
                            normalized, p.finished)
        state = ReportState.COMPLETED if p.finished else ReportState.RUNNING
        report = self._report(command, state, at, progress=progress, detail=f"lane {p.lane_id} of {gpu_id}, policy {gpu.policy}")
        if not p.finished:
            self.prints.progress(command, at, p.iterations_done, p.iterations_total, p.throughput_it_s)
            return [report]
        del self.lane_starts[(command.node_id, p.job)]
        self.lane_finished.add((command.node_id, p.job))
        done = f"{p.iterations_total} iterations done in lane {p.lane_id} of {gpu_id}"
        self.prints.ended(command, at, f"done: {done}")
        return [report, self._lifecycle(command, JobState.COMPLETED, at, done)]

    def _adjust(self, node: SimulatedNode, command: ExecutorCommand) -> list[Event]:
        """SLO protection's step: the running job's launch target and/or SM share (the interference
        model applies them from the next advance)."""
        key = (command.node_id, command.job_id)
        w = node.adjust(command.job_id, sm_share=command.sm_share, launch_target=command.launch_target)
        if w is None or key not in self.commands:
            return []  # not running here any more
        start = self.commands[key]
        detail = f"launch target {w.launch_target:g}, SM share {w.sm_share:g} %: {command.reason}"
        report = self._report(start, ReportState.RUNNING, command.occurred_at, iterations=int(w.iterations_done),
                              total=w.iterations_total, detail=detail[:2000])
        return [report.model_copy(update={"event_id": derived_id("report", command.event_id, "adjusted"), "sm_share": w.sm_share,
                                          "step": "adjusted"})]

    def latency(self, now: datetime) -> list[Event]:
        """Each online service's p99 over the window since its previous report, with its offline
        neighbour as it runs now (`simulated.online_latency`)."""
        out: list[Event] = []
        served = {g: (c.node_id, c.job_id) for g, c in self.services.items()}
        for gpu_id, (node_id, service) in sorted({**self.online, **served}.items()):
            start = self.latency_until.get(gpu_id)
            if start is None or now <= start:
                self.latency_until.setdefault(gpu_id, now)
                continue
            if (now - start).total_seconds() < self.latency_window_s:
                continue
            self.latency_until[gpu_id] = now
            online = self.online_sm.get(gpu_id, 0.0)
            node = self.nodes.get(node_id)
            neighbour = next((w for w in (node.running.values() if node else ()) if w.kind == "offline" and w.gpu_ids[0] == gpu_id), None)
            slowdown = 0.0
            if neighbour is not None and neighbour.solo is not None:
                slowdown = shared_execution(neighbour.solo, sm_share=neighbour.effective_share(online), online_sm_activity=online).online_slowdown
            spec = self.services[gpu_id].workload if gpu_id in self.services else None
            p99 = online_p99_ms(spec.model if spec else service, online, slowdown)
            slo = spec.slo_p99_ms if spec and spec.slo_p99_ms else slo_p99_ms(spec.model if spec else service)
            placed = self.commands.get((node_id, neighbour.job_id)) if neighbour is not None else None
            if gpu_id in self.services:
                self.prints.latency(self.services[gpu_id], now, p99, slo, (now - start).total_seconds())
            out.append(OnlineLatencyReport(
                event_id=derived_id("latency", gpu_id, now.isoformat()), occurred_at=now, source=self.agent(node_id),
                node_id=node_id, gpu_id=gpu_id, service=service, p50_ms=p99 / 2.0, p99_ms=p99, slo_p99_ms=slo,
                request_rate=spec.request_rate if spec else None,
                window_start=start, window_end=now, offline_job_id=neighbour.job_id if neighbour else None,
                sm_share=placed.sm_share if placed is not None else None,
                launch_target=neighbour.launch_target if neighbour else None,
            ))  # fmt: skip
        return out

    def advance(self, now: datetime) -> list[Event]:
        """Advance every workload to ``now``; report progress, completions and observations."""
        out: list[Event] = []
        for node_id, node in sorted(self.nodes.items()):
            # the share each offline job ran at (an SLO step may have cut it): what its observation records
            shares = {w.job_id: w.effective_share(self.online_sm.get(w.gpu_ids[0], 0.0)) for w in node.running.values() if w.kind == "offline"}
            for progress in node.advance(now, self.online_sm):
                key = (node_id, progress.job_id)
                command = self.commands[key]
                state = ReportState.COMPLETED if progress.finished else ReportState.RUNNING
                out.append(self._report(command, state, now, progress=progress))
                window_start = self.observed_until[key]
                if command.action is CommandAction.START_OFFLINE and now > window_start:
                    out.append(self._observation(command, progress, window_start, now, shares.get(progress.job_id)))
                    self.observed_until[key] = now
                if progress.finished:
                    self.prints.ended(command, now, f"done: {progress.iterations_total} iterations")
                    out.append(self._lifecycle(command, JobState.COMPLETED, now, f"{progress.iterations_total} iterations done"))
                    del self.commands[key], self.observed_until[key]
                else:
                    self.prints.progress(command, now, progress.iterations_done, progress.iterations_total, progress.throughput_it_s,
                                         progress.normalized_throughput)  # fmt: skip
        return out + self._advance_lanes(now) + self.latency(now)

    # -- records ----------------------------------------------------------------------------------
    def agent(self, node_id: str) -> str:
        """The source of a node's reports and observations: the fleet plays each node's agent,
        ``executor/<node>`` (`bus.authorization`: an executor reports for its own node only)."""
        return f"{self.source.partition('/')[0]}/{node_id}"

    def _observation(self, command: ExecutorCommand, progress: Progress, start: datetime, end: datetime,
                     share: float | None = None) -> SharingObservation:
        assert command.workload is not None and command.sm_share is not None
        share = command.sm_share if share is None else share
        gpu_id = command.gpu_ids[0]
        gpu_type = self.gpu_types.get(gpu_id, self.default_gpu_type)
        online = self.online_sm.get(gpu_id, 0.0)
        effect = shared_execution(
            solo_profile(command.workload.model, command.workload.batch_size, gpu_type),
            sm_share=share,
            online_sm_activity=online,
        )
        return SharingObservation(
            event_id=derived_id("observation", command.event_id, end.isoformat()),
            occurred_at=end,
            source=self.agent(command.node_id),
            gpu_id=gpu_id,
            node_id=command.node_id,
            gpu_type=gpu_type,
            offline_job_id=command.job_id,
            sm_share=share,
            normalized_throughput=progress.normalized_throughput,
            online_slowdown=effect.online_slowdown,
            window_start=start,
            window_end=end,
            gpu_metrics={
                "online_sm_activity": online,
                "sm_activity": effect.combined_sm_activity,
                "gpu_util": effect.combined_gpu_util,
            },
        )

    def _report(self, command: ExecutorCommand, state: ReportState, at: datetime, *, progress: Progress | None = None,
                iterations: int = 0, total: int = 0, detail: str = "") -> ExecutorReport:
        return ExecutorReport(
            event_id=derived_id("report", command.event_id, state.value, at.isoformat()),
            occurred_at=at,
            source=self.agent(command.node_id),
            node_id=command.node_id,
            job_id=command.job_id,
            command_id=str(command.event_id),
            state=state,
            gpu_ids=command.gpu_ids,
            iterations_done=progress.iterations_done if progress else iterations,
            iterations_total=progress.iterations_total if progress else total,
            throughput_it_s=progress.throughput_it_s if progress else 0.0,
            normalized_throughput=progress.normalized_throughput if progress else None,
            sm_share=command.sm_share,
            detail=detail,
        )

    def _lifecycle(self, command: ExecutorCommand, state: JobState, at: datetime, reason: str) -> JobLifecycleEvent:
        r = command.rendezvous  # a gang pod's names its run and rank, as the process agent's (`workload.lifecycle`)
        return JobLifecycleEvent(
            event_id=derived_id("lifecycle", command.event_id, state.value),
            occurred_at=at,
            source=self.source,
            job_id=command.job_id,
            state=state,
            reason=reason,
            node_id=command.node_id,
            gpu_ids=command.gpu_ids,
            inputs={"run": r.run, "rank": str(r.rank)} if r is not None else {},
        )
