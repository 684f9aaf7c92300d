"""The global manager's scheduler: the folded cluster view and one matching round per interval.

Paper: MuxFlow preprint §3 "Global manager" (the pending queue; scheduling decisions made
periodically), §5 "Matching-based scheduling" (Algorithm 1), §6 ("MuxFlow invokes the
scheduler periodically to schedule all offline workloads"; the execution interval is 15
minutes, journal §6). `Scheduler` is a pure state object: its fold methods take domain inputs
(the matcher's edge, `matching.matcher`, decodes events into them) and are the only way its
state changes; `on_readings` runs `round(at)` when an interval of *event time* has passed
since the last round, so a replay of the same inputs reproduces the same decisions.

One round (`round`): the view's candidates and jobs (`cluster_view.round_inputs`), the plan
(`plan.plan_matching`, or `plan.plan_fcfs` for the FCFS policy), then the decisions in
publication order: running jobs stopped without a new GPU, running jobs moved (stopped on
their old GPU first), placements, and the waiting explanations. A job is told why it waits
only when the reason's substance changes (`events.base.waiting_substance`: not when only its
numbers move, such as the plan's total or the best GPU's predicted throughput), so the log
grows with changes, not with rounds x queue length (issue 16 item 6). What a job was last told
is `told` (``""`` once it was placed or controlled: the next wait is news); for a job this
incarnation has not told, the waiting reason on the log counts (`heard`, folded from
``jobs.lifecycle``), so a restarted or standby matcher does not tell it again. Issue 28 item 6:
the substance is what the job waits for (a feasible job not chosen waits for its turn, whether
the round said "at its fair share" or "the matching gave its GPUs to others"), and a job told
once is told again no sooner than `events.base.RETELL_AFTER` of event time later (`told_at`,
from the log's waiting events after a restart), so reasons that alternate cannot flood the log.
Evictions follow health transitions (`eviction`), outside rounds. A GPU whose health record
says it is time-sliced (its MPS unavailable, issue 30 item 4) is left out of the rounds and its
offline job evicted, unless the policy allows time-sliced sharing (then its pairs are weighed
by the time-slicing model, `bipartite_graph`); jobs that wait are told which GPU and why. After an SLO-driven
eviction (`slo_cooldown`, folded from ``sharing.protection``) the GPU is left out of the rounds'
candidates while it cools down and the evicted job is kept off it for longer (a barred pair of
the plan); jobs that wait are told so. A job running on a cooling GPU is left alone there.

A decision made here is folded in at once (a placed job is running, a stopped one is not);
the recorded `Placement` events folded back later (`on_placement`) agree with it, and are
how a standby or restarted instance rebuilds the same view.

Limits (issue 29, `jobs.limits`): an offline job's ``queue_timeout_s`` (not placed since its
submission) and ``max_runtime_s`` (since its first placement) are checked on live telemetry at
its event time, at most once per second of it, as the expiry is (`time_out`): the job leaves the
queue, is stopped if it runs, and ends ``timed_out``. A failed run (the executor's ``failed``
report of the job's run) sends it back to the queue, told so, until its ``max_restarts``; one
more ends it ``failed`` (`on_report`). Failures are counted from the reports (each once), so a
replay or a standby counts the same; only the live, active instance publishes the steps.

Worked example: interval 5 s; samples of one Healthy GPU at t = 0, 2, 4, 6 s with SM activity
30, 40, 50, 40 and one profiled job: the sample at t = 6 s ends the interval (next round due
at 0 + 5 s), the round sees activity 40, and the job is placed with share 60 %.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Literal

from hivemux.events import ReportState, derived_id
from hivemux.events.base import retell
from hivemux.jobs.limits import Limits
from hivemux.prediction.features import SpeedModel

from .bipartite_graph import OnlineGpu
from .cluster_view import ClusterView, GpuReading, JobControlled, OfflineSubmission, PlacementRecord, RunReport, SoloProfile
from .decisions import Decisions, JobStep, OfflineStart, PlacementChange, Waiting
from .efficiency import EfficiencyReport
from .eviction import HealthChange, evictions, time_sliced_reason
from .expiry import ReportClock
from .plan import PendingJob, PlannedPlacement, plan_fcfs, plan_matching
from .policy import MatchingPolicy
from .slo_cooldown import Closures, SloCooldown, SloEviction

Placement = Literal["matching", "fcfs"]
FINAL_REPORTS = frozenset({ReportState.COMPLETED, ReportState.FAILED, ReportState.STOPPED, ReportState.EVICTED, ReportState.REFUSED})
_EXPIRY_STEP = timedelta(seconds=1)


class Scheduler:
    def __init__(self, policy: MatchingPolicy, *, interval: timedelta, placement: Placement = "matching") -> None:
        self.policy = policy
        self.placement = placement
        self.interval = interval
        self.view = ClusterView()
        self.models: dict[str, SpeedModel] = {}  # per GPU type: the newest version
        self.rounds = 0
        self.next_round_at: datetime | None = None
        self.told: dict[str, str] = {}  # job id -> the last "why not placed" published ("": none since placed or controlled)
        self.told_on_log: dict[str, str] = {}  # job id -> its latest waiting reason on the log (`heard`)
        self.told_at: dict[str, datetime] = {}  # job id -> the event time it was last told why it waits (this incarnation's or the log's)
        self.reports = ReportClock()  # when each placement's executor last reported (`expiry`)
        self.cooldown = SloCooldown(policy.slo_cooldown)  # GPUs and pairs closed after SLO evictions
        self._expiry_due: datetime | None = None
        self.limits = Limits()  # offline jobs' queue_timeout_s and max_runtime_s (`time_out`)
        self.failures: dict[str, set[str]] = {}  # job id -> its failed runs' report ids (`on_report`)
        self.max_restarts: dict[str, int] = {}  # job id -> its max_restarts, while it is not finished

    # -- folds ----------------------------------------------------------------------------
    def on_submission(self, job: OfflineSubmission) -> None:
        self.view.submit(job)
        if job.job_id in self.view.finished:
            return
        self.max_restarts.setdefault(job.job_id, job.max_restarts)
        if job.at is not None:
            self.limits.submit(job.job_id, job.at, queue_timeout_s=job.queue_timeout_s, max_runtime_s=job.max_runtime_s)

    def on_profile(self, profile: SoloProfile) -> None:
        self.view.profiled(profile)

    def on_model(self, gpu_type: str, version: int, load: Callable[[], SpeedModel | None]) -> None:
        """The newest version per GPU type wins, analytic or MLP (the predictor publishes a new
        version only when its held-out error is not worse); ``load`` runs only for a newer one."""
        known = self.models.get(gpu_type)
        if known is not None and version <= known.version:
            return
        model = load()
        if model is not None:
            self.models[gpu_type] = model

    def on_placement(self, placement: PlacementRecord) -> None:
        self.view.record(placement)
        if placement.action == "place" and placement.at is not None:
            self.limits.start(placement.job_id, placement.at)

    def on_report(self, report: RunReport, *, live: bool = False) -> Decisions:
        """Fold an executor's report. A failed run of a job (each report once) sends it back to
        the queue until its ``max_restarts``; one more, and it is finished (module docstring)."""
        self.reports.reported(report.command_id, report.at, final=report.state in FINAL_REPORTS)
        job_id = report.job_id
        if report.state is not ReportState.FAILED or job_id not in self.view.submissions:
            self.view.report(report)
            if job_id in self.view.finished:
                self._finished(job_id)
            return Decisions()
        if not self.view.ends_current_run(report):
            self.view.report(report, retried=True)  # an earlier run's failure: the job runs on elsewhere
            return Decisions()
        failed = self.failures.setdefault(job_id, set())
        if report.report_id and report.report_id in failed:
            return Decisions()  # a redelivered report
        failed.add(report.report_id or f"{report.command_id}/{report.at.isoformat()}")
        count, most = len(failed), self.max_restarts.get(job_id, 0)
        retried = count <= most
        self.view.report(report, retried=retried)
        where = f"its run on {report.node_id} {','.join(report.gpu_ids)} failed ({report.detail or 'no detail'})"
        decision = derived_id("failed-run", report.report_id or report.command_id, report.at.isoformat())
        inputs = {"restarts": str(count), "max_restarts": str(most), "command_id": report.command_id}
        if retried:
            self.told[job_id] = ""  # its next wait is news
            step = JobStep(decision, report.at, job_id, "waiting", f"{where}: back in the queue for the next round (restart {count} of {most})", inputs)
        else:
            self._finished(job_id)
            step = JobStep(decision, report.at, job_id, "failed", f"{where}: {count} failed runs, more than max_restarts {most}", inputs)
        return Decisions((step,)) if live else Decisions()

    def _finished(self, job_id: str) -> None:
        self.limits.ended(job_id)
        self.failures.pop(job_id, None)
        self.max_restarts.pop(job_id, None)

    def on_control(self, command: JobControlled, *, live: bool) -> Decisions:
        """A user's cancel or suspend takes the job off the queue and, when live and it runs,
        off its GPU (a ``stop`` without a lifecycle step: the command's is it); resume puts
        it back at the end of the queue for the next round."""
        stop = None
        if command.action != "resume" and command.job_id in self.view.running and live:
            stop = self._stop(command.job_id, command.reason, command.at, moved_to=None, cause=str(command.event_id))
        elif command.action != "resume":
            self.view.running.pop(command.job_id, None)
        self.view.control(command)
        if command.action == "cancel":
            self._finished(command.job_id)
        self.told[command.job_id] = ""
        return Decisions((stop,)) if stop is not None else Decisions()

    def heard(self, job_id: str, waiting_reason: str | None, at: datetime | None = None) -> None:
        """The job's latest lifecycle step on the log: a waiting reason the matcher published
        at event time `at`, or any other step (None)."""
        if waiting_reason is None:
            self.told_on_log.pop(job_id, None)
        else:
            self.told_on_log[job_id] = waiting_reason
            if at is not None and (job_id not in self.told_at or at > self.told_at[job_id]):
                self.told_at[job_id] = at

    def on_health(self, change: HealthChange, *, live: bool) -> Decisions:
        self.view.health[change.gpu_id] = change.state
        if change.sharing_mode == "time_sliced":
            self.view.time_sliced[change.gpu_id] = change.mps_detail
        else:
            self.view.time_sliced.pop(change.gpu_id, None)
        if not live:
            return Decisions()
        evicted = evictions(list(self.view.running.values()), change, time_sliced_sharing=self.policy.time_sliced_sharing)
        for eviction in evicted:
            self.view.running.pop(eviction.job_id, None)
        return Decisions(evicted)

    def on_slo_eviction(self, eviction: SloEviction) -> None:
        """SLO protection evicted ``eviction.job_id`` from its GPU: the GPU cools down and the job
        is kept off it (`slo_cooldown`); the job no longer runs there (live and in a replay alike:
        the eviction is on the log, the matcher publishes nothing for it)."""
        self.cooldown.on_eviction(eviction)
        placed = self.view.running.get(eviction.job_id)
        if placed is not None and placed.gpu_id == eviction.gpu_id and (placed.at is None or placed.at <= eviction.at):
            self.view.running.pop(eviction.job_id)

    def on_readings(self, readings: Iterable[GpuReading], *, live: bool) -> Decisions:
        """Fold samples; a live sample at or past the due time ends the interval: a round."""
        out = Decisions()
        observe = self.view.observe
        for reading in readings:
            observe(reading)
            at = reading[3]  # GpuReading.at (rows may be plain tuples in its field order)
            if self.next_round_at is None:
                self.next_round_at = at + self.interval
            if not live:
                continue
            if self._expiry_due is None or at >= self._expiry_due:
                out += self.expire(at) + self.time_out(at)
            if at < self.next_round_at:
                continue
            self.next_round_at = at + self.interval
            out += self.round(at)
        return out

    def efficiency(self) -> EfficiencyReport:
        return self.view.efficiency()

    def expire(self, now: datetime) -> Decisions:
        """Evict the placements whose executor has been silent longer than the policy's bound at
        event time ``now`` (`expiry`); checked on live telemetry, at most once per second of it."""
        self._expiry_due = now + _EXPIRY_STEP
        if self.policy.executor_silence_s is None:
            return Decisions()
        expired = self.reports.expired(self.view.running.values(), now, timedelta(seconds=self.policy.executor_silence_s))
        for eviction in expired:
            self.view.running.pop(eviction.job_id, None)
            self.view.issue(eviction.job_id, eviction.decision_id)  # its old run's reports free nothing
        if len(self.reports.heard) > 2 * len(self.view.running) + 1000:
            self.reports.forget_except(self.view.running)
        return Decisions(expired)

    def time_out(self, now: datetime) -> Decisions:
        """The offline jobs over their queue_timeout_s or max_runtime_s at event time ``now``
        (`jobs.limits`): each leaves the queue, is stopped if it runs (gracefully: the executor's
        stop), and ends ``timed_out``."""
        changes: list[PlacementChange | Waiting | JobStep] = []
        for t in self.limits.due(now):
            decision = derived_id("timed_out", t.job_id, now.isoformat())
            if t.job_id in self.view.running:
                changes.append(self._stop(t.job_id, t.reason, now, moved_to=None, cause=str(decision)))
            self.view.control(JobControlled(decision, t.job_id, "cancel", now, t.reason))
            self._finished(t.job_id)
            self.told[t.job_id] = ""
            changes.append(JobStep(decision, now, t.job_id, "timed_out", t.reason, t.inputs))
        return Decisions(tuple(changes))

    # -- one round ------------------------------------------------------------------------
    def round(self, at: datetime) -> Decisions:
        """One scheduling round at event time `at`; the interval's windows start afresh."""
        self.rounds += 1
        closed = self.cooldown.closures(at)
        candidates, jobs = self.view.round_inputs()
        self.view.next_interval()
        cooling = sorted(g.gpu_id for g in candidates if g.gpu_id in closed.gpus)
        if cooling:  # closed to offline placement; a job running there is left alone (not in the round)
            candidates, jobs = self._without(cooling, candidates, jobs)
        sliced = [] if self.policy.time_sliced_sharing else sorted(g.gpu_id for g in candidates if g.time_sliced)
        if sliced:  # no MPS and time-sliced sharing not allowed (issue 30 item 4): closed to offline work
            candidates, jobs = self._without(sliced, candidates, jobs)
        if not jobs or (not candidates and not cooling and not sliced):
            return Decisions()
        note = "; ".join(n for n in (_cooling_note(cooling, closed), self._sliced_note(sliced)) if n)
        if not candidates:
            why = f"no online GPU can take an offline job this round: {note}"
            return Decisions(tuple(Waiting(derived_id("waiting", j.job_id, at.isoformat()), at, j.job_id, why)
                                   for j in jobs if self._news(j.job_id, why, at)))  # fmt: skip
        plan = (plan_matching if self.placement == "matching" else plan_fcfs)(candidates, jobs, self.models, self.policy, closed.pairs or None)
        gpus = {g.gpu_id: g for g in candidates}
        changes: list[PlacementChange | Waiting] = [self._stop(s.job_id, s.reason, at, moved_to=None) for s in plan.stopped]
        changes += [self._stop(p.job_id, p.reason, at, moved_to=p.gpu_id) for p in plan.placements if p.moved_from is not None]
        changes += [self._place(p, gpus[p.gpu_id], at) for p in plan.placements]
        for refusal in plan.not_placed:
            reason = f"{refusal.reason}; {note}" if note else refusal.reason
            if self._news(refusal.job_id, reason, at):  # say it again only when its substance changes
                changes.append(Waiting(derived_id("waiting", refusal.job_id, at.isoformat()), at, refusal.job_id, reason))
        return Decisions(tuple(changes), plan.total_weight)

    @staticmethod
    def _without(cooling: list[str], candidates: list[OnlineGpu], jobs: list[PendingJob]) -> tuple[list[OnlineGpu], list[PendingJob]]:
        """The round without the cooling GPUs, and without the jobs running on them (left alone)."""
        closed = set(cooling)
        return [g for g in candidates if g.gpu_id not in closed], [j for j in jobs if j.running_on not in closed]

    def _sliced_note(self, sliced: list[str]) -> str:
        """What a waiting job is told about the GPUs without MPS ("" for none)."""
        if not sliced:
            return ""
        return f"{len(sliced)} GPU(s) closed to offline work: e.g. {sliced[0]} {time_sliced_reason(self.view.time_sliced.get(sliced[0], ''))}"

    def _news(self, job_id: str, reason: str, at: datetime) -> bool:
        """Whether to tell the job `reason` now (`events.base.retell`, the rule both deciders
        share): its substance differs from what it was last told, and if it was told anything
        since it last waited anew, at least `RETELL_AFTER` of event time has passed since. A
        change held back is told on a later round if it still stands then."""
        last = self.told[job_id] if job_id in self.told else self.told_on_log.get(job_id, "")
        verdict = retell(last, reason, last_at=self.told_at.get(job_id), at=at)
        self.told[job_id] = verdict.told
        if verdict.tell:
            self.told_at[job_id] = at
        return verdict.tell

    def _stop(self, job_id: str, reason: str, at: datetime, *, moved_to: str | None, cause: str | None = None) -> PlacementChange:
        """Take a running job off its GPU: to move it (hysteresis passed) or to give the GPU
        to jobs worth more than its restart cost (then it waits again)."""
        placed = self.view.running.pop(job_id)
        return PlacementChange(
            action="stop",
            decision_id=derived_id("stop", placed.decision_id, cause or at.isoformat()),
            at=at,
            job_id=job_id,
            gpu_id=placed.gpu_id,
            node_id=placed.node_id,
            sm_share=placed.sm_share,
            policy=self.placement,
            reason=reason,
            inputs={"round": self.rounds, "moved_to": moved_to, "restart_cost": self.policy.restart_cost}
            if cause is None
            else {"command": cause},
            waits=moved_to is None and cause is None,
            lifecycle=cause is None,
        )

    def _place(self, planned: PlannedPlacement, gpu: OnlineGpu, at: datetime) -> PlacementChange:
        _, submission = self.view.submissions[planned.job_id]
        model = self.models.get(gpu.gpu_type)
        decision = derived_id("place", planned.job_id, planned.gpu_id, at.isoformat())
        self.view.issue(planned.job_id, decision)
        self.told[planned.job_id] = ""  # placed: a later wait is news
        self.limits.start(planned.job_id, at)
        self.view.running[planned.job_id] = PlacementRecord(
            decision, "place", planned.job_id, planned.gpu_id, planned.node_id, planned.sm_share, self.placement, at
        )
        return PlacementChange(
            action="place",
            decision_id=decision,
            at=at,
            job_id=planned.job_id,
            gpu_id=planned.gpu_id,
            node_id=planned.node_id,
            sm_share=planned.sm_share,
            policy=self.placement,
            reason=planned.reason,
            inputs={**planned.inputs, "online_workload": gpu.online_workload, "round": self.rounds, "moved_from": planned.moved_from},
            start=OfflineStart(
                predicted_normalized_throughput=planned.predicted_normalized_throughput,
                predicted_online_slowdown=planned.predicted_online_slowdown,
                model_version=model.version if model else None,
                memory_quota_mib=self.policy.memory_quota_mib(gpu.memory_total_mib),
                workload=submission.workload,
                solo_iteration_time_ms=self.view.profiles[planned.job_id].iteration_time_ms,
            ),
        )


def _cooling_note(cooling: list[str], closed: Closures) -> str:
    """What a waiting job is told about the GPUs cooling down after an SLO eviction ("" for none)."""
    if not cooling:
        return ""
    return f"{len(cooling)} GPU(s) closed to offline work after an SLO eviction (e.g. {closed.gpus[cooling[0]]})"
