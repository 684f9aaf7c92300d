"""The process executor's configuration: one frozen record, built once by the service shell
from its settings (`HIVEMUX_EXECUTOR_*`) and handed to every part of the node agent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hivemux.executor.cgroup_plan import DEFAULT_PIDS_MAX, KIND_DEFAULTS, KindDefaults
from hivemux.executor.users import WorkloadUsers
from hivemux.jobs.log_bound import LogBound
from hivemux.xcuda import LaunchControl


@dataclass(frozen=True)
class NodeConfig:
    node_id: str
    work_dir: Path
    mps_binary: str = "nvidia-cuda-mps-control"
    mps_timeout_s: float = 2.0
    mps_check_interval_s: float = 1.0
    # False: MPS is disabled by configuration: no daemon is started, every GPU is time-sliced
    # and said so on its health record (issue 30 item 4, `GpuDaemons.client_daemon`).
    mps: bool = True
    grace_s: float = 10.0
    checkpoint_every: int = 20
    train_extra_args: tuple[str, ...] = ()
    memory_quota_fraction: float = 0.4
    gpu_memory_mib: float = 16384.0  # used when telemetry has not told the GPU's size yet
    default_gpu_type: str = "T4"
    xcuda: bool = True
    real_libcuda: str | None = None
    launch_control: LaunchControl = LaunchControl(t_sm=1200, c_h=1590, a_l=1.0, a_h=0.2, kp=300, ki=3000, kd=0, target=0.7)
    # Where the node's cgroups are (`cpuset` for v2 cpusets; `cgroups` for each workload's own
    # cgroup: v2 there, else the v1 memory/cpu/pids hierarchies mounted under it); None: neither.
    cgroup_root: Path | None = None
    # Each workload's host limits when its job asks for none, per kind (`cgroup_plan`), and its pids limit
    kind_defaults: Mapping[str, KindDefaults] = field(default_factory=lambda: dict(KIND_DEFAULTS))
    pids_max: int = DEFAULT_PIDS_MAX
    online_cpu_fraction: float = 0.5
    meminfo_path: Path = Path("/proc/meminfo")
    min_available_memory_fraction: float = 0.0  # 0: never evict for node memory
    # memory guard: GPU memory NVML may show per process beyond the xCUDA quota before the
    # workload is evicted (the CUDA context itself, which xCUDA does not count)
    gpu_memory_allowance_mib: float = 512.0
    online_services: Mapping[str, str] = field(default_factory=dict)  # gpu_id -> online workload name
    online_args: tuple[str, ...] = ()
    observation_window_s: float = 5.0
    report_interval_s: float = 1.0
    # Salus lanes: one lane server per GPU that training and offline workloads can use through
    # `hivemux.salus` (HIVEMUX_SALUS_SOCKET is set for them); None turns lanes off.
    salus_policy: str | None = "fifo"
    # Who workloads run as (`users`): a uid per GPU (MPS's one client uid; or per job, or tenant)
    # from a range, never root.
    workload_users: WorkloadUsers = WorkloadUsers()
    # Each workload in its own mount/PID/IPC namespaces (`sandbox`); ``sandbox_shared``: node
    # paths a private /tmp or the hidden work root would hide that workloads may read.
    sandbox: bool = True
    sandbox_shared: tuple[Path, ...] = ()
    # How long a start waits for the folds of its job's submission and admission (`admission`)
    # before it is refused: the scheduler publishes them with the command, on other topics.
    admission_wait_s: float = 5.0
    # Issue 29: the address other nodes and users reach this one at (a gang's MASTER_ADDR when
    # its rank 0 runs here; an online service's endpoint, address:PORT), and the cluster's
    # checkpoint store as this node mounts it (None: node-local checkpoints), `rendezvous`.
    address: str = "127.0.0.1"
    checkpoint_store: Path | None = None
    # An online service's own command (`service_watch`): how long a replica may take to pass its
    # readiness probe, and the bound of one probe or scrape.
    readiness_timeout_s: float = 300.0
    probe_timeout_s: float = 2.0
    # What of each workload's output is shipped on jobs.logs (`log_shipping`): its head and tail.
    log_bound: LogBound = LogBound()
