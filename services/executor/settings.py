"""The executor's settings (``HIVEMUX_EXECUTOR_*``), read once by `main` and validated at startup;
`node_config` turns the process backend's part into the library's `NodeConfig`."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from hivemux.executor.cgroup_plan import DEFAULT_PIDS_MAX, KIND_DEFAULTS, KindDefaults
from hivemux.executor.config import NodeConfig
from hivemux.executor.users import WorkloadUsers
from hivemux.jobs.log_bound import LogBound
from hivemux.settings import ServiceSettings


class ExecutorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIVEMUX_EXECUTOR_", extra="ignore")

    report_interval_s: float = Field(default=1.0, ge=0.1, description="How often workloads advance and report")
    default_gpu_type: str = "T4"
    backend: Literal["simulated", "process"] = "simulated"
    # -- the process backend (one real node) ---------------------------------------------------
    node_id: str | None = Field(default=None, description="This node's id (the executor.commands key); process backend")
    work_dir: Path = Field(default=Path(tempfile.gettempdir()) / "hivemux-executor",
                           description="Workload files (checkpoints, progress, logs, xCUDA files) and MPS directories")
    tick_interval_s: float = Field(default=0.25, ge=0.05, description="How often process exits and progress are read")
    feed_hz: float = Field(default=10.0, ge=10.0, description="xCUDA control-block samples per second (≥ 10)")
    grace_s: float = Field(default=10.0, ge=0.0, description="SIGTERM → SIGKILL grace period")
    checkpoint_every: int = Field(default=20, ge=1, description="Iterations between checkpoints of the built-in training loop")
    train_args: list[str] = Field(default_factory=list, description="Extra arguments of hivemux.workloads.train")
    mps_binary: str = "nvidia-cuda-mps-control"
    mps_timeout_s: float = Field(default=2.0, gt=0.0, description="An MPS command unanswered this long means a hung daemon")
    mps_check_interval_s: float = Field(default=1.0, gt=0.0)
    mps: bool = Field(default=True, description="False: MPS disabled, every GPU time-sliced (said on its health record)")
    memory_quota_fraction: float = Field(default=0.4, gt=0.0, le=1.0, description="xCUDA quota when the command has none")
    gpu_memory_mib: float = Field(default=16384.0, gt=0.0, description="GPU memory until telemetry reports it")
    xcuda: bool = Field(default=True, description="Preload libxcuda.so into offline workloads")
    real_libcuda: str | None = Field(default=None, description="XCUDA_REAL_LIBCUDA for the workloads")
    cgroup_root: Path | None = Field(default=Path("/sys/fs/cgroup"),
                                     description="cgroup v2 root (cpusets, workload cgroups), or where the v1 hierarchies are mounted")
    workload_host_memory_mib: dict[str, float] = Field(
        default_factory=dict, description="Host memory limit (MiB) of a workload whose job asks none, per kind (training: per GPU; "
        "lane, offline, online); kinds not given: hivemux.executor.cgroup_plan.KIND_DEFAULTS")
    workload_cpus: dict[str, float] = Field(default_factory=dict, description="CPU limit of a workload whose job asks none, per kind")
    workload_pids_max: int = Field(default=DEFAULT_PIDS_MAX, ge=16, le=4_194_304, description="Processes and threads per workload")
    online_cpu_fraction: float = Field(default=0.5, gt=0.0, lt=1.0)
    min_available_memory_fraction: float = Field(default=0.05, ge=0.0, lt=1.0,
                                                 description="Below this MemAvailable/MemTotal offline work is evicted")
    gpu_memory_allowance_mib: float = Field(
        default=512.0, ge=0.0,
        description="GPU memory NVML may show per workload process beyond its xCUDA quota (its CUDA context) before the memory guard evicts it")
    online_services: dict[str, str] = Field(default_factory=dict, description="GPU id -> online service run beside offline work")
    online_args: list[str] = Field(default_factory=list, description="Extra arguments of hivemux.workloads.online")
    observation_window_s: float = Field(default=5.0, gt=0.0)
    salus_policy: Literal["fifo", "pack", "srtf", "fair", "off"] = Field(
        default="fifo", description="Iteration scheduling of the per-GPU Salus lane server; off: no lanes"
    )
    gpu_sampler: Literal["telemetry", "nvml"] = Field(
        default="telemetry", description="Where the xCUDA feed reads SM activity and clock: folded telemetry.gpu, or NVML here")
    nvml_library: str | None = Field(default=None, description="A specific libnvidia-ml.so.1 for the NVML sampler")
    # Who workloads run as (hivemux.executor.users): never root; a numeric uid/gid from a range.
    workload_uid_first: int = Field(default=200_000, ge=1000, description="First uid (and gid) workloads run as")
    workload_uid_count: int = Field(default=65_536, ge=1, description="How many uids the range holds")
    workload_uid_per: Literal["gpu", "job", "tenant"] = Field(
        default="gpu", description="One uid per GPU (every MPS client of a GPU: served at once), per job, or per tenant (vc)")
    sandbox: bool = Field(default=True, description="Each workload in its own mount/PID/IPC namespaces (root agents)")
    sandbox_shared: list[Path] = Field(default_factory=list, description="Node paths workloads may read that the sandbox would hide")
    admission_wait_s: float = Field(default=5.0, ge=0.0,
                                    description="How long a start waits for its job's submission and admission to be folded")
    node_address: str = Field(default="127.0.0.1", min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9.:-]*$",
                              description="The address other nodes and users reach this one at: a gang's MASTER_ADDR when its rank 0 "
                              "runs here, an online service's endpoint (address:PORT)")
    checkpoint_store: Path | None = Field(
        default=None, description="The cluster's checkpoint store (a directory every node mounts, the same on every agent): "
        "training pods checkpoint to <store>/<job>/rank-<rank>; None: node-local checkpoints")
    readiness_timeout_s: float = Field(default=300.0, gt=0.0, description="How long a service replica may take to pass its readiness probe")
    log_head_bytes: int = Field(default=256 * 1024, ge=0, le=64 * 1024 * 1024, description="First bytes of each pod's output shipped on jobs.logs")
    log_tail_bytes: int = Field(default=768 * 1024, ge=0, le=64 * 1024 * 1024,
                                description="Last bytes of each pod's output shipped on jobs.logs (what lies between is dropped)")

    @model_validator(mode="after")
    def _process_needs_a_node(self) -> ExecutorSettings:
        if self.backend == "process" and not self.node_id:
            raise ValueError("HIVEMUX_EXECUTOR_BACKEND=process needs HIVEMUX_EXECUTOR_NODE_ID")
        for name, given in (("WORKLOAD_HOST_MEMORY_MIB", self.workload_host_memory_mib), ("WORKLOAD_CPUS", self.workload_cpus)):
            if set(given) - set(KIND_DEFAULTS) or any(v <= 0 for v in given.values()):
                raise ValueError(f"HIVEMUX_EXECUTOR_{name}: positive values for the kinds {', '.join(KIND_DEFAULTS)}, got {given}")
        return self

    def kind_defaults(self) -> dict[str, KindDefaults]:
        return {kind: KindDefaults(self.workload_host_memory_mib.get(kind, row.host_memory_mib), self.workload_cpus.get(kind, row.cpus))
                for kind, row in KIND_DEFAULTS.items()}

    def node_config(self) -> NodeConfig:
        assert self.node_id is not None
        return NodeConfig(
            node_id=self.node_id, work_dir=self.work_dir / self.node_id, mps_binary=self.mps_binary,
            mps_timeout_s=self.mps_timeout_s, mps_check_interval_s=self.mps_check_interval_s, mps=self.mps, grace_s=self.grace_s,
            checkpoint_every=self.checkpoint_every, train_extra_args=tuple(self.train_args),
            memory_quota_fraction=self.memory_quota_fraction, gpu_memory_mib=self.gpu_memory_mib,
            default_gpu_type=self.default_gpu_type, xcuda=self.xcuda, real_libcuda=self.real_libcuda,
            cgroup_root=self.cgroup_root, online_cpu_fraction=self.online_cpu_fraction,
            kind_defaults=self.kind_defaults(), pids_max=self.workload_pids_max,
            min_available_memory_fraction=self.min_available_memory_fraction,
            gpu_memory_allowance_mib=self.gpu_memory_allowance_mib,
            online_services=dict(self.online_services), online_args=tuple(self.online_args),
            observation_window_s=self.observation_window_s, report_interval_s=self.report_interval_s,
            salus_policy=None if self.salus_policy == "off" else self.salus_policy,
            workload_users=WorkloadUsers(self.workload_uid_first, self.workload_uid_count, self.workload_uid_per),
            admission_wait_s=self.admission_wait_s, address=self.node_address, checkpoint_store=self.checkpoint_store,
            readiness_timeout_s=self.readiness_timeout_s, log_bound=LogBound(self.log_head_bytes, self.log_tail_bytes),
            sandbox=self.sandbox, sandbox_shared=tuple(self.sandbox_shared),
        )
