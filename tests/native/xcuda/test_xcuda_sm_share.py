"""Issue 30: the SM share is the control block's, not the environment's.

MPS gives a client the ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` of its environment, capped by its
server's ``set_active_thread_percentage`` (the variable "will only further constrain" the
daemon's limit). xCUDA rewrites the variable from the control block's
``active_thread_percentage`` when it loads, before the real ``cuInit`` and before each context
is created. The fake driver connects to the fake MPS daemon at ``cuInit`` with the variable it
finds then and logs what it asked and was granted, so what the driver saw is observed, not what
the probe printed.

Root only: a sandbox's ``/etc/xcuda.conf`` (laid over ``/etc`` by `sandbox_init`) says where the
control block is, and the environment's ``XCUDA_*`` are ignored; ``LD_PRELOAD`` is not needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from xcuda_helpers import field_of, probe, rc, read_log

from hivemux.executor import sandbox_init
from hivemux.xcuda import CONFIG_FILE, NATIVE_DIR, ControlBlock, StateFile, pinned_etc
from support.fake_mps import SCRIPT

SHARE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MIB = 1 << 20


def driver_saw(log: Path, call: str) -> list[str]:
    """The ``percentage=`` (and ``mps_percentage=``) the fake driver logged for ``call``."""
    return [rest for _, _, _, name, rest in read_log(log) if name == call]


def test_the_control_blocks_share_replaces_what_the_workload_sets(native, workload) -> None:
    workload.control.set_share(40)
    env = workload.env(native, {SHARE: "100"})
    out = probe(native, env, "proc", f"getenv:{SHARE}", f"setenv:{SHARE}=100", "cuinit", f"getenv:{SHARE}",
                f"unsetenv:{SHARE}", "newctx")
    assert out[0] == f"getenv {SHARE}=40"  # rewritten when the shim loaded, before main
    assert rc(out[2]) == 0 and out[3] == f"getenv {SHARE}=40"  # set back to 100: rewritten before cuInit
    assert rc(out[5]) == 0
    [init] = driver_saw(workload.log, "cuInit")
    assert field_of(init, "percentage") == "40" and field_of(init, "mps_server") == "0"  # no daemon here: no MPS
    [ctx] = driver_saw(workload.log, "cuCtxCreate_v2")
    assert field_of(ctx, "percentage") == "40"  # unset between cuInit and the context: set again


def test_no_share_in_the_control_block_leaves_the_variable_alone(plain_native, workload) -> None:
    env = workload.env(plain_native, {SHARE: "70"})
    out = probe(plain_native, env, "proc", "cuinit", f"getenv:{SHARE}")
    assert rc(out[0]) == 0 and out[1] == f"getenv {SHARE}=70"
    [init] = driver_saw(workload.log, "cuInit")
    assert field_of(init, "percentage") == "70"


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The fake MPS control daemon with a server of this uid whose cap is 60 %."""
    (tmp_path / "pipe").mkdir()
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mpslog")}

    def control(line: str) -> list[str]:
        done = subprocess.run([sys.executable, str(SCRIPT)], input=line + "\n", env=env, capture_output=True, text=True,
                              timeout=10)  # fmt: skip
        return done.stdout.split()

    subprocess.run([sys.executable, str(SCRIPT), "-d"], env=env, check=True, timeout=10)
    assert control(f"start_server -uid {os.getuid()}") == []
    [server] = control("get_server_list")
    assert control(f"set_active_thread_percentage {server} 60") == ["60"]
    yield {k: env[k] for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")} | {"server": server}
    control("quit")


@pytest.mark.parametrize(("preload", "share", "asked", "granted"), [
    (True, 40, "100", "40"),     # the shim: the control block's share, whatever the workload asks
    (False, 40, "100", "60"),    # no shim: the client asks for 100 and gets the server's cap
    (False, 40, "20", "20"),     # a client may always lower its share below the cap
], ids=["shim-pins-40", "no-shim-capped-by-server", "no-shim-lowers"])  # fmt: skip
def test_the_fake_mps_grants_the_pinned_share_or_the_servers_cap(plain_native, workload, mps, preload: bool,
                                                                  share: float, asked: str, granted: str) -> None:
    workload.control.set_share(share)
    server = mps.pop("server")
    env = workload.env(plain_native, {SHARE: asked, **mps}, preload=preload)
    out = probe(plain_native, env, "proc", "cuinit")
    assert rc(out[0]) == 0
    [init] = driver_saw(workload.log, "cuInit")
    assert field_of(init, "mps_server") == server and field_of(init, "mps_percentage") == granted, init
    seen = (Path(mps["CUDA_MPS_LOG_DIRECTORY"]) / "control.log").read_text()
    assert f"connected to server {server} at {granted} %" in seen


def test_the_config_file_path_is_the_one_python_writes() -> None:
    header = (NATIVE_DIR / "src" / "xcuda_internal.h").read_text()
    assert f'#define XCUDA_CONFIG_FILE "{CONFIG_FILE}"' in header


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace (the sandbox's /etc overlay) needs root")
def test_in_a_sandbox_the_config_file_wins_over_the_environment(plain_native, tmp_path: Path) -> None:
    real = ControlBlock.create(tmp_path / "control", mem_quota_bytes=64 * MIB, active_thread_percentage=30)
    state = StateFile.create(tmp_path / "state")
    loose = ControlBlock.create(tmp_path / "loose", mem_quota_bytes=0)  # what the workload would rather use
    agent_env = {"LD_PRELOAD": str(plain_native.lib), "XCUDA_CONTROL": str(real.path), "XCUDA_STATE": str(state.path),
                 "XCUDA_REAL_LIBCUDA": str(plain_native.fake)}  # fmt: skip
    layer = tmp_path / "etc"
    layer.mkdir()
    for name, text in (pinned_etc(agent_env) or {}).items():
        (layer / name).write_text(text)
    log = tmp_path / "calls.log"
    # the workload's own environment: no LD_PRELOAD, its own control block, state and share
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(plain_native.fake.parent), "XCUDA_CONTROL": str(loose.path),
           "XCUDA_STATE": "/nonexistent", SHARE: "100", "FAKE_CUDA_LOG": str(log)}  # fmt: skip
    spec = {"cwd": str(tmp_path), "env": env, "uid": None, "gid": None, "hide": [], "private_tmp": [],
            "binds": [{"path": str(tmp_path), "writable": True}], "etc_layer": str(layer)}  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    argv = [plain_native.prog("probe"), "proc", "getenv:LD_PRELOAD", "init", f"alloc:linear:{100 * MIB}",
            f"alloc:linear:{32 * MIB}", "info"]  # fmt: skip
    done = subprocess.run([sys.executable, "-I", "-S", sandbox_init.__file__, str(tmp_path / "spec.json"), "--", *argv],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0] == "getenv LD_PRELOAD=(unset)" and rc(out[1]) == 0
    assert rc(out[2]) == 2 and rc(out[3]) == 0  # CUDA_ERROR_OUT_OF_MEMORY past the quota of the config's block
    assert field_of(out[4], "total") == str(64 * MIB)
    [init] = driver_saw(log, "cuInit")
    assert field_of(init, "percentage") == "30"
    for f in (real, loose, state):
        f.close()
