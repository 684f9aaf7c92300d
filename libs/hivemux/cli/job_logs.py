"""`hivemux jobs logs JOB [--pod N] [--tail N] [--follow]`: a job's output as its executors shipped
it (`hivemux.projection.logs`: each pod's head and tail, dropped spans said), from the read
models (HIVEMUX_POSTGRES_DSN) or through the API (HIVEMUX_API_URL, the same answers).

A log is its workload's output, untrusted: every control character but newline and tab (escape
sequences that would drive the terminal, carriage returns that would overwrite a line, C1
controls) and the bidirectional overrides are printed as U+FFFD (`printable`).
"""

from __future__ import annotations

import re
from typing import Any

import click

from ..projection.logs import log_lines
from .api_io import api_call, api_client
from .jobs import jobs_group
from .read_model_io import run_on_read_models

# C0 and C1 controls but tab and newline, DEL, and the bidirectional embeddings, overrides and isolates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
FOLLOW_WAIT_S = 10.0


def printable(text: str) -> str:
    """``text`` safe for a terminal: controls but newline and tab replaced by U+FFFD."""
    return _UNSAFE.sub("\ufffd", text)


def _line(line: dict[str, Any], prefix: bool) -> str:
    head = f"[pod {line['pod']} {line['node_id']}] " if prefix else ""
    if line["dropped"]:
        return f"{head}[... {line['dropped']} bytes not kept ...]"
    return head + printable(line["text"])


@jobs_group.command("logs")
@click.argument("job_id")
@click.option("--pod", type=click.IntRange(0, 4096), default=None, help="Only this pod (replica) of the job.")
@click.option("--tail", type=click.IntRange(min=0), default=None, help="Only the last N lines.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the job has ended.")
def logs(job_id: str, pod: int | None, tail: int | None, follow: bool) -> None:
    """A job's output (stdout and stderr of each pod): the first and last part of each pod's output
    as the executors shipped it, a dropped middle said where it was. Lines are prefixed with their
    pod and node when there are several; followed output always is."""
    client = api_client()
    if client is not None:
        path = f"/api/v1/jobs/{job_id}/logs"
        params = {k: v for k, v in {"pod": pod, "tail": tail}.items() if v is not None}
        first = api_call(client, "GET", path, params=params)
        _print_lines(first["lines"])
        cursor, finished = first["cursor"], first["finished"]
        streams = _Streams()
        while follow and not finished:
            params = {k: v for k, v in {"pod": pod, "after": cursor, "wait_s": FOLLOW_WAIT_S}.items() if v is not None}
            answer = api_call(client, "GET", path, params=params)
            _print_chunks(answer["chunks"], streams)
            cursor, finished = answer["cursor"], answer["finished"] and not answer["chunks"]
        streams.flush()
        return
    run_on_read_models(lambda pool: _from_read_models(pool, job_id, pod, tail, follow))


async def _from_read_models(pool: Any, job_id: str, pod: int | None, tail: int | None, follow: bool) -> None:
    from ..store.logs import follow_log, read_log
    from ..store.read_models import ReadModelStore

    if await ReadModelStore(pool).job(job_id) is None:
        raise click.ClickException(f"no job {job_id} in the read model")
    read = await read_log(pool, job_id, pod=pod)
    _print_lines([{"pod": x.pod, "node_id": x.node_id, "text": x.text, "dropped": x.dropped} for x in log_lines(read.chunks, tail=tail)])
    cursor, finished = read.cursor, read.finished
    streams = _Streams()
    while follow and not finished:
        found = await follow_log(pool, job_id, pod=pod, after=cursor, wait_s=FOLLOW_WAIT_S)
        chunks = [{"pod": c.pod, "node_id": c.node_id, "text": c.text, "dropped": gap} for c, gap in zip(found.chunks, found.gaps, strict=True)]
        _print_chunks(chunks, streams)
        cursor, finished = found.cursor, found.finished and not found.chunks
    streams.flush()


def _print_lines(lines: list[dict[str, Any]]) -> None:
    prefix = len({(x["pod"], x["node_id"]) for x in lines}) > 1
    for line in lines:
        click.echo(_line(line, prefix))


class _Streams:
    """Followed output, per stream: printed a whole line at a time (a chunk may end inside one)."""

    def __init__(self) -> None:
        self.partial: dict[tuple[int, str], str] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        key = (chunk["pod"], chunk["node_id"])
        if chunk["dropped"]:
            self._emit(key, self.partial.pop(key, None))
            click.echo(_line({**chunk, "text": ""}, True))
        lines = (self.partial.pop(key, "") + chunk["text"]).split("\n")
        for text in lines[:-1]:
            self._emit(key, text)
        if lines[-1]:
            self.partial[key] = lines[-1]

    def _emit(self, key: tuple[int, str], text: str | None) -> None:
        if text is not None:
            click.echo(f"[pod {key[0]} {key[1]}] {printable(text)}")

    def flush(self) -> None:
        for key, text in sorted(self.partial.items()):
            self._emit(key, text)
        self.partial.clear()


def _print_chunks(chunks: list[dict[str, Any]], streams: _Streams) -> None:
    for chunk in chunks:
        streams.add(chunk)
