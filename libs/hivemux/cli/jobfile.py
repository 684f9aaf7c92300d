"""Job spec files (YAML or JSON) as users write them, validated into `JobSubmission`s."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..events import JobSubmission


class JobFileError(ValueError):
    """A job file that cannot be submitted; the message says where and why."""


def _load(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as error:
        raise JobFileError(f"{path}: cannot read: {error.strerror}") from error
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise JobFileError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {error}") from error


def parse_jobs(path: Path, *, source: str = "cli", at: datetime | None = None) -> list[JobSubmission]:
    """A file holds one job, a list of jobs, or `{jobs: [...]}`. Event fields are filled in."""
    data = _load(path)
    if isinstance(data, dict) and "jobs" in data:
        data = data["jobs"]
    # An empty YAML file (or `jobs:` with nothing under it) loads as None: no jobs, not a job.
    items: Sequence[Any] = [] if data is None else data if isinstance(data, list) else [data]
    if not items:
        raise JobFileError(f"{path}: no jobs in the file")
    stamp = at or datetime.now(UTC)
    jobs, problems = [], []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            problems.append(f"job #{index + 1}: expected a mapping, got {type(item).__name__}")
            continue
        try:
            jobs.append(JobSubmission.model_validate({"occurred_at": stamp, "source": source, **item}))
        except ValidationError as error:
            name = item.get("job_id", f"#{index + 1}")
            details = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"] for e in error.errors()
            )
            problems.append(f"job {name}: {details}")
    if problems:
        raise JobFileError(f"{path}: " + " | ".join(problems))
    # One count per id: the file is parsed in time linear in its jobs (20,000 jobs: benchmarks/lifecycle.py).
    duplicates = sorted(job_id for job_id, n in Counter(j.job_id for j in jobs).items() if n > 1)
    if duplicates:
        raise JobFileError(f"{path}: duplicate job ids {', '.join(duplicates)}")
    return jobs
