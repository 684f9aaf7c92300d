"""Why a job was placed, why it is not placed, why it was stopped: the plan's explanations.

MuxFlow's scheduler (preprint §5) says nothing about explaining itself; hivemux requires that
every decision carry its reason and inputs (ARCHITECTURE.md, "Every decision can explain
itself"), so "why was my job not placed" has an answer from the topics alone. The texts are
computed from the same arrays the plan was solved on (`BipartiteGraph`), per class, so
explaining 5,000 refusals costs one text per job class.

- `pair_inputs`: the numbers a placement was computed from (prediction inputs and outputs,
  share, memory, bound); the `Placement` event's ``inputs``.
- `placement_reason`: the pair, its share, prediction, memory checks and the plan's reason.
- `why_not_placed`: for a job with no GPU, either "feasible on n GPU(s) (best ...) but
  <lost>" or, when no pair is feasible, each exclusion with how many GPUs it ruled out and an
  example (`policy.feasible_pairs`).
- `why_stopped`: a running job leaves its GPU because the plan gains more than its restart
  cost there, or because its pair is no longer feasible.

Worked example: a job peaking at 7,000 MiB in a round with one T4 (quota 6,144 MiB) reads
"no feasible GPU among 1: over memory quota on 1 (e.g. node-00/gpu-0: memory peak 7000 MiB >
quota 6144 MiB)".
"""

from __future__ import annotations

import numpy as np

from .bipartite_graph import BipartiteGraph, online_activity_class


def pair_inputs(graph: BipartiteGraph, gi: int, ji: int, name: str) -> dict[str, float | str]:
    g, j = graph.gpus[gi], graph.jobs[ji]
    a, b = graph.gpu_class[gi], graph.job_class[ji]
    version = graph.versions[a]
    return {
        "policy": name,
        "gpu_type": g.gpu_type,
        "online_workload": g.online_workload,
        "model_version": float(version) if version is not None else -1.0,
        "online_sm_activity": g.sm_activity,
        "online_sm_activity_class": float(online_activity_class(g.sm_activity)),
        "online_gpu_util": g.gpu_util,
        "offline_sm_activity": j.sm_activity,
        "offline_gpu_util": j.gpu_util,
        "offline_sm_occupancy": j.sm_occupancy,
        "offline_iteration_time_ms": j.iteration_time_ms,
        "sm_share": float(graph.share[a]),
        "memory_peak_mib": j.memory_peak_mib,
        "memory_quota_mib": graph.policy.memory_quota_mib(g.memory_total_mib),
        "memory_free_mib": g.memory_total_mib - g.memory_used_mib,
        "slowdown_bound": graph.policy.slowdown_bound,
        "predicted_normalized_throughput": float(graph.throughput[a, b]),
        "predicted_online_slowdown": float(graph.slowdown[a, b]),
        "sharing_mode": "time_sliced" if g.time_sliced else "mps",
    }


def placement_reason(graph: BipartiteGraph, gi: int, ji: int, why: str, moved_from: str | None) -> str:
    g, j = graph.gpus[gi], graph.jobs[ji]
    a, b = graph.gpu_class[gi], graph.job_class[ji]
    t, s, share = float(graph.throughput[a, b]), float(graph.slowdown[a, b]), float(graph.share[a])
    policy = graph.policy
    quota = policy.memory_quota_mib(g.memory_total_mib)
    free = g.memory_total_mib - g.memory_used_mib
    move = f" (moved from {moved_from}: the gain exceeds its restart cost {policy.restart_cost:.3f})" if moved_from else ""
    if g.time_sliced:  # issue 30 item 4: no MPS share; the time-slicing model at the online utilization
        move += f" time-sliced (no MPS; online GPU utilization {g.gpu_util:.1f}%, time-slicing model)"
    return (
        f"{j.job_id} -> {g.gpu_id} on {g.node_id} beside {g.online_workload}{move} "
        f"(online SM activity {g.sm_activity:.1f}%): SM share {share:.1f}%, predicted normalized "
        f"throughput {t:.3f}, online slowdown {s:.3f} <= bound {policy.slowdown_bound:.3f}; "
        f"memory peak {j.memory_peak_mib:.0f} MiB <= quota {quota:.0f} MiB and free {free:.0f} MiB; {why}"
    )


def why_not_placed(graph: BipartiteGraph, b: int, lost: str) -> str:
    """Why the jobs of class ``b`` have no GPU; ``lost`` says what took their feasible GPUs."""
    if not graph.gpus:
        return "no online GPU can take an offline job this round"
    feasible = graph.feasible[:, b]
    sizes = graph.class_size
    if feasible.any():
        count = int(sizes[feasible].sum())
        weights = np.where(feasible, graph.throughput[:, b], -np.inf)
        best = int(np.argmax(weights))  # first of equals: smallest class, i.e. smallest key
        return (
            f"feasible on {count} GPU(s) (best {graph.gpus[graph.class_rep[best]].gpu_id}: predicted normalized throughput "
            f"{graph.throughput[best, b]:.3f}) but {lost}"
        )
    policy = graph.policy
    rep_job = graph.jobs[graph.job_rep[b]]
    peak = f"memory peak {rep_job.memory_peak_mib:.0f} MiB"
    causes: list[tuple[str, np.ndarray, object]] = [
        ("no speed model", ~graph.has_model, lambda g, a: f"no speed model for GPU type {g.gpu_type}"),
        (
            "over memory quota",
            ~graph.quota_ok[:, b],
            lambda g, a: f"{peak} > quota {policy.memory_quota_mib(g.memory_total_mib):.0f} MiB",
        ),
        ("too little free memory", ~graph.free_ok[:, b], lambda g, a: f"{peak} > free {g.memory_total_mib - g.memory_used_mib:.0f} MiB"),
        (
            "slowdown over bound",
            graph.has_model & (graph.slowdown[:, b] > policy.slowdown_bound),
            lambda g, a: f"predicted online slowdown {graph.slowdown[a, b]:.3f} > bound {policy.slowdown_bound:.3f}",
        ),
        (
            "no throughput",
            graph.has_model & ~(graph.throughput[:, b] > 0.0),
            lambda g, a: f"predicted normalized throughput {graph.throughput[a, b]:.3f} <= 0",
        ),
    ]
    if graph.barred is not None:  # `slo_cooldown`: the job was evicted from the GPU by SLO protection
        causes.append(("kept off after an SLO eviction", graph.barred[:, b], lambda g, a: graph.bar_reasons.get((a, b), "")))
    details = []
    for kind, mask, text in sorted(causes, key=lambda c: c[0]):
        if mask.any():
            first = int(np.argmax(mask))
            g = graph.gpus[graph.class_rep[first]]
            details.append(f"{kind} on {int(sizes[mask].sum())} (e.g. {g.gpu_id}: {text(g, first)})")  # type: ignore[operator]
    return f"no feasible GPU among {len(graph.gpus)}: " + "; ".join(details)


def why_stopped(graph: BipartiteGraph, ji: int, still_feasible: bool, name: str, total: float, lost: str) -> str:
    """Why running job ``ji`` leaves its GPU without a new one."""
    j = graph.jobs[ji]
    if still_feasible:
        because = (
            f"the {name} plan (total {total:.3f}) gains more than its restart cost "
            f"{graph.policy.restart_cost:.3f} by giving the GPU to other jobs"
        )
    else:
        because = "no longer feasible there: " + why_not_placed(graph, int(graph.job_class[ji]), lost)
    return f"{j.job_id} leaves {j.running_on}: " + because


def fcfs_reason(position: int, of: int) -> str:
    return f"FCFS: job {position} of {of} in submission order, first feasible free GPU by gpu_id"
