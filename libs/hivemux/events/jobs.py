"""Job submission, lifecycle and profile events."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, ValidationInfo, field_validator, model_validator

from .base import MAX_ENTRIES, MAX_GPUS, MAX_MIB, MAX_ITERATION_MS, MAX_ITERATIONS, Event, JobId, Label, Mebibytes, Name, Percent, Reason, Record, Text


class JobKind(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"
    TRAINING = "training"


class Priority(StrEnum):
    """HiveD's two classes: guaranteed jobs use VC quota, opportunistic ones scavenge."""

    GUARANTEED = "guaranteed"
    OPPORTUNISTIC = "opportunistic"


# A command line's bytes (arguments with their NULs): Linux's one-argument limit
# (MAX_ARG_STRLEN, 128 KiB) is the most any site's scripts rely on, and it keeps a submission
# well under its topic's record limit (1 MiB) with room for the rest of the job.
MAX_COMMAND_BYTES = 128 * 1024


# An environment variable's name a service's port is handed in (``PORT``, ``METRICS_PORT``).
PortName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Z_][A-Z0-9_]*$")]
# An HTTP path on the service (readiness, metrics): absolute, no scheme, host or query tricks.
HttpPath = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^/[A-Za-z0-9._~/-]*$")]
# A Prometheus metric name (the histogram's family, or its ``_bucket`` series).
MetricName = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")]


class ServicePort(Record):
    """A further port an online service's replica is given, in the environment variable ``name``
    (every replica gets ``PORT``; the executor allocates each on its node)."""

    name: PortName


class Readiness(Record):
    """When a replica counts as serving: its ``http`` path on ``PORT`` answers 2xx, or (``tcp``)
    ``PORT`` accepts a connection."""

    http: HttpPath | None = None
    tcp: bool = False

    @model_validator(mode="after")
    def _one_probe(self) -> "Readiness":
        if (self.http is not None) == self.tcp:
            raise ValueError("readiness is either an http path or tcp: true")
        return self


class ServiceMetrics(Record):
    """Where a service's latency is read: the Prometheus exposition at ``path`` on the port
    ``port`` names (default ``PORT``) and its latency histogram ``histogram``, in seconds."""

    path: HttpPath = "/metrics"
    histogram: MetricName
    port: PortName = "PORT"


class HostResources(Record):
    """What one pod of the workload asks of its node's host (issue 30 item 3): the limits of its
    cgroup there (`hivemux.executor.cgroup_plan`: memory beyond it is OOM-killed, CPU time beyond
    it throttled). Unset: its kind's default on the node (`cgroup_plan.KIND_DEFAULTS`)."""

    host_memory_mib: float | None = Field(default=None, ge=16, le=MAX_MIB,
                                          description="Host (not GPU) memory, MiB: the pod's memory limit (at least 16: its sandbox's own processes count)")
    cpus: float | None = Field(default=None, ge=0.01, le=4096, description="CPUs: the pod's CPU time quota (0.5 = half a CPU)")


class WorkloadSpec(Record):
    """What to run: a model family from the catalog, its batch size and length; an online
    service's own command also has its ports, readiness probe and metrics (issue 29)."""

    model: Name = Field(description="Model family, e.g. resnet50, vgg16, densenet201, inceptionv3, bert")
    batch_size: int = Field(ge=1, le=65536)
    iterations: int = Field(ge=1, le=MAX_ITERATIONS)
    command: tuple[Annotated[str, Field(max_length=4096)], ...] = Field(
        default=(), max_length=1024, description="Real command line, when not simulated"
    )
    slo_p99_ms: float | None = Field(default=None, gt=0, le=3_600_000, description="Online services: the p99 latency SLO, ms")
    request_rate: float | None = Field(default=None, ge=0, le=1e9, description="Online services: the expected requests per second")
    ports: tuple[ServicePort, ...] = Field(default=(), max_length=16, description="Online services: further ports, each in its environment variable (PORT is always given)")
    readiness: Readiness | None = Field(default=None, description="Online services: the probe a replica passes before it counts as serving")
    metrics: ServiceMetrics | None = Field(default=None, description="Online services: the Prometheus endpoint and latency histogram its p99 is read from")
    resources: HostResources = Field(default_factory=HostResources, description="Host memory and CPUs each pod asks for: its limits on the node")

    @field_validator("command")
    @classmethod
    def _command_fits(cls, command: tuple[str, ...]) -> tuple[str, ...]:
        size = sum(len(arg.encode()) + 1 for arg in command)  # as argv: each argument and its NUL
        if size > MAX_COMMAND_BYTES:
            raise ValueError(f"{size} bytes, more than the {MAX_COMMAND_BYTES} a command line may take")
        return command

    @model_validator(mode="after")
    def _ports_named_once(self) -> "WorkloadSpec":
        names = [p.name for p in self.ports]
        if len(set(names)) != len(names) or "PORT" in names:
            raise ValueError(f"ports {names}: each name once, and not PORT (every replica has it)")
        if self.metrics is not None and self.metrics.port not in ("PORT", *names):
            raise ValueError(f"metrics port {self.metrics.port} is not PORT nor one of the ports {names}")
        return self


class ResourceEstimates(Record):
    gpu_memory_mib: Mebibytes | None = None
    duration_s: float | None = Field(default=None, ge=0, le=366 * 86400, description="Expected run time (at most a year)")
    sm_activity: Percent | None = None
    persistent_memory_mib: Mebibytes | None = Field(default=None, description="Salus lanes: the job's persistent memory P (model, optimizer state); else its profile's")
    ephemeral_memory_mib: Mebibytes | None = Field(default=None, description="Salus lanes: the job's ephemeral memory E per iteration; else its profile's peak minus P")


class JobSubmission(Event):
    """A job as a user submits it (the event-sourced job log)."""

    job_id: JobId = Field(description="One path segment: letters, digits, '.', '_', ':', '-'; no '/' (node directories, pod names)")
    vc: Name = Field(description="Tenant / virtual cluster")
    kind: JobKind
    pods: int = Field(default=1, ge=1, le=4096)
    gpus_per_pod: int = Field(default=1, ge=1, le=64)
    gpu_type: Name | None = Field(default=None, description="HiveD leaf cell type: the GPU model required, if any")
    affinity_cell_type: Name | None = Field(default=None, description="HiveD cell type the gang must share")
    priority: Priority = Priority.OPPORTUNISTIC
    priority_value: int = Field(default=0, ge=-1, le=1000, description="HiveD priority: -1 opportunistic, 0..1000")
    pinned_cell_id: Name | None = Field(default=None, description="HiveD pinnedCellId: run inside this pinned cell")
    lazy_preemption: bool = Field(default=False, description="HiveD lazyPreemptionEnable: downgrade instead of kill")
    pod_gpus: tuple[Annotated[int, Field(ge=1, le=64)], ...] = Field(
        default=(), max_length=4096, description="GPUs of each pod when pods differ in size (HiveD affinity group members); empty: pods x gpus_per_pod"
    )
    workload: WorkloadSpec
    estimates: ResourceEstimates = Field(default_factory=ResourceEstimates)
    sharing: Literal["exclusive", "lanes"] | None = Field(
        default=None,
        description="lanes: share one GPU with other small jobs in Salus lanes (a 1-GPU training job); exclusive: whole GPUs; None: the scheduler's policy decides",
    )
    principal: Name | None = Field(default=None, description="Who asked (the API's token principal, tenant:token-id); None: a tool or a record from before issue 17")
    # What each limit means per kind (training, offline, online): `hivemux.jobs.limits`.
    max_runtime_s: float | None = Field(default=None, gt=0, le=366 * 86400,
                                        description="Wall-clock limit from the job's first start (a service: its first replica bound): then it is stopped gracefully and ends timed_out; None: no limit")
    queue_timeout_s: float | None = Field(default=None, gt=0, le=366 * 86400,
                                          description="A job not placed whole this long after its submission (a gang: all its pods; an offline job: on a GPU; a service: every replica) ends timed_out; None: it waits as long as it takes")
    max_restarts: int = Field(default=3, ge=0, le=1000,
                              description="Failures taken before the job ends failed: a gang restarts whole from its checkpoints, an offline job goes back to the queue, a service's failed replica starts again on its GPU")

    @model_validator(mode="before")
    @classmethod
    def _online_defaults(cls, data: object) -> object:
        """An online service is written with ``replicas`` (its pods) and is guaranteed unless
        it says otherwise (HiveD's guarantees protect online capacity)."""
        if isinstance(data, dict) and data.get("kind") in (JobKind.ONLINE, "online"):
            data = dict(data)
            if "replicas" in data:
                if "pods" in data and data["pods"] != data["replicas"]:
                    raise ValueError("an online service gives replicas or pods, not both")
                data["pods"] = data.pop("replicas")
            data.setdefault("priority", Priority.GUARANTEED)
            if isinstance(data.get("workload"), dict):  # a service runs until stopped: no iteration count
                data["workload"] = {"iterations": 1, **data["workload"]}
        if isinstance(data, dict) and "priority_value" not in data and data.get("priority", Priority.OPPORTUNISTIC) in (Priority.OPPORTUNISTIC, "opportunistic"):
            data = {**data, "priority_value": -1}  # HiveD's opportunistic priority (`_priority_matches`)
        return data

    @field_validator("priority_value")
    @classmethod
    def _priority_matches(cls, value: int, info: ValidationInfo) -> int:
        """An opportunistic job has HiveD's priority -1 (left out, it is filled in): any other value
        would be silently ignored (the allocator schedules every opportunistic job at -1)."""
        if info.data.get("priority") is Priority.OPPORTUNISTIC and value != -1:
            raise ValueError(f"an opportunistic job has priority_value -1 (or none), not {value}; 0..1000 are for priority: guaranteed")
        return value

    @model_validator(mode="after")
    def _offline_is_single_gpu(self) -> "JobSubmission":
        if self.kind is JobKind.OFFLINE and (self.pods != 1 or self.gpus_per_pod != 1):
            raise ValueError("offline jobs share one GPU: pods and gpus_per_pod must be 1")
        if self.kind is JobKind.ONLINE:
            self._check_online()
        if self.sharing == "lanes" and (self.kind is not JobKind.TRAINING or self.pod_sizes != (1,)):
            raise ValueError("lane sharing (sharing: lanes) is for training jobs of one pod on one GPU")
        if self.pod_gpus and (len(self.pod_gpus) != self.pods or min(self.pod_gpus) < 1):
            raise ValueError(f"pod_gpus lists {len(self.pod_gpus)} sizes for {self.pods} pods (each at least 1)")
        if sum(self.pod_sizes) > MAX_GPUS:
            raise ValueError(f"the job asks for {sum(self.pod_sizes)} GPUs, more than the {MAX_GPUS} any cluster has")
        return self

    def _check_online(self) -> None:
        """An online service: ``pods`` replicas of one GPU each, on a named GPU type, guaranteed,
        with its p99 SLO and expected request rate."""
        problems = []
        if self.gpus_per_pod != 1 or (self.pod_gpus and set(self.pod_gpus) != {1}):
            problems.append("each replica of an online service serves on one GPU: gpus_per_pod must be 1")
        if self.gpu_type is None:
            problems.append("an online service names its gpu_type")
        if self.priority is not Priority.GUARANTEED:
            problems.append("an online service is guaranteed (its replicas hold VC cells)")
        if self.workload.slo_p99_ms is None:
            problems.append("an online service names its latency SLO: workload.slo_p99_ms")
        if self.workload.request_rate is None or self.workload.request_rate <= 0:
            problems.append("an online service names its expected request rate (> 0): workload.request_rate")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def replicas(self) -> int:
        """An online service's replicas: its pods."""
        return self.pods

    @property
    def pod_sizes(self) -> tuple[int, ...]:
        """GPUs of each pod, in pod order."""
        return self.pod_gpus or (self.gpus_per_pod,) * self.pods


class JobState(StrEnum):
    """A job's lifecycle. ``cancelled``, ``suspended`` and ``resumed`` are decided by the job
    controller from user commands (`events.commands`): ``cancelled`` ends the job for good (the
    ``stopped`` the executor then reports for its workload does not change that); ``suspended``
    holds it, cells released and workload stopped, until ``resumed``, which puts it back at the
    end of its queue (then ``waiting``/``bound``/``placed`` as usual)."""

    SUBMITTED = "submitted"
    PROFILED = "profiled"
    WAITING = "waiting"  # not placed yet; the reason says why
    PLACED = "placed"
    BOUND = "bound"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"
    EVICTED = "evicted"
    PREEMPTED = "preempted"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"
    RESUMED = "resumed"
    POD_FAILED = "pod_failed"  # a job's process failed (its node's executor); its decider restarts it or fails it (`jobs.limits`)
    TIMED_OUT = "timed_out"  # over its max_runtime_s or queue_timeout_s (`jobs.limits`)


# States after which nothing happens to a job any more.
FINISHED_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.REJECTED, JobState.CANCELLED, JobState.TIMED_OUT})


class JobLifecycleEvent(Event):
    job_id: Name
    state: JobState
    reason: Reason = ""
    node_id: Name | None = None
    gpu_ids: tuple[Name, ...] = Field(default=(), max_length=MAX_GPUS)
    inputs: dict[Label, Text] = Field(
        default_factory=dict, max_length=MAX_ENTRIES, description="What the decision was computed from (the job controller's: command id, principal, prior state)"
    )


ProfileFeature = Literal["gpu_util", "sm_activity", "sm_occupancy", "memory_peak_mib", "persistent_memory_mib"]


class Profile(Event):
    """An offline job's solo execution features (MuxFlow §5 profiler)."""

    job_id: Name
    signature: str = Field(min_length=8, max_length=128, description="Hash of the workload spec; equal specs reuse a profile")
    gpu_type: Name
    method: Literal["simulated", "torch-cpu", "torch-cuda", "command-cpu", "command-cuda"]
    iteration_time_ms: float = Field(gt=0, le=MAX_ITERATION_MS)
    gpu_util: Percent
    sm_activity: Percent
    sm_occupancy: Percent
    memory_peak_mib: Mebibytes
    persistent_memory_mib: Mebibytes
    reused: bool = False
    profile_source: Literal["measured", "catalog"] = Field(
        default="catalog",
        description="measured: a dry run of the job's own command (issue 29); catalog: the job has no command, its model family's figures (or a dry run of a catalog model) stand in",
    )
    unmeasured: tuple[ProfileFeature, ...] = Field(
        default=(), max_length=5,
        description="Features the profiling device could not measure (a CPU has no SM activity); their values are the catalog's for the model family, not measurements",
    )
