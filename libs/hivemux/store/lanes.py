"""Salus lanes from the read models (migration 0011, folded by `projection.lanes`): what the
cluster status, a job's describe (CLI, API, console) and `hivemux jobs list --kind lane-gpu` show.

- `lane_jobs`: each lane job's latest lane (lane GPU, node, GPU, lane, ``L_j``, policy) with its
  state (``jobs``) and its progress (``job_progress``: iterations, throughput);
- `lane_gpus`: the lane GPUs (``jobs`` rows of kind ``lane-gpu``) with their VC, priority class,
  state, the GPU held now and, from their latest ``bound`` binding, capacity ``C`` and policy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from ..projection.lanes import lane_line

__all__ = ["lane_detail", "lane_gpus", "lane_jobs", "lane_line", "status_row"]

_LANE_JOBS = """
SELECT l.job_id, j.vc, j.state, l.lane_gpu, l.node_id, l.gpu_id, l.lane_id, l.lane_size_mib, l.policy, l.bound_at,
       p.iterations_done, p.iterations_total, p.throughput_it_s, p.reported_at
FROM lane_jobs AS l LEFT JOIN jobs AS j USING (job_id) LEFT JOIN job_progress AS p USING (job_id)
WHERE ($1::text[] IS NULL OR l.job_id = ANY($1)) AND ($2::text[] IS NULL OR j.vc = ANY($2))
ORDER BY l.gpu_id, l.lane_id, l.job_id"""
_LANE_GPUS = """
SELECT j.job_id, j.vc, j.priority, j.state, j.binding, j.last_reason,
       (SELECT e.inputs FROM job_events AS e WHERE e.job_id = j.job_id AND e.kind = 'binding' AND e.what = 'bound'
        ORDER BY e.occurred_at DESC, e.topic, e.partition, e."offset" DESC LIMIT 1) AS bound_inputs
FROM jobs AS j WHERE j.kind = 'lane-gpu' AND ($1::text[] IS NULL OR j.vc = ANY($1)) ORDER BY j.job_id"""


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


async def lane_jobs(pool: asyncpg.Pool, *, job_ids: Sequence[str] | None = None, vcs: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Lane jobs by GPU, lane and id (all of them, or `job_ids`; `vcs`: a tenant's scope); a job
    no executor reported on yet has ``iterations_done`` None."""
    rows = await pool.fetch(_LANE_JOBS, None if job_ids is None else list(job_ids), None if vcs is None else list(vcs))
    return [{k: _iso(v) for k, v in r.items()} for r in rows]


async def lane_gpus(pool: asyncpg.Pool, *, vcs: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Lane GPUs by id: VC, priority class, state, the GPU it holds now (none once released or
    preempted), capacity ``C`` and policy from its latest bound binding."""
    out = []
    for r in await pool.fetch(_LANE_GPUS, None if vcs is None else list(vcs)):
        binding = json.loads(r["binding"]) if r["binding"] else {}
        inputs = json.loads(r["bound_inputs"]) if r["bound_inputs"] else {}
        out.append({
            "job_id": r["job_id"], "vc": r["vc"], "priority": r["priority"], "state": r["state"], "reason": r["last_reason"],
            "gpu_ids": sorted(g for pod in binding.values() for g in pod.get("gpu_ids", ())),
            "node_ids": sorted({n for pod in binding.values() for n in pod.get("node_ids", ())}),
            "lane_group": inputs.get("lane_group"), "capacity_mib": inputs.get("lane_capacity_mib"), "policy": inputs.get("lane_policy"),
        })  # fmt: skip
    return out


def status_row(lane: dict[str, Any]) -> dict[str, Any]:
    """A lane job as `hivemux status` shows it (`status.ClusterStatus._lane_row`'s shape, plus
    its lane GPU, node and throughput)."""
    return {
        "job_id": lane["job_id"], "vc": lane["vc"], "gpu_id": lane["gpu_id"], "lane_id": lane["lane_id"], "policy": lane["policy"],
        "state": lane["state"], "iterations_done": lane["iterations_done"] or 0, "iterations_total": lane["iterations_total"] or 0,
        "lane_gpu": lane["lane_gpu"], "node_id": lane["node_id"], "throughput_it_s": lane["throughput_it_s"],
    }  # fmt: skip


async def lane_detail(pool: asyncpg.Pool, job: Any) -> dict[str, Any]:
    """What a job's describe adds (API, CLI, console): a lane job its ``lane`` (`lane_jobs`'s
    row and ``line``, `projection.lanes.lane_line`), a lane GPU (kind ``lane-gpu``) itself as
    ``lane_gpu`` with its lane jobs; any other job nothing."""
    if job.kind == "lane-gpu":
        [gpu] = [g for g in await lane_gpus(pool, vcs=[job.vc]) if g["job_id"] == job.job_id] or [None]
        if gpu is None:
            return {}
        on = await pool.fetch("SELECT job_id FROM lane_jobs WHERE lane_gpu = $1", job.job_id)
        jobs = await lane_jobs(pool, job_ids=[r["job_id"] for r in on])
        return {"lane_gpu": {**gpu, "lane_jobs": [r | {"line": lane_line(r)} for r in jobs]}}
    [lane] = await lane_jobs(pool, job_ids=[job.job_id]) or [None]
    return {} if lane is None else {"lane": lane | {"line": lane_line(lane)}}
