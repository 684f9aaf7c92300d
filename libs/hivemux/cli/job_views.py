"""`hivemux jobs list | describe | history | explain`: reads of the PostgreSQL read models (written only by
the projector, `hivemux.store.read_models`), through HIVEMUX_POSTGRES_DSN."""

from __future__ import annotations

import json
from typing import Any

import click

from ..api.client import event_record, job_row
from ..api.views import job_json as _job_json
from ..store.read_models import JobRow, ReadModelStore
from ..status import device_label
from .api_io import api_call, api_client
from .jobs import jobs_group
from .read_model_io import run_on_read_models


def _where(job: JobRow) -> str:
    if job.lane:
        return f"{job.lane['gpu_id']} lane {job.lane['lane_id']}"
    if job.placement:
        return f"{job.placement['gpu_id']} (SM {job.placement['sm_share']:g} %)"
    nodes = sorted({n for pod in job.binding.values() for n in pod.get("node_ids", [])})
    return ",".join(nodes) if nodes else "-"


@jobs_group.command("list")
@click.option("--vc", default=None, help="Only this virtual cluster.")
@click.option("--state", default=None, help="Only jobs in this state (waiting, running, ...).")
@click.option("--kind", default=None, help="Only this kind (online, offline, training; lane-gpu: the allocator's lane GPUs, left out otherwise).")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per job.")
def list_jobs(vc: str | None, state: str | None, kind: str | None, limit: int, as_json: bool) -> None:
    """Jobs from the read model, by job id."""
    client = api_client()
    if client is not None:
        params = {k: v for k, v in {"vc": vc, "state": state, "kind": kind, "limit": limit}.items() if v is not None}
        jobs = [job_row(j) for j in api_call(client, "GET", "/api/v1/jobs", params=params)["jobs"]]
    else:
        jobs = run_on_read_models(lambda pool: ReadModelStore(pool).jobs(vc=vc, state=state, kind=kind, limit=limit))
    if as_json:
        for job in jobs:
            click.echo(json.dumps(_job_json(job)))
        return
    click.echo(f"{'job':<24} {'state':<10} {'vc':<12} {'kind':<9} {'priority':<13} {'where':<24} reason")
    for job in jobs:
        click.echo(f"{job.job_id:<24} {job.state:<10} {job.vc or '-':<12} {job.kind or '-':<9} {job.priority or '-':<13} "
                   f"{_where(job):<24} {job.last_reason}")  # fmt: skip
    if not jobs:
        click.echo("(no jobs)")


@jobs_group.command("describe")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
def describe(job_id: str, as_json: bool) -> None:
    """One job: state, VC, kind, priority, placement or binding, times, last reason; an online
    service also its replicas' latest latency against its SLO and its last protection step; a
    lane job its lane and iterations; a lane GPU (`--kind lane-gpu`) its lane jobs."""
    client = api_client()
    service: dict[str, Any] | None = None
    lanes: dict[str, Any] = {}
    if client is not None:
        body = api_call(client, "GET", f"/api/v1/jobs/{job_id}")
        job, service, lanes = job_row(body), body.get("service"), {k: body[k] for k in ("lane", "lane_gpu") if body.get(k)}
        devices: dict[str, int] = body.get("devices") or {}
    else:

        async def read(pool: Any) -> tuple[JobRow | None, dict[str, Any] | None, dict[str, Any], dict[str, int]]:
            from ..store.lanes import lane_detail
            from ..store.online import online_services

            store = ReadModelStore(pool)
            row = await store.job(job_id)
            services = await online_services(pool, job_ids=[job_id]) if row is not None and row.kind == "online" else []
            lanes = await lane_detail(pool, row) if row is not None else {}
            return row, services[0] if services else None, lanes, await store.job_devices(job_id)

        job, service, lanes, devices = run_on_read_models(read)
    if job is None:
        raise click.ClickException(f"no job {job_id} in the read model")
    if as_json:
        click.echo(json.dumps(_job_json(job) | {"devices": devices} | ({"service": service} if service else {}) | lanes, indent=2, default=str))
        return
    for name, value in _job_json(job).items():
        if name == "lane":
            continue  # said below (`_lane_lines`)
        if name in ("placement", "binding", "limits"):
            value = json.dumps(value, sort_keys=True) if value else "-"
        click.echo(f"{name + ':':<14} {value if value not in (None, '') else '-'}")
    click.echo(f"{'devices:':<14} {', '.join(f'{n} x {device_label(t)}' for t, n in devices.items()) or '-'}")
    for line in _service_lines(service) if service else ():
        click.echo(line)
    for line in _lane_lines(lanes):
        click.echo(line)


def _lane_lines(lanes: dict[str, Any]) -> list[str]:
    """A lane job's lane, or a lane GPU's group and its lane jobs (`store.lanes.lane_detail`)."""
    if "lane" in lanes:
        return [f"{'lane:':<14} {lanes['lane']['line']}"]
    if "lane_gpu" not in lanes:
        return []
    g = lanes["lane_gpu"]
    c = f"C {g['capacity_mib']:g} MiB" if g.get("capacity_mib") is not None else "C -"
    lines = [f"{'lane GPU:':<14} {g['priority'] or '-'} GPU of {g['vc']} for Salus lanes ({g.get('lane_group') or '-'}) on "
             f"{', '.join(g['gpu_ids']) or '- (given back)'}, {c}, {str(g.get('policy') or '-').upper()}"]  # fmt: skip
    lines += [f"  {r['job_id']:<22} {r['state'] or '-':<10} {r['line']}" for r in g["lane_jobs"]] or ["  (no lane job)"]
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _service_lines(s: dict[str, Any]) -> list[str]:
    """An online service's latency (`store.online`): the worst replica against the SLO, each replica, the last step."""
    lines = [f"{'latency:':<14} worst p99 {_ms(s['worst_p99_ms'])} / SLO {_ms(s['slo_p99_ms'])} ({s['slo_state']}); "
             f"{s['replicas_bound']}/{s['replicas'] or '-'} replicas bound"]  # fmt: skip
    for r in s["replica_latency"]:
        beside = f" beside {r['offline_job_id']}" if r.get("offline_job_id") else ""
        target = f" (launch target {r['launch_target']:g})" if r.get("launch_target") is not None else ""
        if r.get("endpoint"):  # a service's own command, ready (issue 29)
            lines.append(f"  {r['gpu_id']:<20} serving on {r['endpoint']} since {r.get('ready_at') or '-'}")
        lines.append(f"  {r['gpu_id']:<20} p99 {_ms(r.get('p99_ms'))}  p50 {_ms(r.get('p50_ms'))}  {r['slo_state']:<11} "
                     f"window to {r.get('window_end') or '-'}{beside}{target}")  # fmt: skip
    last = s.get("last_protection")
    if last:
        counts = ", ".join(f"{k} {n}" for k, n in s["protection_steps"].items())
        lines.append(f"{'protection:':<14} last {last['step']} (level {last['level']}) on {last['gpu_id']} at {last['occurred_at']}: "
                     f"{last['reason']}; steps: {counts}")  # fmt: skip
    return lines


@jobs_group.command("history")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
def history(job_id: str, as_json: bool) -> None:
    """Everything that happened to a job, in order: lifecycle, bindings, placements, commands,
    refusals, with reasons and inputs."""
    client = api_client()
    if client is not None:
        events = [event_record(e) for e in api_call(client, "GET", f"/api/v1/jobs/{job_id}/history")["events"]]
    else:
        events = run_on_read_models(lambda pool: ReadModelStore(pool).history(job_id))
    if not events:
        raise click.ClickException(f"no events of job {job_id} in the read model")
    for e in events:
        if as_json:
            click.echo(json.dumps({"occurred_at": e.occurred_at.isoformat(), "kind": e.kind, "what": e.what, "reason": e.reason,
                                   "inputs": e.inputs, "topic": e.topic, "partition": e.partition, "offset": e.offset}))  # fmt: skip
            continue
        inputs = " ".join(f"{k}={v}" for k, v in sorted(e.inputs.items()) if v not in (None, [], ""))
        click.echo(f"{e.occurred_at.isoformat():<32} {e.kind:<10} {e.what:<10} {e.reason}" + (f"  [{inputs}]" if inputs else ""))


@jobs_group.command("explain")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="The explanation as one JSON document.")
def explain(job_id: str, as_json: bool) -> None:
    """Why a job is (not) running: waiting reasons with counts, its place in its VC's queue, the
    cells it was bound to, placements with predicted throughput, evictions with the metric and
    threshold, preemptions with the preemptor, and every decision in order."""
    from ..projection.explain import QUEUED_STATES, explain_job, render_job

    client = api_client()
    if client is not None:
        explanation = api_call(client, "GET", f"/api/v1/jobs/{job_id}/explain")
        click.echo(json.dumps(explanation, indent=2, default=str) if as_json else render_job(explanation))
        return

    async def read(pool: Any) -> tuple[JobRow | None, list[Any], tuple[list[JobRow], dict[str, Any]]]:
        store = ReadModelStore(pool)
        job = await store.job(job_id)
        if job is None:
            return None, [], ([], {})
        queue = await store.queue(job.vc, QUEUED_STATES) if job.vc else ([], {})
        return job, await store.history(job_id), queue

    job, events, (queue, queued_since) = run_on_read_models(read)
    if job is None:
        raise click.ClickException(f"no job {job_id} in the read model")
    explanation = explain_job(job, events, queue, queued_since)
    click.echo(json.dumps(explanation, indent=2, default=str) if as_json else render_job(explanation))
