"""Offline efficiency, computed the paper's way (MuxFlow preprint §5.2 and §7.1, journal §7.1).

- *Normalized throughput* of an offline job: "the throughput when sharing divided by the
  throughput when running separately" (§5.2). Over a run of ``i`` iterations that took
  ``T_real`` seconds of event time, with a profiled solo iteration time ``t_solo``:
  ``T_sep / T_real`` with ``T_sep = i * t_solo``.
- *Overall normalized throughput*: the sum of the jobs' normalized throughputs, the
  quantity the matching maximizes (Figure 9's "overall throughput ... 0.8 + 0.8 = 1.6");
  `EfficiencyReport.mean_normalized_throughput` gives the per-job mean beside it.
- *Oversold GPU*, eq. 3: ``sum_w T_w^sep / sum_w T_w^real`` over offline workloads W_off, in
  [0, 1]: "how much GPU the offline workloads get in the aspect of computation speed". The
  journal prints it this way; the preprint prints the fraction upside down (real over
  separate), which would exceed 1 and contradicts its own "in the range of [0, 1]", so we
  follow the journal.

Name mapping: `JobRun` is one execution of a job on a GPU between two reports (a job moved
or evicted and placed again has several runs; eq. 3 sums them). Worked example: a job ran
100 iterations of 0.5 s solo in 80 s (normalized 0.625) and another 50 of 1 s in 50 s (1.0):
overall 1.625, mean 0.8125, oversold GPU (50 + 50) / (80 + 50) = 0.769.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class JobRun:
    job_id: str
    iterations: float  # done during the run
    solo_iteration_time_s: float  # profiled
    real_time_s: float  # event time the run took

    @property
    def separate_time_s(self) -> float:
        return self.iterations * self.solo_iteration_time_s


@dataclass(frozen=True)
class EfficiencyReport:
    normalized_throughput: Mapping[str, float]  # per job
    overall_normalized_throughput: float
    mean_normalized_throughput: float
    oversold_gpu: float  # eq. 3


def offline_efficiency(runs: Iterable[JobRun]) -> EfficiencyReport:
    separate: dict[str, float] = defaultdict(float)
    real: dict[str, float] = defaultdict(float)
    for run in runs:
        if run.real_time_s < 0 or run.iterations < 0 or run.solo_iteration_time_s <= 0:
            raise ValueError(f"invalid run {run}")
        separate[run.job_id] += run.separate_time_s
        real[run.job_id] += run.real_time_s
    per_job = {j: min(1.0, separate[j] / real[j]) for j in sorted(real) if real[j] > 0}
    overall = sum(per_job.values())
    total_real = sum(real.values())
    return EfficiencyReport(
        normalized_throughput=per_job,
        overall_normalized_throughput=overall,
        mean_normalized_throughput=overall / len(per_job) if per_job else 0.0,
        oversold_gpu=min(1.0, sum(separate.values()) / total_real) if total_real > 0 else 0.0,
    )
