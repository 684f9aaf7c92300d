"""The read models' row statements: how each row change of the projection (`hivemux.projection`)
is written to PostgreSQL (migrations 0003-0011). `ReadModelStore.apply` calls `write_changes`
inside the transaction that also moves the projector's offsets (`store.read_models`).

Within a batch the changes of one kind are written together, in order (state changes folded to
one per job by `fold_states`, job events through COPY); kinds write disjoint columns (see the
projection's docstring), so grouping them does not change the result.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import astuple, fields, replace
from typing import Any

from ..projection import (
    FINISHED_STATES,
    Change,
    FaultRow,
    GpuEventRow,
    GpuHealthChanged,
    GpuOfflineChanged,
    JobBindingChanged,
    JobEnded,
    JobEventRow,
    JobProgress,
    JobPlacementChanged,
    JobPriorityChanged,
    JobRestarted,
    JobStateChanged,
    JobSubmitted,
    LaneGpuChanged,
    LaneJobBound,
    LogChunkStored,
    LogRetention,
    LogsSwept,
    OnlineServiceSubmitted,
    ProtectionStep,
    ReplicaEndpoint,
    ReplicaLatency,
    SharingObserved,
    UsageEnded,
    UsageStarted,
    VcQuotasChanged,
    fold_latency,
    fold_progress,
    fold_states,
)

from .logs import write_log_changes

_FINISHED = "ARRAY[" + ", ".join(f"'{s}'" for s in FINISHED_STATES) + "]"


_STATEMENTS: dict[type, str] = {
    JobSubmitted: """
        INSERT INTO jobs (job_id, vc, kind, priority, priority_value, pods, gpus, submitted_at, updated_at, limits)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9::jsonb)
        ON CONFLICT (job_id) DO UPDATE SET vc = EXCLUDED.vc, kind = EXCLUDED.kind, priority = EXCLUDED.priority,
            -- a priority change folded before the submission keeps its value (migration 0005)
            priority_value = CASE WHEN jobs.priority_changed_at IS NULL THEN EXCLUDED.priority_value ELSE jobs.priority_value END,
            pods = EXCLUDED.pods, gpus = EXCLUDED.gpus, submitted_at = EXCLUDED.submitted_at, limits = EXCLUDED.limits,
            updated_at = GREATEST(jobs.updated_at, EXCLUDED.updated_at)""",
    # Applied once per batch over `fold_states` (one row per job): existing rows by what their
    # stored state makes of the batch, then the jobs not stored yet (see `_STATES_INSERT`).
    JobStateChanged: f"""
        UPDATE jobs SET
            state = CASE WHEN jobs.state = ANY({_FINISHED}) THEN jobs.state
                         WHEN jobs.state = 'suspended' THEN coalesce(f.from_suspended, jobs.state)
                         ELSE f.state END,
            last_reason = CASE WHEN jobs.state = ANY({_FINISHED}) THEN jobs.last_reason
                               WHEN jobs.state = 'suspended' THEN coalesce(f.from_suspended_reason, jobs.last_reason)
                               ELSE f.reason END,
            updated_at = GREATEST(jobs.updated_at, f.at)
        FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[])
             AS f(job_id, state, reason, from_suspended, from_suspended_reason, at)
        WHERE jobs.job_id = f.job_id""",
    # A lane GPU (migration 0011, `projection.lanes`): its bound binding makes its row one (VC,
    # kind, priority class, 1 GPU); its release or preemption moves only a row that is one.
    LaneGpuChanged: """
        WITH moved AS (
            UPDATE jobs SET state = $4::text, last_reason = $5::text, updated_at = GREATEST(jobs.updated_at, $6::timestamptz)
            WHERE NOT $7::boolean AND job_id = $1::text AND kind = 'lane-gpu')
        INSERT INTO jobs (job_id, vc, kind, priority, pods, gpus, state, last_reason, submitted_at, updated_at)
        SELECT $1::text, $2::text, 'lane-gpu', $3::text, 1, 1, $4::text, $5::text, $6::timestamptz, $6::timestamptz WHERE $7::boolean
        ON CONFLICT (job_id) DO UPDATE SET vc = EXCLUDED.vc, kind = 'lane-gpu', priority = EXCLUDED.priority, pods = 1, gpus = 1,
            state = EXCLUDED.state, last_reason = EXCLUDED.last_reason, submitted_at = coalesce(jobs.submitted_at, EXCLUDED.submitted_at),
            updated_at = GREATEST(jobs.updated_at, EXCLUDED.updated_at)""",
    JobRestarted: """
        INSERT INTO jobs (job_id, restarts, updated_at) VALUES ($1, $2, $3)
        ON CONFLICT (job_id) DO UPDATE SET restarts = GREATEST(jobs.restarts, EXCLUDED.restarts),
            updated_at = GREATEST(jobs.updated_at, EXCLUDED.updated_at)""",
    JobPriorityChanged: """
        INSERT INTO jobs (job_id, priority_value, priority_changed_at, updated_at) VALUES ($1, $2, $3, $3)
        ON CONFLICT (job_id) DO UPDATE SET priority_value = EXCLUDED.priority_value,
            priority_changed_at = EXCLUDED.priority_changed_at,
            updated_at = GREATEST(jobs.updated_at, EXCLUDED.updated_at)""",
    JobBindingChanged: """
        INSERT INTO jobs (job_id, binding, updated_at)
        VALUES ($1, CASE WHEN $3::jsonb IS NULL THEN '{}'::jsonb ELSE jsonb_build_object($2::text, $3::jsonb) END, $4)
        ON CONFLICT (job_id) DO UPDATE SET
            binding = CASE WHEN $3::jsonb IS NULL THEN jobs.binding - $2::text
                           ELSE jobs.binding || jsonb_build_object($2::text, $3::jsonb) END,
            updated_at = GREATEST(jobs.updated_at, EXCLUDED.updated_at)""",
    JobPlacementChanged: """
        INSERT INTO jobs (job_id, placement, updated_at) VALUES ($1, $2::jsonb, $3)
        ON CONFLICT (job_id) DO UPDATE SET placement = EXCLUDED.placement,
            updated_at = GREATEST(jobs.updated_at, EXCLUDED.updated_at)""",
    # Copied into a transaction-local staging table first (COPY is the fast path for the most
    # numerous rows), then moved; a redelivered event (same id) is kept once, at its first position.
    JobEventRow: """
        INSERT INTO job_events SELECT * FROM job_events_in ORDER BY job_id, event_id, topic, partition, "offset" ON CONFLICT (job_id, event_id) DO NOTHING""",
    # The last sample (migration 0006) moves only with a transition that has metrics, never back.
    GpuHealthChanged: """
        INSERT INTO gpus (gpu_id, node_id, gpu_type, health, health_cause, health_reason, health_metrics, online_workload, changed_at,
                          sample_at, sample_metrics)
        VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, CASE WHEN $10::timestamptz IS NULL THEN '{}'::jsonb ELSE $7::jsonb END)
        ON CONFLICT (gpu_id) DO UPDATE SET node_id = EXCLUDED.node_id, gpu_type = EXCLUDED.gpu_type,
            health = EXCLUDED.health, health_cause = EXCLUDED.health_cause, health_reason = EXCLUDED.health_reason,
            health_metrics = EXCLUDED.health_metrics, online_workload = EXCLUDED.online_workload,
            changed_at = GREATEST(gpus.changed_at, EXCLUDED.changed_at),
            sample_metrics = CASE WHEN $10 IS NOT NULL AND (gpus.sample_at IS NULL OR $10 >= gpus.sample_at)
                                  THEN EXCLUDED.sample_metrics ELSE gpus.sample_metrics END,
            sample_at = CASE WHEN $10 IS NOT NULL AND (gpus.sample_at IS NULL OR $10 >= gpus.sample_at)
                             THEN $10 ELSE gpus.sample_at END""",
    # A placement replaces the shown job only if it is not older; an eviction clears the GPU only
    # if it evicts the job shown (placements of two jobs may be read in either order).
    GpuOfflineChanged: """
        INSERT INTO gpus (gpu_id, node_id, offline_job, sm_share, offline_since, changed_at)
        VALUES ($1, $2, CASE WHEN $6 THEN $3 END, CASE WHEN $6 THEN $4::float8 END, CASE WHEN $6 THEN $5::timestamptz END, $5)
        ON CONFLICT (gpu_id) DO UPDATE SET
            offline_job = CASE WHEN $6 AND (gpus.offline_since IS NULL OR $5 >= gpus.offline_since) THEN $3
                               WHEN NOT $6 AND gpus.offline_job = $3 THEN NULL ELSE gpus.offline_job END,
            sm_share = CASE WHEN $6 AND (gpus.offline_since IS NULL OR $5 >= gpus.offline_since) THEN $4::float8
                            WHEN NOT $6 AND gpus.offline_job = $3 THEN NULL ELSE gpus.sm_share END,
            offline_since = CASE WHEN $6 AND (gpus.offline_since IS NULL OR $5 >= gpus.offline_since) THEN $5
                                 ELSE gpus.offline_since END,
            changed_at = GREATEST(gpus.changed_at, EXCLUDED.changed_at)""",
    # A configuration replaces the quotas only if it is newer than the one shown (see `apply`).
    VcQuotasChanged: """
        INSERT INTO vc_quotas (vc, guaranteed_gpus, config_version) SELECT vc, gpus, $3 FROM unnest($1::text[], $2::int[]) AS q(vc, gpus)""",
    GpuEventRow: """
        INSERT INTO gpu_events (gpu_id, event_id, occurred_at, topic, partition, "offset", kind, what, reason, inputs)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb) ON CONFLICT (gpu_id, event_id) DO NOTHING""",
    FaultRow: """
        INSERT INTO faults (event_id, gpu_id, node_id, kind, detail, xid, job_id, remediation, occurred_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (event_id) DO NOTHING""",
    # A lane job's latest lane (migration 0011): a later bound by event time replaces it.
    LaneJobBound: """
        INSERT INTO lane_jobs (job_id, lane_gpu, node_id, gpu_id, lane_id, lane_size_mib, policy, inputs, bound_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9)
        ON CONFLICT (job_id) DO UPDATE SET lane_gpu = EXCLUDED.lane_gpu, node_id = EXCLUDED.node_id, gpu_id = EXCLUDED.gpu_id,
            lane_id = EXCLUDED.lane_id, lane_size_mib = EXCLUDED.lane_size_mib, policy = EXCLUDED.policy, inputs = EXCLUDED.inputs,
            bound_at = EXCLUDED.bound_at
        WHERE EXCLUDED.bound_at >= lane_jobs.bound_at""",
    # A job's progress (migration 0011): the most iterations, the latest report's figures.
    JobProgress: """
        INSERT INTO job_progress (job_id, iterations_done, iterations_total, throughput_it_s, node_id, gpu_ids, reported_at)
        VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7)
        ON CONFLICT (job_id) DO UPDATE SET
            iterations_done = GREATEST(job_progress.iterations_done, EXCLUDED.iterations_done),
            iterations_total = GREATEST(job_progress.iterations_total, EXCLUDED.iterations_total),
            throughput_it_s = CASE WHEN EXCLUDED.reported_at >= job_progress.reported_at THEN EXCLUDED.throughput_it_s
                                   ELSE job_progress.throughput_it_s END,
            node_id = CASE WHEN EXCLUDED.reported_at >= job_progress.reported_at THEN EXCLUDED.node_id ELSE job_progress.node_id END,
            gpu_ids = CASE WHEN EXCLUDED.reported_at >= job_progress.reported_at THEN EXCLUDED.gpu_ids ELSE job_progress.gpu_ids END,
            reported_at = GREATEST(job_progress.reported_at, EXCLUDED.reported_at)""",
    # Per-tenant accounting (migration 0008, `projection.usage`): an end is the earliest close at
    # or after the start (`least`), so the order the topics are read in does not matter.
    UsageStarted: """
        WITH closed AS (
            UPDATE usage_intervals SET ended_at = least(coalesce(ended_at, $5), $5)
            WHERE job_id = $1 AND started_at < $5 AND (resource = $2 OR ($3 = 'shared' AND kind = 'shared')))
        INSERT INTO usage_intervals (job_id, resource, kind, gpus, started_at) VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (job_id, resource, started_at) DO NOTHING""",
    UsageEnded: """
        UPDATE usage_intervals SET ended_at = least(coalesce(ended_at, $3), $3) WHERE job_id = $1 AND resource = $2 AND started_at <= $3""",
    JobEnded: """
        INSERT INTO job_ends (job_id, ended_at) VALUES ($1, $2)
        ON CONFLICT (job_id) DO UPDATE SET ended_at = least(job_ends.ended_at, EXCLUDED.ended_at)""",
    SharingObserved: """
        INSERT INTO sharing_observations (event_id, job_id, gpu_id, online_workload, window_start, window_end, normalized_throughput,
                                          online_slowdown)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (event_id) DO NOTHING""",
    # Online services (migration 0009, `projection.online`): a replica's row moves only to a window
    # that ends later (ties: the greater event id), so duplicates, replays and late reports change nothing.
    OnlineServiceSubmitted: """
        INSERT INTO online_services (job_id, model, replicas, slo_p99_ms, request_rate, submitted_at) VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (job_id) DO UPDATE SET model = EXCLUDED.model, replicas = EXCLUDED.replicas, slo_p99_ms = EXCLUDED.slo_p99_ms,
            request_rate = EXCLUDED.request_rate, submitted_at = EXCLUDED.submitted_at""",
    ReplicaLatency: """
        INSERT INTO online_latency (service, gpu_id, node_id, window_start, window_end, p50_ms, p99_ms, slo_p99_ms, request_rate,
                                    offline_job_id, sm_share, launch_target, event_id)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
        ON CONFLICT (service, gpu_id) DO UPDATE SET node_id = EXCLUDED.node_id, window_start = EXCLUDED.window_start,
            window_end = EXCLUDED.window_end, p50_ms = EXCLUDED.p50_ms, p99_ms = EXCLUDED.p99_ms, slo_p99_ms = EXCLUDED.slo_p99_ms,
            request_rate = EXCLUDED.request_rate, offline_job_id = EXCLUDED.offline_job_id, sm_share = EXCLUDED.sm_share,
            launch_target = EXCLUDED.launch_target, event_id = EXCLUDED.event_id
        WHERE (EXCLUDED.window_end, EXCLUDED.event_id) > (online_latency.window_end, online_latency.event_id)""",
    # Where a replica serves (migration 0014, issue 29): the latest ready report (ties: the greater event id).
    ReplicaEndpoint: """
        INSERT INTO online_endpoints (service, gpu_id, node_id, endpoint, ready_at, event_id) VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (service, gpu_id) DO UPDATE SET node_id = EXCLUDED.node_id, endpoint = EXCLUDED.endpoint,
            ready_at = EXCLUDED.ready_at, event_id = EXCLUDED.event_id
        WHERE (EXCLUDED.ready_at, EXCLUDED.event_id) > (online_endpoints.ready_at, online_endpoints.event_id)""",
    ProtectionStep: """
        INSERT INTO slo_protection_steps (event_id, gpu_id, node_id, service, offline_job_id, step, level, p99_ms, slo_p99_ms,
                                          launch_target, sm_share, reason, occurred_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) ON CONFLICT (event_id) DO NOTHING""",
}


_STATES_INSERT = """
    INSERT INTO jobs (job_id, state, last_reason, updated_at)
    SELECT job_id, state, reason, at FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[])
        AS f(job_id, state, reason, from_suspended, from_suspended_reason, at)
    ON CONFLICT (job_id) DO NOTHING"""
_STAGING = "CREATE TEMP TABLE IF NOT EXISTS job_events_in (LIKE job_events) ON COMMIT DELETE ROWS"
_JOB_EVENT_COLUMNS = ("job_id", "event_id", "occurred_at", "topic", "partition", "offset", "kind", "what", "reason", "inputs")


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def _args(change: Change) -> tuple[Any, ...]:
    match change:
        case JobSubmitted():
            return (change.job_id, change.vc, change.kind, change.priority, change.priority_value, change.pods, change.gpus, change.at,
                    _json(change.limits))
        case JobPriorityChanged():
            return change.job_id, change.priority_value, change.at
        case JobRestarted():
            return change.job_id, change.restarts, change.at
        case JobStateChanged():
            return change.job_id, change.state, change.reason, change.at
        case JobBindingChanged():
            return change.job_id, change.pod, _json(change.binding), change.at
        case JobPlacementChanged():
            return change.job_id, _json(change.placement), change.at
        case JobEventRow() | GpuEventRow():
            p = change.position
            subject = change.job_id if isinstance(change, JobEventRow) else change.gpu_id
            return (subject, change.event_id, change.at, p.topic, p.partition, p.offset, change.kind, change.what,
                    change.reason, _json(change.inputs))  # fmt: skip
        case GpuHealthChanged():
            return (change.gpu_id, change.node_id, change.gpu_type, change.health, change.cause, change.reason,
                    _json(change.metrics), change.online_workload, change.at, change.sample_at)  # fmt: skip
        case GpuOfflineChanged():
            return change.gpu_id, change.node_id, change.job_id, change.sm_share, change.at, change.placed
        case VcQuotasChanged():
            return change.version, change.at
        case FaultRow():
            return (change.event_id, change.gpu_id, change.node_id, change.kind, change.detail, change.xid, change.job_id,
                    change.remediation, change.at)  # fmt: skip
        case UsageStarted():
            return change.job_id, change.resource, change.kind, change.gpus, change.at
        case UsageEnded():
            return change.job_id, change.resource, change.at
        case JobEnded():
            return change.job_id, change.at
        case LaneGpuChanged():
            return change.job_id, change.vc, change.priority, change.state, change.reason, change.at, change.marks
        case LaneJobBound():
            return (change.job_id, change.lane_gpu, change.node_id, change.gpu_id, change.lane_id, change.lane_size_mib, change.policy,
                    _json(change.inputs), change.at)  # fmt: skip
        case JobProgress():
            return (change.job_id, change.iterations_done, change.iterations_total, change.throughput_it_s, change.node_id,
                    _json(list(change.gpu_ids)), change.at)  # fmt: skip
        case SharingObserved() | OnlineServiceSubmitted() | ReplicaLatency() | ProtectionStep() | ReplicaEndpoint():
            return astuple(change)
    raise TypeError(f"not a read-model change: {change!r}")


async def write_changes(conn: Any, changes: Sequence[Change], logs: LogRetention = LogRetention()) -> None:
    """`changes` in one go per kind, in a fixed order (kinds write disjoint columns); jobs' logs
    (their own tables) last, under ``logs`` (`store.logs`)."""
    grouped: dict[type, list[tuple[Any, ...]]] = {}
    log_changes = []
    for change in changes:
        if isinstance(change, LogChunkStored | LogsSwept):
            log_changes.append(change)
            continue
        grouped.setdefault(type(change), []).append(_args(change))
    for kind in _STATEMENTS:
        if kind not in grouped:
            continue
        if kind is JobStateChanged:
            folded = fold_states([c for c in changes if isinstance(c, JobStateChanged)])
            columns = [list(column) for column in zip(*(astuple(f) for f in folded), strict=True)]
            await conn.execute(_STATEMENTS[kind], *columns)
            await conn.execute(_STATES_INSERT, *columns)
        elif kind is VcQuotasChanged:
            for quotas in (c for c in changes if isinstance(c, VcQuotasChanged)):
                if await conn.fetchval("SELECT $1 > coalesce(max(config_version), 0) FROM vc_quotas", quotas.version):
                    await conn.execute("DELETE FROM vc_quotas")
                    vcs = sorted(quotas.guaranteed_gpus)
                    await conn.execute(_STATEMENTS[kind], vcs, [quotas.guaranteed_gpus[v] for v in vcs], quotas.version)
        elif kind is ReplicaLatency:  # the batch's latest per replica only (the upsert keeps the latest anyway)
            latest = fold_latency([c for c in changes if isinstance(c, ReplicaLatency)])
            await conn.executemany(_STATEMENTS[kind], [astuple(r) for _, r in sorted(latest.items())])
        elif kind is JobProgress:  # the batch's folded progress per job (the upsert is order-independent anyway)
            folded = fold_progress([c for c in changes if isinstance(c, JobProgress)])
            await conn.executemany(_STATEMENTS[kind], [_args(c) for _, c in sorted(folded.items())])
        elif kind is JobEventRow:
            await conn.execute(_STAGING)
            await conn.copy_records_to_table("job_events_in", records=grouped[kind], columns=_JOB_EVENT_COLUMNS)
            await conn.execute(_STATEMENTS[kind])
        else:
            await conn.executemany(_STATEMENTS[kind], grouped[kind])
    if log_changes:
        await write_log_changes(conn, log_changes, logs)


def without_nul(change: Change) -> Change:
    """`change` with every NUL character in its text replaced by U+FFFD: PostgreSQL's text and
    jsonb cannot hold NUL, and a reason or an input may carry one (a schema-valid string)."""
    return replace(change, **{f.name: _no_nul(getattr(change, f.name)) for f in fields(change)})  # type: ignore[type-var]


def _no_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_no_nul(k): _no_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(_no_nul(v) for v in value)
    return value
