"""Validation of raw readings into telemetry events: a bad value is a dead letter, not a crash.

Checks, each with a reason that names the field: missing required values, NaN or infinite
values, negative or out-of-range values (percentages outside 0-100, more memory used than the
GPU has, an SM clock above its maximum, implausible temperature or power), a GPU the node's
inventory does not hold, and timestamps from the future or the far past.

The checks come before the model's own validation so that every refusal has a reason an
operator can act on ("gpu_util is NaN", "unknown GPU ..."); the model then validates again
(cheaply, in pydantic-core), and consumers validate every record at decode.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from operator import attrgetter, le
from typing import Any, NamedTuple

from hivemux.events import GpuProcess, GpuTelemetryBatch, GpuTelemetrySample, NodeTelemetry
from hivemux.events.telemetry import gpu_ref, node_indices

from .readings import GpuReading, NodeReading


@dataclass(frozen=True)
class Limits:
    future_tolerance_s: float = 5.0  # clock skew between node and ingester we accept
    max_age_s: float = 300.0  # older readings are history, not telemetry
    max_power_w: float = 2000.0
    clock_tolerance: float = 1.05  # SM clock may report a little above the max (boost rounding)


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")  # the events' `Name` pattern
_PERCENT = ("gpu_util", "sm_activity", "sm_occupancy")
_REQUIRED = ("gpu_util", "memory_used_mib", "memory_total_mib", "sm_clock_mhz", "max_sm_clock_mhz")
_NUMBERS = _PERCENT + ("memory_used_mib", "memory_total_mib", "sm_clock_mhz", "max_sm_clock_mhz", "power_w", "temperature_c")


def _bad_number(name: str, value: float | None) -> str | None:
    if value is None:
        return f"{name} missing" if name in _REQUIRED else None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"{name}={value!r} is not a number"
    if math.isnan(value):
        return f"{name} is NaN"
    if math.isinf(value):
        return f"{name} is infinite"
    if value < 0 and name != "temperature_c":
        return f"{name}={value} is negative"
    if name in _PERCENT and value > 100.0:
        return f"{name}={value} is above 100 %"
    return None


_GOOD_NAMES: set[str] = set()  # names that matched the pattern once (ids repeat every sample)


def _names_ok(reading: GpuReading) -> bool:
    texts = (reading.gpu_id, reading.node_id, reading.gpu_type, reading.online_workload, *reading.offline_workloads)
    return all(text is None or text in _GOOD_NAMES or _name_ok(text) for text in texts)


def _name_ok(text: object) -> bool:
    if not isinstance(text, str) or len(text) > 200 or not _NAME.match(text):
        return False
    _GOOD_NAMES.add(text)
    return True


def _plainly_valid(r: GpuReading, limits: Limits) -> bool:
    """One chained comparison for the common case. NaN fails every comparison, a non-number
    raises TypeError: both fall through to the detailed checks, which name the problem."""
    try:
        return (
            0.0 <= r.gpu_util <= 100.0  # type: ignore[operator]
            and 0.0 < r.memory_total_mib < 1e9  # type: ignore[operator]
            and 0.0 <= r.memory_used_mib <= r.memory_total_mib  # type: ignore[operator]
            and 0.0 < r.max_sm_clock_mhz < 1e6  # type: ignore[operator]
            and 0.0 <= r.sm_clock_mhz <= limits.clock_tolerance * r.max_sm_clock_mhz  # type: ignore[operator]
            and (r.sm_activity is None or 0.0 <= r.sm_activity <= 100.0)
            and (r.sm_occupancy is None or 0.0 <= r.sm_occupancy <= 100.0)
            and (r.power_w is None or 0.0 <= r.power_w <= limits.max_power_w)
            and (r.temperature_c is None or -40.0 <= r.temperature_c <= 150.0)
            and r.xid_errors >= 0
            and r.ecc_sbe >= 0
            and r.ecc_dbe >= 0
        )
    except TypeError:
        return False


def gpu_problem(reading: GpuReading, at: float, now: float, known_gpus: frozenset[str] | None, limits: Limits = Limits()) -> str | None:
    """Why this reading cannot be published, or None when it is valid."""
    if (
        (known_gpus is None or reading.gpu_id in known_gpus)
        and now - limits.max_age_s <= at <= now + limits.future_tolerance_s
        and _plainly_valid(reading, limits)
        and _names_ok(reading)
    ):
        return None
    if known_gpus is not None and reading.gpu_id not in known_gpus:
        return f"unknown GPU {reading.gpu_id!r} (not in node {reading.node_id}'s inventory)"
    for label in ("gpu_id", "node_id", "gpu_type"):
        text = getattr(reading, label)
        if not isinstance(text, str) or len(text) > 200 or not _NAME.match(text):
            return f"{label}={text!r} is not a valid name"
    for job in (reading.online_workload, *reading.offline_workloads):
        if job is not None and not _NAME.match(job):
            return f"workload {job!r} is not a valid name"
    for name in _NUMBERS:
        problem = _bad_number(name, getattr(reading, name))
        if problem:
            return problem
    if reading.memory_total_mib == 0 or reading.max_sm_clock_mhz == 0:
        return "memory_total_mib and max_sm_clock_mhz must be positive"
    if reading.memory_used_mib > reading.memory_total_mib:  # type: ignore[operator]
        return f"memory_used_mib={reading.memory_used_mib} exceeds memory_total_mib={reading.memory_total_mib}"
    if reading.sm_clock_mhz > limits.clock_tolerance * reading.max_sm_clock_mhz:  # type: ignore[operator]
        return f"sm_clock_mhz={reading.sm_clock_mhz} exceeds max_sm_clock_mhz={reading.max_sm_clock_mhz}"
    if reading.temperature_c is not None and not -40.0 <= reading.temperature_c <= 150.0:
        return f"temperature_c={reading.temperature_c} outside -40..150"
    if reading.power_w is not None and reading.power_w > limits.max_power_w:
        return f"power_w={reading.power_w} above {limits.max_power_w}"
    for counter in ("xid_errors", "ecc_sbe", "ecc_dbe"):
        if getattr(reading, counter) < 0:
            return f"{counter}={getattr(reading, counter)} is negative"
    if at > now + limits.future_tolerance_s:
        return f"timestamp {at - now:.1f} s in the future"
    if at < now - limits.max_age_s:
        return f"timestamp {now - at:.0f} s in the past (limit {limits.max_age_s:.0f} s)"
    if not _plainly_valid(reading, limits):
        return "a value is out of its range"  # the detailed checks above name every known case
    return None


def gpu_sample(reading: GpuReading, at: float | datetime) -> GpuTelemetrySample:
    """The sample of a reading that passed `gpu_problem` (one GPU on its own: replay files, tests)."""
    return GpuTelemetrySample(
        occurred_at=at if isinstance(at, datetime) else datetime.fromtimestamp(at, UTC),
        gpu_id=reading.gpu_id,
        node_id=reading.node_id,
        gpu_type=reading.gpu_type,
        gpu_util=float(reading.gpu_util),  # type: ignore[arg-type]
        sm_activity=reading.sm_activity,
        sm_occupancy=reading.sm_occupancy,
        memory_used_mib=float(reading.memory_used_mib),  # type: ignore[arg-type]
        memory_total_mib=float(reading.memory_total_mib),  # type: ignore[arg-type]
        sm_clock_mhz=float(reading.sm_clock_mhz),  # type: ignore[arg-type]
        max_sm_clock_mhz=float(reading.max_sm_clock_mhz),  # type: ignore[arg-type]
        power_w=reading.power_w,
        temperature_c=reading.temperature_c,
        xid_errors=reading.xid_errors,
        last_xid=reading.last_xid,
        ecc_sbe=reading.ecc_sbe,
        ecc_dbe=reading.ecc_dbe,
        online_workload=reading.online_workload,
        offline_workloads=reading.offline_workloads,
        processes=tuple(
            GpuProcess(pid=p.pid, used_memory_mib=p.used_memory_mib, sm_util=p.sm_util) for p in reading.processes
        ),
    )


# The columns of a batch, read off every reading in one C call and transposed by `zip` (`_columns`).
_COLUMNS = attrgetter(
    "gpu_type", "taken_at", "gpu_util", "memory_used_mib", "memory_total_mib", "sm_clock_mhz", "max_sm_clock_mhz",
    "sm_activity", "sm_occupancy", "power_w", "temperature_c", "last_xid", "online_workload",
    "xid_errors", "ecc_sbe", "ecc_dbe", "offline_workloads", "processes",
)  # fmt: skip
_OPTIONAL = ("sm_activity", "sm_occupancy", "power_w", "temperature_c", "last_xid", "online_workload")  # None: not reported
_COUNTERS = ("xid_errors", "ecc_sbe", "ecc_dbe")  # 0 by default


class _Columns(NamedTuple):
    """A group of readings, one tuple per field (in `_COLUMNS` order)."""

    gpu_types: tuple[Any, ...]
    taken: tuple[Any, ...]
    util: tuple[Any, ...]
    used: tuple[Any, ...]
    total: tuple[Any, ...]
    clock: tuple[Any, ...]
    max_clock: tuple[Any, ...]
    activity: tuple[Any, ...]
    occupancy: tuple[Any, ...]
    power: tuple[Any, ...]
    temperature: tuple[Any, ...]
    last_xid: tuple[Any, ...]
    online: tuple[Any, ...]
    xid: tuple[Any, ...]
    sbe: tuple[Any, ...]
    dbe: tuple[Any, ...]
    offline: tuple[Any, ...]
    processes: tuple[Any, ...]


def _columns(readings: Sequence[GpuReading]) -> _Columns:
    return _Columns._make(zip(*map(_COLUMNS, readings)))


@lru_cache(maxsize=1 << 16)
def _gpu_ref(node_id: str, gpu_id: str) -> int | str:
    return gpu_ref(node_id, gpu_id)


def gpu_batch(node_id: str, readings: Sequence[GpuReading], at: float, instant: datetime, source: str) -> GpuTelemetryBatch:
    """The batch of one node's readings that passed `gpu_problem`, sampled at `at` (`instant`)
    unless a reading carries its own time. Columns at their default for every GPU are left out."""
    n = len(readings)
    columns = _columns(readings)
    fields = _batch_fields([node_id] * n, [r.gpu_id for r in readings], source, columns)
    taken, processes = columns.taken, columns.processes
    if taken.count(None) == n:
        fields["occurred_at"] = instant
    else:
        times = tuple(instant if t is None else datetime.fromtimestamp(t, UTC) for t in taken)
        fields["occurred_at"] = times[0]
        if times.count(times[0]) != n:
            fields["sampled_at"] = times
    if processes.count(()) != n:
        fields["processes"] = tuple(
            tuple({"pid": p.pid, "used_memory_mib": p.used_memory_mib, "sm_util": p.sm_util} for p in on_gpu) for on_gpu in processes
        )
    return GpuTelemetryBatch(**fields)  # type: ignore[arg-type]


def plain_gpu_batch(
    nodes: Sequence[Sequence[GpuReading]], at: float, instant: datetime, now: float, source: str,
    known_gpus: frozenset[str] | None, limits: Limits, offline_by_gpu: Mapping[str, tuple[str, ...]],
) -> GpuTelemetryBatch | None:  # fmt: skip
    """The common case, a whole group of nodes at once: the batch of all their readings if
    every one of them is plainly valid, checked a column at a time (a handful of C calls over
    the group instead of a dozen comparisons per reading) and built without a second
    validation; None when anything is unusual (a bad or missing value, its own timestamp,
    per-process data), which sends the readings through `gpu_problem` one by one and the
    validated `gpu_batch`. The record's values are the same either way. Readings without
    offline workloads take theirs from `offline_by_gpu` (what the executors said they started)."""
    if not now - limits.max_age_s <= at <= now + limits.future_tolerance_s:
        return None
    readings = [reading for node in nodes for reading in node]
    n = len(readings)
    (gpu_types, taken, util, used, total, clock, max_clock, activity, occupancy, power, temperature, last_xid,
     online, xid, sbe, dbe, offline, processes) = columns = _columns(readings)  # fmt: skip
    if taken.count(None) != n or processes.count(()) != n:
        return None
    gpu_ids = [r.gpu_id for r in readings]
    if known_gpus is not None and not known_gpus.issuperset(gpu_ids):
        return None
    reported = [column for column in (activity, occupancy, power, temperature) if column.count(None) != n]
    try:
        # One sum over every value: NaN or an infinity anywhere makes it non-finite.
        total_sum = sum(util) + sum(used) + sum(total) + sum(clock) + sum(max_clock) + sum(map(sum, reported))
        if not total_sum - total_sum == 0.0:
            return None
        first_total, first_max_clock = total[0], max_clock[0]
        if not (
            0.0 <= min(util) and max(util) <= 100.0
            and 0.0 < min(total) and max(total) < 1e9
            and 0.0 <= min(used)
            and (max(used) <= first_total if total.count(first_total) == n else all(map(le, used, total)))
            and 0.0 < min(max_clock) and max(max_clock) < 1e6
            and 0.0 <= min(clock)
            and (
                max(clock) <= limits.clock_tolerance * first_max_clock
                if max_clock.count(first_max_clock) == n
                else all(c <= limits.clock_tolerance * m for c, m in zip(clock, max_clock, strict=True))
            )
            and (activity.count(None) == n or 0.0 <= min(activity) and max(activity) <= 100.0)
            and (occupancy.count(None) == n or 0.0 <= min(occupancy) and max(occupancy) <= 100.0)
            and (power.count(None) == n or 0.0 <= min(power) and max(power) <= limits.max_power_w)
            and (temperature.count(None) == n or -40.0 <= min(temperature) and max(temperature) <= 150.0)
            and min(xid) >= 0 and min(sbe) >= 0 and min(dbe) >= 0
            and (last_xid.count(None) == n or min(x for x in last_xid if x is not None) >= 0)
        ):  # fmt: skip
            return None
    except TypeError:  # None among reported values, or not a number: the detailed checks say which
        return None
    node_ids = [node[0].node_id for node in nodes]
    node_of = [r.node_id for r in readings]
    if node_of != [node_id for node_id, node in zip(node_ids, nodes, strict=True) for _ in node]:
        return None  # a group's readings must be its node's
    if offline_by_gpu:
        offline = tuple(jobs or offline_by_gpu.get(gpu_id, ()) for jobs, gpu_id in zip(offline, gpu_ids, strict=True))
    names = {*node_ids, *gpu_types, *gpu_ids, *online, *(job for jobs in offline for job in jobs)}
    names.discard(None)  # type: ignore[arg-type]
    if not _GOOD_NAMES.issuperset(names) and not all(_name_ok(name) for name in names):
        return None
    fields = _batch_fields(node_of, gpu_ids, source, columns._replace(offline=offline))
    if len(nodes) > 1:
        if len(set(node_ids)) != len(node_ids):
            return None
        counts = tuple(len(node) for node in nodes)
        fields["nodes"] = tuple(node_ids)
        fields["node_gpus"] = counts[0] if counts.count(counts[0]) == len(counts) else counts
    # Every field given: pydantic's model_construct resolves a missing default slowly.
    return GpuTelemetryBatch.model_construct(**{**_UNREPORTED, **fields}, event_id=uuid.uuid4(), occurred_at=instant)


_UNREPORTED = {
    name: None for name in GpuTelemetryBatch.model_fields if name not in ("event_id", "occurred_at", "source", "node_id", "gpu_type")
}  # fmt: skip


def _batch_fields(node_of: Sequence[str], gpu_ids: Sequence[str], source: str, columns: _Columns) -> dict[str, Any]:
    """The batch's fields from its columns (`node_of`: each GPU's node; the time and process
    columns are the caller's), leaving out what holds only defaults."""
    c = columns
    n = len(c.util)
    fields: dict[str, Any] = {
        "source": source, "node_id": node_of[0], "gpu_type": c.gpu_types[0], "gpu_util": c.util,
        "memory_used_mib": c.used, "sm_clock_mhz": c.clock,
        "memory_total_mib": c.total[0] if c.total.count(c.total[0]) == n else c.total,
        "max_sm_clock_mhz": c.max_clock[0] if c.max_clock.count(c.max_clock[0]) == n else c.max_clock,
    }  # fmt: skip
    gpus = tuple(map(_gpu_ref, node_of, gpu_ids))
    if gpus != node_indices(node_of):
        fields["gpus"] = gpus
    if c.gpu_types.count(c.gpu_types[0]) != n:
        fields["gpu_types"] = c.gpu_types
    for name, column in zip(_OPTIONAL, (c.activity, c.occupancy, c.power, c.temperature, c.last_xid, c.online), strict=True):
        if column.count(None) != n:
            fields[name] = column
    for name, column in zip(_COUNTERS, (c.xid, c.sbe, c.dbe), strict=True):
        if column.count(0) != n:
            fields[name] = column
    if c.offline.count(()) != n:
        fields["offline_workloads"] = c.offline
    return fields


def node_problem(reading: NodeReading, at: float, now: float, limits: Limits = Limits()) -> str | None:
    for name in ("cpu_util", "memory_used_mib", "memory_total_mib", "swap_in_per_s"):
        value = getattr(reading, name)
        if value is None:
            if name == "swap_in_per_s":
                continue
            return f"{name} missing"
        if math.isnan(value) or math.isinf(value):
            return f"{name} is not finite"
        if value < 0:
            return f"{name}={value} is negative"
    if reading.cpu_util > 100.0:  # type: ignore[operator]
        return f"cpu_util={reading.cpu_util} is above 100 %"
    if not reading.memory_total_mib or reading.memory_used_mib > reading.memory_total_mib:  # type: ignore[operator]
        return f"memory_used_mib={reading.memory_used_mib} exceeds memory_total_mib={reading.memory_total_mib}"
    if at > now + limits.future_tolerance_s:
        return f"timestamp {at - now:.1f} s in the future"
    if at < now - limits.max_age_s:
        return f"timestamp {now - at:.0f} s in the past (limit {limits.max_age_s:.0f} s)"
    return None


def node_sample(reading: NodeReading, at: float, source: str) -> NodeTelemetry:
    return NodeTelemetry(
        occurred_at=datetime.fromtimestamp(at, UTC),
        source=source,
        node_id=reading.node_id,
        gpu_type=reading.gpu_type,
        gpu_ids=reading.gpu_ids,
        cpu_util=reading.cpu_util,  # type: ignore[arg-type]
        memory_used_mib=reading.memory_used_mib,  # type: ignore[arg-type]
        memory_total_mib=reading.memory_total_mib,  # type: ignore[arg-type]
        swap_in_per_s=reading.swap_in_per_s or 0.0,
        kswapd_active=reading.kswapd_active,
        online_workloads=reading.online_workloads,
        offline_workloads=reading.offline_workloads,
    )
