"""The explainer (`hivemux.projection.explain`) on read-model rows: a waiting job with repeated
reasons, a placed offline job, an evicted one, a preempted training gang, a finished one, and a GPU."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hivemux.projection.explain import (
    explain_gpu,
    explain_job,
    queue_key,
    rank_queues,
    render_gpu,
    render_job,
    vc_queues,
    vc_summary,
)
from hivemux.store.read_models import JobEventRecord, JobRow

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def at(s: int) -> datetime:
    return T0 + timedelta(seconds=s)


def job(job_id: str, state: str, *, vc: str = "vc-a", kind: str = "training", priority: str = "guaranteed", value: int = 0,
        submitted: int = 0, placement: dict[str, Any] | None = None, binding: dict[str, Any] | None = None, reason: str = "") -> JobRow:  # fmt: skip
    return JobRow(job_id, state, vc, kind, priority, value, 1, 2, placement, binding or {}, at(submitted), at(100), reason)


def ev(s: int, kind: str, what: str, reason: str = "", **inputs: Any) -> JobEventRecord:
    return JobEventRecord(at(s), kind, what, reason, inputs, "t", 0, s)


PLACE = {"gpu_id": "n1/gpu-0", "node_id": "n1", "sm_share": 40.0, "predicted_normalized_throughput": 0.62,
         "predicted_online_slowdown": 0.04, "online_workload": "bert", "policy": "matching"}  # fmt: skip
OVER = "sm_activity=97.000 > overlimit 90.000; memory_usage=97.656 >= unhealthy 95.000"
# What the transition carries as a field (HealthTransition.thresholds): the reason is not parsed.
OVER_THRESHOLDS = [{"metric": "sm_activity", "value": 97.0, "op": ">", "level": "overlimit", "threshold": 90.0},
                   {"metric": "memory_usage", "value": 97.656, "op": ">=", "level": "unhealthy", "threshold": 95.0}]  # fmt: skip


def test_a_waiting_job_dedups_reasons_and_knows_its_place_in_the_queue() -> None:
    me = job("w2", "waiting", submitted=5, reason="no free cell")
    events = [ev(5, "submitted", "submitted"), ev(6, "lifecycle", "waiting", "no free cell"), ev(7, "lifecycle", "waiting", "no free cell"),
              ev(8, "lifecycle", "waiting", "VC quota used"), ev(9, "lifecycle", "waiting", "no free cell")]  # fmt: skip
    queue = [job("w1", "waiting", submitted=1), job("w3", "waiting", submitted=3, priority="opportunistic", value=-1),
             job("w0", "waiting", submitted=9, value=10), me]  # fmt: skip
    x = explain_job(me, events, queue)
    assert x["waiting"] == [
        {"reason": "no free cell", "count": 3, "first": at(6).isoformat(), "last": at(9).isoformat()},
        {"reason": "VC quota used", "count": 1, "first": at(8).isoformat(), "last": at(8).isoformat()},
    ]
    assert x["queue"] == {"vc": "vc-a", "position": 3, "of": 4, "ahead": ["w0", "w1"], "waiting_for": "no free cell"}
    assert x["verdict"] == "not running: waiting; position 3 of 4 in vc-a's queue; waits for: no free cell"
    assert [(c["what"], c["count"]) for c in x["chain"]] == [("submitted", 1), ("waiting", 2), ("waiting", 1), ("waiting", 1)]
    assert "3x" in render_job(x) and "ahead: w0, w1" in render_job(x)


def test_waiting_reasons_that_differ_only_in_numbers_are_one_reason_in_its_latest_wording() -> None:
    me = job("w1", "waiting", submitted=1, reason="no feasible GPU among 4: too little free memory on 4 (e.g. g: 5000 > free 4100 MiB)")
    events = [ev(2, "lifecycle", "waiting", "no feasible GPU among 3: too little free memory on 3 (e.g. g: 5000 > free 4300 MiB)"),
              ev(3, "lifecycle", "waiting", "VC quota used"),
              ev(4, "lifecycle", "waiting", me.last_reason)]  # fmt: skip
    x = explain_job(me, events, [me])
    assert x["waiting"] == [
        {"reason": me.last_reason, "count": 2, "first": at(2).isoformat(), "last": at(4).isoformat()},
        {"reason": "VC quota used", "count": 1, "first": at(3).isoformat(), "last": at(3).isoformat()},
    ]


def test_a_placed_offline_job_shows_throughput_sm_share_and_neighbour() -> None:
    me = job("o1", "placed", kind="offline", placement=PLACE)
    x = explain_job(me, [ev(1, "lifecycle", "waiting", "no GPU fits"), ev(2, "placement", "place", "best pair", **PLACE)])
    assert x["queue"] is None
    assert x["placements"][0] | {} == {"at": at(2).isoformat(), "action": "place", **PLACE, "reason": "best pair"}
    assert x["verdict"] == "placed: offline on n1/gpu-0 with 40 % of the SMs beside online bert, predicted normalized throughput 0.62"
    assert "predicted_normalized_throughput=0.62" in render_job(x)


def test_an_evicted_job_shows_the_gpu_state_metric_value_and_threshold() -> None:
    me = job("o2", "evicted", kind="offline", reason="GPU overlimit; the job waits for the next round")
    events = [ev(2, "placement", "place", "best pair", **PLACE),
              ev(5, "eviction", "Overlimit", OVER, gpu_id="n1/gpu-0", from_state="Healthy", cause="metrics", sm_activity=97.0,
                 thresholds=OVER_THRESHOLDS),
              ev(5, "placement", "evict", "GPU overlimit", **PLACE)]  # fmt: skip
    x = explain_job(me, events, [me])
    (e,) = x["evictions"]
    assert (e["gpu_id"], e["gpu_state"], e["from_state"], e["metrics"]) == ("n1/gpu-0", "Overlimit", "Healthy", {"sm_activity": 97.0})
    assert e["offending"][0] == {"metric": "sm_activity", "value": 97.0, "op": ">", "level": "overlimit", "threshold": 90.0}
    assert x["verdict"].startswith("not running: evicted from n1/gpu-0 (GPU went Overlimit); position 1 of 1")
    assert "sm_activity=97 > overlimit 90" in render_job(x)


def test_a_preempted_training_gang_names_the_preemptor_and_its_cells() -> None:
    pod = {"cell_type": "DGX2-V100-NODE", "node_ids": ["n1"], "gpu_ids": ["n1/gpu-0", "n1/gpu-1"], "priority": "opportunistic"}
    me = job("g1", "preempted", priority="opportunistic", value=-1, reason="preempted by prod-7; it waits to resume")
    events = [ev(1, "binding", "bound", "bound to n1", pod="g1/0", **pod), ev(1, "binding", "bound", "bound to n2", pod="g1/1", **pod),
              ev(9, "binding", "preempted", "preempted by prod-7", pod="g1/0", node_ids=["n1"], preemptor="prod-7"),
              ev(9, "binding", "preempted", "preempted by prod-7", pod="g1/1", node_ids=["n2"], preemptor="prod-7"),
              ev(9, "lifecycle", "preempted", "preempted by prod-7; it waits to resume", preemptor="prod-7")]  # fmt: skip
    x = explain_job(me, events, [me, job("g0", "waiting")])
    assert [(p["pod"], p["by"]) for p in x["preemptions"]] == [("g1/0", "prod-7"), ("g1/1", "prod-7")]
    assert [(b["what"], b["chain"]) for b in x["bindings"]][:2] == [("bound", "DGX2-V100-NODE")] * 2
    assert x["verdict"] == ("not running: preempted by prod-7; position 2 of 2 in vc-a's queue; "
                            "waits for: preempted by prod-7; it waits to resume")  # fmt: skip


@pytest.mark.parametrize("state", ["completed", "failed", "cancelled"])
def test_a_finished_job_says_how_it_ended(state: str) -> None:
    me = job("f1", state, reason="exit 0")
    x = explain_job(me, [ev(1, "lifecycle", "running"), ev(9, "lifecycle", state, "exit 0")], [me])
    assert x["queue"] is None and x["verdict"] == f"not running: {state} (exit 0)"


def test_queue_key_orders_guaranteed_then_priority_then_submission() -> None:
    jobs = [job("a", "waiting", priority="opportunistic", value=-1), job("b", "waiting", submitted=5), job("c", "waiting", value=5, submitted=9)]
    assert [j.job_id for j in sorted(jobs, key=queue_key)] == ["c", "b", "a"]


def test_a_gpu_history_with_causes() -> None:
    gpu = {"gpu_id": "n1/gpu-0", "node_id": "n1", "gpu_type": "A100", "health": "Overlimit", "health_cause": "metrics",
           "health_reason": OVER, "health_metrics": {"sm_activity": 97.0}, "online_workload": "bert", "offline_job": None,
           "sm_share": None, "offline_since": None, "changed_at": at(5), "sample_at": at(5),
           "sample_metrics": {"sm_activity": 97.0, "memory_usage": 97.656}}  # fmt: skip
    events = [ev(0, "health", "Healthy", "initialization finished: first sample", metrics={"sm_activity": 10.0}, from_state="Init",
                 cause="metrics", evicted=[]),
              ev(2, "placement", "place", "best pair", job_id="o2", **PLACE),
              ev(5, "health", "Overlimit", OVER, metrics={"sm_activity": 97.0}, from_state="Healthy", cause="metrics", evicted=["o2"],
                 thresholds=OVER_THRESHOLDS),
              ev(6, "fault", "xid", "xid 79", xid=79, job_id=None, remediation="drain")]  # fmt: skip
    x = explain_gpu(gpu, events)
    assert [(t["from"], t["to"], t["cause"]) for t in x["transitions"]] == [("Init", "Healthy", "metrics"), ("Healthy", "Overlimit", "metrics")]
    assert x["transitions"][1]["evicted"] == ["o2"] and x["transitions"][1]["offending"][1]["threshold"] == 95.0
    assert x["placements"][0]["job_id"] == "o2" and x["faults"][0]["remediation"] == "drain"
    text = render_gpu(x)
    assert "Healthy -> Overlimit (metrics)" in text and "evicted o2" in text and "xid" in text
    assert x["last_sample"] == {"at": at(5).isoformat(), "metrics": {"sm_activity": 97.0, "memory_usage": 97.656}}
    assert "last sample: " + at(5).isoformat() + "  memory_usage=97.7 sm_activity=97" in text
    assert "memory_usage=97.7 >= unhealthy 95" in text  # the offending metrics under the transition, from the field
    assert explain_gpu({"gpu_id": "g"}, [])["last_sample"] is None


def test_reasons_are_not_parsed_for_thresholds_or_the_preemptor() -> None:
    """An event without the fields (recorded before they existed) names no threshold or preemptor,
    whatever its reason says."""
    me = job("g1", "preempted", reason="preempted by prod-7")
    x = explain_job(me, [ev(9, "binding", "preempted", "preempted by prod-7", pod="g1/0"),
                         ev(9, "eviction", "Overlimit", OVER, gpu_id="n1/gpu-0", from_state="Healthy", cause="metrics")])  # fmt: skip
    assert x["preemptions"][0]["by"] is None and x["evictions"][0]["offending"] == []


def test_vc_queues_in_queue_order_per_kind_with_the_vc_cells() -> None:
    queued = [job("b", "waiting", submitted=5), job("a", "waiting", priority="opportunistic", value=-1),
              job("c", "preempted", value=5, submitted=9), job("o", "waiting", kind="offline", priority="opportunistic", value=-1),
              job("x", "running"), job("z", "waiting", vc="vc-b", submitted=1), job("r", "waiting", submitted=0)]  # fmt: skip
    assert {k: [j.job_id for j in v] for k, v in rank_queues(queued, {"r": at(8)}).items()} == {
        ("vc-a", "offline"): ["o"], ("vc-a", "training"): ["c", "b", "r", "a"], ("vc-b", "training"): ["z"]}
    cells = [{"vc": "vc-a", "guaranteed_gpus": 8, "guaranteed_used": 2, "guaranteed_free": 6, "opportunistic_used": 1,
              "waiting_jobs": 3, "bad_gpus": 2}]  # fmt: skip
    (a, b) = vc_queues(cells, queued, {"r": at(8)})
    assert {k: v for k, v in a.items() if k != "queues"} == {"vc": "vc-a", "guaranteed": 8, "used": 2, "opportunistic": 1, "free": 6,
                                                            "bad": 2, "lanes": 0, "queue": 5}  # fmt: skip
    assert [q["job_id"] for q in a["queues"]["training"]] == ["c", "b", "r", "a"] and a["queues"]["training"][2]["since"] == at(8).isoformat()
    assert (b["vc"], b["guaranteed"], b["queue"]) == ("vc-b", 0, 1)
    assert vc_summary(cells, {"vc-a": 5})[0]["queue"] == 5
    # the explainer's position is the same rule: r (requeued at 8) is third of vc-a's training queue
    assert explain_job(queued[-1], [], queued, {"r": at(8)})["queue"]["position"] == 3


def test_a_requeued_job_ranks_by_when_it_entered_the_queue_again() -> None:
    resumed = job("r", "waiting", submitted=0, reason="no free cell")
    later = job("l", "waiting", submitted=5)
    x = explain_job(resumed, [ev(0, "submitted", "submitted"), ev(8, "lifecycle", "resumed")], [later, resumed], {"r": at(8)})
    assert (x["queue"]["position"], x["queue"]["ahead"]) == (2, ["l"])
    assert explain_job(resumed, [], [later, resumed])["queue"]["position"] == 1  # by submission when not requeued


def test_a_gpu_without_mps_shows_it_is_time_sliced_and_why() -> None:
    """Issue 30 item 4: the latest health record's sharing mode, in `gpus explain` and the console."""
    gpu = {"gpu_id": "n1/gpu-1", "node_id": "n1", "gpu_type": "T4", "health": "Healthy"}
    lost = "MPS daemon down: cannot run nvidia-cuda-mps-control"
    events = [ev(0, "health", "Healthy", "first sample", metrics={}, from_state="Init", cause="metrics", evicted=[]),  # before issue 30: MPS
              ev(3, "health", "Healthy", f"MPS unavailable, the GPU is time-sliced: {lost}", metrics={}, from_state="Healthy",
                 cause="mps", evicted=[], sharing_mode="time_sliced", mps_detail=lost)]  # fmt: skip
    x = explain_gpu(gpu, events)
    assert x["sharing"]["mode"] == "time_sliced" and x["sharing"]["mps_detail"] == lost
    assert [t["sharing_mode"] for t in x["transitions"]] == ["mps", "time_sliced"]
    text = render_gpu(x)
    assert f"sharing: time-sliced: MPS unavailable ({lost})" in text and "HIVEMUX_MATCHER_TIME_SLICED_SHARING=true" in text
    assert "Healthy -> Healthy (mps)" in text
    assert x["sharing"]["text"] in text  # what the console shows
    assert "sharing: MPS (space-shared)" in render_gpu(explain_gpu(gpu, events[:1]))
