"""The round's weighted graph over classes (`hivemux.matching.bipartite_graph`)."""

from __future__ import annotations

import numpy as np
import pytest

from hivemux.matching.bipartite_graph import OnlineGpu, PendingJob, build_graph, dense_weights, online_activity_class
from hivemux.matching.policy import MatchingPolicy
from hivemux.prediction.analytic import default_analytic_model

MODELS = {"T4": default_analytic_model("T4"), "A10": default_analytic_model("A10")}


def gpu(gpu_id: str, sm: float, gpu_type: str = "T4") -> OnlineGpu:
    return OnlineGpu(gpu_id, "n", gpu_type, "svc", sm, 40.0, 15360.0, 4000.0)


def job(job_id: str, sm: float = 50.0, running_on: str | None = None) -> PendingJob:
    return PendingJob(job_id, 0, sm, 60.0, 30.0, 2000.0, 120.0, running_on)


def test_activity_class_rounds_up_to_a_whole_percent() -> None:
    assert [online_activity_class(x) for x in (39.2, 39.9, 40.0, -1.0, 101.0)] == [40, 40, 40, 0, 100]


def test_equal_gpus_and_equal_jobs_form_classes() -> None:
    graph = build_graph([gpu("g0", 39.2), gpu("g1", 39.9), gpu("g2", 39.9, "A10")], [job("a"), job("b"), job("c", sm=80.0)], MODELS, MatchingPolicy())
    assert graph.class_size.tolist() == [1, 2]  # sorted keys: A10 first, then the two T4s
    assert graph.share.tolist() == [60.0, 60.0]
    assert graph.job_class.tolist() == [0, 0, 1] and graph.throughput.shape == (2, 2)
    assert graph.versions == [MODELS["A10"].version, MODELS["T4"].version]


def test_a_gpu_type_without_a_model_has_no_edge() -> None:
    graph = build_graph([gpu("g0", 40.0, "V100")], [job("a")], MODELS, MatchingPolicy())
    assert not graph.has_model.any() and not graph.feasible.any()


def test_running_jobs_must_run_on_a_gpu_of_the_round_and_ids_are_unique() -> None:
    with pytest.raises(ValueError, match="not in this round"):
        build_graph([gpu("g0", 40.0)], [job("a", running_on="elsewhere")], MODELS, MatchingPolicy())
    with pytest.raises(ValueError, match="duplicate gpu_id"):
        build_graph([gpu("g0", 40.0), gpu("g0", 50.0)], [], MODELS, MatchingPolicy())


def test_dense_weights_add_the_restart_cost_on_a_running_jobs_own_gpu() -> None:
    policy = MatchingPolicy(restart_cost=0.25)
    graph = build_graph([gpu("g0", 40.0), gpu("g1", 40.0)], [job("a", running_on="g1"), job("b")], MODELS, policy)
    w, ok = dense_weights(graph)
    assert graph.own_gpu().tolist() == [1, -1]
    assert w[1, 0] == pytest.approx(w[0, 0] + 0.25) and w[0, 1] == w[1, 1]
    assert ok.all() and np.isfinite(w).all()
