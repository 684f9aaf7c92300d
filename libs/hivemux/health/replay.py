"""`hivemux health replay`: run recorded telemetry through the SysMonitor and the detector.

Input: JSON Lines, one record per line, as found on the topics — GPU sample batches
(`telemetry.gpu`, columnar; batches recorded in the earlier one-object-per-sample form are
read too), single GPU samples, node samples (`telemetry.node`), executor reports and
operator drains. Output: one JSON object per produced transition, fault, node-pressure change
or executor command, in order, each tagged with its ``type``. No broker is involved, and time
is the records' event time: silence is judged against the latest event time seen (the
core's watermark, as in the service), so the same file always gives the same output.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from pydantic import AwareDatetime, BaseModel, TypeAdapter, ValidationError

from hivemux.events import (
    DeviceControl,
    Event,
    ExecutorReport,
    GpuTelemetryBatch,
    GpuTelemetrySample,
    NodeTelemetry,
    SysMonitorSnapshot,
)

from .config import HealthConfig
from .edge import HealthEdge

SOURCE = "health-replay"


class ReplayInputError(ValueError):
    """A line that is not one of the accepted records; names the line."""


def _model_for(record: dict[str, object]) -> type[BaseModel]:
    if "gpus" in record:
        return GpuTelemetryBatch
    if "gpu_util" in record:
        return GpuTelemetrySample
    if "cpu_util" in record:
        return NodeTelemetry
    if "command_id" in record:
        return ExecutorReport
    if record.get("action") in ("drain", "undrain"):
        return DeviceControl
    raise ReplayInputError("not a GPU sample, batch, node sample, executor report or drain")


def _per_sample_batch(record: dict[str, object]) -> GpuTelemetryBatch:
    """A batch recorded before batches became columnar (one object per sample)."""
    samples = record["samples"]
    if not isinstance(samples, list):
        raise ReplayInputError("samples is not a list")
    parsed = [GpuTelemetrySample.model_validate(s) for s in samples]
    strangers = sorted({s.node_id for s in parsed} - {record["node_id"]})
    if strangers:
        raise ReplayInputError(f"batch of node {record['node_id']} holds samples of {strangers}")
    return GpuTelemetryBatch.from_samples(
        parsed, source=str(record.get("source")), event_id=record.get("event_id"),  # type: ignore[arg-type]
        occurred_at=_WHEN.validate_python(record.get("occurred_at")),
    )  # fmt: skip


_WHEN: TypeAdapter[datetime] = TypeAdapter(AwareDatetime)


def parse_lines(lines: Iterable[str]) -> Iterator[Event]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ReplayInputError("not a JSON object")
            if "samples" in record and "node_id" in record:
                yield _per_sample_batch(record)
                continue
            yield _model_for(record).model_validate(record)  # type: ignore[misc]
        except (ValueError, ValidationError) as error:
            raise ReplayInputError(f"line {number}: {error}") from None


@dataclass
class Replay:
    config: HealthConfig
    include_snapshots: bool = False

    def run(self, records: Iterable[Event]) -> Iterator[dict[str, object]]:
        core = HealthEdge(self.config, SOURCE)
        for record in records:
            match record:
                case GpuTelemetryBatch():
                    produced = core.on_batch(record)
                case GpuTelemetrySample():
                    produced = core.on_sample(record)
                case NodeTelemetry():
                    produced = core.on_node(record)
                case ExecutorReport():
                    produced = core.on_report(record)
                case DeviceControl():
                    produced = core.on_control(record)
                case _:
                    raise ReplayInputError(f"cannot replay {type(record).__name__}")
            produced += core.sweep()
            for event in produced:
                if isinstance(event, SysMonitorSnapshot) and not self.include_snapshots:
                    continue
                yield {"type": type(event).__name__, **event.model_dump(mode="json")}
