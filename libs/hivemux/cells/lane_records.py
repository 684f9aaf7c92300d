"""What `cells.lane_gpus` keeps of each lane GPU and what it folds from the log (issue 20).

A lane GPU is an internal 1-pod, 1-GPU job of the cell allocator (``lane-gpu:<vc>:<n>``): its
request (`GpuRequest`: the group it serves, the VC, the priority it asks HiveD at, the GPU type)
and, once HiveD bound it, where it is and its capacity ``C`` (`BoundGpu`). After a restart
`LaneGpus` folds the log into a `Recorded` (the lane GPUs bound and not released, each lane
job's last recorded lane, the largest size recorded per lane, lane ids past the largest, the
executor refusals not decided yet) and rebuilds its placer from it at `LaneGpus.go_live`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .job_allocator import TrainingJob


@dataclass(frozen=True)
class GpuRequest:
    """An internal job asking HiveD for one GPU for a group."""

    job_id: str
    group: str
    vc: str
    priority: int
    gpu_type: str

    def training_job(self) -> TrainingJob:
        return TrainingJob(self.job_id, self.vc, self.priority, (1,), self.gpu_type)


@dataclass(frozen=True)
class BoundGpu:
    node: str
    gpu_id: str
    capacity_mib: float


@dataclass(frozen=True)
class RecordedLane:
    lane_gpu: str
    gpu_id: str
    lane_id: int
    lane_size_mib: float


@dataclass
class Recorded:
    """What the log said before `go_live` (crash recovery)."""

    gpus: dict[str, tuple[GpuRequest, BoundGpu]] = field(default_factory=dict)  # bound, not released
    lanes: dict[str, RecordedLane] = field(default_factory=dict)  # lane job -> its last recorded lane
    lane_sizes: dict[tuple[str, int], float] = field(default_factory=dict)  # (lane GPU, lane id) -> largest size
    next_lane: dict[str, int] = field(default_factory=dict)  # lane GPU -> past its largest lane id
    refused: dict[str, tuple[str, str, str, bool]] = field(default_factory=dict)  # executor refusals/evictions not decided: job -> (node, GPU, reason, evicted)
