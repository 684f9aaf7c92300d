"""``/api/v1/stream``: the change stream (server-sent events) a console keeps open; the format
is in `hivemux.api.changes`. Every client of one process is fed by that process's one poller.
The token is checked again every ``ApiConfig.token_recheck_s`` (15 s): once revoked or expired,
its stream sends ``event: revoked`` with the reason and ends (and a reconnect is a 401). The edge
(`limits.Edge`) authenticated the request, by header or ``?access_token=``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import asyncpg
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from ...store.tokens import Principal, Refused, TokenStore
from ..auth import principal

router = APIRouter(prefix="/api/v1", tags=["stream"])
KEEPALIVE_S = 15.0


@router.get("/stream", summary="Server-sent events of read-model changes (jobs, GPUs, VCs); token by header or ?access_token=",
            response_class=StreamingResponse, responses={200: {"content": {"text/event-stream": {}}}})  # fmt: skip
async def stream(request: Request, who: Principal = Depends(principal),
                 access_token: str | None = Query(None, description="For EventSource, which sends no headers")) -> StreamingResponse:  # fmt: skip
    return StreamingResponse(_events(request, who, request.state.token), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip


async def _events(request: Request, who: Principal, token: str) -> AsyncIterator[str]:
    feed = request.app.state.feed
    recheck_s = request.app.state.token_recheck_s
    queue = feed.subscribe()
    loop = asyncio.get_running_loop()
    checked = loop.time()
    try:
        hello = {"principal": who.name, "admin": who.admin, "vcs": list(who.vcs), "cursor": feed.cursor, "interval_s": feed.interval_s}
        yield f"event: hello\ndata: {json.dumps(hello)}\n\n"
        scope = who.scope()
        while True:
            if loop.time() - checked >= recheck_s:  # a token revoked while its stream is open: the stream ends
                checked = loop.time()
                refused = await _refused(request, token)
                if refused is not None:
                    yield f"event: revoked\ndata: {json.dumps({'detail': refused.reason})}\n\n"
                    return
            try:
                batch = await asyncio.wait_for(queue.get(), min(KEEPALIVE_S, recheck_s))
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            message = batch.render(scope)
            if message is not None:
                yield message
    finally:
        feed.unsubscribe(queue)


async def _refused(request: Request, token: str) -> Refused | None:
    """Why the token is no longer valid (revoked, expired); None while it is, or while the
    database cannot say (checked again later)."""
    try:
        found = await TokenStore(request.app.state.pool).authenticate(token)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncio.TimeoutError):
        return None
    return found if isinstance(found, Refused) else None
