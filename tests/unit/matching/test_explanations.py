"""Why placed, why not placed, why stopped (`hivemux.matching.explanations`)."""

from __future__ import annotations

from hivemux.matching.bipartite_graph import OnlineGpu, PendingJob, build_graph
from hivemux.matching.explanations import fcfs_reason, pair_inputs, placement_reason, why_not_placed, why_stopped
from hivemux.matching.policy import MatchingPolicy
from hivemux.prediction.analytic import default_analytic_model

MODELS = {"T4": default_analytic_model("T4")}
GPU = OnlineGpu("node-00/gpu-0", "node-00", "T4", "svc", 40.0, 40.0, 15360.0, 4000.0)


def job(job_id: str, memory: float, running_on: str | None = None) -> PendingJob:
    return PendingJob(job_id, 0, 50.0, 60.0, 30.0, memory, 120.0, running_on)


def test_worked_example_over_the_memory_quota() -> None:
    graph = build_graph([GPU], [job("big", 7000.0)], MODELS, MatchingPolicy())
    assert why_not_placed(graph, 0, "lost") == (
        "no feasible GPU among 1: over memory quota on 1 (e.g. node-00/gpu-0: memory peak 7000 MiB > quota 6144 MiB)"
    )


def test_feasible_but_taken_names_the_best_gpu() -> None:
    graph = build_graph([GPU], [job("a", 2000.0)], MODELS, MatchingPolicy())
    text = why_not_placed(graph, 0, "taken by others")
    assert text.startswith("feasible on 1 GPU(s) (best node-00/gpu-0: predicted normalized throughput") and text.endswith("taken by others")
    assert why_not_placed(build_graph([], [job("a", 2000.0)], MODELS, MatchingPolicy()), 0, "x") == "no online GPU can take an offline job this round"


def test_placement_reason_and_inputs_carry_the_numbers() -> None:
    graph = build_graph([GPU], [job("a", 2000.0)], MODELS, MatchingPolicy())
    reason = placement_reason(graph, 0, 0, "because", moved_from="node-01/gpu-0")
    assert reason.startswith("a -> node-00/gpu-0 on node-00 beside svc (moved from node-01/gpu-0: the gain exceeds its restart cost 0.100)")
    assert "SM share 60.0%" in reason and "memory peak 2000 MiB <= quota 6144 MiB and free 11360 MiB; because" in reason
    inputs = pair_inputs(graph, 0, 0, "matching")
    assert (inputs["policy"], inputs["sm_share"], inputs["memory_quota_mib"], inputs["memory_free_mib"]) == ("matching", 60.0, 6144.0, 11360.0)


def test_why_stopped() -> None:
    graph = build_graph([GPU], [job("a", 2000.0, running_on=GPU.gpu_id)], MODELS, MatchingPolicy())
    assert why_stopped(graph, 0, True, "matching", 1.5, "lost") == (
        "a leaves node-00/gpu-0: the matching plan (total 1.500) gains more than its restart cost 0.100 by giving the GPU to other jobs"
    )
    assert why_stopped(graph, 0, False, "fcfs", 0.0, "lost").startswith("a leaves node-00/gpu-0: no longer feasible there: feasible on 1")
    assert fcfs_reason(2, 5) == "FCFS: job 2 of 5 in submission order, first feasible free GPU by gpu_id"
