"""Bearer-token authentication and the checks of what a principal may do.

Every route under ``/api/`` is authenticated by the edge middleware (`limits.Edge`), before the
request's body is read: no or a malformed ``Authorization: Bearer`` header, an unknown, revoked
or expired token is a 401 with the reason in ``detail``, and a client or token id with too many
refused tokens a 429. `principal` gives the routes who it was. `admin` adds the admin check
(403). A tenant asking for another VC's job or VC gets a 403 naming its own VCs
(`require_vc`). Browsers' EventSource cannot send headers: the change stream alone also takes
the token as ``?access_token=``.
"""

from __future__ import annotations

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..store.tokens import Principal
from .limits import MISSING

_bearer = HTTPBearer(auto_error=False, description="A token from `hivemux tokens create` (hmx_<id>_<secret>)")


async def principal(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
    """Who the edge authenticated (`credentials` only documents the scheme in the OpenAPI)."""
    found = getattr(request.state, "principal", None)
    if not isinstance(found, Principal):  # a route outside /api/ asked for a principal: nobody checked one
        raise HTTPException(401, MISSING, headers={"WWW-Authenticate": "Bearer"})
    return found


async def admin(who: Principal = Depends(principal)) -> Principal:
    if not who.admin:
        raise HTTPException(403, f"{who.name} is a tenant token (VCs {', '.join(who.vcs)}): this needs an admin token")
    return who


def require_vc(who: Principal, vc: str | None, what: str) -> None:
    """403 unless `who` may act on `vc` (the VC of `what`)."""
    if not who.may_act_on(vc):
        raise HTTPException(403, f"{what} is not in your VCs ({', '.join(who.vcs)}): {who.name} acts only on those")
