"""A workload that tries to lift its own limits (issue 18, item 2), run as an unprivileged uid.

The executor (these tests, root) creates the files in its own directory
(`hivemux.xcuda.secure_directory`); the workload is the probe program run as uid 65534 with
xCUDA preloaded, over the fake driver. Three bypasses found by the fault-injection audit:
  - zeroing ``used_bytes`` in the state file let a workload with a 64 MiB quota hold 100 MiB;
  - rewriting the control block (quota 0 = none) made ``cuMemGetInfo`` report 16 GiB;
  - a symlink at a file's path made the executor re-mode and overwrite its target.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from xcuda_helpers import Native, Workload, field_of, rc

from hivemux.xcuda import ControlBlock, StateFile, UnsafePath, secure_directory

NOBODY = 65534
MIB = 1 << 20
QUOTA = 64 * MIB
CUDA_ERROR_OUT_OF_MEMORY = 2
EACCES = 13

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the workload as another uid")


@pytest.fixture
def node_dir() -> Iterator[Path]:
    """A directory of the executor's (root, 0755) that uid 65534 can traverse (pytest's own
    temporary directories are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="xcuda-node-"))
    os.chmod(base, 0o755)
    yield base
    subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.fixture
def hostile(node_dir: Path) -> Iterator[Workload]:
    """The executor's files of one workload whose processes run as uid 65534."""
    d = secure_directory(node_dir, ".xcuda", "job")
    cb = ControlBlock.create(d / "xcuda.control", mem_quota_bytes=QUOTA)
    st = StateFile.create(d / "xcuda.state", owner=(NOBODY, NOBODY))
    scratch = node_dir / "scratch"
    scratch.mkdir(mode=0o777)
    os.chmod(scratch, 0o777)
    w = Workload(scratch, cb, st, scratch / "calls.log")
    yield w
    cb.close()
    st.close()


def as_nobody(native: Native, w: Workload, *cmds: str) -> list[str]:
    env = w.env(native, {"FAKE_CUDA_TOTAL_MEM": str(16 << 30)})
    p = subprocess.run([native.prog("probe"), "dlsym", *cmds], env=env, capture_output=True, text=True, timeout=30,
                       user=NOBODY, group=NOBODY, extra_groups=[])
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    return p.stdout.splitlines()


def as_nobody_in_child(attempt: Callable[[], object]) -> int:
    """Run ``attempt`` in a forked child that dropped to uid/gid 65534: 0 if it returned,
    13 if it raised PermissionError, 1 for anything else."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            attempt()
            code = 0
        except PermissionError:
            code = EACCES
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_the_files_belong_to_the_executor_and_the_state_file_to_the_workload(hostile: Workload) -> None:
    control, state, directory = (os.stat(p) for p in (hostile.control.path, hostile.state.path, hostile.control.path.parent))
    assert (control.st_uid, oct(control.st_mode & 0o777)) == (0, "0o644")
    assert (state.st_uid, oct(state.st_mode & 0o777)) == (NOBODY, "0o600")
    assert (directory.st_uid, oct(directory.st_mode & 0o777)) == (0, "0o755")


def test_zeroed_usage_does_not_lift_the_quota(plain_native: Native, hostile: Workload) -> None:
    ready, go = hostile.dir / "ready", hostile.dir / "go"
    env = hostile.env(plain_native)
    p = subprocess.Popen(
        [plain_native.prog("probe"), "dlsym", "init", f"alloc:linear:{60 * MIB}", "zerostate", f"alloc:linear:{40 * MIB}",
         "info", f"touch:{ready}", f"waitfile:{go}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, user=NOBODY, group=NOBODY, extra_groups=[],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.01)
        assert ready.exists(), p.communicate(timeout=5)
        # the helper thread rewrites the slot the workload zeroed from the process's own tally
        while time.monotonic() < deadline and [u.used_bytes for u in hostile.state.processes()] != [60 * MIB]:
            time.sleep(0.01)
        assert [u.used_bytes for u in hostile.state.processes()] == [60 * MIB]
    finally:
        go.touch()
        out, err = p.communicate(timeout=20)
    init, first, zeroed, second, info = out.splitlines()
    assert (rc(init), rc(first), rc(zeroed)) == (0, 0, 0)  # it may write its own account...
    assert rc(second) == CUDA_ERROR_OUT_OF_MEMORY  # ...which does not buy it anything: 60 + 40 > 64 MiB
    assert (int(field_of(info, "total")), int(field_of(info, "free"))) == (QUOTA, QUOTA - 60 * MIB)
    assert "rewritten" in hostile.log.read_text()  # xCUDA's log: the repair


def test_the_control_block_cannot_be_rewritten(native: Native, hostile: Workload) -> None:
    write, init, info = as_nobody(native, hostile, "writecontrol:0", "init", "info")
    assert rc(write) == EACCES  # open(O_RDWR) refused: the block is the executor's
    assert rc(init) == 0 and int(field_of(info, "total")) == QUOTA  # not the 16 GiB of "no quota"
    assert hostile.control.read()["mem_quota_bytes"] == QUOTA
    d = hostile.control.path.parent
    for attempt in (lambda: os.unlink(d / "xcuda.control"), lambda: os.rename(d / "xcuda.control", d / "x"),
                    lambda: open(d / "new", "w"), lambda: os.chmod(d / "xcuda.control", 0o666),
                    lambda: open(d / "xcuda.control", "r+b")):  # fmt: skip
        assert as_nobody_in_child(attempt) == EACCES  # no unlink, rename, new entry, chmod or write


def test_a_symlink_at_a_files_path_is_refused_and_its_target_untouched(node_dir: Path) -> None:
    secret = node_dir / "secret"
    secret.write_text("root only")
    os.chmod(secret, 0o600)
    d = secure_directory(node_dir, ".xcuda", "job")
    (d / "xcuda.control").symlink_to(secret)
    (d / "xcuda.state").symlink_to(secret)
    with pytest.raises(UnsafePath):
        ControlBlock.create(d / "xcuda.control", mem_quota_bytes=QUOTA)
    with pytest.raises(UnsafePath):
        StateFile.create(d / "xcuda.state", owner=(NOBODY, NOBODY))
    with pytest.raises(OSError):
        ControlBlock.open(d / "xcuda.control")  # O_NOFOLLOW: ELOOP
    assert (secret.read_text(), oct(secret.stat().st_mode & 0o777), secret.stat().st_uid) == ("root only", "0o600", 0)


def test_only_the_executors_own_closed_directories_are_used(node_dir: Path) -> None:
    (node_dir / "elsewhere").mkdir()
    (node_dir / "linked").symlink_to(node_dir / "elsewhere")
    with pytest.raises(UnsafePath):
        secure_directory(node_dir, "linked")  # a symlinked directory
    (node_dir / "theirs").mkdir()
    os.chown(node_dir / "theirs", NOBODY, NOBODY)
    with pytest.raises(UnsafePath):
        secure_directory(node_dir, "theirs")  # the workload's directory
    (node_dir / "open").mkdir()
    os.chmod(node_dir / "open", 0o777)
    with pytest.raises(UnsafePath):
        secure_directory(node_dir, "open")  # anyone could swap entries
    with pytest.raises(UnsafePath):
        secure_directory(node_dir, "..")
    with pytest.raises(UnsafePath):
        ControlBlock.create(node_dir / "open" / "xcuda.control")
    d = secure_directory(node_dir, ".xcuda", "job")
    assert as_nobody_in_child(lambda: os.symlink("/etc/shadow", d / "xcuda.state")) == EACCES  # nor can the workload


def test_the_executor_reads_a_truncated_state_file_without_dying(hostile: Workload) -> None:
    assert as_nobody_in_child(lambda: os.truncate(hostile.state.path, 0)) == 0  # its own account: it may wreck it...
    assert hostile.state.processes() == [] and hostile.state.used_bytes() == 0  # ...the executor reads zeros
    hostile.state.notify()  # and the futex wake on the vanished page is an EFAULT, not a SIGBUS
