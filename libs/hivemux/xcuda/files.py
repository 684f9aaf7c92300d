"""The executor's side of xCUDA's two shared files (MuxFlow section 4.2).

``ControlBlock`` is node-owned: the executor creates it (mode 0644, owned by the executor, so
the workload can only read it) and writes the memory quota, the launch-control parameters of
eq. 1-2 and the PID controller, each new (U_SM, C_SM) sample, and the freeze flag. Parameter
updates are guarded by a seqlock (``seq`` odd while writing), so xCUDA never reads half an
update.

``StateFile`` is shared read-write by the workload's processes: per-process memory use, the
freeze marks and what each process's controller did. The executor creates it (xCUDA
initializes the robust lock inside on first use), hands it to the workload's uid (``owner``,
mode 0600) and reads it to report usage and to know a freeze was applied. It reads it with
``pread``, never through a mapping, so a workload that truncates the file cannot bring the
executor down with SIGBUS. What the workload writes there is its own account: the executor's
enforcement does not trust it (`hivemux.executor.memory_guard` checks NVML's per-process
usage). ``notify()`` wakes every process's xCUDA helper thread at once (a futex wake on
``event_seq``) instead of waiting for its next poll.

Both files are created only in a directory that belongs to the executor and that nobody else
can write (``secure_directory``; a workload cannot swap or plant entries there), with
``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to that directory's descriptor: an existing entry
— a symlink planted to make the executor overwrite or re-mode another file — is refused
(`UnsafePath`), never followed.

Worked example::

    d = secure_directory(work_root, ".xcuda", job)      # root-owned 0755, checked
    cb = ControlBlock.create(d / "xcuda.control", mem_quota_bytes=8 << 30)
    st = StateFile.create(d / "xcuda.state", owner=(uid, gid))
    cb.set_launch_control(t_sm=1200, c_h=1590, a_l=1.0, a_h=0.2, kp=2000, ki=20000, kd=0, target=0.8)
    cb.sample(u_sm=0.55, c_sm=1410)      # each GPU monitor sample
    cb.set_flags(freeze=True)            # SysMonitor says Overlimit: hold all launches
    cb.set_share(40)                     # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of its next processes
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from hivemux.xcuda.layout import Layout, layout, pack_into, unpack_from


class LayoutMismatch(ValueError):
    """The file was written with another layout version (or is not an xCUDA file)."""


class UnsafePath(PermissionError):
    """A path the executor refuses to create a shared file at (symlink, foreign or writable directory)."""


def _check_directory(fd: int, where: str | os.PathLike) -> None:
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{where}: not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"{where}: owned by uid {st.st_uid}, not by the executor (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise UnsafePath(f"{where}: writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafePath(f"{name!r} is not a plain file name")


def secure_directory(base: str | os.PathLike, *names: str) -> Path:
    """``base/names...``, each level created if missing (mode 0755), and every level — ``base``
    included — checked through its descriptor: a directory (no symlink), owned by this process's
    uid and writable by nobody else. Raises `UnsafePath` otherwise."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    path = Path(base)
    try:
        _check_directory(fd, path)
        for name in names:
            _check_name(name)
            path = path / name
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except (NotADirectoryError, OSError) as error:
                if isinstance(error, NotADirectoryError) or error.errno == errno.ELOOP:
                    raise UnsafePath(f"{path}: not a directory (a symlink?)") from error
                raise
            os.close(fd)
            fd = child
            _check_directory(fd, path)
        return path
    finally:
        os.close(fd)


def _create(path: Path, size: int, mode: int, owner: tuple[int, int] | None) -> int:
    """A new file of ``size`` zero bytes at ``path`` in a `secure_directory`; its descriptor."""
    _check_name(path.name)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _check_directory(dfd, path.parent)
        try:
            fd = os.open(path.name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dfd)
        except FileExistsError as error:
            raise UnsafePath(f"{path}: already exists (a stale file or a planted link); not reused") from error
    finally:
        os.close(dfd)
    try:
        os.ftruncate(fd, size)
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)  # on the new file itself: never on what a path points to
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_existing(path: Path, size: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size < size:
        os.close(fd)
        raise LayoutMismatch(f"{path}: not a regular file of at least {size} bytes")
    return fd


def _map(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def remove_files(directory: str | os.PathLike, *names: str) -> None:
    """Unlink ``names`` in a `secure_directory` (a previous run's files) without following links."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _check_directory(dfd, directory)
        for name in names:
            _check_name(name)
            try:
                os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                pass
    finally:
        os.close(dfd)


def _check_header(mm: mmap.mmap, lay: Layout, fields, magic: int, path: Path) -> None:
    got_magic = unpack_from(mm, 0, fields["magic"])
    got_version = unpack_from(mm, 0, fields["layout_version"])
    if got_magic != magic or got_version != lay.version:
        raise LayoutMismatch(
            f"{path}: magic {got_magic:#x} layout {got_version}, expected {magic:#x} layout {lay.version}"
        )


_FUTEX_WAKE = 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}


def _futex_wake(mm: mmap.mmap, offset: int) -> None:
    number = _SYS_FUTEX.get(os.uname().machine)
    if number is None:
        return  # the helper threads' poll picks the change up
    libc = ctypes.CDLL(None, use_errno=True)
    word = ctypes.c_uint32.from_buffer(mm, offset)
    try:
        libc.syscall(number, ctypes.byref(word), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)
    finally:
        del word


@dataclass(frozen=True)
class LaunchControl:
    """Parameters of eq. 1-2 and the PID controller (meaning of each: ``xcuda_layout.h``)."""

    t_sm: float
    c_h: float
    a_l: float
    a_h: float
    kp: float
    ki: float
    kd: float
    target: float
    max_interval_us: float = 100_000.0


class ControlBlock:
    """The executor's control block of one offline workload."""

    def __init__(self, path: Path, mm: mmap.mmap) -> None:
        self.path = path
        self._mm = mm
        self._f = layout().control

    @classmethod
    def create(cls, path: str | os.PathLike, *, mem_quota_bytes: int = 0,
               active_thread_percentage: float = 0.0) -> ControlBlock:
        lay = layout()
        path = Path(path)
        fd = _create(path, lay.constants["CONTROL_SIZE"], 0o644, None)
        try:
            mm = _map(fd, lay.constants["CONTROL_SIZE"])
        finally:
            os.close(fd)
        cb = cls(path, mm)
        f = cb._f
        pack_into(mm, 0, f["layout_version"], lay.version)
        pack_into(mm, 0, f["size"], lay.constants["CONTROL_SIZE"])
        pack_into(mm, 0, f["mem_quota_bytes"], mem_quota_bytes)
        pack_into(mm, 0, f["active_thread_percentage"], float(active_thread_percentage))
        pack_into(mm, 0, f["magic"], lay.constants["CONTROL_MAGIC"])  # last: marks it valid
        return cb

    @classmethod
    def open(cls, path: str | os.PathLike) -> ControlBlock:
        lay = layout()
        path = Path(path)
        fd = _open_existing(path, lay.constants["CONTROL_SIZE"])
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                raise UnsafePath(f"{path}: a control block must belong to the executor")
            mm = _map(fd, lay.constants["CONTROL_SIZE"])
        finally:
            os.close(fd)
        _check_header(mm, lay, lay.control, lay.constants["CONTROL_MAGIC"], path)
        return cls(path, mm)

    def close(self) -> None:
        self._mm.close()

    def read(self) -> dict[str, float | int]:
        """Every field, read consistently (retried while the seqlock is odd or moved)."""
        for _ in range(100_000):
            seq = unpack_from(self._mm, 0, self._f["seq"])
            values = {name: unpack_from(self._mm, 0, f) for name, f in self._f.items()}
            if seq % 2 == 0 and unpack_from(self._mm, 0, self._f["seq"]) == seq:
                return values
        raise TimeoutError(f"{self.path}: a write never completed (seq stays odd); rewrite any field to repair")

    def write(self, **values: float | int) -> None:
        """Update fields atomically with respect to xCUDA's seqlock reader."""
        unknown = (set(values) - set(self._f)) | ({"seq"} & set(values))
        if unknown:
            raise KeyError(f"not writable control-block fields: {sorted(unknown)}")
        seq = unpack_from(self._mm, 0, self._f["seq"])
        # odd while writing; an odd value left by a writer that died mid-write is reused
        writing = seq if seq % 2 else (seq + 1) & 0xFFFFFFFF
        pack_into(self._mm, 0, self._f["seq"], writing)
        for name, value in values.items():
            pack_into(self._mm, 0, self._f[name], value)
        gen = unpack_from(self._mm, 0, self._f["generation"])
        pack_into(self._mm, 0, self._f["generation"], gen + 1)
        pack_into(self._mm, 0, self._f["seq"], (writing + 1) & 0xFFFFFFFF)

    def set_quota(self, mem_quota_bytes: int) -> None:
        self.write(mem_quota_bytes=mem_quota_bytes)

    def set_share(self, percentage: float | None) -> None:
        """The workload's SM share, which xCUDA writes into the client's
        ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` before the driver initializes (MPS reads it once,
        when the client connects: a new share reaches new processes); None or 0: none."""
        self.write(active_thread_percentage=float(percentage or 0.0))

    def set_launch_control(self, params: LaunchControl, *, enabled: bool = True) -> None:
        flags = unpack_from(self._mm, 0, self._f["flags"])
        bit = layout().constants["FLAG_THROTTLE"]
        self.write(
            t_sm=params.t_sm, c_h=params.c_h, a_l=params.a_l, a_h=params.a_h, kp=params.kp,
            ki=params.ki, kd=params.kd, target=params.target, max_interval_us=params.max_interval_us,
            flags=(flags | bit) if enabled else (flags & ~bit),
        )

    def sample(self, *, u_sm: float, c_sm: float, at_ns: int | None = None) -> None:
        """One GPU monitor sample: xCUDA takes one PID step per sample."""
        seq = unpack_from(self._mm, 0, self._f["sample_seq"])
        self.write(
            u_sm=u_sm, c_sm=c_sm, sample_time_ns=time.monotonic_ns() if at_ns is None else at_ns,
            sample_seq=(seq + 1) & 0xFFFFFFFF,
        )

    def set_flags(self, *, throttle: bool | None = None, freeze: bool | None = None) -> None:
        c = layout().constants
        flags = unpack_from(self._mm, 0, self._f["flags"])
        for on, bit in ((throttle, c["FLAG_THROTTLE"]), (freeze, c["FLAG_FREEZE"])):
            if on is not None:
                flags = (flags | bit) if on else (flags & ~bit)
        self.write(flags=flags)


@dataclass(frozen=True)
class ProcessUsage:
    """One occupied slot of the state file."""

    slot: int
    pid: int
    used_bytes: int
    freezing: bool
    frozen: bool
    interval_ns: int
    u_gpu: float
    a_c: float
    delayed_launches: int
    pid_steps: int


class StateFile:
    """The workload's shared state: per-process usage and freeze marks.

    The executor reads it with ``pread`` (a truncated file reads as empty, never SIGBUS) and
    maps it only for the futex address of ``notify``."""

    def __init__(self, path: Path, fd: int, mm: mmap.mmap) -> None:
        self.path = path
        self._fd = fd
        self._mm = mm
        lay = layout()
        self._f = lay.state
        self._slot = lay.slot
        self._c = lay.constants

    @classmethod
    def create(cls, path: str | os.PathLike, *, owner: tuple[int, int] | None = None, mode: int = 0o600) -> StateFile:
        """A new state file in a `secure_directory`; ``owner`` ``(uid, gid)``: the workload's, so
        its processes (and only they) can write their accounting."""
        lay = layout()
        path = Path(path)
        size = lay.constants["STATE_SIZE"]
        fd = _create(path, size, mode, owner)
        header = bytearray(lay.constants["STATE_HEADER_SIZE"])
        f = lay.state
        pack_into(header, 0, f["layout_version"], lay.version)
        pack_into(header, 0, f["size"], size)
        pack_into(header, 0, f["max_slots"], lay.constants["MAX_SLOTS"])
        pack_into(header, 0, f["magic"], lay.constants["STATE_MAGIC"])
        os.pwrite(fd, bytes(header), 0)
        return cls(path, fd, _map(fd, size))

    @classmethod
    def open(cls, path: str | os.PathLike) -> StateFile:
        lay = layout()
        path = Path(path)
        size = lay.constants["STATE_SIZE"]
        fd = _open_existing(path, size)
        try:
            data = os.pread(fd, lay.constants["STATE_HEADER_SIZE"], 0)
            _check_header(data, lay, lay.state, lay.constants["STATE_MAGIC"], path)
            mm = _map(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, mm)

    def close(self) -> None:
        self._mm.close()
        os.close(self._fd)

    def _read(self) -> bytes:
        size = self._c["STATE_SIZE"]
        data = os.pread(self._fd, size, 0)
        return data + bytes(size - len(data))  # what a workload truncated reads as zeros

    def header(self) -> dict[str, int]:
        data = self._read()
        return {n: unpack_from(data, 0, f) for n, f in self._f.items() if f.code is not None}

    def processes(self) -> list[ProcessUsage]:
        out = []
        data = self._read()
        for i in range(self._c["MAX_SLOTS"]):
            base = self._c["STATE_HEADER_SIZE"] + i * self._c["SLOT_SIZE"]
            v = {n: unpack_from(data, base, f) for n, f in self._slot.items()}
            if v["pid"] != 0:
                out.append(ProcessUsage(
                    slot=i, pid=v["pid"], used_bytes=v["used_bytes"], freezing=bool(v["freezing"]),
                    frozen=bool(v["frozen"]), interval_ns=v["interval_ns"], u_gpu=v["u_gpu"], a_c=v["a_c"],
                    delayed_launches=v["delayed_launches"], pid_steps=v["pid_steps"],
                ))
        return out

    def used_bytes(self) -> int:
        """Memory held by the workload's processes that are still alive."""
        total = 0
        for p in self.processes():
            try:
                os.kill(p.pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            total += p.used_bytes
        return total

    def notify(self) -> None:
        """Wake every xCUDA helper thread of the workload now (after a control-block write)."""
        field = self._f["event_seq"]
        seq = unpack_from(self._read(), 0, field)
        os.pwrite(self._fd, ((seq + 1) & 0xFFFFFFFF).to_bytes(4, "little"), field.offset)
        _futex_wake(self._mm, field.offset)  # beyond a truncated file's end: EFAULT, not SIGBUS
