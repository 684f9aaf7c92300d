"""The topic registry: every topic hivemux uses, declared once.

Each topic names its value model, the model field that is its key (so the key, and therefore
the partition and the owning consumer-group member, follows from the event), its partition
count, its cleanup policy, its retention and its dead-letter topic. `schemas/` is generated from
here, and services create exactly these topics at start.

Retention (ARCHITECTURE.md, "The log as the system of record"): the topics are the record, so
every topic keeps everything on any Kafka (``retention.ms`` and ``retention.bytes`` -1), except
raw telemetry (samples are re-measured every second; what they caused is on the decision
topics) and dead letters, which keep the broker's default. A compacted topic keeps the last
record per key for ever: its key must make that record the whole state of the key
(tests/unit/test_compaction.py folds a recorded run from all records and from the last per key).

Partition counts bound how many instances of a consuming service share work: the telemetry
and health topics are keyed by GPU, node-facing commands by node, job topics by job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .events import (
    CellBinding,
    CellConfig,
    ClockTick,
    ConsumptionJournal,
    DeadLetter,
    DeviceControl,
    Event,
    ExecutorCommand,
    ExecutorReport,
    Fault,
    GpuTelemetryBatch,
    HealthTransition,
    JobCommand,
    JobCommandRefused,
    JobLifecycleEvent,
    JobLogChunk,
    JobPriorityChanged,
    JobResized,
    JobSubmission,
    LeaderElected,
    NodeAgent,
    NodePressure,
    NodeTelemetry,
    OnlineLatencyReport,
    Placement,
    PredictorModel,
    Profile,
    SharingObservation,
    SloProtectionAction,
    SysMonitorSnapshot,
)

CleanupPolicy = Literal["delete", "compact"]
# "unlimited": the history is the record; "bounded": the broker's default retention.
Retention = Literal["unlimited", "bounded"]
DEAD_LETTER_SUFFIX = ".dlq"
UNLIMITED_RETENTION = {"retention.ms": "-1", "retention.bytes": "-1"}


@dataclass(frozen=True)
class Topic:
    name: str
    model: type[Event]
    key_field: str
    partitions: int
    cleanup_policy: CleanupPolicy
    description: str
    # Defaults to keeping everything: a topic declared without it loses nothing.
    retention: Retention = "unlimited"
    # A record larger than this is refused at decode (dead-lettered), whatever it holds.
    max_record_bytes: int = 1024 * 1024

    @property
    def dead_letter(self) -> "Topic":
        return Topic(
            name=self.name + DEAD_LETTER_SUFFIX,
            model=DeadLetter,
            key_field="original_topic",
            partitions=1,
            cleanup_policy="delete",
            description=f"Records of {self.name} that could not be accepted, with the reason.",
            retention="bounded",  # evidence for an operator to look at, not the record
        )

    @property
    def configs(self) -> dict[str, str]:
        """The topic configs it is created with, in Kafka's names."""
        configs = {"cleanup.policy": self.cleanup_policy}
        if self.retention == "unlimited":
            configs |= UNLIMITED_RETENTION
        return configs

    def key_of(self, event: Event) -> str:
        return str(getattr(event, self.key_field))


# Keyed by node: one record per node and sampling instant; the health-processor instance that
# owns a node's partition owns all its GPUs. gpu.control and executor.reports share the key and
# the partition count, so the default range assignor gives one instance all of a node's inputs.
GPU_TELEMETRY = Topic("telemetry.gpu", GpuTelemetryBatch, "node_id", 8, "delete", "GPU samples, batched per node and instant", "bounded")
GPU_CONTROL = Topic("gpu.control", DeviceControl, "node_id", 8, "delete", "Operator drains and undrains of GPUs")
# A snapshot is a GPU's whole SysMonitor state: compaction keeps what a new owner resumes from.
HEALTH_STATE = Topic("health.state", SysMonitorSnapshot, "gpu_id", 8, "compact", "Changelog of each GPU's full SysMonitor state")
# Transitions and pressure changes are decisions (with the evictions they caused): their history
# is what `gpus explain` and audit replay read, so they are not compacted to the latest one.
NODE_PRESSURE = Topic("node.pressure", NodePressure, "node_id", 4, "delete", "Node CPU/memory pressure changes")
NODE_TELEMETRY = Topic("telemetry.node", NodeTelemetry, "node_id", 8, "delete", "Node samples: GPUs, CPU and memory pressure", "bounded")
GPU_HEALTH = Topic("gpu.health", HealthTransition, "gpu_id", 4, "delete", "SysMonitor state transitions per GPU")
GPU_FAULTS = Topic("gpu.faults", Fault, "gpu_id", 4, "delete", "Detected error patterns and their remediation")
JOBS_SUBMITTED = Topic("jobs.submitted", JobSubmission, "job_id", 4, "delete", "The event-sourced job log")
# Commands share the job log's key and partition count: one job's submission, commands and
# lifecycle sit on the same partition number of each topic.
JOBS_COMMANDS = Topic("jobs.commands", JobCommand, "job_id", 4, "delete", "Users' commands on jobs: cancel, suspend, resume, priority, resize")
JOBS_REFUSALS = Topic("jobs.refusals", JobCommandRefused, "job_id", 4, "delete", "Job commands refused, with the reason")
JOBS_PRIORITIES = Topic("jobs.priorities", JobPriorityChanged, "job_id", 4, "delete", "Training jobs' HiveD priority changes")
JOBS_RESIZES = Topic("jobs.resizes", JobResized, "job_id", 4, "delete", "Resizes applied: replicas, SM share, memory quota, before and after")
JOBS_LIFECYCLE = Topic("jobs.lifecycle", JobLifecycleEvent, "job_id", 4, "delete", "Job state changes with reasons")
# Workloads' output (issue 29), keyed by job like the job log: one job's chunks are in order on one
# partition, so a reader's cursor is the record offset. Bounded retention: the read model keeps
# each job's head and tail for its configured time after the job ends (`projection.logs`); the
# topic is transport, not the record of any decision.
JOBS_LOGS = Topic("jobs.logs", JobLogChunk, "job_id", 4, "delete", "Workloads' output in bounded chunks (head and tail per pod)", "bounded")
# Compacted: a profile is the job's whole solo profile; a newer one replaces it.
JOBS_PROFILED = Topic("jobs.profiled", Profile, "job_id", 4, "compact", "Solo execution profiles of offline jobs")
SHARING_OBSERVATIONS = Topic("sharing.observations", SharingObservation, "gpu_id", 4, "delete", "Measured effects of sharing a GPU")
ONLINE_LATENCY = Topic("online.latency", OnlineLatencyReport, "node_id", 8, "delete", "Online services' measured latency percentiles per window")
SLO_PROTECTION = Topic("sharing.protection", SloProtectionAction, "gpu_id", 4, "delete", "SLO-driven protection steps: measured p99, SLO, step")
# History, not compacted: every training is a decision on the log, refused versions too
# (``published=False``): compacted by GPU type, a refused version would hide the one in use.
# A trained MLP's weights are ~50 KB of base64: a record four times that is not a model.
PREDICTOR_MODELS = Topic("predictor.models", PredictorModel, "gpu_type", 1, "delete", "Speed predictor versions per GPU type", max_record_bytes=256 * 1024)
# Compacted: a configuration version carries the whole cell configuration; consumers take the
# newest version, so the last record is the state.
CELL_CONFIG = Topic("cells.config", CellConfig, "cluster", 1, "compact", "Cell configuration versions (HiveD format)")
# History, not compacted: a job's record is one per pod (bound, then released or preempted) plus
# its refusals, which name no pod. The allocator rebuilds from the whole binding log after a crash
# (HiveD §4 "Fault tolerance"); compacted by job id, a Kafka broker would keep one pod of a gang.
# Keying per pod would survive compaction for recovery but not refusals, and would lose the
# binding history that audit replay compares. Keyed by job, a gang's records stay in order on
# one partition.
CELL_BINDINGS = Topic("cells.bindings", CellBinding, "job_id", 4, "delete", "HiveD cell bindings of training jobs")
PLACEMENTS = Topic("placements", Placement, "job_id", 4, "delete", "Matcher decisions for offline jobs")
EXECUTOR_COMMANDS = Topic("executor.commands", ExecutorCommand, "node_id", 8, "delete", "Commands to node executors")
# Time passing (`events/clock.py`): every instance folds all ticks, so one partition.
CLOCK_TICKS = Topic("clock.ticks", ClockTick, "ticker", 1, "delete", "Ticks that trigger periodic decisions at their event time")
EXECUTOR_REPORTS = Topic("executor.reports", ExecutorReport, "node_id", 8, "delete", "Node executors' workload reports")
# Compacted: a node agent's record is its whole state (its address, its checkpoint store); every
# agent folds all of them (a gang's rendezvous address), so one partition.
NODE_AGENTS = Topic("nodes.agents", NodeAgent, "node_id", 1, "compact", "Node agents: the address other nodes reach each at, its checkpoint store")
# What each deciding service consumed, in order (`events/audit.py`): keyed by the instance, so
# each incarnation's records stay in order on one partition; the audit replay reads it.
AUDIT_JOURNAL = Topic("audit.journal", ConsumptionJournal, "source", 4, "delete", "Deciding services' consumption journals")

# Single-active deciders (`bus.leadership`): each instance of the cell allocator and of the
# matcher joins the group `<prefix>.<service>.leader` on this one-partition topic, and the member
# given its partition decides. Each group is its own, so one partition serves every decider. The
# records are the takeovers (who decides from when), a history kept like every decision.
LEADERSHIP = Topic("leadership", LeaderElected, "service", 1, "delete", "Takeovers of single-active deciders (who decides from when)")

TOPICS: tuple[Topic, ...] = (
    GPU_TELEMETRY,
    NODE_TELEMETRY,
    GPU_CONTROL,
    GPU_HEALTH,
    HEALTH_STATE,
    NODE_PRESSURE,
    GPU_FAULTS,
    JOBS_SUBMITTED,
    JOBS_COMMANDS,
    JOBS_REFUSALS,
    JOBS_PRIORITIES,
    JOBS_RESIZES,
    JOBS_LIFECYCLE,
    JOBS_LOGS,
    JOBS_PROFILED,
    SHARING_OBSERVATIONS,
    ONLINE_LATENCY,
    SLO_PROTECTION,
    PREDICTOR_MODELS,
    CELL_CONFIG,
    CELL_BINDINGS,
    PLACEMENTS,
    EXECUTOR_COMMANDS,
    EXECUTOR_REPORTS,
    NODE_AGENTS,
    CLOCK_TICKS,
    AUDIT_JOURNAL,
    LEADERSHIP,
)

ALL_TOPICS: tuple[Topic, ...] = TOPICS + tuple(t.dead_letter for t in TOPICS)

_BY_NAME = {t.name: t for t in ALL_TOPICS}
_BY_MODEL = {t.model: t for t in TOPICS}


def by_name(name: str) -> Topic:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown topic {name!r}; known: {sorted(_BY_NAME)}") from None


def topic_for(event: Event) -> Topic:
    """The one topic an event of this type is published to."""
    try:
        return _BY_MODEL[type(event)]
    except KeyError:
        raise TypeError(f"{type(event).__name__} has no topic of its own (dead letters name theirs)") from None
