"""The SLO-driven protection rule (`hivemux.sharing.slo_protection`)."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from hivemux.sharing.slo_protection import GpuProtection, LatencyReading, SloPolicy, SloProtector, Step, decide

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
# The module docstring's example policy: two launch-target levels, then two SM-share levels.
POLICY = SloPolicy(approach=0.8, restore_below=0.6, launch_targets=(0.5, 0.3))


def make(**changes: object) -> SloProtector:
    return SloProtector(replace(POLICY, **changes))


def reading(p99: float, k: int, *, job: str | None = "off-1", slo: float = 100.0, share: float = 80.0) -> LatencyReading:
    return LatencyReading("node-00/gpu-0", "node-00", "infer-bert-00", p99, slo, T0 + timedelta(seconds=15 * k), job, share)


def feed(protector: SloProtector, p99s: list[float], **kw) -> list[list]:
    return [list(protector.observe(reading(p, k, **kw))) for k, p in enumerate(p99s)]


def test_approach_lowers_the_launch_target_then_the_sm_share() -> None:
    out = feed(make(), [85, 90, 95, 99, 99])
    steps = [[a.step for a in o] for o in out]
    assert steps == [[Step.LOWER_LAUNCH_TARGET], [], [Step.LOWER_LAUNCH_TARGET], [], [Step.LOWER_SM_SHARE]]
    first, second, third = out[0][0], out[2][0], out[4][0]
    assert (first.launch_target, first.sm_share, first.level) == (0.5, 80.0, 1)
    assert (second.launch_target, second.sm_share) == (0.3, 80.0)
    assert (third.launch_target, third.sm_share, third.level) == (0.3, 40.0, 3)
    assert (third.p99_ms, third.slo_p99_ms) == (99, 100.0) and "99 % of the SLO" in third.reason


def test_inside_the_band_holds() -> None:
    protector = make()
    feed(protector, [85])
    assert feed(protector, [70, 65, 75, 79, 61]) == [[]] * 5
    assert protector.level("node-00/gpu-0") == 1


def test_hysteresis_restores_one_step_per_streak() -> None:
    protector = make()
    feed(protector, [85, 85, 85, 85, 85])  # level 3: targets lowered twice, share halved
    assert protector.level("node-00/gpu-0") == 3
    out = [[a.step for a in o] for o in feed(protector, [50, 50, 50, 50, 70, 50, 50, 50, 50, 50, 50])]
    assert out == [[], [], [Step.RESTORE_SM_SHARE], [], [], [], [], [Step.RESTORE_LAUNCH_TARGET], [], [], [Step.RESTORE_LAUNCH_TARGET]]
    assert protector.level("node-00/gpu-0") == 0


def test_restored_values_are_the_nominal_ones() -> None:
    protector = make()
    feed(protector, [85, 85, 85])
    restores = [a for o in feed(protector, [10] * 6) for a in o]
    assert [(a.launch_target, a.sm_share) for a in restores] == [(0.5, 80.0), (0.7, 80.0)]


def test_sustained_breach_evicts() -> None:
    protector = SloProtector(replace(POLICY, breach_reports=5, breach_s=60.0))
    out = feed(protector, [120] * 5)  # 5 reports 15 s apart span 60 s
    assert out[-1] and out[-1][0].step is Step.EVICT and out[-1][0].offline_job_id == "off-1"
    assert "sustained breach" in out[-1][0].reason
    assert protector.level("node-00/gpu-0") == 0


def test_a_short_breach_does_not_evict() -> None:
    out = feed(make(), [120, 120, 120, 120, 50, 120, 120])
    assert Step.EVICT not in [a.step for o in out for a in o]


def test_breach_needs_event_time_not_only_reports() -> None:
    protector = SloProtector(replace(POLICY, breach_reports=2, breach_s=600.0))
    assert Step.EVICT not in [a.step for o in feed(protector, [150] * 10) for a in o]  # 135 s < 600 s


def test_a_new_neighbour_starts_nominal_and_no_neighbour_resets() -> None:
    protector = make()
    feed(protector, [85, 85, 85])
    out = protector.observe(reading(85, 10, job="off-2", share=60.0))
    assert [(a.step, a.level, a.offline_job_id, a.sm_share) for a in out] == [(Step.LOWER_LAUNCH_TARGET, 1, "off-2", 60.0)]
    assert protector.observe(reading(200, 11, job=None)) == ()
    assert protector.level("node-00/gpu-0") == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_decisions_are_a_function_of_the_reports(seed: int) -> None:
    rng = random.Random(seed)
    reports = [reading(rng.uniform(20, 140), k, job=f"off-{k // 40}") for k in range(300)]
    runs = []
    for _ in range(2):
        protector = make()
        runs.append([a for r in reports for a in protector.observe(r)])
    assert runs[0] == runs[1] and runs[0]


def test_decide_does_not_mutate_its_input() -> None:
    state = GpuProtection()
    decide(state, reading(90, 0), POLICY)
    assert state == GpuProtection()


def test_the_shipped_defaults_step_through_three_launch_targets() -> None:
    p = SloProtector()
    steps = [(a.step, a.launch_target, a.sm_share) for k in range(12) for a in p.observe(reading(95, k))]
    assert [s[1] for s in steps[:3]] == [0.6, 0.5, 0.4] and steps[3] == (Step.LOWER_SM_SHARE, 0.4, 40.0)
    assert p.observe(reading(89, 20)) == ()  # under the 90 % approach, over the 75 % restore: hold


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        SloPolicy(approach=0.5, restore_below=0.6)
