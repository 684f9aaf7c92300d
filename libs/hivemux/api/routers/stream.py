"""``/api/v1/stream``: the change stream (server-sent events) a console keeps open; the format
is in `hivemux.api.changes`. Every client of one process is fed by that process's one poller."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from fastapi.security.utils import get_authorization_scheme_param

from ...store.tokens import Principal
from ..auth import authenticate

router = APIRouter(prefix="/api/v1", tags=["stream"])
KEEPALIVE_S = 15.0


@router.get("/stream", summary="Server-sent events of read-model changes (jobs, GPUs, VCs); token by header or ?access_token=",
            response_class=StreamingResponse, responses={200: {"content": {"text/event-stream": {}}}})  # fmt: skip
async def stream(request: Request, access_token: str | None = Query(None, description="For EventSource, which sends no headers")) -> StreamingResponse:
    scheme, header_token = get_authorization_scheme_param(request.headers.get("Authorization"))
    who = await authenticate(request, header_token if scheme.lower() == "bearer" and header_token else access_token)
    return StreamingResponse(_events(request, who), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip


async def _events(request: Request, who: Principal) -> AsyncIterator[str]:
    feed = request.app.state.feed
    queue = feed.subscribe()
    try:
        hello = {"principal": who.name, "admin": who.admin, "vcs": list(who.vcs), "cursor": feed.cursor, "interval_s": feed.interval_s}
        yield f"event: hello\ndata: {json.dumps(hello)}\n\n"
        scope = who.scope()
        while True:
            try:
                batch = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            message = batch.render(scope)
            if message is not None:
                yield message
    finally:
        feed.unsubscribe(queue)
