"""The health processor's core (MuxFlow preprint §4.1 "GPU level" and §4.2; journal §4.1, §5,
§8): GPU observations, node observations, workload reports and operator drains in; SysMonitor
transitions, evictions, node pressure, findings with their remedies and SysMonitor states out,
all domain values (`observations`, `decisions`). The edge (`health.edge`) converts records to
those inputs and the decisions to event models.

Pure and deterministic (no clock, no bus, no event models): the service shell and
`hivemux health replay` both drive it through the edge. One SysMonitor per GPU, mutable inside
for speed (the state machine is the hot path: `benchmarks/health.py`); a call returns the
decisions to publish and never mutates what it is given.

Silence, in event time. ``watermark`` is the latest event time among the records consumed
(every input's record time and the clock ticks on the bus, `events/clock.py`; the changelog
fold does not count), and only moves forward. The ticks keep it moving when every input of
an instance falls silent (an ingester down), so that silence is still seen. The
staleness sweep judges silence against it, so replaying the topics gives the same Disabled
transitions whatever the wall clock says; a periodic tick only decides when the sweep runs.

Ownership. Telemetry is keyed by node; the instance that receives a node's samples owns its
GPUs. `assign` tells the core which telemetry partitions it owns now, so the staleness sweep
only disables GPUs this instance is responsible for, and gives a newly taken-over partition a
full ``stale_after_s`` of event time from the watermark at takeover (or from the first record
consumed, if none was yet) before judging silence. Every instance folds the `health.state`
changelog of all GPUs, so when it takes a partition over it already holds those GPUs' full
SysMonitor state (back-off history included).
"""

from __future__ import annotations

from collections.abc import Iterable

from hivemux.events.base import clip_reason

from .config import HealthConfig
from .decisions import Eviction, GpuVerdict, NodeVerdict, Remedy, SysMonitorState
from .error_patterns import Finding, ProgressLog, report_findings, sample_findings
from .node_pressure import NodeMonitor
from .observations import Drain, GpuObservation, NodeObservation, WorkloadReport
from .sysmonitor import DISABLED, INIT, HealthState, SysMonitor

UNKNOWN_TYPE = "unknown"
MPS_JOB_PREFIX = "mps:"  # an executor report of job ``mps:<gpu_id>`` is about the GPU's MPS, not a workload
_NEVER = float("-inf")


class HealthProcessorCore:
    def __init__(self, config: HealthConfig) -> None:
        self.config = config
        self.monitors: dict[str, SysMonitor] = {}
        self.partition_of: dict[str, int] = {}  # gpu -> telemetry partition it arrives on
        self.nodes: dict[str, NodeMonitor] = {}
        self.progress = ProgressLog()
        self.owned: set[int] | None = None  # None: every partition (a single instance, replay)
        self.assigned_at: dict[int, float] = {}
        self.watermark = _NEVER  # latest event time consumed (see the module docstring)
        self._grace_pending: set[int] = set()  # assigned before any record: grace from the first
        self._high_util_pct = config.detector.high_util_pct  # read for every sample

    # -- event time and ownership ------------------------------------------------------------
    def _advance(self, at: float) -> None:
        if at > self.watermark:
            self.watermark = at
            if self._grace_pending:
                for p in self._grace_pending:
                    self.assigned_at[p] = at
                self._grace_pending.clear()

    def advance(self, at: float) -> None:
        """Time passed without a record of ours (a clock tick on the bus): the watermark moves
        forward to `at`, never back."""
        self._advance(at)

    def assign(self, partitions: Iterable[int] | None) -> None:
        if partitions is None:
            self.owned = None
            return
        owned = set(partitions)
        for p in owned - (self.owned or set()):
            if self.watermark == _NEVER:
                self._grace_pending.add(p)
            else:
                self.assigned_at[p] = self.watermark
        self._grace_pending &= owned
        self.owned = owned

    def _owns(self, gpu_id: str) -> bool:
        if self.owned is None:
            return True
        return self.partition_of.get(gpu_id) in self.owned

    # -- inputs ---------------------------------------------------------------------------
    def observe(self, rows: Iterable[GpuObservation], partition: int, record_at: float) -> list[GpuVerdict]:
        """A record of GPU samples (each row at its own instant ``at``) consumed at event time
        ``record_at``. Returns a verdict per GPU whose state changed materially (few: almost
        every sample leaves its GPU as it was)."""
        if record_at > self.watermark:
            self._advance(record_at)
        out: list[GpuVerdict] = []
        monitors, partition_of, config, high_util_pct = self.monitors, self.partition_of, self.config, self._high_util_pct
        # The hot path (>= 50,000 samples/s end to end, `benchmarks/health.py`): one pass per
        # sample, inline, with no call on the steady path but the state machine's. Rows are
        # read by position only: the edge's batch rows are plain tuples in the row's order.
        for row in rows:
            (gpu_id, node_id, gpu_type, at, gpu_util, sm_activity, sm_clock_mhz, max_sm_clock_mhz, memory_used_mib,
             memory_total_mib, temperature_c, power_w, xid_errors, last_xid, ecc_sbe, ecc_dbe, online_workload,
             offline_workloads) = row  # fmt: skip
            monitor = monitors.get(gpu_id)
            if monitor is None:
                monitor = monitors[gpu_id] = SysMonitor(gpu_id, node_id, gpu_type)
            elif monitor.gpu_type != gpu_type:
                monitor.gpu_type = gpu_type  # a drained GPU first seen through a control
            partition_of[gpu_id] = partition
            if at <= monitor.as_of:
                continue  # replayed or out of order: the state already reflects it
            material = False
            if offline_workloads != monitor.offline_workloads or online_workload != monitor.online_workload:
                monitor.offline_workloads = offline_workloads
                monitor.online_workload = online_workload
                for job in offline_workloads:
                    self.progress.seen(job, at)
                material = True
            below_since, high_since = monitor.below_overlimit_since, monitor.high_util_since
            # The judged values (`sysmonitor.values_of`), spelt out: this runs for every sample.
            values = (gpu_util, sm_activity, sm_clock_mhz / max_sm_clock_mhz, 100.0 * memory_used_mib / memory_total_mib,
                      temperature_c, power_w)  # fmt: skip
            transitions = monitor.observe(values, at, config)  # type: ignore[arg-type]
            findings = None
            if (
                xid_errors != monitor.xid_errors
                or ecc_dbe != monitor.ecc_dbe
                or ecc_sbe != monitor.ecc_sbe
                or gpu_util >= high_util_pct
                or monitor.high_util_since is not None
            ):
                counters = (monitor.xid_errors, monitor.ecc_sbe, monitor.ecc_dbe)
                findings = sample_findings(
                    monitor, at, gpu_util, xid_errors, last_xid, ecc_sbe, ecc_dbe, self.progress, config.detector,
                )  # fmt: skip
                material = material or counters != (monitor.xid_errors, monitor.ecc_sbe, monitor.ecc_dbe)
            if (
                transitions
                or findings
                or material
                or below_since != monitor.below_overlimit_since
                or high_since != monitor.high_util_since
            ):
                remedies = tuple([self._remedy(monitor, finding, at) for finding in findings]) if findings else ()
                out.append(GpuVerdict(at, tuple(transitions) if transitions else (), remedies, self._record(monitor)))
        return out

    def on_node(self, node: NodeObservation) -> NodeVerdict | None:
        self._advance(node.at)
        monitor = self.nodes.get(node.node_id)
        if monitor is None:
            monitor = self.nodes[node.node_id] = NodeMonitor(node.node_id)
        change = monitor.observe(
            node.at,
            node.cpu_util,
            100.0 * node.memory_used_mib / node.memory_total_mib,
            node.kswapd_active,
            node.offline_workloads,
            self.config.node,
        )
        if change is None:
            return None
        reason = f"node {node.node_id} under CPU/memory pressure: {change.reason}"
        evictions = tuple(Eviction(node.node_id, job, self._gpus_of(job, node.node_id), reason) for job in change.evicted)
        return NodeVerdict(change, evictions)

    def on_report(self, report: WorkloadReport) -> list[GpuVerdict]:
        at = report.at
        self._advance(at)
        if report.finished:
            self.progress.forget(report.job_id)
        else:
            self.progress.record(report.job_id, report.iterations_done, at)
        if report.mps_server is None and report.cuda_error is None:
            return []
        if report.job_id.startswith(MPS_JOB_PREFIX):  # the node on one GPU's MPS (issue 30 item 4)
            return self._mps(report)
        # A report that names no GPU of a job we never saw on one is judged at node level.
        gpu_ids = report.gpu_ids or self._gpus_of(report.job_id, report.node_id) or (report.node_id,)
        out: list[GpuVerdict] = []
        for finding in report_findings(gpu_ids, report.job_id, report.mps_server, report.cuda_error, report.detail):
            monitor = self._monitor(finding.gpu_id, report.node_id)
            remedy = self._remedy(monitor, finding, at)
            out.append(GpuVerdict(at, (), (remedy,), self._record(monitor)))
        return out

    def _mps(self, report: WorkloadReport) -> list[GpuVerdict]:
        """A GPU's MPS availability as its node reports it (``mps:<gpu_id>``, `MPS_JOB_PREFIX`):
        unavailable makes the GPU time-sliced, running makes it space-shared again."""
        if report.mps_server not in ("unavailable", "running"):
            return []
        out: list[GpuVerdict] = []
        for gpu_id in report.gpu_ids or (report.job_id.removeprefix(MPS_JOB_PREFIX),):
            monitor = self._monitor(gpu_id, report.node_id)
            transition = monitor.mps(report.at, report.mps_server == "running", report.detail or "reported by the node")
            if transition is not None:
                out.append(GpuVerdict(report.at, (transition,), (), self._record(monitor)))
        return out

    def on_drain(self, drain: Drain) -> GpuVerdict:
        at = drain.at
        self._advance(at)
        monitor = self._monitor(drain.gpu_id, drain.node_id)
        if drain.action == "drain":
            transition = monitor.disable(at, "drained", f"drained by an operator: {drain.reason}".rstrip(": "))
        else:
            transition = monitor.undrain(at, f"undrained by an operator: {drain.reason}".rstrip(": "))
        return GpuVerdict(at, (transition,) if transition else (), (), self._record(monitor))

    def is_newer(self, gpu_id: str, as_of: float, revision: int) -> bool:
        """Whether a state record of the GPU is newer than ours (most folded records are not:
        every instance folds its own changelog too)."""
        known = self.monitors.get(gpu_id)
        return known is None or (as_of, revision) > (known.as_of, known.revision)

    def on_state(self, state: SysMonitorState) -> None:
        """Fold the changelog: adopt a GPU's state when it is newer than ours (another
        instance owned it, or we restart). Not a consumed input: the watermark stays."""
        if not self.is_newer(state.gpu_id, state.as_of, state.revision):
            return
        self.monitors[state.gpu_id] = SysMonitor(
            gpu_id=state.gpu_id,
            node_id=state.node_id,
            gpu_type=state.gpu_type,
            state=state.state,
            as_of=state.as_of,
            overlimit_entries=list(state.overlimit_entries),
            backoff_s=state.backoff_s,
            below_overlimit_since=state.below_overlimit_since,
            disabled_cause=state.disabled_cause,
            online_workload=state.online_workload,
            offline_workloads=state.offline_workloads,
            xid_errors=state.xid_errors,
            ecc_sbe=state.ecc_sbe,
            ecc_dbe=state.ecc_dbe,
            high_util_since=state.high_util_since,
            revision=state.revision,
            sharing_mode=state.sharing_mode,
            mps_detail=state.mps_detail,
        )
        if state.partition is not None:
            self.partition_of[state.gpu_id] = state.partition

    def sweep(self) -> list[GpuVerdict]:
        """Disable owned GPUs that stopped reporting: no sample for ``stale_after_s`` of event
        time before the watermark. Nothing consumed yet: no time to judge by."""
        now = self.watermark
        if now == _NEVER:
            return []
        stale_after = self.config.stale_after_s
        out: list[GpuVerdict] = []
        for gpu_id, monitor in self.monitors.items():
            if monitor.state is DISABLED or now - monitor.as_of < stale_after or not self._owns(gpu_id):
                continue
            partition = self.partition_of.get(gpu_id)
            if partition is not None and now - self.assigned_at.get(partition, _NEVER) < stale_after:
                continue  # just taken over: let the stream reach us first
            silent = now - monitor.as_of
            transition = monitor.disable(now, "stale", f"no sample for {silent:.0f} s (limit {stale_after:.0f} s)")
            if transition is not None:
                out.append(GpuVerdict(now, (transition,), (), self._record(monitor)))
        return out

    def state_of(self, gpu_id: str) -> HealthState:
        monitor = self.monitors.get(gpu_id)
        return INIT if monitor is None else monitor.state

    # -- decisions ------------------------------------------------------------------------
    def _monitor(self, gpu_id: str, node_id: str) -> SysMonitor:
        monitor = self.monitors.get(gpu_id)
        if monitor is None:
            monitor = self.monitors[gpu_id] = SysMonitor(gpu_id, node_id, UNKNOWN_TYPE)
        return monitor

    def _gpus_of(self, job_id: str, node_id: str) -> tuple[str, ...]:
        return tuple(gpu for gpu, m in self.monitors.items() if m.node_id == node_id and job_id in m.offline_workloads)

    def _remedy(self, monitor: SysMonitor, finding: Finding, at: float) -> Remedy:
        """Apply the rule of a matched error pattern (mixed error handling, journal §5)."""
        rule = self.config.rules[finding.kind]
        if rule == "drain":
            reason = clip_reason(f"{finding.kind}: {finding.detail}")
            return Remedy(finding, rule, drained=monitor.disable(at, "fault", f"drained after {reason}"))
        if rule == "reset_and_restart":
            return Remedy(finding, rule, reset=(finding.job_id,) if finding.job_id else monitor.offline_workloads)
        return Remedy(finding, rule)

    def _record(self, monitor: SysMonitor) -> SysMonitorState:
        """The GPU's whole state after a material change, for the changelog."""
        monitor.revision += 1
        return SysMonitorState(
            gpu_id=monitor.gpu_id,
            node_id=monitor.node_id,
            gpu_type=monitor.gpu_type,
            state=monitor.state,
            as_of=monitor.as_of,
            revision=monitor.revision,
            partition=self.partition_of.get(monitor.gpu_id),
            overlimit_entries=tuple(monitor.overlimit_entries),
            backoff_s=monitor.backoff_s,
            below_overlimit_since=monitor.below_overlimit_since,
            disabled_cause=monitor.disabled_cause,
            high_util_since=monitor.high_util_since,
            xid_errors=monitor.xid_errors,
            ecc_sbe=monitor.ecc_sbe,
            ecc_dbe=monitor.ecc_dbe,
            online_workload=monitor.online_workload,
            offline_workloads=monitor.offline_workloads,
            sharing_mode=monitor.sharing_mode,
            mps_detail=monitor.mps_detail,
        )

