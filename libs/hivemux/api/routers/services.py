"""``/api/v1/services``: online services (issue 19) with each replica's GPU and latest latency
window, the worst replica's p99 against the SLO (within, approaching or over it) and the last SLO
protection step, from the read models (`store.online`, migration 0009).

Scoped like the jobs endpoints: a tenant sees only its VCs' services (``vc`` of another VC is a
403), and an offline neighbour of another tenant is shown as ``(other tenant)``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from ...store.online import online_services
from ...store.tokens import Principal
from ..auth import principal, require_vc

router = APIRouter(prefix="/api/v1/services", tags=["services"])


@router.get("", summary="Online services: replicas' GPUs and latest p99, the worst p99 against the SLO, the last protection step")
async def list_services(request: Request, who: Principal = Depends(principal), vc: str | None = None) -> dict[str, Any]:
    if vc is not None:
        require_vc(who, vc, f"VC {vc}")
    scope = who.scope()
    wanted = [vc] if vc is not None else None if scope is None else list(scope)
    return {"services": await online_services(request.app.state.pool, vcs=wanted, scope=scope)}
