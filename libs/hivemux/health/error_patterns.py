"""The error-pattern detector: the "other 1 %" of propagated errors (MuxFlow preprint §4.2,
journal §5 and its Table 2).

99 % of propagated errors come from SIGINT/SIGTERM and are handled by xCUDA's graceful exit.
The rest — MPS server crashes, XID 31 (GPU memory page fault), MPS hangs, sticky CUDA errors —
are found by "an automated detector [that] monitors GPUs and alerts when the error patterns are
satisfied"; the remediation resets the CUDA context and the MPS server and restarts the
workload. The patterns here, each a `FaultKind`:

- ``xid31_page_fault``: the GPU's XID counter rose and the latest XID is 31; ``xid``: any other XID;
- ``ecc_uncorrectable``: double-bit ECC errors rose; ``ecc_correctable``: single-bit ECC errors
  rose by at least ``ecc_sbe_burst`` between two samples;
- ``mps_server_crash`` / ``mps_hang``: an executor report says the GPU's MPS server crashed or
  stopped answering;
- ``mps_client_error``: a workload hit one of the MPS errors 805-810;
- ``sticky_cuda_error``: a workload hit a sticky error (the context is unusable until reset);
- ``high_util_no_progress``: utilization pinned at or above ``high_util_pct`` for longer than
  ``high_util_s`` while none of the GPU's offline workloads reported progress in that time.

Which remediation each pattern gets is configuration (`HealthConfig.rules`), not code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hivemux.events.telemetry import FaultKind

from .config import DetectorSettings
from .sysmonitor import SysMonitor

XID_PAGE_FAULT = 31
# CUDA driver errors after which the context is unusable until it is destroyed.
STICKY_CUDA_ERRORS: dict[int, str] = {
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC",
    719: "CUDA_ERROR_LAUNCH_FAILED",
}
MPS_CLIENT_ERRORS: dict[int, str] = {
    805: "CUDA_ERROR_MPS_CONNECTION_FAILED",
    806: "CUDA_ERROR_MPS_RPC_FAILURE",
    807: "CUDA_ERROR_MPS_SERVER_NOT_READY",
    808: "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
    809: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED",
    810: "CUDA_ERROR_MPS_CLIENT_TERMINATED",
}


@dataclass(frozen=True, slots=True)
class Finding:
    """A matched error pattern on one GPU."""

    kind: FaultKind
    gpu_id: str
    detail: str
    xid: int | None = None
    cuda_error: int | None = None
    job_id: str | None = None


def sample_findings(
    monitor: SysMonitor,
    at: float,
    gpu_util: float,
    xid_errors: int,
    last_xid: int | None,
    ecc_sbe: int,
    ecc_dbe: int,
    progress: "ProgressLog",
    settings: DetectorSettings,
) -> list[Finding] | None:
    """Patterns visible in one GPU sample, against the counters the monitor remembers.
    Counters that go down (driver reload, backend restart) re-baseline silently."""
    out: list[Finding] | None = None
    if xid_errors > monitor.xid_errors:
        rise = xid_errors - monitor.xid_errors
        if last_xid == XID_PAGE_FAULT:
            finding = Finding(FaultKind.XID_PAGE_FAULT, monitor.gpu_id, f"XID 31 (GPU memory page fault): {rise} new XID event(s)", xid=last_xid)
        else:
            finding = Finding(FaultKind.XID, monitor.gpu_id, f"XID {last_xid}: {rise} new XID event(s)", xid=last_xid)
        out = [finding]
    monitor.xid_errors = xid_errors
    if ecc_dbe > monitor.ecc_dbe:
        out = out or []
        out.append(Finding(FaultKind.ECC_UNCORRECTABLE, monitor.gpu_id, f"double-bit ECC errors rose from {monitor.ecc_dbe} to {ecc_dbe}"))
    monitor.ecc_dbe = ecc_dbe
    if ecc_sbe - monitor.ecc_sbe >= settings.ecc_sbe_burst:
        out = out or []
        out.append(Finding(FaultKind.ECC_CORRECTABLE, monitor.gpu_id, f"single-bit ECC errors rose from {monitor.ecc_sbe} to {ecc_sbe}"))
    monitor.ecc_sbe = ecc_sbe
    if gpu_util < settings.high_util_pct:
        monitor.high_util_since = None
        return out
    if monitor.high_util_since is None:
        monitor.high_util_since = at
        return out
    pinned_for = at - monitor.high_util_since
    if pinned_for < settings.high_util_s or not monitor.offline_workloads:
        return out
    since = monitor.high_util_since
    if any(progress.progressed_since(job, since) for job in monitor.offline_workloads):
        return out
    monitor.high_util_since = at  # one alert per pinned window
    out = out or []
    out.append(
        Finding(
            FaultKind.HIGH_UTIL_NO_PROGRESS,
            monitor.gpu_id,
            f"utilization >= {settings.high_util_pct:.1f} % for {pinned_for:.0f} s with no progress from "
            f"{', '.join(monitor.offline_workloads)}",
            job_id=monitor.offline_workloads[0],
        )
    )
    return out


def report_findings(
    gpu_ids: tuple[str, ...], job_id: str, mps_server: str | None, cuda_error: int | None, detail: str
) -> list[Finding]:
    """Patterns an executor report shows (one finding per GPU the workload runs on)."""
    out: list[Finding] = []
    for gpu_id in gpu_ids:
        if mps_server == "crashed":
            out.append(Finding(FaultKind.MPS_SERVER_CRASH, gpu_id, f"MPS server crashed (seen by {job_id}): {detail}".strip(": "), job_id=job_id))
        elif mps_server == "hung":
            out.append(Finding(FaultKind.MPS_HANG, gpu_id, f"MPS server hangs (seen by {job_id}): {detail}".strip(": "), job_id=job_id))
        if cuda_error in STICKY_CUDA_ERRORS:
            out.append(
                Finding(FaultKind.STICKY_CUDA_ERROR, gpu_id, f"{job_id} hit {STICKY_CUDA_ERRORS[cuda_error]} ({cuda_error})", cuda_error=cuda_error, job_id=job_id)
            )
        elif cuda_error in MPS_CLIENT_ERRORS:
            out.append(
                Finding(FaultKind.MPS_CLIENT_ERROR, gpu_id, f"{job_id} hit {MPS_CLIENT_ERRORS[cuda_error]} ({cuda_error})", cuda_error=cuda_error, job_id=job_id)
            )
    return out


@dataclass
class ProgressLog:
    """When each workload last made progress (its reported iteration count rose), event time.

    A workload first seen is credited with progress at that moment, so a processor that
    just took over a node does not accuse workloads whose history it never saw."""

    iterations: dict[str, int] = field(default_factory=dict)
    progressed_at: dict[str, float] = field(default_factory=dict)

    def record(self, job_id: str, iterations_done: int, at: float) -> None:
        if iterations_done > self.iterations.get(job_id, -1):
            self.iterations[job_id] = iterations_done
            self.progressed_at[job_id] = max(at, self.progressed_at.get(job_id, at))

    def seen(self, job_id: str, at: float) -> None:
        self.progressed_at.setdefault(job_id, at)

    def progressed_since(self, job_id: str, since: float) -> bool:
        return self.progressed_at.get(job_id, since) > since

    def forget(self, job_id: str) -> None:
        self.iterations.pop(job_id, None)
        self.progressed_at.pop(job_id, None)
