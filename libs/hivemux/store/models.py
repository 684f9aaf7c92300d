"""The predictor's store of speed-model versions (MuxFlow §5.2; migration 0002).

Every trained version is recorded, published or not, so "why is version 4 not in use" has an
answer (its held-out error was worse). A mirror of `predictor.models`: a restarted predictor
over a fresh broker republishes the newest published version and the refused ones after it
(`versions(gpu_type)`) instead of bootstrapping again. Writes are idempotent
(``ON CONFLICT DO NOTHING``): a version number is written once.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from datetime import datetime
from uuid import UUID

import asyncpg

from ..bus.outage import is_outage
from ..events import PredictorModel

log = logging.getLogger("hivemux.store.models")


@dataclass(frozen=True)
class ModelRecord:
    gpu_type: str
    version: int
    kind: str  # "analytic" | "mlp"
    weights_b64: str | None
    parameters: dict[str, float]
    heldout_error: float | None
    trained_on: int
    published: bool
    event_id: UUID
    occurred_at: datetime

    @classmethod
    def of(cls, event: PredictorModel) -> "ModelRecord":
        return cls(**{f.name: getattr(event, f.name) for f in fields(cls)} | {"parameters": dict(event.parameters)})


_COLUMNS = tuple(f.name for f in fields(ModelRecord))
_INSERT = (
    f"INSERT INTO predictor_models ({', '.join(_COLUMNS)}) "
    f"VALUES ({', '.join(f'${i}::jsonb' if name == 'parameters' else f'${i}' for i, name in enumerate(_COLUMNS, start=1))}) "
    "ON CONFLICT (gpu_type, version) DO NOTHING"
)
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM predictor_models"


class ModelStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def record(self, model: ModelRecord) -> bool:
        """True when this call wrote the version."""
        values = [json.dumps(model.parameters, sort_keys=True) if name == "parameters" else getattr(model, name) for name in _COLUMNS]
        status: str = await self._pool.execute(_INSERT, *values)
        return status == "INSERT 0 1"

    async def mirror(self, pending: list[ModelRecord]) -> None:
        """Record `pending` in order, removing each once written; a database outage leaves the
        rest for the next call instead of failing the caller (whose decisions are on the log)."""
        while pending:
            try:
                await self.record(pending[0])
            except Exception as error:
                if not is_outage(error):
                    raise
                log.warning("%d model versions not yet mirrored to PostgreSQL: %s", len(pending), error)
                return
            pending.pop(0)

    async def latest_published(self, gpu_type: str) -> ModelRecord | None:
        row = await self._pool.fetchrow(
            f"{_SELECT} WHERE gpu_type = $1 AND published ORDER BY version DESC LIMIT 1", gpu_type
        )
        return _record(row)

    async def newest_version(self, gpu_type: str) -> int:
        version: int | None = await self._pool.fetchval("SELECT max(version) FROM predictor_models WHERE gpu_type = $1", gpu_type)
        return version or 0

    async def versions(self, gpu_type: str) -> list[ModelRecord]:
        rows = await self._pool.fetch(f"{_SELECT} WHERE gpu_type = $1 ORDER BY version", gpu_type)
        return [r for r in map(_record, rows) if r is not None]


def _record(row: asyncpg.Record | None) -> ModelRecord | None:
    if row is None:
        return None
    values = dict(row)
    values["parameters"] = json.loads(values["parameters"]) if isinstance(values["parameters"], str) else dict(values["parameters"])
    return ModelRecord(**values)
