"""The lane placer: Algorithm 1 across a VC's lane GPUs (lanes/placer.py)."""

from __future__ import annotations

import random

import pytest

from hivemux.lanes.iteration_scheduler import Policy
from hivemux.lanes.placer import GpuReleased, LaneGpu, LaneJob, LanePlacer, Left, Placed, Refused, Waiting

GIB = 1024.0


def gpu(gpu_id: str, vc: str = "a", capacity_gib: float = 16.0, policy: Policy = Policy.PACK) -> LaneGpu:
    return LaneGpu(gpu_id, capacity_gib * GIB, vc, f"cell-{gpu_id}", policy)


def job(name: str, p_gib: float, e_gib: float, vc: str = "a") -> LaneJob:
    return LaneJob(name, vc, p_gib * GIB, e_gib * GIB)


def only(events, kind):
    found = [e for e in events if isinstance(e, kind)]
    assert len(found) == 1, events
    return found[0]


def test_docstring_example_wait_and_release() -> None:
    placer = LanePlacer()
    assert placer.add_gpu(gpu("g0")) == (GpuReleased("g0", "a", "cell-g0", "no waiting job fits it"),)
    w = only(placer.arrive(job("j1", 1, 6)), Waiting)
    assert w.wants_gpu and "VC a has no lane GPU" in w.reason
    p1 = only(placer.add_gpu(gpu("g0")), Placed)
    assert (p1.job, p1.gpu_id, p1.step, p1.lane_id) == ("j1", "g0", "new_lane", 0)
    p2 = only(placer.arrive(job("j2", 2, 6)), Placed)
    assert (p2.step, p2.lane_id) == ("new_lane", 1) and "a lane that exists on it holds E" in p2.reason
    assert p2.persistent_total_mib + p2.lanes_total_mib == 15 * GIB
    w3 = only(placer.arrive(job("j3", 1, 7)), Waiting)
    assert w3.wants_gpu and "Σ P_i = 3072, Σ L_j = 12288, C = 16384" in w3.reason and "P = 1024, E = 7168" in w3.reason
    events = placer.finish("j1")
    assert events[0] == Left("j1", "g0")
    p3 = only(events, Placed)
    assert (p3.job, p3.step) == ("j3", "new_lane") and p3.persistent_total_mib + p3.lanes_total_mib == 16 * GIB
    assert not any(isinstance(e, GpuReleased) for e in placer.finish("j2"))
    assert only(placer.finish("j3"), GpuReleased) == GpuReleased("g0", "a", "cell-g0", "its last lane job j3 left")
    assert placer.gpus() == ()


def test_prefers_a_gpu_whose_existing_lane_fits_over_the_best_fit() -> None:
    placer = LanePlacer()
    placer.arrive(job("a", 0.5, 6))
    placer.add_gpu(gpu("g0"))
    assert only(placer.arrive(job("f", 9, 0.1)), Placed).gpu_id == "g0"  # g0: 15.6 GiB used
    assert only(placer.arrive(job("b", 6, 1)), Waiting).wants_gpu
    assert only(placer.add_gpu(gpu("g1")), Placed).job == "b"  # g1: 7 GiB used, a lane of 1
    placer.finish("f")  # g0: 6.5 GiB used, a lane of 6
    # c (P 1, E 5): both GPUs open a new lane; g1 is the tighter fit (3 GiB free after vs 3.5),
    # but g0 has a lane that holds E = 5
    p = only(placer.arrive(job("c", 1, 5)), Placed)
    assert (p.gpu_id, p.step) == ("g0", "new_lane") and "a lane that exists on it holds E" in p.reason
    # no lane holds E = 5.5 on g1 and g0 has no room: the best fit among the rest
    placer.finish("c")
    placer.finish("a")  # g0 released
    q = only(placer.arrive(job("q", 1, 5)), Placed)
    assert q.gpu_id == "g1" and "no lane that exists on a lane GPU holds E" in q.reason


def test_vcs_are_separate_and_an_emptied_gpu_goes_back() -> None:
    placer = LanePlacer()
    placer.arrive(job("a", 1, 10))
    placer.add_gpu(gpu("g0"))
    assert only(placer.arrive(job("b", 1, 10)), Placed).step == "existing_lane"  # 2 + 10 + 10 > 16
    other = only(placer.arrive(job("o", 1, 1, vc="b")), Waiting)
    assert "VC b has no lane GPU" in other.reason  # VC a's GPU is not VC b's
    placer.finish("a")
    assert only(placer.finish("b"), GpuReleased).cell == "cell-g0"
    assert placer.gpus() == () and placer.waiting == ("o",)
    assert only(placer.add_gpu(gpu("h0", vc="b")), Placed).gpu_id == "h0"


def test_refused_when_it_cannot_fit_any_gpu_alone_and_bad_input() -> None:
    placer = LanePlacer()
    placer.arrive(job("x", 1, 1))
    placer.add_gpu(gpu("g0"))
    r = only(placer.arrive(job("huge", 8, 9)), Refused)
    assert "exceeds C" in r.reason and placer.waiting == ()
    assert isinstance(placer.arrive(job("x", 1, 1))[0], Refused)
    assert isinstance(placer.arrive(LaneJob("nan", "a", float("nan"), 1.0))[0], Refused)
    assert isinstance(placer.arrive(LaneJob("neg", "a", -1.0, 1.0))[0], Refused)


def test_finish_of_a_waiting_job_and_twice() -> None:
    placer = LanePlacer()
    placer.arrive(job("w", 1, 1))
    assert placer.finish("w") == (Left("w", None),)
    assert placer.finish("w") == ()


def test_eviction_releases_only_the_evicted_job() -> None:
    placer = LanePlacer()
    placer.arrive(job("a", 2, 7))
    placer.add_gpu(gpu("g0"))
    assert only(placer.arrive(job("b", 2, 7)), Placed).step == "existing_lane"  # 4 + 7 + 7 > 16
    assert only(placer.arrive(job("c", 1, 4)), Placed).step == "new_lane"  # 5 + 7 + 4 = 16
    lanes_before = {la.lane_id: la.jobs for la in placer.manager("g0").lanes}
    placer.finish("b")
    lanes_after = {la.lane_id: la.jobs for la in placer.manager("g0").lanes}
    assert lanes_after == {k: tuple(j for j in v if j != "b") for k, v in lanes_before.items()}
    assert placer.gpu_of("a") == placer.gpu_of("c") == "g0"


@pytest.mark.parametrize("seed", range(30))
def test_never_admits_past_capacity(seed: int) -> None:
    """Random arrivals, finishes and GPU grants: Σ P_i + Σ L_j <= C on every GPU after every step."""
    rng = random.Random(seed)
    placer = LanePlacer()
    live: list[str] = []
    n_gpu = 0
    for i in range(200):
        r = rng.random()
        if r < 0.55:
            events = placer.arrive(job(f"j{i}", rng.uniform(0, 3), rng.uniform(0, 13), vc=rng.choice("ab")))
            live.append(f"j{i}")
            for e in events:
                assert not isinstance(e, Placed) or e.persistent_total_mib + e.lanes_total_mib <= e.capacity_mib + 1e-6
        elif r < 0.85 and live:
            placer.finish(live.pop(rng.randrange(len(live))))
        elif placer.waiting:
            placer.add_gpu(gpu(f"g{n_gpu}", vc=rng.choice("ab"), capacity_gib=rng.choice((12.0, 16.0))))
            n_gpu += 1
        for spec in placer.gpus():
            m = placer.manager(spec.gpu_id)
            assert m.persistent_total_mib + m.lanes_total_mib <= m.capacity_mib * (1 + 1e-9)
            assert placer.jobs_on(spec.gpu_id), "an empty lane GPU was kept instead of released"
            m.check_safety()
            for j in placer.jobs_on(spec.gpu_id):
                assert placer._jobs[j].vc == spec.vc
