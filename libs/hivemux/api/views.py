"""The JSON shapes the API answers with and the CLI prints with ``--json`` (one definition)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..store.read_models import JobEventRecord, JobRow


def job_json(job: JobRow) -> dict[str, Any]:
    return {
        "job_id": job.job_id, "state": job.state, "vc": job.vc, "kind": job.kind, "priority": job.priority,
        "priority_value": job.priority_value, "pods": job.pods, "gpus": job.gpus, "placement": job.placement, "binding": job.binding,
        "submitted_at": job.submitted_at.isoformat() if job.submitted_at else None,
        "updated_at": job.updated_at.isoformat(), "last_reason": job.last_reason, "lane": job.lane,
        "limits": job.limits, "restarts": job.restarts,
    }  # fmt: skip


def event_json(e: JobEventRecord) -> dict[str, Any]:
    return {"occurred_at": e.occurred_at.isoformat(), "kind": e.kind, "what": e.what, "reason": e.reason,
            "inputs": e.inputs, "topic": e.topic, "partition": e.partition, "offset": e.offset}  # fmt: skip


def gpu_json(gpu: dict[str, Any], scope: Sequence[str] | None) -> dict[str, Any]:
    """A GPU row for a principal seeing `scope` (None: every VC): another tenant's offline job
    on it is shown as ``(other tenant)``; its health, cause and SM share are cluster-wide."""
    out = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in gpu.items() if k != "offline_vc"}
    if scope is not None and gpu.get("offline_job") and gpu.get("offline_vc") not in scope:
        out["offline_job"] = "(other tenant)"
    return out
