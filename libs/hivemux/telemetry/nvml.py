"""NVML backend: per-GPU readings through pynvml (the `nvidia-ml-py` distribution), MuxFlow §3
"GPU monitor".

What one `read` reports per GPU, and the NVML call behind it:

==================  ===========================================================================
gpu_util            nvmlDeviceGetUtilizationRates().gpu (% of time a kernel ran)
memory_*_mib        nvmlDeviceGetMemoryInfo() used/total, bytes -> MiB
sm_clock_mhz        nvmlDeviceGetClockInfo(NVML_CLOCK_SM); max: nvmlDeviceGetMaxClockInfo
power_w             nvmlDeviceGetPowerUsage(), mW -> W
temperature_c       nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)
ecc_sbe / ecc_dbe   nvmlDeviceGetTotalEccErrors(corrected / uncorrected, NVML_VOLATILE_ECC)
processes           nvmlDeviceGetComputeRunningProcesses (v3) joined by pid with the samples of
                    nvmlDeviceGetProcessUtilization newer than the previous read
xid_errors/last_xid an NVML event set registered for nvmlEventTypeXidCriticalError
sm_activity/occ.    always None: NVML has no SM activity before Hopper's GPM; use the dcgm backend
==================  ===========================================================================

A call that answers NVML_ERROR_NOT_SUPPORTED gives None (ECC counters: 0, since a GPU without ECC
has no ECC errors to count); any other NVML error fails the read with a `TransientError`.

XID events: `nvmlEventSetWait_v2` blocks for up to its timeout, so a daemon thread owns the wait
and folds each event into per-GPU counters under a lock; `read` copies them. `close()` stops the
thread (it notices within one wait timeout), frees the event set and shuts NVML down. The
asyncio loop never waits on NVML: the ingester calls `read` in a worker thread.

Loading a given library: pynvml always `dlopen`s ``"libnvidia-ml.so.1"`` by soname. With
``library`` the backend first loads that file itself (`ctypes.CDLL`); glibc's `dlopen`
returns an already loaded object whose DT_SONAME matches the requested name, so pynvml gets the
same library. That only works before pynvml has loaded NVML in this process, which the backend
checks (a process holds one NVML library, whatever pynvml is asked).
"""

from __future__ import annotations
from hivemux.gpu_ids import gpu_id

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

import pynvml

from hivemux.errors import ConfigurationError, TransientError

from .readings import GpuReading, ProcessReading, gpu_type_of

log = logging.getLogger(__name__)

MIB = 1024 * 1024
XID_EVENT = pynvml.nvmlEventTypeXidCriticalError

T = TypeVar("T")


def nvml_optional(call: Callable[..., T], *args: object) -> T | None:
    """``call(*args)``, or None when NVML answers NVML_ERROR_NOT_SUPPORTED."""
    try:
        return call(*args)
    except pynvml.NVMLError_NotSupported:
        return None


def _handle_key(handle: object) -> int | None:
    """The device pointer's address: how an event's ``device`` is matched to a GPU index."""
    return ctypes.cast(handle, ctypes.c_void_p).value


class NvmlBackend:
    """`GpuBackend` over NVML on this node; GPU ids are ``f"{node_id}/gpu-{nvml index}"``.

    ``library``: a specific ``libnvidia-ml.so.1`` to load (see the module docstring); None
    uses the dynamic linker's search. ``xid_wait_ms`` is the event-set wait timeout, which bounds
    how long `close` waits for the XID thread. ``watch_xid=False`` skips the event set.
    """

    name = "nvml"

    def __init__(
        self,
        node_id: str,
        *,
        library: str | os.PathLike[str] | None = None,
        xid_wait_ms: int = 500,
        watch_xid: bool = True,
    ) -> None:
        self.node_id = node_id
        self._xid_wait_ms = xid_wait_ms
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._event_set: object | None = None
        self._load(library)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise ConfigurationError(f"NVML init failed: {exc}") from exc
        try:
            self.driver_version: str = pynvml.nvmlSystemGetDriverVersion()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._names = [pynvml.nvmlDeviceGetName(h) for h in self._handles]
            self._uuids = [pynvml.nvmlDeviceGetUUID(h) for h in self._handles]
            self._index_by_key = {_handle_key(h): i for i, h in enumerate(self._handles)}
            self._xid_counts = [0] * count
            self._last_xid: list[int | None] = [None] * count
            self._last_seen_us = [0] * count  # newest process-utilization sample per GPU
            self.xid_unsupported: frozenset[int] = frozenset()
            self.xid_watch_error: pynvml.NVMLError | None = None
            if watch_xid:
                self._start_xid_watch()
        except pynvml.NVMLError as exc:
            self.close()
            raise ConfigurationError(f"NVML device discovery failed: {exc}") from exc

    @staticmethod
    def _load(library: str | os.PathLike[str] | None) -> None:
        if library is None or not os.fspath(library):
            return
        try:
            wanted = ctypes.CDLL(os.fspath(library), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise ConfigurationError(f"cannot load NVML library {library}: {exc}") from exc
        loaded = pynvml.nvmlLib
        if loaded is not None and loaded._handle != wanted._handle:
            raise ConfigurationError(
                f"pynvml already loaded another NVML library in this process; cannot use {library}"
            )

    # -- XID events ---------------------------------------------------------------------------

    def _start_xid_watch(self) -> None:
        event_set = pynvml.nvmlEventSetCreate()
        self._event_set = event_set
        unsupported = set()
        for index, handle in enumerate(self._handles):
            supported = nvml_optional(pynvml.nvmlDeviceGetSupportedEventTypes, handle) or 0
            if not supported & XID_EVENT:
                unsupported.add(index)
                continue
            pynvml.nvmlDeviceRegisterEvents(handle, XID_EVENT, event_set)
        self.xid_unsupported = frozenset(unsupported)
        if len(unsupported) == len(self._handles):
            return
        self._thread = threading.Thread(target=self._watch_xids, name=f"nvml-xid-{self.node_id}", daemon=True)
        self._thread.start()

    def _watch_xids(self) -> None:
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, self._xid_wait_ms)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as exc:
                # Kept for the caller (and logged) rather than ending the watch: a driver hiccup
                # must not silently stop XID reporting for the backend's lifetime.
                self.xid_watch_error = exc
                log.warning("NVML event wait failed on %s: %s", self.node_id, exc)
                self._stop.wait(self._xid_wait_ms / 1000)
                continue
            if not data.eventType & XID_EVENT:
                continue
            index = self._index_by_key.get(_handle_key(data.device))
            if index is None:
                log.warning("XID %d on an unknown device on %s", data.eventData, self.node_id)
                continue
            with self._lock:
                self._xid_counts[index] += 1
                self._last_xid[index] = int(data.eventData)

    # -- readings -----------------------------------------------------------------------------

    def read(self, at: datetime) -> list[GpuReading]:
        """One reading per GPU; ``at`` is unused (NVML values are "now")."""
        if self._closed:
            raise RuntimeError("NvmlBackend is closed")
        try:
            return [self._read_gpu(i, h) for i, h in enumerate(self._handles)]
        except pynvml.NVMLError as exc:
            raise TransientError(f"NVML read failed on {self.node_id}: {exc}") from exc

    def _read_gpu(self, index: int, handle: object) -> GpuReading:
        util = nvml_optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
        memory = nvml_optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
        power_mw = nvml_optional(pynvml.nvmlDeviceGetPowerUsage, handle)
        sm_clock = nvml_optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
        max_sm_clock = nvml_optional(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM)
        temperature = nvml_optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
        with self._lock:
            xid_errors, last_xid = self._xid_counts[index], self._last_xid[index]
        return GpuReading(
            gpu_id=gpu_id(self.node_id, index),
            node_id=self.node_id,
            gpu_type=gpu_type_of(self._names[index]),
            gpu_util=None if util is None else float(util.gpu),
            sm_activity=None,
            sm_occupancy=None,
            memory_used_mib=None if memory is None else memory.used / MIB,
            memory_total_mib=None if memory is None else memory.total / MIB,
            sm_clock_mhz=None if sm_clock is None else float(sm_clock),
            max_sm_clock_mhz=None if max_sm_clock is None else float(max_sm_clock),
            power_w=None if power_mw is None else power_mw / 1000,
            temperature_c=None if temperature is None else float(temperature),
            xid_errors=xid_errors,
            last_xid=last_xid,
            ecc_sbe=self._ecc(handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ecc_dbe=self._ecc(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            uuid=self._uuids[index],
            processes=self._processes(index, handle),
        )

    @staticmethod
    def _ecc(handle: object, error_type: int) -> int:
        count = nvml_optional(pynvml.nvmlDeviceGetTotalEccErrors, handle, error_type, pynvml.NVML_VOLATILE_ECC)
        return count or 0

    def _processes(self, index: int, handle: object) -> tuple[ProcessReading, ...]:
        running = nvml_optional(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        if not running:
            return ()
        sm_by_pid: dict[int, tuple[int, float]] = {}
        try:
            samples = nvml_optional(pynvml.nvmlDeviceGetProcessUtilization, handle, self._last_seen_us[index]) or []
        except pynvml.NVMLError_NotFound:  # no sample since the previous read
            samples = []
        for sample in samples:
            newest = sm_by_pid.get(sample.pid)
            if newest is None or sample.timeStamp > newest[0]:
                sm_by_pid[sample.pid] = (sample.timeStamp, float(sample.smUtil))
            self._last_seen_us[index] = max(self._last_seen_us[index], sample.timeStamp)
        return tuple(
            ProcessReading(
                pid=proc.pid,
                used_memory_mib=None if proc.usedGpuMemory is None else proc.usedGpuMemory / MIB,
                sm_util=sm_by_pid[proc.pid][1] if proc.pid in sm_by_pid else None,
            )
            for proc in sorted(running, key=lambda p: p.pid)
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the XID thread, free the event set, shut NVML down. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._xid_wait_ms / 1000 + 5)
            if self._thread.is_alive():  # still inside the wait: freeing the set would race it
                log.error("NVML XID thread on %s did not stop; leaking its event set", self.node_id)
                self._event_set = None
        if self._event_set is not None:
            pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        pynvml.nvmlShutdown()
