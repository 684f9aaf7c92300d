"""SLO-driven protection at the bus's edge: latency reports in, protection steps and executor
commands out (the health processor drives it beside SysMonitor, `services/health_processor`).

In: an `OnlineLatencyReport` (the node executor's measured p99 of one online service over a
window, with its offline neighbour, the neighbour's placed SM share and the launch target in
force) becomes a `LatencyReading` at the window's end (event time); a report without an SLO
or without a neighbour decides nothing. Out: each `ProtectionAction` becomes a
`SloProtectionAction` (measured p99, SLO, step, new launch target and SM share, reason,
inputs) and the `ExecutorCommand` that applies it: ``adjust`` with the new ``launch_target``
(and the new ``sm_share`` on the SM-share steps only: a new MPS share restarts the job from its
checkpoint, a new launch target is one write into its xCUDA control block), or ``evict``.

Ids: ``slo/<report>/<step>`` and ``slo-command/<report>/<step>``: a redelivered or replayed
report emits the same ids. Restart: the health processor folds ``sharing.protection`` back
(`on_action`), so a restarted or new owner of a GPU resumes at the level it left the
neighbour at (its streak counters start afresh) and can still restore it.
"""

from __future__ import annotations

from hivemux.events import CommandAction, Event, ExecutorCommand, OnlineLatencyReport, SloProtectionAction, derived_id
from hivemux.events.base import clip_reason

from .slo_protection import GpuProtection, LatencyReading, ProtectionAction, SloPolicy, SloProtector, Step

_SHARE_STEPS = (Step.LOWER_SM_SHARE, Step.RESTORE_SM_SHARE)


class SloEdge:
    def __init__(self, policy: SloPolicy, source: str) -> None:
        self.protector = SloProtector(policy)
        self.source = source

    def on_report(self, report: OnlineLatencyReport) -> list[Event]:
        if report.slo_p99_ms is None:
            return []
        reading = LatencyReading(
            gpu_id=report.gpu_id, node_id=report.node_id, service=report.service, p99_ms=report.p99_ms,
            slo_p99_ms=report.slo_p99_ms, at=report.window_end, offline_job_id=report.offline_job_id, sm_share=report.sm_share,
        )  # fmt: skip
        out: list[Event] = []
        for action in self.protector.observe(reading):
            out += self._events(action, report)
        return out

    def on_action(self, action: SloProtectionAction) -> None:
        """Fold a recorded step: the GPU resumes at its level (no-op when it is already there)."""
        state = self.protector.gpus.get(action.gpu_id, GpuProtection())
        if action.step == Step.EVICT.value:
            if state.offline_job_id == action.offline_job_id:
                self.protector.gpus[action.gpu_id] = GpuProtection()
            return
        if state.offline_job_id == action.offline_job_id and state.level == action.level:
            return
        nominal = action.nominal_sm_share if action.nominal_sm_share is not None else state.nominal_sm_share
        self.protector.gpus[action.gpu_id] = GpuProtection(offline_job_id=action.offline_job_id, nominal_sm_share=nominal,
                                                           level=action.level)

    def _events(self, action: ProtectionAction, report: OnlineLatencyReport) -> list[Event]:
        state = self.protector.gpus.get(action.gpu_id)
        nominal = state.nominal_sm_share if state is not None and state.offline_job_id == action.offline_job_id else report.sm_share
        step = SloProtectionAction(
            event_id=derived_id("slo", report.event_id, action.step.value), occurred_at=action.at, source=self.source,
            gpu_id=action.gpu_id, node_id=action.node_id, service=action.service, offline_job_id=action.offline_job_id,
            step=action.step.value, level=action.level, p99_ms=action.p99_ms, slo_p99_ms=action.slo_p99_ms,
            launch_target=action.launch_target, sm_share=action.sm_share, nominal_sm_share=nominal,
            reason=clip_reason(action.reason),
            inputs={"report": str(report.event_id), "window_start": report.window_start.isoformat(),
                    "window_end": report.window_end.isoformat(), "request_rate": report.request_rate,
                    "launch_target_before": report.launch_target},
        )  # fmt: skip
        evict = action.step is Step.EVICT
        command = ExecutorCommand(
            event_id=derived_id("slo-command", report.event_id, action.step.value), occurred_at=action.at, source=self.source,
            node_id=action.node_id, action=CommandAction.EVICT if evict else CommandAction.ADJUST, job_id=action.offline_job_id,
            gpu_ids=(action.gpu_id,), launch_target=None if evict else action.launch_target,
            sm_share=action.sm_share if action.step in _SHARE_STEPS else None,
            reason=clip_reason(f"SLO protection, {action.step.value}: {action.reason}"),
        )  # fmt: skip
        return [step, command]
