"""``/api/v1/jobs``: submit, cancel, suspend, resume, priority, resize, list, describe, history, explain, logs.

Reads are the queries `hivemux jobs list|describe|history|explain` make (`store.read_models`);
writes publish the commands `hivemux jobs` publishes (`hivemux.commands`) with the token's
principal, then wait (``wait_s``) for the job controller's outcome to reach the read model (its
event id is derived from the command id: `events.outcome_id`), so the answer says what happened.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from ... import commands
from ...events import JobSubmission, outcome_id
from ...projection.explain import QUEUED_STATES, explain_job
from ...projection.logs import log_lines
from ...store.lanes import lane_detail
from ...store.logs import follow_log, read_log
from ...store.online import online_services
from ...store.read_models import JobRow, ReadModelStore
from ...store.tokens import Principal
from ..auth import principal, require_vc
from ..models import CommandBody, JobRequest, PriorityBody, ResizeBody
from ..views import event_json, job_json

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


def _store(request: Request) -> ReadModelStore:
    return ReadModelStore(request.app.state.pool)


async def _own_job(request: Request, who: Principal, job_id: str) -> JobRow:
    job = await _store(request).job(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id} in the read model")
    require_vc(who, job.vc, f"job {job_id}")
    return job


def _invalid(error: ValidationError) -> RequestValidationError:
    return RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in error.errors(include_url=False, include_context=False)])


@router.post("", status_code=202, summary="Submit a job (published to jobs.submitted with your principal)")
async def submit(request: Request, body: JobRequest, who: Principal = Depends(principal)) -> dict[str, Any]:  # type: ignore[valid-type]
    # What the body left out gets the event's defaults (an opportunistic job's priority -1).
    fields = body.model_dump(exclude_unset=True)  # type: ignore[attr-defined]
    require_vc(who, fields["vc"], f"VC {fields['vc']}")
    if await _store(request).job(fields["job_id"]) is not None:
        raise HTTPException(409, f"job {fields['job_id']} exists already; choose another job id")
    try:
        job = JobSubmission(**fields, occurred_at=datetime.now(UTC), source=request.app.state.source, principal=who.name)
    except ValidationError as error:
        raise _invalid(error) from error
    state = request.app.state
    try:  # `archived`: the embedded broker's archive holds it (None: no archive to ask); when not, `warning` says why
        done = await commands.submit_archived(state.servers, [job], source=state.source, dsn=state.archive_dsn, publisher=state.publisher)
        [meta], archived, warning = done.metadata, done.archived, None
    except commands.NotArchived as error:
        [meta], archived, warning = error.metadata, False, str(error)
    return {"job_id": job.job_id, "event_id": str(job.event_id), "principal": who.name, "partition": meta.partition, "offset": meta.offset,
            "archived": archived, "warning": warning}  # fmt: skip


@router.get("", summary="Jobs by id (a tenant: only its VCs'), filtered; page with `after`")
async def list_jobs(
    request: Request, who: Principal = Depends(principal), vc: str | None = None, state: str | None = None, kind: str | None = None,
    limit: int = Query(100, ge=1, le=10_000), after: str | None = Query(None, description="The last job id of the previous page"),
) -> dict[str, Any]:  # fmt: skip
    if vc is not None:
        require_vc(who, vc, f"VC {vc}")
    jobs = await _store(request).jobs(vc=vc, state=state, kind=kind, limit=limit, vcs=who.scope(), after=after)
    return {"jobs": [job_json(j) for j in jobs], "next_after": jobs[-1].job_id if len(jobs) == limit else None}


@router.get("/{job_id}", summary="One job: state, VC, kind, priority, placement or binding, times, last reason; an online one: its latency; "
            "a lane job: its lane and iterations; a lane GPU: its lane jobs")
async def describe(request: Request, job_id: str, who: Principal = Depends(principal)) -> dict[str, Any]:
    job = await _own_job(request, who, job_id)
    devices = {"devices": await _store(request).job_devices(job_id)}  # its GPUs' types: CPU devices say so
    if job.kind != "online":
        return job_json(job) | devices | await lane_detail(request.app.state.pool, job)
    [service] = await online_services(request.app.state.pool, job_ids=[job_id], scope=who.scope()) or [None]
    return job_json(job) | devices | {"service": service}


@router.get("/{job_id}/history", summary="Everything that happened to a job, in order, with reasons, inputs and principals")
async def history(request: Request, job_id: str, who: Principal = Depends(principal)) -> dict[str, Any]:
    await _own_job(request, who, job_id)
    return {"job_id": job_id, "events": [event_json(e) for e in await _store(request).history(job_id)]}


@router.get("/{job_id}/explain", summary="Why a job is (not) running: `hivemux jobs explain --json`")
async def explain(request: Request, job_id: str, who: Principal = Depends(principal)) -> dict[str, Any]:
    job = await _own_job(request, who, job_id)
    store = _store(request)
    queue, since = await store.queue(job.vc, QUEUED_STATES) if job.vc else ([], {})
    return explain_job(job, await store.history(job_id), queue, since)


@router.get("/{job_id}/logs", summary="A job's output as its executors shipped it (head and tail of each pod, dropped spans said); "
            "`after` (a cursor from an earlier answer) follows it: what was shipped since, waiting up to wait_s")
async def logs(
    request: Request, job_id: str, who: Principal = Depends(principal),
    tail: int | None = Query(None, ge=0, le=100_000, description="Only the last lines"),
    pod: int | None = Query(None, ge=0, le=4096, description="Only this pod (replica)"),
    after: int | None = Query(None, ge=-1, le=2**62, description="Follow: the chunks shipped after this cursor (-1: from the start)"),
    wait_s: float = Query(0.0, ge=0.0, le=60.0, description="Follow: how long to wait for new output"),
) -> dict[str, Any]:  # fmt: skip
    await _own_job(request, who, job_id)
    pool = request.app.state.pool
    if after is None:
        read = await read_log(pool, job_id, pod=pod)
        lines = [{"pod": line.pod, "node_id": line.node_id, "text": line.text, "dropped": line.dropped}
                 for line in log_lines(read.chunks, tail=tail)]  # fmt: skip
        return {"job_id": job_id, "lines": lines, "cursor": read.cursor, "finished": read.finished, "truncated": read.truncated}
    read = await follow_log(pool, job_id, pod=pod, after=after, wait_s=wait_s)
    chunks = [{"pod": c.pod, "node_id": c.node_id, "offset": c.offset, "text": c.text, "dropped": gap}
              for c, gap in zip(read.chunks, read.gaps, strict=True)]  # fmt: skip
    return {"job_id": job_id, "chunks": chunks, "cursor": read.cursor, "finished": read.finished, "truncated": read.truncated}


async def _command(
    request: Request, who: Principal, job_id: str, action: str, body: CommandBody, priority: int | None = None, **resize: Any
) -> dict[str, Any]:  # fmt: skip
    await _own_job(request, who, job_id)
    state = request.app.state
    try:
        command = commands.job_command(action, job_id, principal=who.name, source=state.source, reason=body.reason,
                                       command_id=body.command_id, priority=priority, **resize)  # fmt: skip
    except ValidationError as error:
        raise _invalid(error) from error
    await state.publisher.publish(command)
    outcome = await _outcome(state.pool, job_id, command.command_id, body.wait_s)
    return {"job_id": job_id, "command_id": command.command_id, "principal": who.name, "action": action, "outcome": outcome}


async def _outcome(pool: Any, job_id: str, command_id: str, wait_s: float) -> dict[str, Any] | None:
    """The outcome's history row once the projector has it (None after `wait_s`)."""
    wanted = str(outcome_id(command_id))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        row = await pool.fetchrow(
            "SELECT kind, what, reason FROM job_events WHERE job_id = $1 AND event_id = $2::uuid", job_id, wanted)
        if row is not None:
            return {"kind": row["kind"], "what": row["what"], "reason": row["reason"], "refused": row["kind"] == "refusal"}
        if loop.time() >= deadline:
            return None
        await asyncio.sleep(0.1)


def _control(action: str, summary: str) -> None:
    @router.post(f"/{{job_id}}/{action}", summary=summary, name=action)
    async def control(request: Request, job_id: str, body: CommandBody | None = None, who: Principal = Depends(principal)) -> dict[str, Any]:
        return await _command(request, who, job_id, action, body or CommandBody())


_control("cancel", "Cancel a job (jobs.commands); its outcome when the job controller decided it within wait_s")
_control("suspend", "Suspend a job: cells released, workload stopped until resumed")
_control("resume", "Resume a suspended job: back to the end of its VC's queue")


@router.post("/{job_id}/priority", summary="Change a training job's HiveD priority within its class")
async def set_priority(request: Request, job_id: str, body: PriorityBody, who: Principal = Depends(principal)) -> dict[str, Any]:
    return await _command(request, who, job_id, "set_priority", body, body.value)


@router.post("/{job_id}/resize", summary="Resize a running job: an online service's replicas, an offline job's SM share / memory quota")
async def resize(request: Request, job_id: str, body: ResizeBody, who: Principal = Depends(principal)) -> dict[str, Any]:
    return await _command(request, who, job_id, "resize", body, replicas=body.replicas, sm_share=body.sm_share, memory_mib=body.memory_mib)
