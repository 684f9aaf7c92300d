"""``/api/v1/admin``: drain and undrain GPUs, publish a cell configuration (admin tokens only).
Each publishes the command `hivemux health drain` / `hivemux cells configure` publishes
(`hivemux.commands`), carrying the principal."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from ... import commands
from ...errors import ConfigurationError
from ...store.tokens import Principal
from ..auth import admin
from ..models import CellConfigBody, DrainBody

router = APIRouter(prefix="/api/v1/admin", tags=["admin"])


def _invalid(field: str, message: str) -> RequestValidationError:
    return RequestValidationError([{"type": "value_error", "loc": ("body", field), "msg": message, "input": None}])


async def _drain(request: Request, body: DrainBody, who: Principal, undo: bool) -> dict[str, Any]:
    state = request.app.state
    try:
        control = commands.device_control(body.gpu_id, undo=undo, principal=who.name, source=state.source, reason=body.reason)
    except (ValueError, ValidationError) as error:
        raise _invalid("gpu_id", str(error)) from error
    [meta] = await state.publisher.publish(control)
    return {"gpu_id": control.gpu_id, "action": control.action, "event_id": str(control.event_id), "principal": who.name, "offset": meta.offset}


@router.post("/gpus/drain", status_code=202, summary="Drain a GPU: SysMonitor Disabled, offline work evicted (gpu.control)")
async def drain(request: Request, body: DrainBody, who: Principal = Depends(admin)) -> dict[str, Any]:
    return await _drain(request, body, who, undo=False)


@router.post("/gpus/undrain", status_code=202, summary="Return a drained GPU to service")
async def undrain(request: Request, body: DrainBody, who: Principal = Depends(admin)) -> dict[str, Any]:
    return await _drain(request, body, who, undo=True)


@router.post("/cells/config", status_code=202, summary="Publish a HiveD cell configuration (cells.config); the allocator reconfigures")
async def cell_config(request: Request, body: CellConfigBody, who: Principal = Depends(admin)) -> dict[str, Any]:
    state = request.app.state
    try:
        change = commands.cell_config(body.config, version=body.version, principal=who.name, source=state.source)
    except (ConfigurationError, ValidationError, AttributeError, TypeError, KeyError) as error:
        raise _invalid("config", f"not a valid HiveD configuration: {error}") from error
    [meta] = await state.publisher.publish(change)
    return {"version": change.version, "event_id": str(change.event_id), "principal": who.name, "offset": meta.offset}
