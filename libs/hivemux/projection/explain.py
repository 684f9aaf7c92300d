"""Why is a job (not) running, and what happened to a GPU: explanations built from the read
models' rows (`hivemux jobs explain`, `hivemux gpus explain`). Pure: the caller reads the job's
row, its events (``job_events``), the queue of its VC and the GPU's history (``gpu_events``)
and passes them in as plain data; this module returns a JSON-ready structure and its text.

A job's explanation:

- ``verdict``: one line answering the question (running where, or why not);
- ``waiting``: its waiting reasons, deduplicated by substance (`events.base.reason_substance`:
  the same words with other numbers are one reason, shown in its latest wording): each with how
  often it was told, first and last time. Since issue 16 the deciders tell a waiting job again
  only when the substance changes, so a count above 1 means the job went back to that reason
  after another (A, B, A), and "last" is when it was last told, not when it last held: a
  reason the job still waits for holds from its "last" time until now;
- ``queue``: while it waits, its position among the waiting jobs of its VC and kind (`QUEUED_STATES`,
  ranked by `queue_key`: guaranteed before opportunistic, higher HiveD priority value first,
  then earlier submission; `rank_queues`, which `hivemux vcs` lists too), the jobs ahead of it
  and what it waits for (the latest waiting reason);
- ``bindings``: the cells (chain, nodes, GPUs) each pod was bound to, released from or refused;
- ``placements``: offline placements with the predicted normalized throughput, SM share and
  the online neighbour; ``evictions``: the GPU's new state, the metrics, and for each offending
  metric its value, comparison, level and threshold (the transition's ``thresholds`` field);
- ``preemptions``: with the preemptor (the binding's or lifecycle event's ``preemptor`` input);
- ``chain``: every decision in order, consecutive repeats collapsed with their count.

Example: a job that waited three times for "no free cell" then was bound gives
``waiting == [{"reason": "no free cell", "count": 3, "first": ..., "last": ...}]`` and the
verdict "bound: ...".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from ..events.base import reason_substance

# Job states in which a job waits in its VC's queue (to be placed, bound or resumed).
QUEUED_STATES: tuple[str, ...] = ("submitted", "waiting", "preempted", "evicted")
RUNNING_STATES: tuple[str, ...] = ("placed", "bound", "running")


class JobLike(Protocol):
    job_id: str
    state: str
    vc: str | None
    kind: str | None
    priority: str | None
    priority_value: int | None
    placement: dict[str, Any] | None
    binding: dict[str, Any]
    submitted_at: datetime | None
    last_reason: str


class EventLike(Protocol):
    occurred_at: datetime
    kind: str
    what: str
    reason: str
    inputs: dict[str, Any]


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def queue_key(job: JobLike, since: datetime | None = None) -> tuple[int, int, str, str]:
    """Rank in a VC's queue: guaranteed first, higher priority value first, then who queued
    first (`since`: when it last entered the queue, i.e. its submission or its latest resume,
    preemption or eviction; default its submission)."""
    queued = _iso(since or job.submitted_at) or "9999"
    return (0 if job.priority == "guaranteed" else 1, -(job.priority_value or 0), queued, job.job_id)


def rank_queues(jobs: Iterable[JobLike], since: Mapping[str, datetime] | None = None) -> dict[tuple[str, str], list[JobLike]]:
    """The queued jobs (`QUEUED_STATES`) in queue order per (VC, kind): training jobs queue for
    HiveD's cells, offline jobs for the matcher's GPUs, so they are separate queues. `since`:
    when each last entered the queue (`queue_key`)."""
    queues: dict[tuple[str, str], list[JobLike]] = {}
    for job in {j.job_id: j for j in jobs}.values():
        if job.state in QUEUED_STATES:
            queues.setdefault((job.vc or "", job.kind or ""), []).append(job)
    when = since or {}
    return {key: sorted(queued, key=lambda q: queue_key(q, when.get(q.job_id))) for key, queued in sorted(queues.items())}


def vc_summary(cells: Sequence[Mapping[str, Any]], queued: Mapping[str, int]) -> list[dict[str, Any]]:
    """Per VC (rows of the ``vc_cells`` view): guaranteed GPUs, used (guaranteed), opportunistic
    use, free, bad, the GPUs of its lane GPUs among the used ones (``lanes``, Salus lanes: migration
    0012) and how many jobs are in its queue (`QUEUED_STATES`), by VC name."""
    rows = {c["vc"]: {"vc": c["vc"], "guaranteed": c["guaranteed_gpus"], "used": c["guaranteed_used"],
                      "opportunistic": c["opportunistic_used"], "free": c["guaranteed_free"], "bad": c["bad_gpus"],
                      "lanes": c.get("lane_gpus", 0), "queue": 0}
            for c in cells}  # fmt: skip
    for vc, n in queued.items():
        rows.setdefault(vc, {"vc": vc, "guaranteed": 0, "used": 0, "opportunistic": 0, "free": 0, "bad": 0, "lanes": 0, "queue": 0})["queue"] = n
    return [rows[vc] for vc in sorted(rows)]


def vc_queues(cells: Sequence[Mapping[str, Any]], queued: Sequence[JobLike], since: Mapping[str, datetime] | None = None) -> list[dict[str, Any]]:
    """`vc_summary` with each VC's queues in order (`rank_queues`), by kind: each job with its
    state, priority, when it entered the queue and what it waits for (its last reason)."""
    when = since or {}
    ranked = rank_queues(queued, when)
    counts: dict[str, int] = {}
    for (vc, _), jobs in ranked.items():
        counts[vc] = counts.get(vc, 0) + len(jobs)
    out = []
    for row in vc_summary(cells, counts):
        queues = {kind: [{"job_id": q.job_id, "state": q.state, "priority": q.priority, "priority_value": q.priority_value,
                          "since": _iso(when.get(q.job_id) or q.submitted_at), "reason": q.last_reason} for q in jobs]
                  for (vc, kind), jobs in ranked.items() if vc == row["vc"]}  # fmt: skip
        out.append({**row, "queues": queues})
    return out


def last_sample(gpu: Mapping[str, Any]) -> dict[str, Any] | None:
    """A GPU row's last sample (migration 0006): when and its SysMonitor metrics; None before any."""
    at = gpu.get("sample_at")
    return None if at is None else {"at": _iso(at), "metrics": dict(gpu.get("sample_metrics") or {})}


def render_sample(sample: Mapping[str, Any] | None) -> str:
    return "-" if sample is None else f"{sample['at']}  {_inputs(sample['metrics'])}"


def dedup_waiting(events: Iterable[EventLike]) -> list[dict[str, Any]]:
    """Waiting reasons by substance with how often each was given and when first and last, by
    first time; each shown in its latest wording."""
    seen: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.kind == "lifecycle" and e.what == "waiting":
            entry = seen.setdefault(reason_substance(e.reason), {"reason": e.reason, "count": 0, "first": _iso(e.occurred_at)})
            entry["reason"] = e.reason
            entry["count"] += 1
            entry["last"] = _iso(e.occurred_at)
    return list(seen.values())


def collapse(events: Iterable[EventLike]) -> list[dict[str, Any]]:
    """Every decision in order; consecutive ones with the same kind, outcome and reason collapsed."""
    chain: list[dict[str, Any]] = []
    for e in events:
        last = chain[-1] if chain else None
        if last is not None and (last["kind"], last["what"], last["reason"]) == (e.kind, e.what, e.reason):
            last["count"] += 1
            last["last"] = _iso(e.occurred_at)
            continue
        chain.append({"at": _iso(e.occurred_at), "last": _iso(e.occurred_at), "count": 1, "kind": e.kind, "what": e.what,
                      "reason": e.reason, "inputs": dict(e.inputs)})  # fmt: skip
    return chain


def _queue(job: JobLike, queue: Sequence[JobLike], waiting_for: str | None, since: Mapping[str, datetime]) -> dict[str, Any] | None:
    if job.state not in QUEUED_STATES:
        return None
    ranked = rank_queues([q for q in queue if q.job_id != job.job_id] + [job], since).get((job.vc or "", job.kind or ""), [])
    position = [q.job_id for q in ranked].index(job.job_id)
    return {"vc": job.vc, "position": position + 1, "of": len(ranked), "ahead": [q.job_id for q in ranked[:position]],
            "waiting_for": waiting_for or job.last_reason or None}  # fmt: skip


def _binding(e: EventLike) -> dict[str, Any]:
    i = e.inputs
    return {"at": _iso(e.occurred_at), "what": e.what, "pod": i.get("pod"), "chain": i.get("cell_type"), "priority": i.get("priority"),
            "node_ids": i.get("node_ids", []), "gpu_ids": i.get("gpu_ids", []), "reason": e.reason}  # fmt: skip


def _placement(e: EventLike) -> dict[str, Any]:
    i = e.inputs
    keys = ("gpu_id", "node_id", "sm_share", "predicted_normalized_throughput", "predicted_online_slowdown", "online_workload", "policy")
    return {"at": _iso(e.occurred_at), "action": e.what, **{k: i.get(k) for k in keys}, "reason": e.reason}


def _eviction(e: EventLike) -> dict[str, Any]:
    i = e.inputs
    metrics = {k: v for k, v in i.items() if k not in ("gpu_id", "from_state", "cause", "thresholds")}
    return {"at": _iso(e.occurred_at), "gpu_id": i.get("gpu_id"), "gpu_state": e.what, "from_state": i.get("from_state"),
            "cause": i.get("cause"), "metrics": metrics, "offending": list(i.get("thresholds", [])), "reason": e.reason}  # fmt: skip


def _preemption(e: EventLike) -> dict[str, Any]:
    return {"at": _iso(e.occurred_at), "pod": e.inputs.get("pod"), "by": e.inputs.get("preemptor"), "source": e.kind, "reason": e.reason}


def explain_job(
    job: JobLike, events: Sequence[EventLike], queue: Sequence[JobLike] = (), queued_since: Mapping[str, datetime] | None = None
) -> dict[str, Any]:
    """The explanation of `job` from its events (in order), the queued jobs of its VC and when
    each last entered the queue (`queue_key`)."""
    waiting = dedup_waiting(events)
    latest_wait = next((e.reason for e in reversed(events) if e.kind == "lifecycle" and e.what == "waiting"), None)
    placements = [_placement(e) for e in events if e.kind == "placement"]
    evictions = [_eviction(e) for e in events if e.kind == "eviction"]
    # HiveD records a preemption per pod (binding) and once for the job (lifecycle); the matcher only the latter.
    by_pod = [e for e in events if e.kind == "binding" and e.what == "preempted"]
    pod_times = {e.occurred_at for e in by_pod}
    of_job = [e for e in events if e.kind == "lifecycle" and e.what == "preempted" and e.occurred_at not in pod_times]
    preemptions = [_preemption(e) for e in sorted((*by_pod, *of_job), key=lambda e: e.occurred_at)]
    explanation: dict[str, Any] = {
        "job_id": job.job_id, "state": job.state, "vc": job.vc, "kind": job.kind, "priority": job.priority,
        "priority_value": job.priority_value, "submitted_at": _iso(job.submitted_at), "last_reason": job.last_reason,
        "waiting": waiting, "queue": _queue(job, queue, latest_wait, queued_since or {}),
        "bindings": [_binding(e) for e in events if e.kind == "binding"], "current_binding": job.binding,
        "placements": placements, "current_placement": job.placement, "evictions": evictions, "preemptions": preemptions,
        "faults": [{"at": _iso(e.occurred_at), "kind": e.what, "detail": e.reason, **e.inputs} for e in events if e.kind == "fault"],
        "commands": [{"at": _iso(e.occurred_at), "kind": e.kind, "action": e.what, "reason": e.reason, **e.inputs}
                     for e in events if e.kind in ("command", "refusal", "priority", "resize")],
        "chain": collapse(events),
    }  # fmt: skip
    explanation["verdict"] = _verdict(job, explanation)
    return explanation


def _verdict(job: JobLike, x: Mapping[str, Any]) -> str:
    state, reason = job.state, job.last_reason
    if state in RUNNING_STATES:
        if job.placement:
            p = job.placement
            beside = f" beside online {p['online_workload']}" if p.get("online_workload") else ""
            return (f"{state}: offline on {p.get('gpu_id')} with {_num(p.get('sm_share'))} % of the SMs{beside}, "
                    f"predicted normalized throughput {_num(p.get('predicted_normalized_throughput'))}")  # fmt: skip
        if job.binding:
            chains = sorted({str(pod.get("cell_type")) for pod in job.binding.values()})
            nodes = sorted({n for pod in job.binding.values() for n in pod.get("node_ids", [])})
            return f"{state}: {len(job.binding)} pod(s) bound in {', '.join(chains)} on {', '.join(nodes)}"
        return f"{state}: {reason}" if reason else state
    if x["queue"] is not None:
        q = x["queue"]
        why = {"preempted": "preempted", "evicted": "evicted", "submitted": "submitted, not yet decided"}.get(state, "waiting")
        if state == "preempted" and x["preemptions"] and x["preemptions"][-1]["by"]:
            why += f" by {x['preemptions'][-1]['by']}"
        if state == "evicted" and x["evictions"]:
            last = x["evictions"][-1]
            why += f" from {last['gpu_id']} (GPU went {last['gpu_state']})"
        return f"not running: {why}; position {q['position']} of {q['of']} in {q['vc']}'s queue; waits for: {q['waiting_for'] or '-'}"
    return f"not running: {state}" + (f" ({reason})" if reason else "")


def _offending(o: Mapping[str, Any]) -> str:
    return f"{o['metric']}={_num(o['value'])} {o['op']} {o['level']} {_num(o['threshold'])}"


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def _inputs(inputs: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    pairs = [(k, inputs.get(k)) for k in keys] if keys is not None else sorted(inputs.items())
    return " ".join(f"{k}={_num(v)}" for k, v in pairs if v not in (None, [], "", {}))


def render_job(x: Mapping[str, Any]) -> str:
    """The explanation as text: the verdict, then each section that has something to say."""
    lines = [f"{x['job_id']}: {x['verdict']}",
             f"  {x['kind'] or '-'} job in {x['vc'] or '-'}, {x['priority'] or '-'} (priority {_num(x['priority_value'])}), "
             f"submitted {x['submitted_at'] or '-'}; state {x['state']}"]  # fmt: skip
    if x["queue"]:
        q = x["queue"]
        ahead = ", ".join(q["ahead"][:10]) + (" ..." if len(q["ahead"]) > 10 else "")
        lines.append(f"queue: position {q['position']} of {q['of']} in {q['vc']}" + (f"; ahead: {ahead}" if ahead else ""))
    if x["waiting"]:
        lines.append("waiting reasons:")
        lines += [f"  {w['count']:>4}x  {w['first']} .. {w['last']}  {w['reason']}" for w in x["waiting"]]
    if x["bindings"]:
        lines.append("cells:")
        lines += [f"  {b['at']}  {b['what']:<9} {b['pod'] or '-'} chain={b['chain'] or '-'} nodes={','.join(b['node_ids']) or '-'} "
                  f"gpus={','.join(b['gpu_ids']) or '-'}  {b['reason']}" for b in x["bindings"]]  # fmt: skip
    if x["placements"]:
        lines.append("placements:")
        keys = ("gpu_id", "sm_share", "predicted_normalized_throughput", "predicted_online_slowdown", "online_workload", "policy")
        lines += [f"  {p['at']}  {p['action']:<6} {_inputs(p, keys)}  {p['reason']}" for p in x["placements"]]
    if x["evictions"]:
        lines.append("evictions:")
        for e in x["evictions"]:
            offending = "; ".join(_offending(o) for o in e["offending"])
            lines.append(f"  {e['at']}  {e['gpu_id']} {e['from_state']} -> {e['gpu_state']} ({e['cause']}): "
                         f"{offending or e['reason']}  [{_inputs(e['metrics'])}]")  # fmt: skip
    if x["preemptions"]:
        lines.append("preemptions:")
        lines += [f"  {p['at']}  {p['pod'] or '-'} by {p['by'] or '?'}  {p['reason']}" for p in x["preemptions"]]
    if x["faults"]:
        lines.append("faults:")
        lines += [f"  {f['at']}  {f['kind']} on {f.get('gpu_id')}: {f['detail']} -> {f.get('remediation')}" for f in x["faults"]]
    lines.append("decisions:")
    for c in x["chain"]:
        times = f"{c['at']}" + (f" .. {c['last']} ({c['count']}x)" if c["count"] > 1 else "")
        lines.append(f"  {times}  {c['kind']:<10} {c['what']:<10} {c['reason']}")
    return "\n".join(lines)


def explain_gpu(gpu: Mapping[str, Any] | None, events: Sequence[EventLike]) -> dict[str, Any]:
    """A GPU's current state and its history: each state change with its cause, metrics and the
    offending metrics with thresholds, the workloads it evicted; placements on it; faults."""
    now = dict(gpu or {})
    states = [{"at": _iso(e.occurred_at), "from": e.inputs.get("from_state"), "to": e.what, "cause": e.inputs.get("cause"),
               "reason": e.reason, "metrics": e.inputs.get("metrics", {}), "offending": list(e.inputs.get("thresholds", [])),
               "online_workload": e.inputs.get("online_workload"), "evicted": e.inputs.get("evicted", [])}
              for e in events if e.kind == "health"]  # fmt: skip
    placements = [{**_placement(e), "job_id": e.inputs.get("job_id")} for e in events if e.kind == "placement"]
    faults = [{"at": _iso(e.occurred_at), "kind": e.what, "detail": e.reason, **e.inputs} for e in events if e.kind == "fault"]
    # the sharing mode (issue 30 item 4): the latest health record's (a record from before it: MPS)
    latest = max((e for e in events if e.kind == "health"), key=lambda e: e.occurred_at, default=None)
    sharing = {"mode": latest.inputs.get("sharing_mode", "mps") if latest else "mps",
               "mps_detail": latest.inputs.get("mps_detail", "") if latest else ""}
    for s, e in zip(states, (e for e in events if e.kind == "health"), strict=True):
        s["sharing_mode"] = e.inputs.get("sharing_mode", "mps")
    time_in: dict[str, int] = {}
    for s in states:
        time_in[s["to"]] = time_in.get(s["to"], 0) + 1
    return {
        "gpu_id": now.get("gpu_id"), "node_id": now.get("node_id"), "gpu_type": now.get("gpu_type"), "health": now.get("health"),
        "cause": now.get("health_cause"), "reason": now.get("health_reason"), "metrics": now.get("health_metrics") or {},
        "online_workload": now.get("online_workload"), "offline_job": now.get("offline_job"), "sm_share": now.get("sm_share"),
        "offline_since": _iso(now.get("offline_since")), "changed_at": _iso(now.get("changed_at")), "last_sample": last_sample(now),
        "sharing": {**sharing, "text": sharing_line(sharing)}, "transitions": states, "entries_by_state": time_in, "placements": placements, "faults": faults,
    }  # fmt: skip


def sharing_line(sharing: Mapping[str, Any] | None) -> str:
    """How co-located workloads share the GPU, as `gpus explain` and the console say it."""
    if not sharing or sharing.get("mode", "mps") == "mps":
        return "MPS (space-shared)"
    return (f"time-sliced: MPS unavailable ({sharing.get('mps_detail') or 'reported by its node'}); offline jobs are placed "
            "here only with HIVEMUX_MATCHER_TIME_SLICED_SHARING=true, weighed by the time-slicing model")


def render_gpu(x: Mapping[str, Any]) -> str:
    offline = f"{x['offline_job']} ({_num(x['sm_share'])} % SM since {x['offline_since']})" if x["offline_job"] else "-"
    lines = [f"{x['gpu_id']} ({x['gpu_type'] or '-'} on {x['node_id'] or '-'}): {x['health'] or 'unknown'}"
             + (f" ({x['cause']}: {x['reason']})" if x["reason"] else ""),
             f"  online: {x['online_workload'] or '-'}; offline: {offline}; metrics: {_inputs(x['metrics']) or '-'}",
             f"  last sample: {render_sample(x.get('last_sample'))}",
             f"  sharing: {sharing_line(x.get('sharing'))}"]  # fmt: skip
    if x["transitions"]:
        lines.append("state history:")
        for s in x["transitions"]:
            evicted = f"; evicted {', '.join(s['evicted'])}" if s["evicted"] else ""
            lines.append(f"  {s['at']}  {s['from'] or '?'} -> {s['to']} ({s['cause']}): {s['reason']}{evicted}  [{_inputs(s['metrics'])}]")
            lines += [f"      {_offending(o)}" for o in s["offending"]]
    if x["placements"]:
        lines.append("offline jobs:")
        lines += [f"  {p['at']}  {p['action']:<6} {p['job_id']} sm_share={_num(p['sm_share'])} "
                  f"predicted_normalized_throughput={_num(p['predicted_normalized_throughput'])} beside={p['online_workload'] or '-'}  {p['reason']}"
                  for p in x["placements"]]  # fmt: skip
    if x["faults"]:
        lines.append("faults:")
        lines += [f"  {f['at']}  {f['kind']}: {f['detail']} -> {f.get('remediation')}" for f in x["faults"]]
    return "\n".join(lines)
