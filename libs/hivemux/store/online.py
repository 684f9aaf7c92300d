"""Online services from the read models (migration 0009, folded by `projection.online`): what
``GET /api/v1/services``, an online job's describe, the console and `hivemux status` show.

Per service: its job row (VC, state) and submission (model, replicas, SLO, rate); its replicas
bound now (pods of ``jobs.binding``; none once it ended or is suspended), each with its GPU's
latest latency window and, for a service's own command, its endpoint (migration 0015); the latest protection step per GPU it was taken for and its steps by
kind. `projection.online.service_view` shapes one service.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from ..projection.online import service_view

_NOT_BOUND = ["completed", "failed", "rejected", "cancelled", "stopped", "suspended"]

_SERVICES = """
SELECT j.job_id, j.vc, j.state, s.model, coalesce(s.replicas, j.pods) AS replicas, s.slo_p99_ms, s.request_rate, j.binding
FROM jobs AS j LEFT JOIN online_services AS s USING (job_id)
WHERE j.kind = 'online' AND ($1::text[] IS NULL OR j.vc = ANY($1)) AND ($2::text[] IS NULL OR j.job_id = ANY($2))
ORDER BY j.job_id"""
_LATENCY = """
SELECT l.service, l.gpu_id, l.node_id, l.window_start, l.window_end, l.p50_ms, l.p99_ms, l.slo_p99_ms AS report_slo_p99_ms,
       l.request_rate, l.offline_job_id, l.sm_share, l.launch_target, o.vc AS offline_vc
FROM online_latency AS l LEFT JOIN jobs AS o ON o.job_id = l.offline_job_id WHERE l.service = ANY($1) AND l.gpu_id = ANY($2)"""
_ENDPOINTS = "SELECT service, gpu_id, endpoint, ready_at FROM online_endpoints WHERE service = ANY($1) AND gpu_id = ANY($2)"
_STEPS = """
SELECT DISTINCT ON (p.service, p.gpu_id) p.*, o.vc AS offline_vc
FROM slo_protection_steps AS p LEFT JOIN jobs AS o ON o.job_id = p.offline_job_id WHERE p.service = ANY($1)
ORDER BY p.service, p.gpu_id, p.occurred_at DESC, p.event_id DESC"""
_COUNTS = "SELECT service, step, count(*)::int AS n FROM slo_protection_steps WHERE service = ANY($1) GROUP BY service, step"


def _iso(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else str(v) if k == "event_id" else v) for k, v in row.items()}


async def online_services(
    pool: asyncpg.Pool, *, vcs: Sequence[str] | None = None, job_ids: Sequence[str] | None = None, scope: Sequence[str] | None = None
) -> list[dict[str, Any]]:  # fmt: skip
    """The online services of `vcs` (None: every VC), or these `job_ids`, by id (`service_view`);
    `scope`: the VCs of the principal asking (other tenants' offline neighbours are masked)."""
    async with pool.acquire() as conn:
        services = await conn.fetch(_SERVICES, None if vcs is None else list(vcs), None if job_ids is None else list(job_ids))
        ids = [r["job_id"] for r in services]
        bindings = {r["job_id"]: json.loads(r["binding"]) if r["state"] not in _NOT_BOUND else {} for r in services}
        # only the GPUs bound now: rows of other GPUs (moved replicas, or reports naming any GPU) are never read
        gpus = sorted({g for binding in bindings.values() for spec in binding.values() for g in spec.get("gpu_ids", ())})
        latency = await conn.fetch(_LATENCY, ids, gpus)
        endpoints = {(r["service"], r["gpu_id"]): (r["endpoint"], r["ready_at"].isoformat()) for r in await conn.fetch(_ENDPOINTS, ids, gpus)}
        steps = await conn.fetch(_STEPS, ids)
        counts = await conn.fetch(_COUNTS, ids)
    reports: dict[tuple[str, str], dict[str, Any]] = {(r["service"], r["gpu_id"]): _iso(dict(r)) for r in latency}
    out = []
    for s in services:
        replicas = []
        for pod, spec in sorted(bindings[s["job_id"]].items()):
            for gpu in spec.get("gpu_ids", ()):
                report = {k: v for k, v in reports.get((s["job_id"], gpu), {}).items() if k not in ("service", "gpu_id")}
                where, ready_at = endpoints.get((s["job_id"], gpu), (None, None))  # its own command's, once ready (issue 29)
                replicas.append({"pod": pod, "gpu_id": gpu, "node_id": (spec.get("node_ids") or [None])[0], **report,
                                 "endpoint": where, "ready_at": ready_at})
        own_steps = [_iso(dict(r)) for r in steps if r["service"] == s["job_id"]]
        own_counts = {r["step"]: r["n"] for r in counts if r["service"] == s["job_id"]}
        row = {k: v for k, v in dict(s).items() if k != "binding"}
        out.append(service_view(row, replicas, own_steps, own_counts, scope))
    return out
