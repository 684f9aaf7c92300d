"""``/api/v1/whoami`` (any token) and ``/api/v1/admin/tokens`` (admin): the tokens of
`hivemux tokens create|list|revoke`, over HTTP."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request

from ...errors import ConfigurationError
from ...store.tokens import Principal, TokenStore
from ..auth import admin, principal
from ..models import TokenBody

router = APIRouter(prefix="/api/v1", tags=["tokens"])


@router.get("/whoami", summary="The principal of this token: tenant, VCs, admin")
async def whoami(who: Principal = Depends(principal)) -> dict[str, Any]:
    return {"principal": who.name, "tenant": who.tenant, "token_id": who.token_id, "vcs": list(who.vcs), "admin": who.admin}


@router.get("/admin/tokens", summary="Every token (never the secret)")
async def list_tokens(request: Request, who: Principal = Depends(admin)) -> dict[str, Any]:
    return {"tokens": [t.to_json() for t in await TokenStore(request.app.state.pool).list()]}


@router.post("/admin/tokens", status_code=201, summary="Create a token; the answer holds the token, shown this once")
async def create_token(request: Request, body: TokenBody, who: Principal = Depends(admin)) -> dict[str, Any]:
    try:
        record, token = await TokenStore(request.app.state.pool).create(
            tenant=body.tenant, vcs=body.vcs, admin=body.admin, ttl=None if body.ttl_s is None else timedelta(seconds=body.ttl_s)
        )
    except ConfigurationError as error:
        raise HTTPException(422, [{"type": "value_error", "loc": ["body", "vcs"], "msg": str(error)}]) from error
    return {**record.to_json(), "token": token}


@router.delete("/admin/tokens/{token_id}", summary="Revoke a token: refused from the next request on")
async def revoke_token(request: Request, token_id: str, who: Principal = Depends(admin)) -> dict[str, Any]:
    record = await TokenStore(request.app.state.pool).revoke(token_id)
    if record is None:
        raise HTTPException(404, f"no token {token_id}")
    return record.to_json()
