"""Starting a workload's process on the node (MuxFlow preprint §3 "Local executor", §6).

`Launcher.launch` starts — or restarts from its checkpoint — one workload with what its kind
needs (`launch` builds the environment and command line): offline work gets its GPU's MPS
daemon (`GpuDaemons`, started on first use), its SM share, xCUDA preloaded with a node-owned
control block (memory quota: ``memory_quota_fraction`` of the GPU, §6: "fixed to 40 %", or the
command's when it is lower) and the offline cpuset; online services get MPS and the online cpuset;
training pods get whole GPUs, a gang's rendezvous and their checkpoints in the cluster's store
(`rendezvous`). Every workload gets a cgroup of its own with its host memory, CPU and pids
limits (`cgroups`, issue 30), joined before its command runs. Training and offline work also
get the GPU's Salus lane server; a lane job (issue 20, `lane_jobs`) runs the training loop gated
by it with its grant's P and E, as an MPS client of its GPU held by xCUDA to ``P + E`` (issue 30).
A relaunch resumes at the last checkpoint (what ran after it is lost) and starts unfrozen.

What runs is the job's submitted workload (``Workload.spec``, from `admission`; a re-adopted
workload relaunched later looks it up in the folded submissions), as the workload's own uid
(``Workload.owner``, `users`), never as the agent. An online service with its own command gets
its ports in the environment (`service_watch`); without one, the built-in server stands in.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from hivemux.executor import adoption, cgroup_plan
from hivemux.executor.admission import Admissions
from hivemux.executor.cgroups import NodeCgroups
from hivemux.executor.config import NodeConfig
from hivemux.executor.cpuset import Cpusets
from hivemux.executor.gpu_daemons import GpuDaemons
from hivemux.executor.gpu_readings import GpuReadings
from hivemux.executor.lane_jobs import is_lane_job, lane_args, lane_quota_mib
from hivemux.executor.rendezvous import NodeAddresses, pod_env
from hivemux.executor.launch import (
    MIB,
    create_xcuda_files,
    gpu_index,
    train_argv,
    workload_env,
)
from hivemux.executor.service_watch import ServiceWatch, runs_own_command
from hivemux.executor.sandbox import Sandbox
from hivemux.executor.users import Owner
from hivemux.executor.workload import Workload
from hivemux.salus import SOCKET_ENV as SALUS_SOCKET_ENV
from hivemux.workloads.progress import ProgressReader

log = logging.getLogger("hivemux.executor.launcher")


class Launcher:
    def __init__(self, config: NodeConfig, *, base_env: Mapping[str, str], daemons: GpuDaemons, readings: GpuReadings,
                 clock: Callable[[], float], admissions: Admissions | None = None,
                 addresses: NodeAddresses | None = None) -> None:
        self.config = config
        self.admissions = admissions
        self.base_env = base_env
        self.daemons = daemons
        self.readings = readings
        self.clock = clock
        self.addresses = addresses or NodeAddresses()
        self.cpusets = Cpusets(False, "not opened", Path("/"))
        self.cgroups = NodeCgroups.unavailable("not opened")  # each workload's host limits (`cgroups`)
        self.services: ServiceWatch | None = None  # own-command online services: ports (`service_watch`)
        self.sandbox = Sandbox(config.sandbox, config.sandbox_shared)

    def quota_bytes(self, w: Workload) -> int:
        """xCUDA's memory quota of ``w``: a lane job's grant, ``P + E`` (Salus's limit, `lane_jobs`);
        else the node's cap (a fraction of its GPU's memory), or its command's quota when that is
        lower (a command tightens the limit, never lifts it)."""
        grant = lane_quota_mib(w.command) if w.kind == "training" else None
        if grant is not None:
            return int(grant * MIB)
        total = self.readings.memory_total_mib(w.gpu, self.config.gpu_memory_mib)
        cap = self.config.memory_quota_fraction * total
        quota = cap if w.memory_quota_mib is None else min(cap, w.memory_quota_mib)
        return int(quota * MIB)

    def limits(self, w: Workload) -> cgroup_plan.Limits:
        """The host limits of ``w`` (`cgroup_plan.limits_for`): its submitted request, else its kind's default."""
        asked = w.spec.resources if w.spec is not None else None
        lane = w.command is not None and w.command.lane is not None
        return cgroup_plan.limits_for(cgroup_plan.kind_of(w.kind, lane=lane), gpus=len(w.gpu_ids),
                                      host_memory_mib=asked.host_memory_mib if asked else None, cpus=asked.cpus if asked else None,
                                      defaults=self.config.kind_defaults, pids_max=self.config.pids_max)

    def limits_text(self, w: Workload) -> str:
        """What the ``launched`` report says of its host limits."""
        if w.cgroup is None:
            return f"no host limits: {self.cgroups.reason}"
        return f"limits: {w.cgroup.limits.describe()} (cgroup v{w.cgroup.version})"

    def owner(self, w: Workload) -> Owner:
        """The uid ``w`` runs as (`users.WorkloadUsers`), kept in its node directory."""
        users = self.config.workload_users
        name = w.files.root.name
        key = users.key(w.job_id if w.kind != "online" else name, w.tenant, gpu=gpu_index(w.gpu))
        return users.owner(w.files.node.parent, name, key)

    async def launch(self, w: Workload) -> None:
        """Start (or restart, from its checkpoint) the process of ``w``."""
        indices = [gpu_index(g) for g in w.gpu_ids]
        w.owner = w.owner or self.owner(w)
        w.files.create(w.owner)  # its private directory (its uid, 0700) and the agent's about it
        mps_env = None
        lane_job = is_lane_job(w)
        if w.kind in ("offline", "online") or lane_job:  # MPS clients (lane jobs: several on one GPU)
            daemon = await self.daemons.client_daemon(indices[0], w.owner.uid if w.owner.switch else None)
            mps_env = daemon.client_env() if daemon is not None else None  # None: no MPS, time-sliced
        share = w.sm_share if w.kind == "offline" else None
        if (w.kind == "offline" or lane_job) and self.config.xcuda and w.control is None:
            ids = (w.owner.uid, w.owner.gid) if w.owner.switch else None
            w.control, w.state = create_xcuda_files(w.files, mem_quota_bytes=self.quota_bytes(w),
                                                     launch=self.config.launch_control, owner=ids, sm_share=share,
                                                     throttle=not lane_job)
        elif w.control is not None:
            w.control.set_share(share)  # a relaunch for a new share: its new processes get it
            w.control.set_flags(freeze=False)  # a relaunch starts unfrozen
        env = workload_env(self.base_env, w.files, gpu_indices=indices, mps=mps_env,
                           sm_share=w.sm_share if w.kind == "offline" else None,
                           xcuda=w.control is not None, real_libcuda=self.config.real_libcuda)
        # a gang pod's rendezvous and checkpoints in the cluster's store (`rendezvous`)
        env.update(pod_env(w.command, job_id=w.job_id, kind=w.kind, owner=w.owner, addresses=self.addresses,
                           checkpoint_store=self.config.checkpoint_store))
        lane = lane_args(w.command) if w.kind == "training" else ()
        if w.kind != "online" and self.config.salus_policy is not None:
            env[SALUS_SOCKET_ENV] = (await self.daemons.lane_server(indices[0])).socket_path
            env["HIVEMUX_JOB_ID"] = w.job_id
        if w.kind == "online" and self.services is not None and runs_own_command(w):  # the user's own service (issue 29)
            assert w.spec is not None
            env.update(self.services.prepare(w, self.clock()))
            argv = list(w.spec.command)
        elif w.kind == "online":  # the built-in stand-in serves at the service's expected request rate
            rate = ["--rate", f"{w.spec.request_rate:g}"] if w.spec is not None and w.spec.request_rate else []
            argv = [sys.executable, "-m", "hivemux.workloads.online", *self.config.online_args, *rate]
        else:
            if w.spec is None and self.admissions is not None:
                found = self.admissions.workload(w.job_id)  # a re-adopted workload: its submission
                if found is not None:
                    w.spec, w.tenant = found
            if w.spec is None:
                raise OSError(f"no submitted workload known for {w.job_id} (jobs.submitted): nothing to launch")
            spec = w.spec
            argv = train_argv(spec.model, spec.batch_size, spec.iterations, spec.command,
                              checkpoint_every=self.config.checkpoint_every, extra=(*self.config.train_extra_args, *lane))
        if w.launches:
            w.iteration = w.checkpoint or 0  # what ran after the last checkpoint is lost; it resumes there
        cpuset = None  # cgroup v2: a process is in one cgroup, so its cpuset side is written into its own
        if self.cgroups.version == 2 and self.cpusets.available:
            cpuset = self.cpusets.online_cpus if w.kind == "online" else self.cpusets.offline_cpus
        if self.cgroups.available:  # its limits, joined before its command runs (`cgroups`)
            w.cgroup = self.cgroups.create(w.key, self.limits(w), cpuset=cpuset)
        procs = w.cgroup.procs if w.cgroup is not None else ()
        w.proc = await self.sandbox.launch(argv, env=env, files=w.files, owner=w.owner, cgroups=procs)  # `sandbox`
        w.reader = w.reader or ProgressReader(w.files.progress)
        w.launches += 1
        adoption.record(w.files.node, pid=w.proc.pid, launches=w.launches, command=w.command)  # for a restarted agent
        w.observed_until = w.reported_at = self.clock()  # the process's runtime is measured from here
        w.points.clear()
        problem = self.cpusets.place(w.proc.pid, online=w.kind == "online") if cpuset is None else None
        if problem and self.cpusets.available:
            log.warning("%s: %s", w.job_id, problem)
