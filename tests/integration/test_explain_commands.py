"""`hivemux jobs explain` and `hivemux gpus explain` as real processes on the embedded
PostgreSQL, over rows the projection made of real events (applied through the ReadModelStore)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta

from hivemux.events.telemetry import MetricThreshold
from hivemux.events import CellBinding, HealthState, HealthTransition, JobKind, JobLifecycleEvent, JobState, JobSubmission, Placement, Priority, WorkloadSpec
from hivemux.projection import Position, project
from hivemux.store import connect, migrate
from hivemux.store.read_models import ReadModelStore
from tests.support.read_model_kit import T0

SPEC = WorkloadSpec(model="resnet50", batch_size=32, iterations=100)
OVER = "sm_activity=97.000 > overlimit 90.000"


def events() -> list:  # type: ignore[type-arg]
    b = {"source": "test"}

    def t(s: int):  # type: ignore[no-untyped-def]
        return T0 + timedelta(seconds=s)

    gpu, node = "n1/gpu-0", "n1"
    pod = {"vc": "vc-a", "cell_type": "DGX2-V100", "reason": "buddy cell allocation"}
    return [
        # a waiting training job, told "no free cell" three times, behind an earlier one
        JobSubmission(**b, occurred_at=t(0), job_id="early", vc="vc-a", kind=JobKind.TRAINING, priority=Priority.GUARANTEED, workload=SPEC),
        JobLifecycleEvent(**b, occurred_at=t(1), job_id="early", state=JobState.WAITING, reason="no free cell"),
        JobSubmission(**b, occurred_at=t(2), job_id="w", vc="vc-a", kind=JobKind.TRAINING, priority=Priority.GUARANTEED, workload=SPEC),
        *[JobLifecycleEvent(**b, occurred_at=t(3 + k), job_id="w", state=JobState.WAITING, reason="no free cell") for k in range(3)],
        # an offline job placed beside bert, evicted when the GPU went Overlimit
        JobSubmission(**b, occurred_at=t(10), job_id="off", vc="vc-b", kind=JobKind.OFFLINE, workload=SPEC),
        Placement(**b, occurred_at=t(11), job_id="off", action="place", gpu_id=gpu, node_id=node, sm_share=40.0, policy="matching",
                  predicted_normalized_throughput=0.62, reason="best match", inputs={"online_workload": "bert"}),
        HealthTransition(**b, occurred_at=t(12), gpu_id=gpu, node_id=node, gpu_type="A100", from_state=HealthState.HEALTHY,
                         to_state=HealthState.OVERLIMIT, reason=OVER, metrics={"sm_activity": 97.0}, online_workload="bert",
                         evicted_workloads=("off",),
                         thresholds=(MetricThreshold(metric="sm_activity", value=97.0, op=">", level="overlimit", threshold=90.0),)),
        Placement(**b, occurred_at=t(12), job_id="off", action="evict", gpu_id=gpu, node_id=node, sm_share=40.0, policy="matching",
                  reason="GPU overlimit"),
        JobLifecycleEvent(**b, occurred_at=t(12), job_id="off", state=JobState.EVICTED, reason="GPU overlimit; it waits"),
        # an opportunistic gang preempted by a guaranteed job
        JobSubmission(**b, occurred_at=t(20), job_id="opp", vc="vc-a", kind=JobKind.TRAINING, pods=2, gpus_per_pod=4,
                      priority=Priority.OPPORTUNISTIC, workload=SPEC),
        *[CellBinding(**b, **pod, occurred_at=t(21), job_id="opp", state="bound", pod=f"opp/{k}", priority=Priority.OPPORTUNISTIC,
                      node_ids=(f"n{k + 2}",), gpu_ids=tuple(f"n{k + 2}/gpu-{g}" for g in range(4))) for k in range(2)],
        *[CellBinding(**b, vc="vc-a", occurred_at=t(25), job_id="opp", state="preempted", pod=f"opp/{k}", priority=Priority.OPPORTUNISTIC,
                      node_ids=(f"n{k + 2}",), reason="preempted by prod", inputs={"preemptor": "prod"}) for k in range(2)],
        JobLifecycleEvent(**b, occurred_at=t(25), job_id="opp", state=JobState.PREEMPTED, reason="preempted by prod; it waits to resume",
                          inputs={"preemptor": "prod"}),
        # the preemptor, bound on n4, a node that goes bad (one of its GPUs Disabled): 4 bad GPUs in vc-a
        JobSubmission(**b, occurred_at=t(24), job_id="prod", vc="vc-a", kind=JobKind.TRAINING, pods=1, gpus_per_pod=4,
                      priority=Priority.GUARANTEED, workload=SPEC),
        CellBinding(**b, **pod, occurred_at=t(25), job_id="prod", state="bound", pod="prod/0", priority=Priority.GUARANTEED,
                    node_ids=("n4",), gpu_ids=tuple(f"n4/gpu-{g}" for g in range(4))),
        JobLifecycleEvent(**b, occurred_at=t(26), job_id="prod", state=JobState.RUNNING),
        HealthTransition(**b, occurred_at=t(30), gpu_id="n4/gpu-7", node_id="n4", gpu_type="A100", from_state=HealthState.HEALTHY,
                         to_state=HealthState.DISABLED, reason="no sample for 30 s", cause="stale"),
    ]  # fmt: skip


async def test_explain_commands_on_projected_rows(pg_dsn: str) -> None:
    pool = await connect(pg_dsn)
    await migrate(pool)
    changes = [c for offset, e in enumerate(events()) for c in project(e, Position("t", 0, offset))]
    await ReadModelStore(pool).apply(changes, {}, {("t", 0): len(events())})
    await pool.close()
    env = {**os.environ, "HIVEMUX_POSTGRES_DSN": pg_dsn}

    async def run(*args: str) -> str:
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "hivemux.cli.main", *args], env=env,
                                       capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    waiting = json.loads(await run("jobs", "explain", "w", "--json"))
    assert [(w["reason"], w["count"]) for w in waiting["waiting"]] == [("no free cell", 3)]
    assert waiting["queue"]["position"] == 2 and waiting["queue"]["ahead"] == ["early"]  # opp (opportunistic) is behind
    assert waiting["queue"]["of"] == 3 and waiting["queue"]["waiting_for"] == "no free cell"
    evicted = json.loads(await run("jobs", "explain", "off", "--json"))
    assert evicted["placements"][0]["predicted_normalized_throughput"] == 0.62 and evicted["placements"][0]["online_workload"] == "bert"
    (eviction,) = evicted["evictions"]
    assert (eviction["gpu_state"], eviction["offending"][0]["threshold"], eviction["metrics"]) == ("Overlimit", 90.0, {"sm_activity": 97.0})
    text = await run("jobs", "explain", "opp")
    assert "not running: preempted by prod; position 3 of 3 in vc-a's queue" in text
    assert "chain=DGX2-V100 nodes=n2 gpus=n2/gpu-0" in text and "opp/1 by prod" in text
    gpu = json.loads(await run("gpus", "explain", "n1/gpu-0", "--json"))
    assert (gpu["health"], gpu["online_workload"]) == ("Overlimit", "bert")
    assert [(t["from"], t["to"], t["cause"], t["evicted"]) for t in gpu["transitions"]] == [("Healthy", "Overlimit", "metrics", ["off"])]
    assert [(p["action"], p["job_id"]) for p in gpu["placements"]] == [("place", "off"), ("evict", "off")]
    assert "Healthy -> Overlimit (metrics): " + OVER in await run("gpus", "explain", "n1/gpu-0")
    # the last sample: time and metrics of the latest metric-driven transition; a stale one has none
    assert gpu["last_sample"] == {"at": (T0 + timedelta(seconds=12)).isoformat(), "metrics": {"sm_activity": 97.0}}
    listed = [json.loads(line) for line in (await run("gpus", "list", "--json")).splitlines()]
    assert [(g["gpu_id"], g["health"], g["last_sample"] and g["last_sample"]["metrics"]) for g in listed] == [
        ("n1/gpu-0", "Overlimit", {"sm_activity": 97.0}), ("n4/gpu-7", "Disabled", None)]
    assert "sm_activity=97" in await run("gpus", "list")
    # VCs: cells, bad GPUs and the queue in the explainer's order
    vcs = {v["vc"]: v for v in json.loads(await run("vcs", "--json"))}
    a = vcs["vc-a"]
    assert (a["used"], a["bad"], a["queue"]) == (4, 4, 3)
    assert [q["job_id"] for q in a["queues"]["training"]] == ["early", "w", "opp"]
    assert [q["job_id"] for q in vcs["vc-b"]["queues"]["offline"]] == ["off"]
    assert "1. early" in await run("vcs", "--vc", "vc-a")
    status = json.loads(await run("status", "--json"))
    assert {v["vc"]: (v["used"], v["bad"], v["queue"]) for v in status["vcs"]} == {"vc-a": (4, 4, 3), "vc-b": (0, 0, 1)}
    assert "Virtual clusters" in await run("status")
    missing = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "hivemux.cli.main", "gpus", "explain", "n9/gpu-9"],
                                      env=env, capture_output=True, text=True)  # fmt: skip
    assert missing.returncode == 1 and "no GPU n9/gpu-9" in missing.stderr
