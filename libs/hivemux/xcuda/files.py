"""The executor's side of xCUDA's two shared files (MuxFlow section 4.2).

``ControlBlock`` is node-owned: the executor creates it (mode 0644, so the workload can only
read it) and writes the memory quota, the launch-control parameters of eq. 1-2 and the PID
controller, each new (U_SM, C_SM) sample, and the freeze flag. Parameter updates are guarded
by a seqlock (``seq`` odd while writing), so xCUDA never reads half an update.

``StateFile`` is shared read-write by the workload's processes: per-process memory use, the
freeze marks and what each process's controller did. The executor creates it (xCUDA
initializes the robust lock inside on first use) and reads it to report usage and to know a
freeze was applied. ``notify()`` wakes every process's xCUDA helper thread at once (a futex
wake on ``event_seq``) instead of waiting for its next poll.

Worked example::

    cb = ControlBlock.create(path, mem_quota_bytes=8 << 30)
    cb.set_launch_control(t_sm=1200, c_h=1590, a_l=1.0, a_h=0.2, kp=2000, ki=20000, kd=0, target=0.8)
    cb.sample(u_sm=0.55, c_sm=1410)      # each GPU monitor sample
    cb.set_flags(freeze=True)            # SysMonitor says Overlimit: hold all launches
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path

from hivemux.xcuda.layout import Layout, layout, pack_into, unpack_from


class LayoutMismatch(ValueError):
    """The file was written with another layout version (or is not an xCUDA file)."""


def _open_map(path: Path, size: int, *, create: bool, mode: int) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, mode)
    try:
        if create:
            os.ftruncate(fd, size)
            os.fchmod(fd, mode)
        elif os.fstat(fd).st_size < size:
            raise LayoutMismatch(f"{path}: smaller than {size} bytes")
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


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
    def create(cls, path: str | os.PathLike, *, mem_quota_bytes: int = 0) -> ControlBlock:
        lay = layout()
        path = Path(path)
        mm = _open_map(path, lay.constants["CONTROL_SIZE"], create=True, mode=0o644)
        mm[:] = bytes(len(mm))
        cb = cls(path, mm)
        f = cb._f
        pack_into(mm, 0, f["layout_version"], lay.version)
        pack_into(mm, 0, f["size"], lay.constants["CONTROL_SIZE"])
        pack_into(mm, 0, f["mem_quota_bytes"], mem_quota_bytes)
        pack_into(mm, 0, f["magic"], lay.constants["CONTROL_MAGIC"])  # last: marks it valid
        return cb

    @classmethod
    def open(cls, path: str | os.PathLike) -> ControlBlock:
        lay = layout()
        path = Path(path)
        mm = _open_map(path, lay.constants["CONTROL_SIZE"], create=False, mode=0o644)
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
    """The workload's shared state: per-process usage and freeze marks."""

    def __init__(self, path: Path, mm: mmap.mmap) -> None:
        self.path = path
        self._mm = mm
        lay = layout()
        self._f = lay.state
        self._slot = lay.slot
        self._c = lay.constants

    @classmethod
    def create(cls, path: str | os.PathLike, *, mode: int = 0o666) -> StateFile:
        lay = layout()
        path = Path(path)
        mm = _open_map(path, lay.constants["STATE_SIZE"], create=True, mode=mode)
        mm[:] = bytes(len(mm))
        sf = cls(path, mm)
        pack_into(mm, 0, sf._f["layout_version"], lay.version)
        pack_into(mm, 0, sf._f["size"], lay.constants["STATE_SIZE"])
        pack_into(mm, 0, sf._f["max_slots"], lay.constants["MAX_SLOTS"])
        pack_into(mm, 0, sf._f["magic"], lay.constants["STATE_MAGIC"])
        return sf

    @classmethod
    def open(cls, path: str | os.PathLike) -> StateFile:
        lay = layout()
        path = Path(path)
        mm = _open_map(path, lay.constants["STATE_SIZE"], create=False, mode=0o666)
        _check_header(mm, lay, lay.state, lay.constants["STATE_MAGIC"], path)
        return cls(path, mm)

    def close(self) -> None:
        self._mm.close()

    def header(self) -> dict[str, int]:
        return {n: unpack_from(self._mm, 0, f) for n, f in self._f.items() if f.code is not None}

    def processes(self) -> list[ProcessUsage]:
        out = []
        for i in range(self._c["MAX_SLOTS"]):
            base = self._c["STATE_HEADER_SIZE"] + i * self._c["SLOT_SIZE"]
            v = {n: unpack_from(self._mm, base, f) for n, f in self._slot.items()}
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
        off = self._f["event_seq"].offset
        seq = unpack_from(self._mm, 0, self._f["event_seq"])
        pack_into(self._mm, 0, self._f["event_seq"], (seq + 1) & 0xFFFFFFFF)
        _futex_wake(self._mm, off)
