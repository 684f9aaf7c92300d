"""Cluster gauges for a console's charts, from the read models (`GET /api/v1/cluster/metrics`
and the change stream's ``metrics`` events, every `ChangeFeed.metrics_interval_s`).

What the read models hold now: GPUs by health state; the mean GPU utilization and SM activity
of each GPU's last sample (the sample of its latest metric-driven health transition: the
projector does not fold the 1 Hz telemetry, so these move when health does); oversold GPUs
(an online GPU lent to an offline job, MuxFlow's sharing); the queue length per VC (jobs in
`QUEUED_STATES`) and running jobs. ``online_slowdown_mean`` is the mean predicted online
slowdown of the offline jobs sharing GPUs now (the matcher's prediction); each online service's
measured p99 is in the read models since migration 0009 (``GET /api/v1/services``). A console draws them over time by keeping what
the stream sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ..projection.explain import QUEUED_STATES

_GPUS = """SELECT count(*)::int AS gpus, count(offline_job)::int AS oversold,
    avg((sample_metrics ->> 'gpu_util')::float8) AS gpu_util, avg((sample_metrics ->> 'sm_activity')::float8) AS sm_activity FROM gpus"""
_HEALTH = "SELECT health, count(*)::int AS n FROM gpus WHERE health IS NOT NULL GROUP BY health ORDER BY health"
_QUEUES = "SELECT vc, count(*)::int AS n FROM jobs WHERE vc IS NOT NULL AND state = ANY($1::text[]) GROUP BY vc ORDER BY vc"
_RUNNING = "SELECT vc, count(*)::int AS n FROM jobs WHERE vc IS NOT NULL AND state = 'running' GROUP BY vc ORDER BY vc"
_SLOWDOWN = """SELECT avg((placement ->> 'predicted_online_slowdown')::float8) FROM jobs WHERE placement IS NOT NULL
    AND state NOT IN ('completed', 'failed', 'rejected', 'cancelled', 'stopped', 'suspended', 'evicted', 'preempted')"""


async def cluster_metrics(conn: Any) -> dict[str, Any]:
    """Every VC's gauges (`scoped` narrows them to a principal's VCs)."""
    gpus = await conn.fetchrow(_GPUS)
    queues = {r["vc"]: r["n"] for r in await conn.fetch(_QUEUES, list(QUEUED_STATES))}
    running = {r["vc"]: r["n"] for r in await conn.fetch(_RUNNING)}
    slowdown = await conn.fetchval(_SLOWDOWN)
    by_health = {r["health"]: r["n"] for r in await conn.fetch(_HEALTH)}
    return {
        "at": datetime.now(UTC).isoformat(), "gpus": gpus["gpus"],
        "gpus_by_health": by_health,
        "gpu_util_mean": gpus["gpu_util"], "sm_activity_mean": gpus["sm_activity"], "oversold_gpus": gpus["oversold"],
        "online_slowdown_mean": slowdown, "queue_length": queues, "running_jobs": running,
    }  # fmt: skip


def scoped(metrics: dict[str, Any], scope: Sequence[str] | None) -> dict[str, Any]:
    if scope is None:
        return metrics
    return {**metrics, "queue_length": {vc: n for vc, n in metrics["queue_length"].items() if vc in scope},
            "running_jobs": {vc: n for vc, n in metrics["running_jobs"].items() if vc in scope}}  # fmt: skip
