"""Read-model projections: pure folds of decoded events into row changes (no I/O).

``read_models.py`` turns each event the projector consumes into the changes it makes to the
read-model tables (jobs, job_events, gpus, faults); ``hivemux.store.read_models`` applies them
in PostgreSQL together with the consumed offsets, and ``hivemux.store.projector`` runs the loop.
"""

from .read_models import (
    ENDS_SUSPENSION,
    FINISHED_STATES,
    PROJECTED_TOPICS,
    Change,
    FaultRow,
    FoldedStates,
    GpuEventRow,
    GpuHealthChanged,
    GpuOfflineChanged,
    JobBindingChanged,
    JobEventRow,
    JobPlacementChanged,
    JobPriorityChanged,
    JobRestarted,
    JobStateChanged,
    JobSubmitted,
    Position,
    VcQuotasChanged,
    applies,
    fold_states,
    project,
)
from .logs import LogChunkStored, LogLine, LogRetention, LogsSwept, StoredChunk, log_lines
from .lanes import LANE_GPU_KIND, JobProgress, LaneGpuChanged, LaneJobBound, fold_progress, lane_line
from .online import OnlineServiceSubmitted, ProtectionStep, ReplicaEndpoint, ReplicaLatency, fold_latency, slo_state
from .usage import JobEnded, SharingObserved, UsageEnded, UsageStarted

__all__ = [
    "LogChunkStored",
    "LogLine",
    "LogRetention",
    "LogsSwept",
    "StoredChunk",
    "log_lines",
    "LANE_GPU_KIND",
    "JobProgress",
    "LaneGpuChanged",
    "LaneJobBound",
    "fold_progress",
    "lane_line",
    "ENDS_SUSPENSION",
    "FINISHED_STATES",
    "PROJECTED_TOPICS",
    "Change",
    "FaultRow",
    "FoldedStates",
    "JobEnded",
    "OnlineServiceSubmitted",
    "ProtectionStep",
    "ReplicaEndpoint",
    "ReplicaLatency",
    "fold_latency",
    "slo_state",
    "SharingObserved",
    "UsageEnded",
    "UsageStarted",
    "GpuEventRow",
    "GpuHealthChanged",
    "GpuOfflineChanged",
    "JobBindingChanged",
    "JobEventRow",
    "JobPlacementChanged",
    "JobPriorityChanged",
    "JobRestarted",
    "JobStateChanged",
    "JobSubmitted",
    "Position",
    "VcQuotasChanged",
    "applies",
    "fold_states",
    "project",
]
