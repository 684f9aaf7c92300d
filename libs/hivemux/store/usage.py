"""Per-tenant accounting from the read models (migration 0008, folded by `projection.usage`):
what `hivemux vcs usage` prints and the projector exports as Prometheus gauges.

Per VC over a window [since, until] (until: now, or the given time):
- ``guaranteed_gpu_hours`` / ``opportunistic_gpu_hours``: GPUs its bound pods held, by HiveD
  priority class; ``shared_gpu_hours``: online GPUs its offline jobs shared (MuxFlow);
- from the executors' sharing observations whose window ends in [since, until], weighted by
  window length: ``offline_normalized_throughput`` (shared / solo throughput, MuxFlow §5.2),
  ``offline_slowdown`` (1 / normalized throughput: iteration time against the solo profile;
  a window without progress counts as 100x), ``online_slowdown_caused`` (the mean relative
  latency increase of the online services its jobs shared with), ``online_slowdown_max`` and
  ``online_slowdown_gpu_hours`` (slowdown x shared hours: the harm to online work it owns);
  ``observations``: how many windows (0: the figures are None).

Each interval is clipped to the window and to its job's end (``job_ends``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

_GPU_HOURS = """
WITH held AS (
    SELECT j.vc, u.kind, u.gpus, greatest(u.started_at, $1) AS s,
           least(coalesce(u.ended_at, $2), $2, CASE WHEN e.ended_at >= u.started_at THEN e.ended_at END) AS t
    FROM usage_intervals AS u JOIN jobs AS j USING (job_id) LEFT JOIN job_ends AS e USING (job_id)
    WHERE j.vc IS NOT NULL
)
SELECT vc, kind, sum(gpus * greatest(extract(epoch FROM t - s), 0)) / 3600.0 AS gpu_hours FROM held GROUP BY vc, kind"""

_SHARING = """
WITH w AS (
    SELECT j.vc, o.normalized_throughput AS nt, o.online_slowdown AS slow,
           greatest(extract(epoch FROM o.window_end - o.window_start), 0.001) AS seconds
    FROM sharing_observations AS o JOIN jobs AS j USING (job_id)
    WHERE j.vc IS NOT NULL AND o.window_end > $1 AND o.window_end <= $2
)
SELECT vc, count(*) AS observations, sum(nt * seconds) / sum(seconds) AS offline_normalized_throughput,
       sum(seconds / greatest(nt, 0.01)) / sum(seconds) AS offline_slowdown,
       sum(slow * seconds) / sum(seconds) AS online_slowdown_caused, max(slow) AS online_slowdown_max,
       sum(greatest(slow, 0) * seconds) / 3600.0 AS online_slowdown_gpu_hours
FROM w GROUP BY vc"""

KINDS = ("guaranteed", "opportunistic", "shared")
# The sharing figures per VC and what each means (the projector's gauges hivemux_vc_<name>).
FIGURES = {
    "offline_normalized_throughput": "Time-weighted mean normalized throughput of a VC's offline jobs (shared / solo)",
    "offline_slowdown": "Time-weighted mean slowdown of a VC's offline jobs against their solo profile (x solo iteration time)",
    "online_slowdown_caused": "Time-weighted mean relative slowdown a VC's offline jobs caused to the online services they shared with",
    "online_slowdown_max": "Largest relative online slowdown a VC's offline jobs caused in one observation window",
    "online_slowdown_gpu_hours": "Online slowdown x shared hours a VC's offline jobs caused",
    "observations": "Sharing observation windows of a VC's offline jobs",
}
_SHARING_FIGURES = tuple(name for name in FIGURES if name != "observations")


async def vc_usage(pool: asyncpg.Pool, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """One row per VC that held GPUs or shared in the window (see the module docstring), by name."""
    async with pool.acquire() as conn:
        hours = await conn.fetch(_GPU_HOURS, since, until)
        sharing = await conn.fetch(_SHARING, since, until)
    return usage_rows([dict(r) for r in hours], [dict(r) for r in sharing])


def usage_rows(hours: list[dict[str, Any]], sharing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The two queries' rows merged per VC (VCs by name; absent figures 0 hours / None)."""
    out: dict[str, dict[str, Any]] = {}

    def row(vc: str) -> dict[str, Any]:
        if vc not in out:
            out[vc] = {"vc": vc, **{f"{k}_gpu_hours": 0.0 for k in KINDS}, "observations": 0, **dict.fromkeys(_SHARING_FIGURES)}
        return out[vc]

    for h in hours:
        if h["kind"] in KINDS:
            row(h["vc"])[f"{h['kind']}_gpu_hours"] = float(h["gpu_hours"] or 0.0)
    for s in sharing:
        r = row(s["vc"])
        r["observations"] = int(s["observations"])
        for figure in _SHARING_FIGURES:
            r[figure] = None if s[figure] is None else float(s[figure])
    return [out[vc] for vc in sorted(out)]
