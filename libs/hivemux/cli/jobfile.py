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


# The largest job file read: 20,000 jobs (benchmarks/lifecycle.py) take about 6 MB.
MAX_FILE_BYTES = 64 * 1024 * 1024


class JobFileError(ValueError):
    """A job file that cannot be submitted; the message (one line) says where and why."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))  # one line: a YAML error spans several


def _load(path: Path) -> Any:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise JobFileError(f"{path}: {path.stat().st_size} bytes, more than the {MAX_FILE_BYTES} a job file may hold")
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise JobFileError(f"{path}: cannot read: {error.strerror}") from error
    except UnicodeDecodeError as error:
        raise JobFileError(f"{path}: not UTF-8 text: {error.reason} at byte {error.start}") from error
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError, RecursionError) as error:  # RecursionError: nested deeper than a parser goes
        what = str(error) if not isinstance(error, RecursionError) else "nested too deep"
        raise JobFileError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {what}") from error


def _msg(error: Any) -> str:
    return str(error["msg"]).removeprefix("Value error, ")  # pydantic's prefix of a rule's own message


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
        except (ValidationError, RecursionError) as error:
            name = item.get("job_id", f"#{index + 1}")
            name = name if isinstance(name, str) and len(name) <= 200 else f"#{index + 1}"
            if isinstance(error, RecursionError):
                problems.append(f"job {name}: nested too deep")
                continue
            details = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {_msg(e)}" if e["loc"] else _msg(e) for e in error.errors()
            )
            problems.append(f"job {name}: {details}")
    if problems:
        more = f" | and {len(problems) - 10} more jobs with problems" if len(problems) > 10 else ""
        raise JobFileError(f"{path}: " + " | ".join(problems[:10]) + more)
    # One count per id: the file is parsed in time linear in its jobs (20,000 jobs: benchmarks/lifecycle.py).
    duplicates = sorted(job_id for job_id, n in Counter(j.job_id for j in jobs).items() if n > 1)
    if duplicates:
        raise JobFileError(f"{path}: duplicate job ids {', '.join(duplicates)}")
    return jobs
