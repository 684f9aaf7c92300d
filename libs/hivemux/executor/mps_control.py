"""A typed wrapper over `nvidia-cuda-mps-control`, one MPS control daemon per GPU.

MuxFlow shares a GPU between an online and an offline workload with NVIDIA MPS (preprint §3,
"Local executor"; §4.2's mixed error handling names the MPS server crash as an error pattern).
Each GPU gets its own control daemon with its own ``CUDA_MPS_PIPE_DIRECTORY`` and
``CUDA_MPS_LOG_DIRECTORY`` (and ``CUDA_VISIBLE_DEVICES`` = the GPU's index), so a crash or a
restart on one GPU touches only that GPU's clients.

The control program's interface (its man page): ``nvidia-cuda-mps-control -d`` starts the
daemon; without arguments it reads commands on stdin: ``get_server_list`` (one server pid per
line), ``start_server -uid UID``, ``get_client_list PID``, ``terminate_client SERVER CLIENT``,
``quit``. The daemon writes its pid to ``nvidia-cuda-mps-control.pid`` in the pipe directory,
which is how a hung daemon is killed.

Health (`MpsDaemon.check`): ``running`` when ``get_server_list`` answers and the server this
daemon started is still listed and alive; ``crashed`` when the daemon is gone or the server
vanished; ``hung`` when the command does not answer within ``timeout_s``.

Departure from a stock MPS setup: the server is started explicitly (``start_server``) right
after the daemon, instead of on the first client's connection, so that there is a server pid
to watch (and to name in ``terminate_client``) before any workload runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MpsState = Literal["running", "crashed", "hung"]
DAEMON_PID_FILE = "nvidia-cuda-mps-control.pid"


class MpsError(RuntimeError):
    """The control program refused a command or could not be run."""


class MpsHung(MpsError):
    """The control program did not answer in time."""


def process_alive(pid: int) -> bool:
    """True for a running process (a zombie nobody reaped yet counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@dataclass(frozen=True)
class MpsCheck:
    state: MpsState
    server_pids: tuple[int, ...]
    detail: str


class MpsDaemon:
    """The MPS control daemon of one GPU (``gpu_index``), its directories under ``root``."""

    def __init__(self, gpu_index: int, root: Path, *, binary: str = "nvidia-cuda-mps-control",
                 timeout_s: float = 2.0, uid: int | None = None, base_env: dict[str, str] | None = None) -> None:
        self.gpu_index = gpu_index
        self.pipe_dir = Path(root) / f"gpu-{gpu_index}" / "pipe"
        self.log_dir = Path(root) / f"gpu-{gpu_index}" / "log"
        self.binary = binary
        self.timeout_s = timeout_s
        self.uid = os.getuid() if uid is None else uid
        self._base_env = dict(os.environ if base_env is None else base_env)
        self.server_pid: int | None = None

    def client_env(self) -> dict[str, str]:
        """What every client process of this GPU needs in its environment."""
        return {
            "CUDA_VISIBLE_DEVICES": str(self.gpu_index),
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def _env(self) -> dict[str, str]:
        # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in the control daemon's environment is the default cap
        # of its servers, i.e. of every client of the GPU, the online one included: a client's
        # share is its own variable (xCUDA pins the offline one's), never the daemon's.
        base = {k: v for k, v in self._base_env.items() if k != "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}
        return {**base, **self.client_env()}

    async def _run(self, args: list[str], stdin: str | None) -> tuple[int, str]:
        try:
            proc = await asyncio.create_subprocess_exec(
                self.binary, *args, env=self._env(), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )
        except OSError as error:
            raise MpsError(f"cannot run {self.binary}: {error}") from error
        try:
            out, _ = await asyncio.wait_for(proc.communicate((stdin or "").encode()), self.timeout_s)
        except TimeoutError:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
            raise MpsHung(f"gpu {self.gpu_index}: `{(stdin or ' '.join(args)).strip()}` got no answer in {self.timeout_s} s") from None
        return proc.returncode or 0, out.decode(errors="replace")

    async def command(self, line: str) -> list[str]:
        """Send one command on stdin; return the answer's lines (error → `MpsError`)."""
        code, out = await self._run([], line + "\n")
        lines = [x.strip() for x in out.splitlines() if x.strip()]
        if code != 0:
            raise MpsError(f"gpu {self.gpu_index}: `{line}` failed ({code}): {' '.join(lines)}")
        return lines

    async def start(self) -> int:
        """Start the daemon (if not running) and a server for our uid; return the server pid."""
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.daemon_pid() is None:
            code, out = await self._run(["-d"], None)
            if code != 0:
                raise MpsError(f"gpu {self.gpu_index}: `{self.binary} -d` failed ({code}): {out.strip()}")
        await self.command(f"start_server -uid {self.uid}")
        pids = await self.server_list()
        if not pids:
            raise MpsError(f"gpu {self.gpu_index}: no MPS server after start_server")
        self.server_pid = pids[0]
        return self.server_pid

    async def server_list(self) -> tuple[int, ...]:
        return tuple(int(x) for x in await self.command("get_server_list") if x.isdigit())

    async def client_list(self, server_pid: int) -> tuple[int, ...]:
        return tuple(int(x) for x in await self.command(f"get_client_list {server_pid}") if x.isdigit())

    async def terminate_client(self, client_pid: int) -> bool:
        """Ask the server to terminate one client; False when there is no live server."""
        if self.server_pid is None or not process_alive(self.server_pid):
            return False
        answer = await self.command(f"terminate_client {self.server_pid} {client_pid}")
        return not answer

    def daemon_pid(self) -> int | None:
        try:
            pid = int((self.pipe_dir / DAEMON_PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if process_alive(pid) else None

    async def check(self) -> MpsCheck:
        try:
            pids = await self.server_list()
        except MpsHung as error:
            return MpsCheck("hung", (), str(error))
        except MpsError as error:
            return MpsCheck("crashed", (), f"MPS control daemon of gpu {self.gpu_index} gone: {error}")
        if self.server_pid is not None and (self.server_pid not in pids or not process_alive(self.server_pid)):
            return MpsCheck("crashed", pids, f"MPS server {self.server_pid} of gpu {self.gpu_index} is gone")
        return MpsCheck("running", pids, "")

    async def quit(self) -> None:
        """Stop the daemon and its servers; a daemon that does not answer is killed."""
        try:
            await self.command("quit")
        except MpsError:
            pass
        for pid in (self.daemon_pid(), self.server_pid):
            if pid is not None and process_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        (self.pipe_dir / DAEMON_PID_FILE).unlink(missing_ok=True)
        self.server_pid = None

    async def restart(self) -> int:
        await self.quit()
        return await self.start()
