"""salus-policies: the one-GPU Salus §5.1 simulation driving the real LaneManager and IterationScheduler."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from hivemux.lanes.iteration_scheduler import Policy
from hivemux.experiments import salus_experiments as se
from hivemux.experiments.report import write_outputs
from hivemux.experiments.scenarios import SCENARIOS, run_scenario, scenario_params

SMALL = scenario_params("salus-policies", "small").salus


class CheckedRun(se.SalusRun):
    """Records every step and checks the lane safety condition after every event (on top of the run's own check)."""

    def run(self) -> se.SalusRun:  # same loop as SalusRun.run, with extra assertions per event
        for j in self.jobs:
            self.sim.schedule(j.arrival_s, "arrival", j.name)
        self.checks = 0
        while (ev := self.sim.pop()) is not None:
            self._advance()
            if ev.kind == "arrival":
                j = self.recs[ev.payload].job
                self._lane_events(self.lanes.job_arrive(j.name, j.persistent_mib, j.ephemeral_mib))
            else:
                self.tick = None
                for lane_id in sorted(lid for lid, r in self.running.items() if r[1] <= 1e-9):
                    self._step_done(lane_id)
            self._reschedule()
            self.lanes.check_safety()  # raises InvariantViolation if Σ P_i + Σ L_j > C
            assert self.lanes.persistent_total_mib + self.lanes.lanes_total_mib <= self.lanes.capacity_mib * (1 + 1e-9)
            for lane in self.lanes.lanes:
                assert all(self.lanes.memory_of(j).ephemeral_mib <= lane.size_mib for j in lane.jobs)
            # at most one running iteration per lane, and only in an existing lane
            assert set(self.running) <= {lane.lane_id for lane in self.lanes.lanes}
            self.checks += 1
        return self


@pytest.mark.parametrize("policy", se.POLICIES)
def test_every_job_finishes_exactly_once_and_lanes_stay_safe(policy: Policy) -> None:
    jobs = se.make_jobs(SMALL, seed=3)
    run = CheckedRun(policy, jobs, SMALL, seed=3).run()
    assert run.checks > len(jobs)
    assert all(r.finished_count == 1 for r in run.recs.values())
    finishes = Counter(step[0] for step in run.steps)
    assert {name: finishes[name] for name in run.recs} == {j.name: j.steps for j in jobs}
    assert not run.refused and not run.running and not run.lanes.lanes and not run.lanes.pending
    s = run.summary()
    assert s["finished"] == s["jobs"] == SMALL.jobs
    assert 1 <= s["max_concurrent_lanes"] <= s["lanes_opened"]


def test_deterministic_per_seed() -> None:
    a = se.run_policies(SMALL, seed=5)
    b = se.run_policies(SMALL, seed=5)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c = se.run_policies(SMALL, seed=6)
    assert json.dumps(a, sort_keys=True) != json.dumps(c, sort_keys=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_srtf_beats_fifo_on_average_jct_at_small_scale(seed: int) -> None:
    pol = se.run_policies(SMALL, seed)["policies"]
    assert pol["SRTF"]["avg_jct_min"] < pol["FIFO"]["avg_jct_min"]
    for s in pol.values():
        assert s["finished"] == SMALL.jobs
        assert s["fairness_jain"] is None or 0 < s["fairness_jain"] <= 1 + 1e-9


@pytest.mark.parametrize("policy", se.POLICIES)
def test_iterations_in_a_lane_are_serialized(policy: Policy) -> None:
    run = se.SalusRun(policy, se.make_jobs(SMALL, 1), SMALL, 1).run()
    by_lane: dict[int, list[tuple[float, float]]] = {}
    for _job, start, end, lane in run.steps:
        by_lane.setdefault(lane, []).append((start, end))
    assert by_lane
    for spans in by_lane.values():
        spans.sort()
        assert all(a_end <= b_start + 1e-9 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_scenario_registered_and_outputs_written(tmp_path: Path) -> None:
    assert "salus-policies" in SCENARIOS
    result = run_scenario("salus-policies", scenario_params("salus-policies", "small"), seed=0)
    files = write_outputs(result, tmp_path)
    names = {f.name for f in files}
    assert {"results.json", "salus-policies.png", "report.md"} <= names
    report = (tmp_path / "report.md").read_text()
    assert "Where we disagree" in report and "170.6" in report  # the paper's FIFO avg JCT beside ours
    assert set(json.loads((tmp_path / "results.json").read_text())["results"]["policies"]) == {"FIFO", "SRTF", "PACK", "FAIR"}
