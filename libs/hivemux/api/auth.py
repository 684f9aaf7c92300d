"""Bearer-token authentication and the checks of what a principal may do.

Every endpoint but ``/healthz``, ``/metrics`` and the OpenAPI document depends on `principal`:
no or a malformed ``Authorization: Bearer`` header, an unknown or a revoked token is a 401 with
the reason in ``detail``. `admin` adds the admin check (403). A tenant asking for another VC's
job or VC gets a 403 naming its own VCs (`require_vc`). Browsers' EventSource cannot send
headers: the change stream alone also takes the token as ``?access_token=``.
"""

from __future__ import annotations

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..store.tokens import Principal, TokenStore

_bearer = HTTPBearer(auto_error=False, description="A token from `hivemux tokens create` (hmx_<id>_<secret>)")


def _unauthorized(reason: str) -> HTTPException:
    return HTTPException(401, reason, headers={"WWW-Authenticate": "Bearer"})


async def authenticate(request: Request, token: str | None) -> Principal:
    if not token:
        raise _unauthorized("missing bearer token: send 'Authorization: Bearer <token>' (hivemux tokens create)")
    found = await TokenStore(request.app.state.pool).authenticate(token)
    if found is None:
        raise _unauthorized("unknown or revoked token")
    return found


async def principal(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
    return await authenticate(request, credentials.credentials if credentials else None)


async def admin(who: Principal = Depends(principal)) -> Principal:
    if not who.admin:
        raise HTTPException(403, f"{who.name} is a tenant token (VCs {', '.join(who.vcs)}): this needs an admin token")
    return who


def require_vc(who: Principal, vc: str | None, what: str) -> None:
    """403 unless `who` may act on `vc` (the VC of `what`)."""
    if not who.may_act_on(vc):
        raise HTTPException(403, f"{what} is not in your VCs ({', '.join(who.vcs)}): {who.name} acts only on those")
