"""The health core at the bus's edge: decoded records in, event models out, in one place.

In: a `GpuTelemetryBatch`'s columns become one `GpuObservation` row per GPU (no per-sample
event objects: a row is the tuple of the GPU's entries, zipped off the columns); node samples,
executor reports, operator drains and changelog snapshots become their domain values. Out: the
core's decisions (`decisions`) become `HealthTransition`, `ExecutorCommand` (evict, restart
MPS, reset a workload), `Fault`, `NodePressure` and `SysMonitorSnapshot` events.

Event ids are derived from the input record's id and the decision's place in it, so a replay
emits the same ids: ``health/<origin>/<gpu>/<i>`` for the i-th transition of a GPU,
``evict/<transition or pressure>/<job>``, ``fault/<origin>/<gpu>/<kind>``,
``remedy/<fault>[/<job>]``, ``snapshot/<origin>/<gpu>``; a staleness verdict's origin is
``stale/<gpu>/<as_of>``. The service shell and `hivemux health replay` both drive this class.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from itertools import repeat
from typing import cast

from hivemux.errors import ConfigurationError, InvalidEvent
from hivemux.events import (
    CellConfig,
    ClockTick,
    CommandAction,
    DeviceControl,
    Event,
    ExecutorCommand,
    ExecutorReport,
    Fault,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    HealthTransition,
    NodeAgent,
    NodePressure,
    NodeTelemetry,
    ReportState,
    SysMonitorSnapshot,
    derived_id,
)
from hivemux.events.base import clip_reason
from hivemux.events.telemetry import MetricThreshold
from hivemux.events.versions import version_jump

from .config import HealthConfig
from .decisions import Eviction, GpuVerdict, Remedy, SysMonitorState, evictions_of
from .known_nodes import KnownNodes, configured_nodes
from .observations import Drain, GpuObservation, NodeObservation, WorkloadReport
from .processor import HealthProcessorCore
from .sysmonitor import HealthState, SysMonitor, Transition

_FINISHED = {ReportState.COMPLETED, ReportState.FAILED, ReportState.STOPPED, ReportState.EVICTED, ReportState.REFUSED}


def _dt(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


@functools.cache
def _fillers(n: int) -> tuple[tuple[None, ...], tuple[int, ...], tuple[tuple[()], ...]]:
    """Per batch size: the columns a batch leaves out, spelt out (None, zero counters, no workloads)."""
    return (None,) * n, (0,) * n, ((),) * n


class HealthEdge:
    """`HealthProcessorCore` driven by event models; `source` names the publisher. With `nodes`,
    telemetry and drains of nodes and GPUs not in the cluster are refused (`known_nodes`)."""

    def __init__(self, config: HealthConfig, source: str, nodes: KnownNodes | None = None) -> None:
        self.core = HealthProcessorCore(config)
        self.source = source
        self.nodes = nodes

    @property
    def monitors(self) -> dict[str, SysMonitor]:
        return self.core.monitors

    def state_of(self, gpu_id: str) -> HealthState:
        return self.core.state_of(gpu_id)

    def assign(self, partitions: Iterable[int] | None) -> None:
        self.core.assign(partitions)

    # -- in -------------------------------------------------------------------------------
    def rows(self, batch: GpuTelemetryBatch, at: float) -> Iterator[GpuObservation]:
        """The batch's GPUs as named rows, read straight off its columns (`at`: the batch's
        ``occurred_at``, every GPU's instant unless the batch has ``sampled_at``)."""
        n = len(batch.gpu_util)
        nones, zeros, empty = _fillers(n)
        gpu_ids, node_ids = batch.gpu_ids, batch.node_ids  # cached per batch shape
        times = (
            repeat(at, n)  # a node's samples usually share their instant
            if batch.sampled_at is None
            else [t.timestamp() for t in batch.sampled_at]
        )
        totals, max_clocks = batch.memory_total_mib, batch.max_sm_clock_mhz  # one value: every GPU's
        # The zipped column tuples are the rows, in GpuObservation's field order: a NamedTuple
        # is that tuple, and the core reads rows by position. Making the NamedTuple instance
        # per GPU cost ~130 ns a sample, 7 % of the core's throughput (`benchmarks/health.py`);
        # `test_edge` pins the order against GpuObservation built field by field.
        return cast(Iterator[GpuObservation], zip(
            gpu_ids, node_ids, batch.gpu_types or repeat(batch.gpu_type, n), times, batch.gpu_util,
            batch.sm_activity or nones, batch.sm_clock_mhz,
            max_clocks if type(max_clocks) is tuple else repeat(max_clocks, n), batch.memory_used_mib,
            totals if type(totals) is tuple else repeat(totals, n), batch.temperature_c or nones,
            batch.power_w or nones, batch.xid_errors or zeros, batch.last_xid or nones, batch.ecc_sbe or zeros,
            batch.ecc_dbe or zeros, batch.online_workload or nones, batch.offline_workloads or empty,
        ))  # fmt: skip

    def on_batch(self, batch: GpuTelemetryBatch, partition: int = 0) -> list[Event]:
        if self.nodes is not None and (why := self.nodes.refusal(batch.gpu_ids, batch.node_ids)) is not None:
            raise InvalidEvent(f"telemetry.gpu: {why}")
        at = batch.occurred_at.timestamp()
        verdicts = self.core.observe(self.rows(batch, at), partition, at)
        if not verdicts:
            return []
        out: list[Event] = []
        for verdict in verdicts:
            out += self._gpu_events(verdict, batch.event_id)
        return out

    def on_sample(
        self, sample: GpuTelemetrySample, partition: int = 0, at: float | None = None, origin: object = None
    ) -> list[Event]:
        """One GPU's sample. `origin` (the batch's id) seeds the ids of what it causes."""
        row = GpuObservation(
            sample.gpu_id, sample.node_id, sample.gpu_type, sample.occurred_at.timestamp() if at is None else at,
            sample.gpu_util, sample.sm_activity, sample.sm_clock_mhz, sample.max_sm_clock_mhz,
            sample.memory_used_mib, sample.memory_total_mib, sample.temperature_c, sample.power_w,
            sample.xid_errors, sample.last_xid, sample.ecc_sbe, sample.ecc_dbe, sample.online_workload,
            sample.offline_workloads,
        )  # fmt: skip
        origin = origin if origin is not None else sample.event_id
        out: list[Event] = []
        for verdict in self.core.observe((row,), partition, sample.occurred_at.timestamp()):
            out += self._gpu_events(verdict, origin)
        return out

    def on_node(self, node: NodeTelemetry) -> list[Event]:
        if self.nodes is not None and (why := self.nodes.node_refusal(node.node_id, node.gpu_ids)) is not None:
            raise InvalidEvent(f"telemetry.node: {why}")
        verdict = self.core.on_node(
            NodeObservation(node.node_id, node.occurred_at.timestamp(), node.cpu_util, node.memory_used_mib,
                            node.memory_total_mib, node.kswapd_active, node.offline_workloads)
        )  # fmt: skip
        if verdict is None:
            return []
        change = verdict.change
        pressure_id = derived_id("node-pressure", node.event_id)
        out: list[Event] = [
            NodePressure(
                event_id=pressure_id, occurred_at=node.occurred_at, source=self.source, node_id=node.node_id,
                pressured=change.pressured, reason=change.reason, metrics=change.metrics, evicted_workloads=change.evicted,
            )
        ]  # fmt: skip
        out += [self._evict(e, pressure_id, node.occurred_at) for e in verdict.evictions]
        return out

    def on_report(self, report: ExecutorReport) -> list[Event]:
        verdicts = self.core.on_report(
            WorkloadReport(report.job_id, report.node_id, report.gpu_ids, report.occurred_at.timestamp(),
                           report.state in _FINISHED, report.iterations_done, report.mps_server, report.cuda_error,
                           report.detail)
        )  # fmt: skip
        out: list[Event] = []
        for verdict in verdicts:
            out += self._gpu_events(verdict, report.event_id)
        return out

    def on_control(self, control: DeviceControl) -> list[Event]:
        """An operator's drain or undrain. One of a GPU no telemetry (nor the ``health.state``
        changelog) ever named is refused (issue 28): there is nothing there to drain, and a
        SysMonitor made for it would stand for a GPU that does not exist."""
        if self.nodes is not None and (why := self.nodes.node_refusal(control.node_id, (control.gpu_id,))) is not None:
            raise InvalidEvent(f"gpu.control: {control.action} of {control.gpu_id}: {why}")
        if control.gpu_id not in self.core.monitors:
            raise InvalidEvent(f"gpu.control: {control.action} of {control.gpu_id}: no GPU of that id has reported telemetry")
        drain = Drain(control.gpu_id, control.node_id, control.occurred_at.timestamp(), control.action, control.reason)
        return self._gpu_events(self.core.on_drain(drain), control.event_id)

    def on_cell_config(self, change: CellConfig) -> None:
        """A cell configuration version: its nodes are the cluster's from now on, if it is newer
        than the one in force (`known_nodes`); an implausible version or an invalid configuration
        is refused, as the cell allocator refuses it."""
        if self.nodes is None or change.version <= self.nodes.version:
            return
        jump = version_jump(self.nodes.version, change.version, at=change.occurred_at)
        try:
            if jump is not None:
                raise ConfigurationError(jump)
            nodes = configured_nodes(change.config)
        except ConfigurationError as error:
            raise InvalidEvent(f"cell configuration version {change.version} is refused: {error}") from error
        self.nodes.configure(change.version, nodes)

    def on_agent(self, agent: NodeAgent) -> None:
        """A node agent registered its node (`known_nodes`)."""
        if self.nodes is not None and (why := self.nodes.register(agent.node_id)) is not None:
            raise InvalidEvent(f"nodes.agents: {agent.node_id} not registered: {why}")

    def on_tick(self, tick: ClockTick, *, replaying: bool = False) -> list[Event]:
        """Time passed (a tick on the bus): the watermark moves to the tick and, live, silent
        GPUs are disabled at it. A replayed tick only moves the watermark: the changelog
        already holds what its sweep decided."""
        self.core.advance(tick.occurred_at.timestamp())
        return [] if replaying else self.sweep()

    def on_snapshot(self, snapshot: SysMonitorSnapshot) -> None:
        if not self.core.is_newer(snapshot.gpu_id, snapshot.as_of, snapshot.revision):
            return  # our own record coming back, or an older one: nothing to convert
        s = snapshot
        self.core.on_state(
            SysMonitorState(  # positional, in SysMonitorState's field order (a restart folds every GPU)
                s.gpu_id, s.node_id, s.gpu_type, s.state, s.as_of, s.revision, s.partition, s.overlimit_entries,
                s.backoff_s, s.below_overlimit_since, s.disabled_cause, s.high_util_since, s.xid_errors, s.ecc_sbe,
                s.ecc_dbe, s.online_workload, s.offline_workloads, s.sharing_mode, s.mps_detail,
            )
        )  # fmt: skip

    def sweep(self) -> list[Event]:
        """Silent GPUs disabled, judged at the watermark (the latest event time consumed)."""
        out: list[Event] = []
        for verdict in self.core.sweep():
            out += self._gpu_events(verdict, derived_id("stale", verdict.state.gpu_id, verdict.state.as_of))
        return out

    # -- out ------------------------------------------------------------------------------
    def _gpu_events(self, verdict: GpuVerdict, origin: object) -> list[Event]:
        state = verdict.state
        out: list[Event] = []
        for index, transition in enumerate(verdict.transitions):
            out += self._transition(transition, state, origin, index)
        for remedy in verdict.remedies:
            out += self._remedy(remedy, state, origin, verdict.at)
        out.append(self._snapshot(state, origin, verdict.at))
        return out

    def _transition(self, t: Transition, state: SysMonitorState, origin: object, index: int) -> list[Event]:
        transition_id = derived_id("health", origin, t.gpu_id, index)
        at = _dt(t.at)
        out: list[Event] = [
            HealthTransition(
                event_id=transition_id, occurred_at=at, source=self.source, gpu_id=t.gpu_id,
                node_id=state.node_id, gpu_type=state.gpu_type, from_state=t.from_state,
                to_state=t.to_state, reason=clip_reason(t.reason), metrics=t.metrics,
                online_workload=state.online_workload, sample_event_id=str(origin), cause=t.cause,  # type: ignore[arg-type]
                evicted_workloads=t.evicted,
                thresholds=tuple(MetricThreshold(metric=o.metric, value=o.value, op=o.op, level=o.level, threshold=o.threshold)  # type: ignore[arg-type]
                                 for o in t.offending),
                sharing_mode=state.sharing_mode, mps_detail=clip_reason(state.mps_detail),  # type: ignore[arg-type]
            )
        ]  # fmt: skip
        if t.evicted:
            out += [self._evict(e, transition_id, at) for e in evictions_of(t, state.node_id)]
        return out

    def _evict(self, eviction: Eviction, origin: object, at: datetime) -> ExecutorCommand:
        return ExecutorCommand(
            event_id=derived_id("evict", origin, eviction.job_id), occurred_at=at, source=self.source,
            node_id=eviction.node_id, action=CommandAction.EVICT, job_id=eviction.job_id, gpu_ids=eviction.gpu_ids,
            reason=clip_reason(eviction.reason),
        )  # fmt: skip

    def _remedy(self, remedy: Remedy, state: SysMonitorState, origin: object, at: float) -> list[Event]:
        finding = remedy.finding
        fault_id = derived_id("fault", origin, finding.gpu_id, finding.kind)
        when = _dt(at)
        out: list[Event] = [
            Fault(
                event_id=fault_id, occurred_at=when, source=self.source, gpu_id=finding.gpu_id,
                node_id=state.node_id, kind=finding.kind, detail=clip_reason(finding.detail), xid=finding.xid,
                cuda_error=finding.cuda_error, job_id=finding.job_id, remediation=remedy.rule,
            )
        ]  # fmt: skip
        reason = clip_reason(remedy.reason)
        if remedy.drained is not None:
            out += self._transition(remedy.drained, state, fault_id, 0)
        if remedy.rule == "restart_mps":
            out.append(
                ExecutorCommand(
                    event_id=derived_id("remedy", fault_id), occurred_at=when, source=self.source,
                    node_id=state.node_id, action=CommandAction.RESTART_MPS, job_id=f"mps:{finding.gpu_id}",
                    gpu_ids=(finding.gpu_id,), reason=reason,
                )
            )  # fmt: skip
        out += [
            ExecutorCommand(
                event_id=derived_id("remedy", fault_id, job), occurred_at=when, source=self.source,
                node_id=state.node_id, action=CommandAction.RESET_WORKLOAD, job_id=job,
                gpu_ids=(finding.gpu_id,), reason=reason,
            )
            for job in remedy.reset
        ]  # fmt: skip
        return out

    def _snapshot(self, state: SysMonitorState, origin: object, at: float) -> SysMonitorSnapshot:
        return SysMonitorSnapshot(
            event_id=derived_id("snapshot", origin, state.gpu_id),
            occurred_at=_dt(at),
            revision=state.revision,
            source=self.source,
            gpu_id=state.gpu_id,
            node_id=state.node_id,
            gpu_type=state.gpu_type,
            state=state.state,
            as_of=state.as_of if state.as_of > float("-inf") else 0.0,
            partition=state.partition,
            overlimit_entries=state.overlimit_entries,
            backoff_s=state.backoff_s,
            below_overlimit_since=state.below_overlimit_since,
            disabled_cause=state.disabled_cause,  # type: ignore[arg-type]
            high_util_since=state.high_util_since,
            xid_errors=state.xid_errors,
            ecc_sbe=state.ecc_sbe,
            ecc_dbe=state.ecc_dbe,
            online_workload=state.online_workload,
            offline_workloads=state.offline_workloads,
            sharing_mode=state.sharing_mode,  # type: ignore[arg-type]
            mps_detail=clip_reason(state.mps_detail),
        )
