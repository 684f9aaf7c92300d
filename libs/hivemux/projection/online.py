"""Online services' latency and SLO protection in the read models (issue 19 items 1 and 3): the
row changes that let the API, the console and `hivemux up`'s summary show each online service's
replicas with their latest p99 against the SLO, and the protection steps taken for them.

Tables (migration 0009), each fed by one topic:
- ``online_services``: an online service's model, replicas, SLO and expected request rate
  (``jobs.submitted``, kind ``online``); the SLO shown is the submission's, the report's only
  when the submission did not name one;
- ``online_latency``: per (service, GPU), the latest window (``online.latency``, keyed by node, so
  one replica's reports arrive in order). A report replaces the row only if its window ends
  later, ties broken by the greater event id: a duplicate, a replay and a report older than the
  stored window change nothing, and the result does not depend on the order reports are read;
- ``online_endpoints`` (migration 0014, issue 29): per (service, GPU), where the replica running
  the service's own command serves (``executor.reports`` step ``ready``, its ``endpoint``), the
  latest ready report winning (ties: the greater event id);
- ``slo_protection_steps``: every ``sharing.protection`` step once (by event id); the latest per
  GPU (view ``slo_protection_latest``) and the counts per service and step are queries. Each step
  is also a row of the offline job's and the GPU's history (``job_events``, ``gpu_events``,
  kind ``protection``), so `jobs history` says why a job was throttled or evicted.

Bounds on hostile but well-formed reports: the models bound every number at decode (p99 at most
an hour, rates at most 1e9, level at most 64) and reasons are clipped; a window cannot end after
its report was written (``window_end`` is clipped to ``occurred_at``, as both executors write
it), so a report dated far ahead cannot pin a replica's row against every later report.

`slo_state` is how a p99 compares with its SLO, with SLO-driven protection's own threshold
(`sharing.slo_protection.SloPolicy.approach`): ``over`` above the SLO, ``approaching`` above
90 % of it, else ``within``; ``unknown`` without a p99 or an SLO.

Example: reports for (svc, n1/gpu-0) with windows ending 10:00:05, 10:00:10, then 10:00:05 again
(redelivered) leave the 10:00:10 one; p99 46 ms against an SLO of 50 ms is ``approaching``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ..events import ExecutorReport, JobSubmission, OnlineLatencyReport, SloProtectionAction
from ..sharing.slo_protection import SloPolicy

SloState = Literal["within", "approaching", "over", "unknown"]
APPROACHING = SloPolicy().approach


@dataclass(frozen=True)
class OnlineServiceSubmitted:
    job_id: str
    model: str
    replicas: int
    slo_p99_ms: float | None
    request_rate: float | None
    at: datetime


@dataclass(frozen=True)
class ReplicaLatency:
    """A replica's latency window; `window_end` is at most the report's event time."""

    service: str
    gpu_id: str
    node_id: str
    window_start: datetime
    window_end: datetime
    p50_ms: float | None
    p99_ms: float
    slo_p99_ms: float | None
    request_rate: float | None
    offline_job_id: str | None
    sm_share: float | None
    launch_target: float | None
    event_id: UUID


@dataclass(frozen=True)
class ProtectionStep:
    event_id: UUID
    gpu_id: str
    node_id: str
    service: str
    offline_job_id: str
    step: str
    level: int
    p99_ms: float
    slo_p99_ms: float
    launch_target: float
    sm_share: float | None
    reason: str
    at: datetime


@dataclass(frozen=True)
class ReplicaEndpoint:
    """Where a replica running the service's own command serves, since it passed its readiness
    probe (an ``executor.reports`` record, step ``ready``); the later report wins."""

    service: str
    gpu_id: str
    node_id: str
    endpoint: str
    ready_at: datetime
    event_id: UUID


OnlineChange = OnlineServiceSubmitted | ReplicaLatency | ProtectionStep | ReplicaEndpoint


def online_submission(event: JobSubmission) -> tuple[OnlineChange, ...]:
    if event.kind.value != "online":
        return ()
    w = event.workload
    return (OnlineServiceSubmitted(event.job_id, w.model, event.pods, w.slo_p99_ms, w.request_rate, event.occurred_at),)


def latency(event: OnlineLatencyReport) -> ReplicaLatency:
    end = min(event.window_end, event.occurred_at)
    return ReplicaLatency(
        event.service, event.gpu_id, event.node_id, min(event.window_start, end), end, event.p50_ms, event.p99_ms,
        event.slo_p99_ms, event.request_rate, event.offline_job_id, event.sm_share, event.launch_target, event.event_id,
    )  # fmt: skip


def endpoint(event: ExecutorReport) -> tuple[ReplicaEndpoint, ...]:
    """A ``ready`` report's endpoint, one row per GPU of the replica (none for other reports)."""
    if event.endpoint is None or event.step != "ready":
        return ()
    return tuple(ReplicaEndpoint(event.job_id, g, event.node_id, event.endpoint, event.occurred_at, event.event_id) for g in event.gpu_ids)


def protection(event: SloProtectionAction) -> ProtectionStep:
    return ProtectionStep(
        event.event_id, event.gpu_id, event.node_id, event.service, event.offline_job_id, event.step, event.level, event.p99_ms,
        event.slo_p99_ms, event.launch_target, event.sm_share, event.reason, event.occurred_at,
    )  # fmt: skip


def newer(stored: ReplicaLatency | None, report: ReplicaLatency) -> bool:
    """Whether `report` replaces `stored` (the store's upsert condition, in Python)."""
    return stored is None or (report.window_end, report.event_id.hex) > (stored.window_end, stored.event_id.hex)


def fold_latency(reports: list[ReplicaLatency]) -> dict[tuple[str, str], ReplicaLatency]:
    """The latest report per (service, GPU) after `reports` in any order."""
    latest: dict[tuple[str, str], ReplicaLatency] = {}
    for r in reports:
        key = (r.service, r.gpu_id)
        if newer(latest.get(key), r):
            latest[key] = r
    return latest


def slo_state(p99_ms: float | None, slo_p99_ms: float | None, approach: float = APPROACHING) -> SloState:
    if p99_ms is None or not slo_p99_ms:
        return "unknown"
    if p99_ms > slo_p99_ms:
        return "over"
    return "approaching" if p99_ms > approach * slo_p99_ms else "within"


OTHER_TENANT = "(other tenant)"


def service_view(
    service: dict[str, Any], replicas: list[dict[str, Any]], steps: list[dict[str, Any]], counts: dict[str, int],
    scope: Sequence[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One online service as the API shows it: `service` its job row joined with its submission
    (job_id, vc, state, model, replicas, slo_p99_ms, request_rate), `replicas` its bound pods
    ({pod, gpu_id, node_id} and its latest window's columns, or none yet), `steps` the latest
    protection step per GPU, `counts` its steps by kind. The worst replica's p99 against the SLO
    gives the service's `slo_state`; an offline neighbour of a VC outside `scope` (None: every
    VC) is shown as ``(other tenant)``."""
    slo = service.get("slo_p99_ms")
    shown = []
    for r in replicas:
        replica_slo = slo or r.get("report_slo_p99_ms")
        row = {k: v for k, v in r.items() if k not in ("offline_vc", "report_slo_p99_ms")}
        if _masked(r.get("offline_job_id"), r.get("offline_vc"), scope):
            row["offline_job_id"] = OTHER_TENANT
        shown.append(row | {"slo_p99_ms": replica_slo, "slo_state": slo_state(r.get("p99_ms"), replica_slo)})
    measured = [r for r in shown if r.get("p99_ms") is not None]
    worst = max(measured, key=lambda r: r["p99_ms"], default=None)
    latest = max(steps, key=lambda s: (s["occurred_at"], str(s["event_id"])), default=None)
    last = None
    if latest is not None:
        last = {k: v for k, v in latest.items() if k != "offline_vc"}
        if _masked(latest.get("offline_job_id"), latest.get("offline_vc"), scope):
            last["offline_job_id"] = OTHER_TENANT
    return {
        **service, "slo_p99_ms": slo or (worst or {}).get("slo_p99_ms"), "replicas_bound": len(shown), "replica_latency": shown,
        "worst_p99_ms": worst["p99_ms"] if worst else None, "worst_gpu_id": worst["gpu_id"] if worst else None,
        "slo_state": worst["slo_state"] if worst else "unknown", "last_protection": last, "protection_steps": dict(sorted(counts.items())),
    }  # fmt: skip


def _masked(job_id: str | None, vc: str | None, scope: Sequence[str] | None) -> bool:
    return scope is not None and job_id is not None and vc not in scope
