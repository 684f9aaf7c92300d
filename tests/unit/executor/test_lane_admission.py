"""A lane start's admission (`hivemux.executor.admission`, issue 20): the job's VC has a lane GPU
(``lane-gpu:<vc>:<n>`` on ``cells.bindings``) bound on the command's node and GPU."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hivemux.events import CellBinding, CommandAction, ExecutorCommand, JobKind, JobSubmission, LaneGrant, Priority, WorkloadSpec
from hivemux.executor.admission import Admissions, Admitted, Refusal

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
GPU = "node-00/gpu-1"
SPEC = WorkloadSpec(model="bert", batch_size=8, iterations=50)


def submission(vc: str = "vc-a", sharing: str | None = "lanes") -> JobSubmission:
    return JobSubmission(occurred_at=T0, source="api/test", job_id="j", vc=vc, kind=JobKind.TRAINING, workload=SPEC,
                         sharing=sharing)  # type: ignore[arg-type]


def lane_gpu(vc: str = "vc-a", gpu: str = GPU, state: str = "bound", allocators: bool = True) -> CellBinding:
    return CellBinding(occurred_at=T0, source="cell-allocator/test", job_id=f"lane-gpu:{vc}:0", vc=vc, state=state,  # type: ignore[arg-type]
                       pod=f"lane-gpu:{vc}:0/0", priority=Priority.GUARANTEED, node_ids=("node-00",), gpu_ids=(gpu,),
                       reason="lane GPU", inputs={"lane_group": f"{vc}/T4"} if allocators else {})  # fmt: skip


START = ExecutorCommand(occurred_at=T0, source="cell-allocator/test", node_id="node-00", action=CommandAction.START_TRAINING,
                        job_id="j", gpu_ids=(GPU,), workload=SPEC,
                        lane=LaneGrant(lane_id=0, lane_size_mib=2000, persistent_mib=500, ephemeral_mib=2000, policy="srtf"))


@pytest.mark.parametrize(
    ("folds", "expect"),
    [
        ([submission(), lane_gpu()], "lane GPU lane-gpu:vc-a:0"),
        ([submission(sharing=None), lane_gpu()], "lane GPU lane-gpu:vc-a:0"),  # the scheduler chose lanes by policy
        ([submission(), lane_gpu(vc="vc-b")], "no lane GPU of VC vc-a is bound to node-00/gpu-1"),
        ([submission(), lane_gpu(gpu="node-00/gpu-2")], "no lane GPU of VC vc-a is bound to node-00/gpu-1"),
        ([submission(), lane_gpu(), lane_gpu(state="released")], "no lane GPU of VC vc-a"),
        ([submission(sharing="exclusive"), lane_gpu()], "sharing: exclusive"),
        ([submission(), lane_gpu(allocators=False)], "no lane GPU of VC vc-a"),  # a user's job named lane-gpu:...
        ([lane_gpu()], "never submitted"),
    ],
    ids=["own-vc-lane-gpu", "sharing-unset", "other-vcs-lane-gpu", "other-gpu", "lane-gpu-released", "exclusive", "named-like-a-lane-gpu",
         "not-submitted"],
)
def test_lane_start_admission(folds: list, expect: str) -> None:
    admissions = Admissions()
    for event in folds:
        admissions.fold(event)
    found = admissions.resolve(START, "node-00")
    if isinstance(found, Admitted):
        assert found.by == expect and found.gpu_ids == (GPU,) and found.workload == SPEC
    else:
        assert isinstance(found, Refusal) and expect in found.reason
