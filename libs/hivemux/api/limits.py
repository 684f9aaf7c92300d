"""The API's edge limits (issue 28), one ASGI middleware (`Edge`) in front of every route,
before FastAPI reads anything of a request's body:

1. **Parameters.** A NUL or any other control character (U+0000-U+001F, U+007F-U+009F) in the
   path or in a query parameter's name or value is a 422 naming it, in FastAPI's error shape
   (PostgreSQL refuses NUL in text: such a filter used to become a 503).
2. **Authentication** of everything under ``/api/``: the bearer token (the change stream's also
   from ``?access_token=``) is looked up here, so a request without a token, or with a token
   refused, is answered 401 before a byte of its body is read; the principal is handed to the
   routes in ``request.state.principal`` (`auth.principal`).
3. **Failed-authentication lockout.** Refused tokens are counted per client (its address; an
   IPv6 client by its /64, what one host is usually given) and per token id (``hmx_<id>_…``,
   however many clients try it): `AuthLimits.max_failures` refusals within `window_s` lock that
   client or token id for `lockout_s`. While locked, every request that would authenticate from
   that client or with that token id gets a 429 with ``Retry-After`` and no lookup: a valid
   token from a locked client is refused too, or the answer would tell a guess from a hit. So
   anyone who knows a token id (principals carry it) can lock its holder out for `lockout_s`
   by failing `max_failures` times; the lockout is the price of a bound on guessing.
   Successes reset nothing (a holder of one token must not launder guesses at others). The two
   tables keep at most `tracked` entries each, least recently failed evicted first, so a flood
   of distinct addresses or token ids costs bounded memory (an evicted client starts afresh).
   Each API instance counts its own failures.
4. **Body size.** A declared ``Content-Length`` above `max_body_bytes` is a 413 at once; a body
   without one (chunked) is counted as the route reads it, and the read that passes the limit
   ends the request with a 413 (``Connection: close``): nothing past the limit is taken in.

Example (max_failures=3, window_s=60, lockout_s=300): a client sends three unknown tokens at
t=0, 1, 2 s: 401, 401, 401; at t=3 s anything it sends to ``/api/`` gets 429 with
``Retry-After: 299``, until t=302 s.

`FailureTable` is the counting, a state object whose methods take the time (`Edge` passes
`time.monotonic`), so it is tested without a clock.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from prometheus_client import Counter
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..store.tokens import Principal, Refused, token_id_of

REFUSALS = Counter("hivemux_api_edge_refusals_total", "Requests the API's edge refused, by reason", ["reason"])
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MISSING = "missing bearer token: send 'Authorization: Bearer <token>' (hivemux tokens create)"
Authenticate = Callable[[str], Awaitable[Principal | Refused]]


@dataclass(frozen=True)
class AuthLimits:
    max_failures: int = 10  # refused tokens from one client, or for one token id, within window_s ...
    window_s: float = 60.0
    lockout_s: float = 300.0  # ... lock it for this long
    tracked: int = 10_000  # entries per table (clients, token ids)

    def __post_init__(self) -> None:
        if self.max_failures < 1 or self.window_s <= 0 or self.lockout_s <= 0 or self.tracked < 1:
            raise ValueError(f"auth limits must be positive: {self}")


@dataclass
class _Failures:
    count: int
    since: float  # when the window of `count` began
    locked_until: float = -math.inf


class FailureTable:
    """Refused attempts per key (a client or a token id), bounded to `limits.tracked` keys."""

    def __init__(self, limits: AuthLimits) -> None:
        self._limits = limits
        self._keys: OrderedDict[str, _Failures] = OrderedDict()  # least recently failed first

    def __len__(self) -> int:
        return len(self._keys)

    def locked_for(self, key: str, now: float) -> float:
        """Seconds `key` stays locked (0: not locked)."""
        entry = self._keys.get(key)
        if entry is None:
            return 0.0
        if entry.locked_until <= now and now - entry.since >= self._limits.window_s:
            del self._keys[key]  # nothing left to remember
            return 0.0
        return max(0.0, entry.locked_until - now)

    def fail(self, key: str, now: float) -> None:
        """One refused attempt by `key`; the `max_failures`-th within the window locks it."""
        limits = self._limits
        entry = self._keys.pop(key, None)
        if entry is None or now - entry.since >= limits.window_s:
            entry = _Failures(0, now, entry.locked_until if entry else -math.inf)
        entry.count += 1
        if entry.count >= limits.max_failures:
            entry.locked_until = now + limits.lockout_s
            entry.count, entry.since = 0, now
        self._keys[key] = entry
        while len(self._keys) > limits.tracked:
            self._keys.popitem(last=False)


def client_key(scope: Scope) -> str:
    """Who a request comes from, for counting: its address, an IPv6 one by its /64."""
    host = (scope.get("client") or ("unknown", 0))[0]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return str(host)[:100]
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        return str(mapped) if mapped else str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def control_characters(scope: Scope) -> list[dict[str, Any]]:
    """FastAPI-shaped 422 errors for each path or query parameter holding a control character."""
    errors = []

    def check(loc: list[str], value: str) -> None:
        found = _CONTROL.search(value)
        if found:
            msg = f"control character U+{ord(found.group()):04X} is not allowed"
            errors.append({"type": "value_error", "loc": loc, "msg": msg, "input": value.encode("unicode_escape").decode()[:200]})

    check(["path"], scope.get("path", ""))
    for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True):
        check(["query", name.encode("unicode_escape").decode()[:100]], name + value)
    return errors


class BodyTooLarge(HTTPException):
    """Raised by the counting receive: FastAPI lets an HTTPException out of its body reading,
    and the app's handler answers it."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over the limit of {limit} bytes", headers={"Connection": "close"})


@dataclass(frozen=True)
class EdgeLimits:
    auth: AuthLimits = AuthLimits()
    max_body_bytes: int = 1024 * 1024


class Edge:
    """The middleware (see the module docstring). `authenticate` looks a token up; an error in
    `outages` (the database away) is a 503, as the app answers it elsewhere."""

    def __init__(self, app: ASGIApp, *, limits: EdgeLimits, authenticate: Authenticate,
                 outages: tuple[type[BaseException], ...] = (), clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.app, self.limits, self._authenticate, self._outages, self._clock = app, limits, authenticate, outages, clock
        self.clients, self.token_ids = FailureTable(limits.auth), FailureTable(limits.auth)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        errors = control_characters(scope)
        if errors:
            await _answer(send, 422, {"detail": errors}, "control_character")
            return
        if scope["path"].startswith("/api/") and not await self._authenticated(scope, send):
            return
        limit = self.limits.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and not declared.isdigit():  # servers refuse these first; an ASGI app may be served otherwise
            await _answer(send, 400, {"detail": f"Content-Length {declared[:40]!r} is not a number"}, "bad_length", {"Connection": "close"})
            return
        if declared is not None and int(declared) > limit:
            await _answer(send, 413, {"detail": f"request body of {declared} bytes over the limit of {limit}"}, "body_too_large",
                          {"Connection": "close"})  # fmt: skip
            return
        await self._within(limit, scope, receive, send)

    async def _authenticated(self, scope: Scope, send: Send) -> bool:
        token = _token(scope)
        if not token:
            await _answer(send, 401, {"detail": MISSING}, "missing_token", {"WWW-Authenticate": "Bearer"})
            return False
        now, client, token_id = self._clock(), client_key(scope), token_id_of(token)
        wait = max(self.clients.locked_for(client, now), self.token_ids.locked_for(token_id, now) if token_id else 0.0)
        if wait > 0:
            whom = f"client {client}" if self.clients.locked_for(client, now) else f"token {token_id}"
            detail = f"too many refused tokens: {whom} is locked out for {math.ceil(wait)} s"
            await _answer(send, 429, {"detail": detail}, "locked_out", {"Retry-After": str(math.ceil(wait))})
            return False
        try:
            found = await self._authenticate(token)
        except self._outages as error:
            await _answer(send, 503, {"detail": f"temporarily unavailable: {type(error).__name__}: {error}"[:500]}, "outage")
            return False
        if isinstance(found, Refused):
            self.clients.fail(client, now)
            if token_id:
                self.token_ids.fail(token_id, now)
            await _answer(send, 401, {"detail": found.reason}, "refused_token", {"WWW-Authenticate": "Bearer"})
            return False
        state = scope.setdefault("state", {})
        state["principal"], state["token"] = found, token
        return True

    async def _within(self, limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        received, started = 0, False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except BodyTooLarge as error:  # read where no handler answers it (e.g. a streaming route)
            if started:
                raise
            await _answer(send, 413, {"detail": error.detail}, "body_too_large", dict(error.headers or {}))
            return
        if received > limit:
            REFUSALS.labels("body_too_large").inc()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


def _token(scope: Scope) -> str | None:
    scheme, _, credentials = (_header(scope, b"authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    if scope["path"] == "/api/v1/stream":  # EventSource sends no headers
        for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1")):
            if name == "access_token" and value:
                return value
    return None


async def _answer(send: Send, status: int, body: dict[str, Any], reason: str, headers: dict[str, str] | None = None) -> None:
    REFUSALS.labels(reason).inc()
    content = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})
