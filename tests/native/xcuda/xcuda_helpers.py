"""Helpers of the xCUDA tests: build flavours, one workload's files, running the probe."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from hivemux.xcuda import ControlBlock, StateFile

@dataclass(frozen=True)
class Native:
    """One flavour of the native build."""

    out: Path
    preload_first: tuple[str, ...] = ()  # sanitizer runtime, which must come first
    sanitized: bool = False

    @property
    def lib(self) -> Path:
        return self.out / "libxcuda.so"

    @property
    def fake(self) -> Path:
        return self.out / "fake" / "libcuda.so.1"

    def prog(self, name: str) -> str:
        return str(self.out / "tests" / name)

    def env(self, extra: dict[str, str] | None = None, *, preload: bool = True) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XCUDA_", "FAKE_CUDA_", "PROBE_"))}
        env["LD_LIBRARY_PATH"] = str(self.fake.parent)
        env["XCUDA_REAL_LIBCUDA"] = str(self.fake)
        env["XCUDA_POLL_US"] = "1000"
        if self.sanitized:
            env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:exitcode=66"
            env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=67"
        preloads = list(self.preload_first) + ([str(self.lib)] if preload else [])
        if preloads:
            env["LD_PRELOAD"] = " ".join(preloads)
        env.update(extra or {})
        return env


def san_runtime() -> str | None:
    out = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return out if out and os.path.isabs(out) and os.path.exists(out) else None


@dataclass
class Workload:
    """One offline workload: its control block, state file and a shared call log."""

    dir: Path
    control: ControlBlock
    state: StateFile
    log: Path
    env_extra: dict[str, str] = field(default_factory=dict)

    def env(self, native: Native, extra: dict[str, str] | None = None, *, preload: bool = True) -> dict[str, str]:
        e = {
            "XCUDA_CONTROL": str(self.control.path),
            "XCUDA_STATE": str(self.state.path),
            "FAKE_CUDA_LOG": str(self.log),
            "XCUDA_LOG": str(self.log),
        }
        e.update(self.env_extra)
        e.update(extra or {})
        return native.env(e, preload=preload)


SANITIZER_REPORT = re.compile(r"ERROR: (Address|Leak)Sanitizer|runtime error:")


def check_clean(proc: subprocess.CompletedProcess | subprocess.Popen, stderr: str) -> None:
    assert not SANITIZER_REPORT.search(stderr or ""), stderr


def probe(native: Native, env: dict[str, str], mode: str, *cmds: str, timeout: float = 30,
          program: str = "probe") -> list[str]:
    """Run the probe, check it exited 0 with no sanitizer report, return its stdout lines."""
    p = subprocess.run([native.prog(program), mode, *cmds], env=env, capture_output=True, text=True, timeout=timeout)
    check_clean(p, p.stderr)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    return p.stdout.splitlines()


def field_of(line: str, key: str) -> str:
    m = re.search(rf"\b{key}=(\S+)", line)
    assert m, (key, line)
    return m.group(1)


def rc(line: str) -> int:
    return int(field_of(line, "rc"))


def read_log(path: Path) -> list[tuple[int, int, int, str, str]]:
    """(start_ns, end_ns, pid, name, rest) per line of the shared fake-driver/xCUDA log."""
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(" ", 4)
        if len(parts) >= 4:
            out.append((int(parts[0]), int(parts[1]), int(parts[2]), parts[3], parts[4] if len(parts) > 4 else ""))
    return out

