"""The progress protocol between a workload and the executor: JSON lines appended to the file
named by ``HIVEMUX_PROGRESS_FILE``.

Each line is an object with ``event`` and the wall time ``t`` (epoch seconds):

- ``{"event": "start", "iteration": k, "total": n, "resumed_from": k|null, "sm_share": pct|null}``
- ``{"event": "progress", "iteration": k, "total": n}`` (every few iterations)
- ``{"event": "checkpoint", "iteration": k, "path": "..."}``
- ``{"event": "done", "iteration": n, "total": n}``
- ``{"event": "latency", "requests": r, "mean_ms": m, "p50_ms": a, "p99_ms": b}`` (online)

The executor reads the file incrementally (`ProgressReader`); a line cut by a crash is ignored
until it is complete.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

CHECKPOINT_DIR_ENV = "HIVEMUX_CHECKPOINT_DIR"
PROGRESS_FILE_ENV = "HIVEMUX_PROGRESS_FILE"


class ProgressWriter:
    def __init__(self, path: str | os.PathLike | None) -> None:
        self._f = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - lives as long as the workload

    def write(self, event: str, **fields: Any) -> None:
        if self._f is not None:
            self._f.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
            self._f.flush()


class ProgressReader:
    """Reads the complete lines appended since the previous call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        out = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "event" in record:
                out.append(record)
        return out
