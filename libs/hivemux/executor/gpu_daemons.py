"""The per-GPU daemons of a node: one MPS control daemon and one Salus lane server per GPU.

MuxFlow shares a GPU in space through NVIDIA MPS (preprint §3 "Local executor"): each GPU gets
its own control daemon (`mps_control.MpsDaemon`, own pipe and log directories), so a crash or
restart touches only that GPU's clients. Salus runs one execution service per GPU (§3: every
GPU access of the sharing jobs goes through it; §3.3 GPU lanes; §4 scheduling policies): here
a lane server (`hivemux.salus.server.LaneServer`, capacity: the GPU's memory) that training and
offline workloads reach through ``HIVEMUX_SALUS_SOCKET``. Both are started on a
workload's first use of the GPU and stopped with the agent.

Time-slicing fallback (issue 30 item 4): a GPU whose MPS is unavailable — disabled by
configuration (``NodeConfig.mps``), a daemon that cannot be started, or one still down after
the recovery's restart — is kept in ``unavailable`` with the reason; its workloads start
without MPS (the driver time-slices them) and `MpsRecovery.watch` says so on the GPU's health
record (a report of job ``mps:<gpu_id>``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping

from hivemux.executor.config import NodeConfig
from hivemux.executor.mps_control import MpsDaemon, MpsError
from hivemux.salus.server import LaneServer


class GpuDaemons:
    def __init__(self, config: NodeConfig, base_env: Mapping[str, str]) -> None:
        self.config = config
        self.base_env = base_env
        self.mps: dict[int, MpsDaemon] = {}
        self.mps_state: dict[int, str] = {}  # gpu index -> the last known state of its MPS server
        self.lanes: dict[int, LaneServer] = {}
        self.unavailable: dict[int, str] = {}  # gpu index -> why its MPS is unavailable (time-sliced)

    def mps_down(self, gpu: int, why: str) -> None:
        self.unavailable[gpu] = why
        self.mps_state[gpu] = "unavailable"

    async def client_daemon(self, gpu: int, uid: int | None = None) -> MpsDaemon | None:
        """The GPU's MPS daemon for a new client (`daemon`), or None when the GPU's MPS is
        unavailable (disabled, or its daemon cannot be started): the client runs time-sliced."""
        if not self.config.mps:
            self.mps_down(gpu, "MPS disabled by configuration (HIVEMUX_EXECUTOR_MPS=false)")
            return None
        if gpu in self.unavailable:
            return None
        try:
            return await self.daemon(gpu, uid)
        except MpsError as error:
            self.mps_down(gpu, f"MPS daemon down: {error}")
            return None

    async def daemon(self, gpu: int, uid: int | None = None) -> MpsDaemon:
        """The GPU's MPS daemon, with a server running — for ``uid``, the uid of its first client
        (MPS serves the clients of one uid at a time; a server for the agent's root would make
        workloads under their own uids wait), else the agent's."""
        daemon = self.mps.get(gpu)
        if daemon is None:
            daemon = MpsDaemon(gpu, self.config.work_dir / "mps", binary=self.config.mps_binary, uid=uid,
                               timeout_s=self.config.mps_timeout_s, base_env=self.base_env)
            self.mps[gpu] = daemon
        if daemon.server_pid is None:
            await daemon.start()
            self.mps_state[gpu] = "running"
        return daemon

    async def lane_server(self, gpu: int) -> LaneServer:
        """The GPU's Salus lane server (capacity: the GPU's memory)."""
        server = self.lanes.get(gpu)
        if server is None:
            # in a directory of its own: a workload's sandbox binds that directory, so a lane
            # server restarted with a new socket is reachable there again (`sandbox`)
            folder = str(self.config.work_dir / f"salus-{gpu}")
            if len(folder) > 90:  # a Unix socket path holds at most 107 bytes
                digest = hashlib.sha1(str(self.config.work_dir).encode()).hexdigest()[:12]
                folder = os.path.join(tempfile.gettempdir(), f"hivemux-salus-{digest}-{gpu}")
            os.makedirs(folder, mode=0o755, exist_ok=True)
            socket = os.path.join(folder, "lane.sock")
            server = LaneServer(socket, capacity_mib=self.config.gpu_memory_mib, policy=self.config.salus_policy or "fifo")
            await server.start()
            os.chmod(socket, 0o666)  # workloads run as their own uids (`users`) and must connect
            self.lanes[gpu] = server
        return server

    async def close(self) -> None:
        for daemon in self.mps.values():
            await daemon.quit()
        for lanes in self.lanes.values():
            await lanes.stop()
        self.lanes.clear()
