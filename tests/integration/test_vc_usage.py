"""Per-tenant accounting on the embedded broker and PostgreSQL (issue 19 item 2): bindings,
placements, lifecycle and sharing observations published to their topics by their writers,
folded by the projector into the read models (migration 0008), read back per VC by
`store.usage.vc_usage`, `hivemux vcs usage` (a real process) and the projector's gauges."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from hivemux.bus import Publisher, ensure_topics
from hivemux.bus.authorization import as_writer
from hivemux.events import (
    CellBinding,
    Event,
    JobKind,
    JobLifecycleEvent,
    JobState,
    JobSubmission,
    Placement,
    Priority,
    SharingObservation,
    WorkloadSpec,
)
from hivemux.infra import Endpoints
from hivemux.store import connect, migrate
from hivemux.store.projector import run_projector
from hivemux.store.usage import vc_usage
from hivemux.topics import ALL_TOPICS
from tests.support.read_model_kit import T0

SPEC = WorkloadSpec(model="resnet50", batch_size=32, iterations=100)
H = timedelta(hours=1)


def events(p: str) -> list[Event]:
    a, b = f"{p}-a", f"{p}-b"
    base = {"source": "test"}

    def submit(job: str, vc: str, kind: JobKind, **kw: object) -> JobSubmission:
        return JobSubmission(**base, occurred_at=T0 - H, job_id=job, vc=vc, kind=kind, workload=SPEC, **kw)  # type: ignore[arg-type]

    def bind(job: str, vc: str, state: str, at: datetime, priority: Priority, gpus: int) -> CellBinding:
        return CellBinding(**base, occurred_at=at, job_id=job, vc=vc, state=state, pod=f"{job}/0", priority=priority,  # type: ignore[arg-type]
                           node_ids=("n1",), gpu_ids=tuple(f"n1/gpu-{g}" for g in range(gpus)), reason="test")  # fmt: skip

    def place(job: str, action: str, gpu: str, at: datetime) -> Placement:
        return Placement(**base, occurred_at=at, job_id=job, action=action, gpu_id=gpu, node_id="n2", sm_share=40.0,  # type: ignore[arg-type]
                         policy="matching", reason="test")  # fmt: skip

    def seen(job: str, start: datetime, minutes: int, nt: float, slowdown: float) -> SharingObservation:
        return SharingObservation(**base, occurred_at=start + timedelta(minutes=minutes), gpu_id="n2/gpu-0", node_id="n2", gpu_type="T4",
                                  offline_job_id=job, online_workload="svc", sm_share=40.0, normalized_throughput=nt,
                                  online_slowdown=slowdown, window_start=start, window_end=start + timedelta(minutes=minutes))  # fmt: skip

    t1, t2, o1, o2 = f"{p}-t1", f"{p}-t2", f"{p}-o1", f"{p}-o2"
    return [
        submit(t1, a, JobKind.TRAINING, priority=Priority.GUARANTEED, gpus_per_pod=4),
        submit(t2, b, JobKind.TRAINING, gpus_per_pod=2),
        submit(o1, a, JobKind.OFFLINE),
        submit(o2, b, JobKind.OFFLINE),
        # t1: 4 guaranteed GPUs for 2 h; t2: 2 opportunistic GPUs for 1 h, then preempted
        bind(t1, a, "bound", T0, Priority.GUARANTEED, 4),
        bind(t1, a, "released", T0 + 2 * H, Priority.GUARANTEED, 4),
        bind(t2, b, "bound", T0, Priority.OPPORTUNISTIC, 2),
        bind(t2, b, "preempted", T0 + H, Priority.OPPORTUNISTIC, 2),
        # o1 shares gpu-1 for 30 min (evicted), then gpu-2 from 1 h until it completes at 1.5 h;
        # its completion is published before its last placement: the interval still ends there
        place(o1, "place", "n2/gpu-1", T0),
        place(o1, "evict", "n2/gpu-1", T0 + H / 2),
        JobLifecycleEvent(**base, occurred_at=T0 + 1.5 * H, job_id=o1, state=JobState.COMPLETED),
        place(o1, "place", "n2/gpu-2", T0 + H),
        # o2 shares from 0 on and still runs
        place(o2, "place", "n2/gpu-3", T0),
        seen(o1, T0, 10, 0.5, 0.10),
        seen(o1, T0 + H, 10, 0.8, 0.20),
        seen(o2, T0, 20, 1.0, 0.0),
    ]


@pytest.fixture
def prefix() -> str:
    return f"u{uuid.uuid4().hex[:8]}"


async def test_usage_per_vc_from_the_topics(infra: Endpoints, pg_dsn: str, prefix: str) -> None:
    await ensure_topics(infra.bootstrap_servers, ALL_TOPICS)
    async with Publisher(infra.bootstrap_servers, source="test") as publisher:
        for event in events(prefix):  # one at a time: the order across topics is the test's
            await publisher.publish_all([as_writer(event)])
            await publisher.publish_all([as_writer(event)])  # redelivered: counted once
    pool = await connect(pg_dsn)
    try:
        await migrate(pool)
        await run_projector(infra.bootstrap_servers, pool, until_caught_up=True)
        rows = {r["vc"]: r for r in await vc_usage(pool, T0 - H, T0 + 3 * H) if r["vc"].startswith(prefix)}
        a, b = rows[f"{prefix}-a"], rows[f"{prefix}-b"]
        assert (a["guaranteed_gpu_hours"], a["opportunistic_gpu_hours"], a["shared_gpu_hours"]) == pytest.approx((8.0, 0.0, 1.0))
        assert (b["guaranteed_gpu_hours"], b["opportunistic_gpu_hours"], b["shared_gpu_hours"]) == pytest.approx((0.0, 2.0, 3.0))
        assert a["observations"] == 2
        assert a["offline_normalized_throughput"] == pytest.approx(0.65)
        assert a["offline_slowdown"] == pytest.approx((2.0 + 1.25) / 2)
        assert (a["online_slowdown_caused"], a["online_slowdown_max"]) == pytest.approx((0.15, 0.2))
        assert a["online_slowdown_gpu_hours"] == pytest.approx(0.3 / 6)
        assert (b["offline_normalized_throughput"], b["offline_slowdown"], b["online_slowdown_caused"]) == pytest.approx((1.0, 1.0, 0.0))
        # a later window clips every interval: from 1 h on, t1 holds 4 GPUs for 1 h, o1 shares 0.5 h
        later = {r["vc"]: r for r in await vc_usage(pool, T0 + H, T0 + 3 * H)}[f"{prefix}-a"]
        assert (later["guaranteed_gpu_hours"], later["shared_gpu_hours"], later["observations"]) == pytest.approx((4.0, 0.5, 1))

        # the projector's gauges
        from hivemux.services.projector.service import export_usage

        await export_usage(pool)
        assert REGISTRY.get_sample_value("hivemux_vc_gpu_hours", {"vc": f"{prefix}-a", "kind": "guaranteed"}) == pytest.approx(8.0)
        assert REGISTRY.get_sample_value("hivemux_vc_online_slowdown_caused", {"vc": f"{prefix}-a"}) == pytest.approx(0.15)
    finally:
        await pool.close()

    env = {**os.environ, "HIVEMUX_POSTGRES_DSN": pg_dsn}
    window = ["--since", (T0 - H).isoformat(), "--until", (T0 + 3 * H).isoformat()]
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "hivemux.cli.main", "vcs", "usage", "--json", *window], env=env,
                                   capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = {r["vc"]: r for r in json.loads(done.stdout)["vcs"]}
    assert shown[f"{prefix}-b"]["shared_gpu_hours"] == pytest.approx(3.0)
    text = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "hivemux.cli.main", "vcs", "usage", "--vc", f"{prefix}-a", *window],
                                   env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert f"{prefix}-a" in text.stdout and "8.00" in text.stdout and "0.650" in text.stdout
