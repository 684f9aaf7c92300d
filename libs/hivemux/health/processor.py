"""The health processor's core: telemetry, reports and operator controls in; SysMonitor
transitions, evictions, node pressure, faults with remediations and state snapshots out.

Pure and deterministic (no clock, no bus): the service shell and `hivemux health replay` both
drive it. Event ids are derived from the input's id, so a replay emits the same ids.

Ownership. Telemetry is keyed by node; the instance that receives a node's samples owns its
GPUs. `assign` tells the core which telemetry partitions it owns now, so the staleness sweep
only disables GPUs this instance is responsible for (and gives a newly taken-over partition a
full ``stale_after_s`` before judging silence). Every instance folds the `health.state`
changelog of all GPUs, so when it takes a partition over it already holds those GPUs' full
SysMonitor state (back-off history included).
"""

from __future__ import annotations
from hivemux.events.base import clip_reason

import functools
from collections.abc import Iterable
from datetime import UTC, datetime
from itertools import repeat

from hivemux.events import (
    CommandAction,
    DeviceControl,
    Event,
    ExecutorCommand,
    ExecutorReport,
    Fault,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    HealthState,
    HealthTransition,
    NodePressure,
    NodeTelemetry,
    ReportState,
    SysMonitorSnapshot,
    derived_id,
)

from .config import HealthConfig
from .error_patterns import Finding, ProgressLog, report_findings, sample_findings
from .node_pressure import NodeMonitor
from .sysmonitor import SysMonitor, Transition, values_of

_FINISHED = {ReportState.COMPLETED, ReportState.FAILED, ReportState.STOPPED, ReportState.EVICTED, ReportState.REFUSED}
UNKNOWN_TYPE = "unknown"


def _dt(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


@functools.cache
def _fillers(n: int) -> tuple[tuple[None, ...], tuple[int, ...], tuple[tuple[()], ...]]:
    """Per batch size: the columns a batch leaves out, spelt out (None, zero counters, no workloads)."""
    return (None,) * n, (0,) * n, ((),) * n


def _memory_usage(used: float, total: float) -> float:
    return 100.0 * used / total


class HealthProcessorCore:
    def __init__(self, config: HealthConfig, source: str) -> None:
        self.config = config
        self.source = source
        self.monitors: dict[str, SysMonitor] = {}
        self.partition_of: dict[str, int] = {}  # gpu -> telemetry partition it arrives on
        self.nodes: dict[str, NodeMonitor] = {}
        self.progress = ProgressLog()
        self.owned: set[int] | None = None  # None: every partition (a single instance, replay)
        self.assigned_at: dict[int, float] = {}
        # (nodes, node_gpus, gpus) -> (GPU ids, their nodes): a fleet's batches repeat a few shapes
        self._gpu_ids: dict[tuple[object, object, object], tuple[tuple[str, ...], tuple[str, ...]]] = {}

    # -- ownership ------------------------------------------------------------------------
    def assign(self, partitions: Iterable[int] | None, at: float) -> None:
        if partitions is None:
            self.owned = None
            return
        owned = set(partitions)
        for p in owned - (self.owned or set()):
            self.assigned_at[p] = at
        self.owned = owned

    def _owns(self, gpu_id: str) -> bool:
        if self.owned is None:
            return True
        return self.partition_of.get(gpu_id) in self.owned

    # -- inputs ---------------------------------------------------------------------------
    def on_batch(self, batch: GpuTelemetryBatch, partition: int = 0) -> list[Event]:
        """A node's samples, read straight off the batch's columns (no per-sample objects)."""
        out: list[Event] = []
        n = len(batch.gpu_util)
        nones, zeros, empty = _fillers(n)
        origin = batch.event_id
        key = (batch.nodes or batch.node_id, batch.node_gpus, batch.gpus or n)
        named = self._gpu_ids.get(key)
        if named is None:  # a node's GPUs change rarely: name them once
            named = self._gpu_ids[key] = (batch.gpu_ids, batch.node_ids)
        gpu_ids, node_ids = named
        times = (
            repeat(batch.occurred_at.timestamp(), n)  # a node's samples usually share their instant
            if batch.sampled_at is None
            else [t.timestamp() for t in batch.sampled_at]
        )
        totals, max_clocks = batch.memory_total_mib, batch.max_sm_clock_mhz  # one value: every GPU's
        for (gpu_id, node_id, gpu_type, at, util, activity, occupancy, used, total, clock, max_clock, power, temperature,
             xid, last_xid, sbe, dbe, online, offline) in zip(
            gpu_ids, node_ids, batch.gpu_types or repeat(batch.gpu_type, n), times, batch.gpu_util,
            batch.sm_activity or nones, batch.sm_occupancy or nones, batch.memory_used_mib,
            totals if type(totals) is tuple else repeat(totals, n), batch.sm_clock_mhz,
            max_clocks if type(max_clocks) is tuple else repeat(max_clocks, n), batch.power_w or nones,
            batch.temperature_c or nones, batch.xid_errors or zeros, batch.last_xid or nones, batch.ecc_sbe or zeros,
            batch.ecc_dbe or zeros, batch.online_workload or nones, batch.offline_workloads or empty,
        ):  # fmt: skip
            produced = self._observe(
                gpu_id, node_id, gpu_type, partition, at, util, activity, occupancy, used, total, clock, max_clock,
                power, temperature, xid, last_xid, sbe, dbe, online, offline, origin,
            )  # fmt: skip
            if produced:
                out += produced
        return out

    def on_sample(
        self, sample: GpuTelemetrySample, partition: int = 0, at: float | None = None, origin: object = None
    ) -> list[Event] | None:
        """One GPU's sample. `origin` (the batch's id) seeds the ids of what it causes."""
        return self._observe(
            sample.gpu_id, sample.node_id, sample.gpu_type, partition,
            sample.occurred_at.timestamp() if at is None else at,
            sample.gpu_util, sample.sm_activity, sample.sm_occupancy, sample.memory_used_mib, sample.memory_total_mib,
            sample.sm_clock_mhz, sample.max_sm_clock_mhz, sample.power_w, sample.temperature_c,
            sample.xid_errors, sample.last_xid, sample.ecc_sbe, sample.ecc_dbe,
            sample.online_workload, sample.offline_workloads, origin if origin is not None else sample.event_id,
        )  # fmt: skip

    def _observe(
        self, gpu_id: str, node_id: str, gpu_type: str, partition: int, at: float, gpu_util: float,
        sm_activity: float | None, sm_occupancy: float | None, memory_used_mib: float, memory_total_mib: float,
        sm_clock_mhz: float, max_sm_clock_mhz: float, power_w: float | None, temperature_c: float | None,
        xid_errors: int, last_xid: int | None, ecc_sbe: int, ecc_dbe: int, online_workload: str | None,
        offline_workloads: tuple[str, ...], origin: object,
    ) -> list[Event] | None:  # fmt: skip
        """One GPU's sample, as values. `origin` seeds the ids of what it causes (None: derived)."""
        monitor = self.monitors.get(gpu_id)
        if monitor is None:
            monitor = self.monitors[gpu_id] = SysMonitor(gpu_id, node_id, gpu_type)
        elif monitor.gpu_type != gpu_type:
            monitor.gpu_type = gpu_type  # a drained GPU first seen through a control
        self.partition_of[gpu_id] = partition
        if at <= monitor.as_of:
            return None  # replayed or out of order: the state already reflects it
        material = False
        if offline_workloads != monitor.offline_workloads or online_workload != monitor.online_workload:
            monitor.offline_workloads = offline_workloads
            monitor.online_workload = online_workload
            for job in offline_workloads:
                self.progress.seen(job, at)
            material = True
        timers = (monitor.below_overlimit_since, monitor.high_util_since)
        transitions = monitor.observe(
            values_of(gpu_util, sm_activity, sm_clock_mhz, max_sm_clock_mhz, memory_used_mib, memory_total_mib, temperature_c, power_w),
            at,
            self.config,
        )  # fmt: skip
        findings = None
        if (
            xid_errors != monitor.xid_errors
            or ecc_dbe != monitor.ecc_dbe
            or ecc_sbe != monitor.ecc_sbe
            or gpu_util >= self.config.detector.high_util_pct
            or monitor.high_util_since is not None
        ):
            counters = (monitor.xid_errors, monitor.ecc_sbe, monitor.ecc_dbe)
            findings = sample_findings(
                monitor, at, gpu_util, xid_errors, last_xid, ecc_sbe, ecc_dbe, self.progress, self.config.detector,
            )  # fmt: skip
            material = material or counters != (monitor.xid_errors, monitor.ecc_sbe, monitor.ecc_dbe)
        if not (transitions or findings or material or timers != (monitor.below_overlimit_since, monitor.high_util_since)):
            return None
        if origin is None:
            origin = derived_id("sample", gpu_id, at)
        out: list[Event] = []
        if transitions:
            out += self._transition_events(monitor, transitions, origin)
        for finding in findings or ():
            out += self._remediate(monitor, finding, at, origin)
        out.append(self._snapshot(monitor, origin, at))
        return out

    def on_node(self, node: NodeTelemetry) -> list[Event]:
        monitor = self.nodes.get(node.node_id)
        if monitor is None:
            monitor = self.nodes[node.node_id] = NodeMonitor(node.node_id)
        change = monitor.observe(
            node.occurred_at.timestamp(),
            node.cpu_util,
            _memory_usage(node.memory_used_mib, node.memory_total_mib),
            node.kswapd_active,
            node.offline_workloads,
            self.config.node,
        )
        if change is None:
            return []
        pressure_id = derived_id("node-pressure", node.event_id)
        out: list[Event] = [
            NodePressure(
                event_id=pressure_id, occurred_at=node.occurred_at, source=self.source, node_id=node.node_id,
                pressured=change.pressured, reason=change.reason, metrics=change.metrics, evicted_workloads=change.evicted,
            )
        ]  # fmt: skip
        reason = f"node {node.node_id} under CPU/memory pressure: {change.reason}"
        out += [self._evict(node.node_id, job, self._gpus_of(job, node.node_id), reason, pressure_id, node.occurred_at) for job in change.evicted]
        return out

    def on_report(self, report: ExecutorReport) -> list[Event]:
        at = report.occurred_at.timestamp()
        if report.state in _FINISHED:
            self.progress.forget(report.job_id)
        else:
            self.progress.record(report.job_id, report.iterations_done, at)
        if report.mps_server is None and report.cuda_error is None:
            return []
        # A report that names no GPU of a job we never saw on one is judged at node level.
        gpu_ids = report.gpu_ids or self._gpus_of(report.job_id, report.node_id) or (report.node_id,)
        out: list[Event] = []
        for finding in report_findings(gpu_ids, report.job_id, report.mps_server, report.cuda_error, report.detail):
            monitor = self._monitor(finding.gpu_id, report.node_id)
            out += self._remediate(monitor, finding, at, report.event_id)
            out.append(self._snapshot(monitor, report.event_id, at))
        return out

    def on_control(self, control: DeviceControl) -> list[Event]:
        monitor = self._monitor(control.gpu_id, control.node_id)
        at = control.occurred_at.timestamp()
        if control.action == "drain":
            transition = monitor.disable(at, "drained", f"drained by an operator: {control.reason}".rstrip(": "))
        else:
            transition = monitor.undrain(at, f"undrained by an operator: {control.reason}".rstrip(": "))
        out = self._transition_events(monitor, [transition], control.event_id) if transition else []
        out.append(self._snapshot(monitor, control.event_id, at))
        return out

    def on_snapshot(self, snapshot: SysMonitorSnapshot) -> None:
        """Fold the changelog: adopt a GPU's state when it is newer than ours (another
        instance owned it, or we restart)."""
        known = self.monitors.get(snapshot.gpu_id)
        if known is not None and (snapshot.as_of, snapshot.revision) <= (known.as_of, known.revision):
            return
        self.monitors[snapshot.gpu_id] = SysMonitor(
            gpu_id=snapshot.gpu_id,
            node_id=snapshot.node_id,
            gpu_type=snapshot.gpu_type,
            state=snapshot.state,
            as_of=snapshot.as_of,
            overlimit_entries=list(snapshot.overlimit_entries),
            backoff_s=snapshot.backoff_s,
            below_overlimit_since=snapshot.below_overlimit_since,
            disabled_cause=snapshot.disabled_cause,
            online_workload=snapshot.online_workload,
            offline_workloads=snapshot.offline_workloads,
            xid_errors=snapshot.xid_errors,
            ecc_sbe=snapshot.ecc_sbe,
            ecc_dbe=snapshot.ecc_dbe,
            high_util_since=snapshot.high_util_since,
            revision=snapshot.revision,
        )
        if snapshot.partition is not None:
            self.partition_of[snapshot.gpu_id] = snapshot.partition

    def sweep(self, now: float) -> list[Event]:
        """Disable owned GPUs that stopped reporting (no sample for ``stale_after_s``)."""
        stale_after = self.config.stale_after_s
        out: list[Event] = []
        for gpu_id, monitor in self.monitors.items():
            if monitor.state is HealthState.DISABLED or now - monitor.as_of < stale_after or not self._owns(gpu_id):
                continue
            partition = self.partition_of.get(gpu_id)
            if partition is not None and now - self.assigned_at.get(partition, float("-inf")) < stale_after:
                continue  # just taken over: let the stream reach us first
            silent = now - monitor.as_of
            transition = monitor.disable(now, "stale", f"no sample for {silent:.0f} s (limit {stale_after:.0f} s)")
            if transition is not None:
                origin = derived_id("stale", gpu_id, monitor.as_of)
                out += self._transition_events(monitor, [transition], origin)
                out.append(self._snapshot(monitor, origin, now))
        return out

    def state_of(self, gpu_id: str) -> HealthState:
        monitor = self.monitors.get(gpu_id)
        return HealthState.INIT if monitor is None else monitor.state

    # -- outputs --------------------------------------------------------------------------
    def _monitor(self, gpu_id: str, node_id: str) -> SysMonitor:
        monitor = self.monitors.get(gpu_id)
        if monitor is None:
            monitor = self.monitors[gpu_id] = SysMonitor(gpu_id, node_id, UNKNOWN_TYPE)
        return monitor

    def _gpus_of(self, job_id: str, node_id: str) -> tuple[str, ...]:
        return tuple(gpu for gpu, m in self.monitors.items() if m.node_id == node_id and job_id in m.offline_workloads)

    def _transition_events(self, monitor: SysMonitor, transitions: list[Transition], origin: object) -> list[Event]:
        out: list[Event] = []
        for index, t in enumerate(transitions):
            transition_id = derived_id("health", origin, t.gpu_id, index)
            at = _dt(t.at)
            out.append(
                HealthTransition(
                    event_id=transition_id, occurred_at=at, source=self.source, gpu_id=t.gpu_id,
                    node_id=monitor.node_id, gpu_type=monitor.gpu_type, from_state=t.from_state,
                    to_state=t.to_state, reason=clip_reason(t.reason), metrics=t.metrics,
                    online_workload=monitor.online_workload, sample_event_id=str(origin), cause=t.cause,
                    evicted_workloads=t.evicted,
                )
            )  # fmt: skip
            reason = f"GPU {t.gpu_id} {t.to_state}: {t.reason}"
            out += [self._evict(monitor.node_id, job, (t.gpu_id,), reason, transition_id, at) for job in t.evicted]
        return out

    def _evict(self, node_id: str, job_id: str, gpu_ids: tuple[str, ...], reason: str, origin: object, at: datetime) -> ExecutorCommand:
        return ExecutorCommand(
            event_id=derived_id("evict", origin, job_id), occurred_at=at, source=self.source, node_id=node_id,
            action=CommandAction.EVICT, job_id=job_id, gpu_ids=gpu_ids, reason=clip_reason(reason),
        )  # fmt: skip

    def _remediate(self, monitor: SysMonitor, finding: Finding, at: float, origin: object) -> list[Event]:
        remediation = self.config.rules[finding.kind]
        fault_id = derived_id("fault", origin, finding.gpu_id, finding.kind)
        when = _dt(at)
        out: list[Event] = [
            Fault(
                event_id=fault_id, occurred_at=when, source=self.source, gpu_id=finding.gpu_id,
                node_id=monitor.node_id, kind=finding.kind, detail=clip_reason(finding.detail), xid=finding.xid,
                cuda_error=finding.cuda_error, job_id=finding.job_id, remediation=remediation,
            )
        ]  # fmt: skip
        reason = clip_reason(f"{finding.kind}: {finding.detail}")
        if remediation == "drain":
            transition = monitor.disable(at, "fault", f"drained after {reason}")
            if transition is not None:
                out += self._transition_events(monitor, [transition], fault_id)
        elif remediation == "restart_mps":
            out.append(
                ExecutorCommand(
                    event_id=derived_id("remedy", fault_id), occurred_at=when, source=self.source,
                    node_id=monitor.node_id, action=CommandAction.RESTART_MPS, job_id=f"mps:{finding.gpu_id}",
                    gpu_ids=(finding.gpu_id,), reason=reason,
                )
            )  # fmt: skip
        elif remediation == "reset_and_restart":
            jobs = (finding.job_id,) if finding.job_id else monitor.offline_workloads
            out += [
                ExecutorCommand(
                    event_id=derived_id("remedy", fault_id, job), occurred_at=when, source=self.source,
                    node_id=monitor.node_id, action=CommandAction.RESET_WORKLOAD, job_id=job,
                    gpu_ids=(finding.gpu_id,), reason=reason,
                )
                for job in jobs
            ]  # fmt: skip
        return out

    def _snapshot(self, monitor: SysMonitor, origin: object, at: float) -> SysMonitorSnapshot:
        """The GPU's whole state after a material change; `revision` orders snapshots with
        the same `as_of` (a drain or a staleness verdict changes the state without a sample)."""
        monitor.revision += 1
        return SysMonitorSnapshot(
            event_id=derived_id("snapshot", origin, monitor.gpu_id),
            occurred_at=_dt(at),
            revision=monitor.revision,
            source=self.source,
            gpu_id=monitor.gpu_id,
            node_id=monitor.node_id,
            gpu_type=monitor.gpu_type,
            state=monitor.state,
            as_of=monitor.as_of if monitor.as_of > float("-inf") else 0.0,
            partition=self.partition_of.get(monitor.gpu_id),
            overlimit_entries=tuple(monitor.overlimit_entries),
            backoff_s=monitor.backoff_s,
            below_overlimit_since=monitor.below_overlimit_since,
            disabled_cause=monitor.disabled_cause,  # type: ignore[arg-type]
            high_util_since=monitor.high_util_since,
            xid_errors=monitor.xid_errors,
            ecc_sbe=monitor.ecc_sbe,
            ecc_dbe=monitor.ecc_dbe,
            online_workload=monitor.online_workload,
            offline_workloads=monitor.offline_workloads,
        )
