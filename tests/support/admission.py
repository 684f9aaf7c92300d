"""What a scheduler publishes with an executor start: the job's submission and its admission.

The process executor starts only what the log admitted (`hivemux.executor.admission`): a
test that hands a node a start command first gives it (or publishes) the `JobSubmission` and
the `Placement` (offline) or `CellBinding` (training) behind it. The submitted workload is the
command's own here — the test plays the user who submitted that command line.

`reachable_by_workload_uids` makes the interpreter and a test's directories traversable by the
unprivileged uids workloads run as (`hivemux.executor.users`) when the tests run as root: the
executor switches uid for real then, and e.g. a pyenv Python under a 0700 ``/root`` (or pytest's
0700 ``/tmp/pytest-of-root``) could not be reached. Only the search (x) bit for others is added,
nothing becomes listable or readable that was not.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

from hivemux.events import (
    CellBinding,
    CommandAction,
    Event,
    ExecutorCommand,
    JobKind,
    JobSubmission,
    Placement,
    Priority,
    WorkloadSpec,
)

VC = "vc-test"


def admitted(command: ExecutorCommand, *, vc: str = VC, workload: WorkloadSpec | None = None) -> list[Event]:
    """The submission and the admission that back ``command`` (nothing for other actions)."""
    spec = workload or command.workload
    if command.action not in (CommandAction.START_OFFLINE, CommandAction.START_TRAINING) or spec is None:
        return []
    offline = command.action is CommandAction.START_OFFLINE
    at, job = command.occurred_at, command.job_id
    submission = JobSubmission(
        occurred_at=at, source="api/test", job_id=job, vc=vc, kind=JobKind.OFFLINE if offline else JobKind.TRAINING,
        gpus_per_pod=1 if offline else len(command.gpu_ids), workload=spec,
    )  # fmt: skip
    if offline:
        return [submission, Placement(
            occurred_at=at, source="matcher/test", job_id=job, action="place", gpu_id=command.gpu_ids[0],
            node_id=command.node_id, sm_share=command.sm_share or 50.0, policy="matching", reason="test placement",
        )]  # fmt: skip
    if command.lane is not None:  # a Salus lane job: admitted by its VC's lane GPU bound to the GPU (issue 20)
        lane_gpu = f"lane-gpu:{vc}:{command.gpu_ids[0].replace('/', '.')}"
        return [submission.model_copy(update={"sharing": "lanes"}), CellBinding(
            occurred_at=at, source="cell-allocator/test", job_id=lane_gpu, vc=vc, state="bound", pod=f"{lane_gpu}/0",
            priority=Priority.GUARANTEED, node_ids=(command.node_id,), gpu_ids=command.gpu_ids, reason="test lane GPU",
            inputs={"lane_group": f"{vc}/T4"},
        )]  # fmt: skip
    return [submission, CellBinding(
        occurred_at=at, source="cell-allocator/test", job_id=job, vc=vc, state="bound", pod=f"{job}/0",
        priority=Priority.GUARANTEED, node_ids=(command.node_id,), gpu_ids=command.gpu_ids, reason="test binding",
    )]  # fmt: skip


def admit(node: object, *commands: ExecutorCommand) -> None:
    """Fold into a `ProcessNode` what backs each of ``commands``."""
    for command in commands:
        for event in admitted(command):
            node.on_admission(event)  # type: ignore[attr-defined]


def reachable_by_workload_uids(paths: Iterable[Path] = ()) -> None:
    """Add the others' search bit to every ancestor of the interpreter, the virtualenv and
    ``paths`` (see the module docstring); nothing when not root."""
    if os.geteuid() != 0:
        return
    targets = [Path(os.path.realpath(sys.executable)), Path(sys.prefix), Path(sys.base_prefix), *paths]
    for target in targets:
        for directory in [target, *target.parents] if target.is_dir() else target.parents:
            mode = directory.stat().st_mode
            if not mode & stat.S_IXOTH:
                os.chmod(directory, stat.S_IMODE(mode) | stat.S_IXOTH)
