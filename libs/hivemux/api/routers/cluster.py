"""``/api/v1/cluster``: nodes, GPUs (health state, cause, online service, offline job, SM share,
and one GPU's state history with causes), VCs with their cells and queues, placements, faults,
and the status summary. Health and capacity are cluster-wide (any token sees them); jobs are
a tenant's only: another tenant's job names are not shown (`views.gpu_json`), queues and
placements list the tenant's VCs only."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from ...projection.explain import QUEUED_STATES, explain_gpu, last_sample, vc_queues
from ...store.lanes import lane_gpus, lane_jobs, lane_line
from ...store.read_models import ReadModelStore
from ...store.tokens import Principal
from ..auth import principal, require_vc
from ..metrics import cluster_metrics, scoped
from ..views import gpu_json

router = APIRouter(prefix="/api/v1/cluster", tags=["cluster"])
HEALTH = ("Init", "Healthy", "Unhealthy", "Overlimit", "Disabled")
_GPUS = "SELECT g.*, j.vc AS offline_vc FROM gpus AS g LEFT JOIN jobs AS j ON j.job_id = g.offline_job"


def _gpu(row: Any) -> dict[str, Any]:
    return {**dict(row), "health_metrics": json.loads(row["health_metrics"]), "sample_metrics": json.loads(row["sample_metrics"])}


@router.get("/status", summary="`hivemux status`: GPUs by health, jobs by state, VCs (a tenant: job lists of its VCs only)")
async def status(request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
    summary = await ReadModelStore(request.app.state.pool).status_summary()
    scope = who.scope()
    if scope is None:
        return summary
    mine = {r["job_id"] for r in await request.app.state.pool.fetch("SELECT job_id FROM jobs WHERE vc = ANY($1::text[])", list(scope))}
    for key in ("offline_sharing", "offline_shared", "waiting", "online_services", "training_bound", "training_bound_now", "lane_jobs", "lane_gpus"):
        summary[key] = [row for row in summary[key] if row["job_id"] in mine]
    summary["vcs"] = [v for v in summary["vcs"] if v["vc"] in scope]
    return summary


@router.get("/lanes", summary="Salus lanes: the lane GPUs (VC, priority class, GPU, C, policy) and the lane jobs on them (lane, state, "
            "iterations); a tenant: its VCs' only")
async def lanes(request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
    scope = who.scope()
    vcs = None if scope is None else list(scope)
    jobs = await lane_jobs(request.app.state.pool, vcs=vcs)
    return {"lane_gpus": await lane_gpus(request.app.state.pool, vcs=vcs), "lane_jobs": [j | {"line": lane_line(j)} for j in jobs]}


@router.get("/metrics", summary="Cluster gauges for charts: GPUs by health, mean utilization and SM activity, oversold GPUs, queues")
async def metrics(request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
    async with request.app.state.pool.acquire() as conn:
        return scoped(await cluster_metrics(conn), who.scope())


@router.get("/nodes", summary="Nodes: their GPUs by health state, and whether the cell allocator treats them as bad")
async def nodes(request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
    rows = await request.app.state.pool.fetch(
        "SELECT node_id, count(*)::int AS gpus, jsonb_object_agg(gpu_id, health) AS health, bool_or(health = 'Disabled') AS bad "
        "FROM gpus WHERE node_id IS NOT NULL GROUP BY node_id ORDER BY node_id")
    return {"nodes": [{"node_id": r["node_id"], "gpus": r["gpus"], "health": json.loads(r["health"]), "bad": bool(r["bad"])} for r in rows]}


@router.get("/gpus", summary="GPUs by id: health state and cause, online service, offline job and SM share, last sample")
async def gpus(
    request: Request, who: Principal = Depends(principal), health: str | None = Query(None, pattern="^(" + "|".join(HEALTH) + ")$")
) -> dict[str, Any]:
    rows = await request.app.state.pool.fetch(f"{_GPUS} WHERE ($1::text IS NULL OR g.health = $1) ORDER BY g.gpu_id", health)
    return {"gpus": [{**gpu_json(_gpu(r), who.scope()), "last_sample": last_sample(_gpu(r))} for r in rows]}


@router.get("/gpus/{gpu_id:path}", summary="One GPU: its state now and every state change with its cause (`hivemux gpus explain`)")
async def gpu(request: Request, gpu_id: str, who: Principal = Depends(principal)) -> dict[str, Any]:
    row = await request.app.state.pool.fetchrow(f"{_GPUS} WHERE g.gpu_id = $1", gpu_id)
    events = await ReadModelStore(request.app.state.pool).gpu_history(gpu_id)
    if row is None and not events:
        raise HTTPException(404, f"no GPU {gpu_id} in the read model")
    scope = who.scope()
    shown = _gpu(row) if row is not None else {"gpu_id": gpu_id}
    if scope is not None and shown.get("offline_job") and shown.get("offline_vc") not in scope:
        shown["offline_job"] = "(other tenant)"
    explanation = explain_gpu(shown, events)
    if scope is not None:  # placements of other tenants' jobs: the decision stays, the job's name does not
        mine = {r["job_id"] for r in await request.app.state.pool.fetch("SELECT job_id FROM jobs WHERE vc = ANY($1::text[])", list(scope))}
        explanation = json.loads(json.dumps(explanation, default=str), object_hook=lambda d: _mask(d, mine))
    return explanation


def _mask(d: dict[str, Any], mine: set[str]) -> dict[str, Any]:
    if isinstance(d.get("job_id"), str) and d["job_id"] not in mine:
        d["job_id"] = "(other tenant)"
    return d


@router.get("/vcs", summary="Per VC: guaranteed, used, opportunistic, free and bad GPUs, and its queues in order (`hivemux vcs`)")
async def vcs(request: Request, who: Principal = Depends(principal), vc: str | None = None) -> dict[str, Any]:
    if vc is not None:
        require_vc(who, vc, f"VC {vc}")
    store = ReadModelStore(request.app.state.pool)
    scope = who.scope()
    wanted = [vc] if vc is not None else None if scope is None else list(scope)
    if wanted is None:
        queued, since = await store.queues(QUEUED_STATES)
        cells = await store.vc_cells()
    else:  # only the VCs asked for: their queues, their rows of the summary
        queued, since = [], {}
        for name in wanted:
            jobs, when = await store.queue(name, QUEUED_STATES)
            queued, since = queued + jobs, since | when
        cells = [dict(r) for r in await request.app.state.pool.fetch("SELECT * FROM vc_cells WHERE vc = ANY($1::text[]) ORDER BY vc", wanted)]
    shown = vc_queues(cells, queued, since)
    return {"vcs": [v for v in shown if (vc is None or v["vc"] == vc) and (scope is None or v["vc"] in scope)]}


@router.get("/placements", summary="Where jobs run now: offline jobs' GPU shares and training jobs' bound cells")
async def placements(request: Request, who: Principal = Depends(principal), vc: str | None = None) -> dict[str, Any]:
    if vc is not None:
        require_vc(who, vc, f"VC {vc}")
    rows = await request.app.state.pool.fetch(
        "SELECT job_id, vc, kind, state, placement, binding FROM jobs WHERE (placement IS NOT NULL OR binding <> '{}'::jsonb) "
        "AND state NOT IN ('completed', 'failed', 'rejected', 'cancelled', 'stopped', 'suspended', 'evicted', 'preempted') "
        "AND ($1::text IS NULL OR vc = $1) AND ($2::text[] IS NULL OR vc = ANY($2)) ORDER BY job_id",
        vc, None if who.scope() is None else list(who.scope() or ()),
    )  # fmt: skip
    return {"placements": [{"job_id": r["job_id"], "vc": r["vc"], "kind": r["kind"], "state": r["state"],
                            "placement": json.loads(r["placement"]) if r["placement"] else None, "binding": json.loads(r["binding"])}
                           for r in rows]}  # fmt: skip


@router.get("/faults", summary="Faults seen on GPUs (Xid errors, ...), newest first, with the remediation")
async def faults(request: Request, who: Principal = Depends(principal), limit: int = Query(200, ge=1, le=10_000)) -> dict[str, Any]:
    rows = await request.app.state.pool.fetch(
        "SELECT f.*, j.vc AS job_vc FROM faults AS f LEFT JOIN jobs AS j ON j.job_id = f.job_id ORDER BY f.occurred_at DESC LIMIT $1", limit)
    scope = who.scope()
    out = []
    for r in rows:
        row = {k: (v.isoformat() if hasattr(v, "isoformat") else str(v) if k == "event_id" else v) for k, v in dict(r).items() if k != "job_vc"}
        if scope is not None and row["job_id"] and r["job_vc"] not in scope:
            row["job_id"] = "(other tenant)"
        out.append(row)
    return {"faults": out}
