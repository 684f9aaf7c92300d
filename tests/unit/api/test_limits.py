"""The API's edge limits (`hivemux.api.limits`, issue 28): the failure table without a clock;
the middleware in front of a small FastAPI app (tokens from a dict: the database's part is in
tests/integration/test_api.py) through httpx's ASGI transport for what the app decides, and
served by a real uvicorn for what must happen before a body is read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from pydantic import BaseModel
from support.buskit import eventually
from support.raw_http import RawRequest

from hivemux.api.limits import AuthLimits, Edge, EdgeLimits, FailureTable, client_key, control_characters
from hivemux.infra import free_port
from hivemux.store.tokens import UNKNOWN, Principal, Refused

GOOD = "hmx_0000000a_good"
TOKENS = {GOOD: Principal("acme", "0000000a", ("vc-a",), False), "hmx_0000000b_other": Principal("acme", "0000000b", ("vc-a",), False)}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Payload(BaseModel):
    data: str


def make_edge(limits: EdgeLimits = EdgeLimits(), clock: Clock | None = None, outage: bool = False) -> tuple[Edge, list[int]]:
    """The middleware around an app whose POST reads a JSON body; `seen` holds each body's size."""
    app, seen = FastAPI(), []

    @app.post("/api/v1/things")
    async def things(request: Request, payload: Payload) -> dict[str, object]:
        seen.append(len(payload.data))
        return {"principal": request.state.principal.name, "size": len(payload.data)}

    @app.get("/api/v1/things")
    async def listed(request: Request, state: str = "") -> dict[str, str]:
        return {"principal": request.state.principal.name, "state": state}

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ready": True}

    async def authenticate(token: str) -> Principal | Refused:
        if outage:
            raise OSError("connection refused")
        return TOKENS.get(token) or Refused(UNKNOWN)

    return Edge(app, limits=limits, authenticate=authenticate, outages=(OSError,), clock=clock or Clock()), seen


async def call(edge: Edge, token: str | None, method: str = "GET", path: str = "/api/v1/things", client: str = "10.0.0.1", **kwargs: object) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    transport = httpx.ASGITransport(app=edge, client=(client, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        return await http.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]


# -- the failure table, time passed in


def test_the_nth_failure_within_the_window_locks_the_key_for_the_lockout() -> None:
    table = FailureTable(AuthLimits(max_failures=3, window_s=60, lockout_s=300))
    table.fail("k", 0)
    table.fail("k", 1)
    assert table.locked_for("k", 1.5) == 0
    table.fail("k", 2)
    assert table.locked_for("k", 3) == 299 and table.locked_for("other", 3) == 0
    assert table.locked_for("k", 301.9) == pytest.approx(0.1) and table.locked_for("k", 302) == 0
    assert len(table) == 0  # forgotten once neither locked nor counting


def test_failures_further_apart_than_the_window_never_lock() -> None:
    table = FailureTable(AuthLimits(max_failures=3, window_s=60, lockout_s=300))
    for at in range(0, 600, 31):  # two in any window, never three
        table.fail("k", at)
        assert table.locked_for("k", at) == 0, at


def test_a_flood_of_distinct_keys_keeps_the_table_bounded_and_the_recent_ones() -> None:
    table = FailureTable(AuthLimits(max_failures=2, window_s=60, lockout_s=300, tracked=1000))
    for n in range(100_000):
        table.fail(f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}", n * 1e-4)
    assert len(table) == 1000
    table.fail("10.1.134.159", 10.0)  # the last one seen, failing again: locked
    assert table.locked_for("10.1.134.159", 10.0) > 0


@pytest.mark.parametrize(("host", "key"), [("192.0.2.7", "192.0.2.7"), ("2001:db8:1:2:aa::1", "2001:db8:1:2::/64"),
                                           ("::ffff:192.0.2.7", "192.0.2.7"), ("testclient", "testclient")],
                         ids=["ipv4", "ipv6-by-its-64", "ipv4-mapped", "not-an-address"])  # fmt: skip
def test_a_client_is_its_address_and_an_ipv6_client_its_64(host: str, key: str) -> None:
    assert client_key({"client": (host, 1)}) == key


@pytest.mark.parametrize(("path", "query", "loc"), [
    ("/api/v1/jobs", b"state=%00", ["query", "state"]), ("/api/v1/jobs", b"state=run%0Aning", ["query", "state"]),
    ("/api/v1/jobs", b"vc=a&%01=x", ["query", "\\x01"]), ("/api/v1/jobs/a\x00b", b"", ["path"]),
    ("/api/v1/jobs", b"state=%7F", ["query", "state"]), ("/api/v1/jobs", b"state=%C2%85", ["query", "state"]),
], ids=["nul", "newline", "in-a-name", "nul-in-path", "del", "c1-next-line"])  # fmt: skip
def test_control_characters_in_parameters_are_named(path: str, query: bytes, loc: list[str]) -> None:
    errors = control_characters({"path": path, "query_string": query})
    assert [e["loc"] for e in errors] == [loc] and "control character U+" in errors[0]["msg"]


def test_printable_parameters_pass() -> None:
    assert control_characters({"path": "/api/v1/jobs/é-1", "query_string": b"state=running&vc=vc%20a&after=x%2Fy"}) == []


# -- the middleware, through the ASGI app


async def test_a_client_that_fails_too_often_gets_429_with_retry_after_even_with_a_valid_token() -> None:
    clock = Clock()
    edge, _ = make_edge(EdgeLimits(AuthLimits(max_failures=3, window_s=60, lockout_s=120)), clock)
    for n in range(3):
        response = await call(edge, f"hmx_{n:08x}_guess")
        assert response.status_code == 401 and response.json()["detail"] == UNKNOWN
    for token in ("hmx_00000009_guess", GOOD, "garbage"):
        locked = await call(edge, token)
        assert locked.status_code == 429 and locked.headers["Retry-After"] == "120", locked.text
        assert "client 10.0.0.1 is locked out" in locked.json()["detail"]
    assert (await call(edge, GOOD, client="10.0.0.2")).status_code == 200  # another client is not locked
    assert (await call(edge, None, "GET", "/healthz")).status_code == 200  # nor anything outside /api/
    clock.now += 119.5
    assert (await call(edge, GOOD)).headers["Retry-After"] == "1"
    clock.now += 0.5
    assert (await call(edge, GOOD)).json()["principal"] == "acme:0000000a"


async def test_a_token_id_tried_from_many_clients_is_locked_for_all_of_them() -> None:
    clock = Clock()
    edge, _ = make_edge(EdgeLimits(AuthLimits(max_failures=3, window_s=60, lockout_s=60)), clock)
    for n in range(3):  # one wrong secret for token 0000000a from each of three clients
        assert (await call(edge, f"hmx_0000000a_wrong{n}", client=f"10.0.1.{n}")).status_code == 401
    locked = await call(edge, GOOD, client="10.0.1.9")
    assert locked.status_code == 429 and "token 0000000a is locked out" in locked.json()["detail"]
    assert (await call(edge, "hmx_0000000b_other", client="10.0.1.9")).status_code == 200  # another token, same client
    assert (await call(edge, GOOD, client="10.0.1.0")).status_code == 429


async def test_a_flood_of_refused_tokens_from_distinct_clients_keeps_both_tables_bounded() -> None:
    edge, _ = make_edge(EdgeLimits(AuthLimits(max_failures=5, tracked=64)))
    transport = httpx.ASGITransport(app=edge)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        for n in range(500):
            transport.client = (f"2001:db8:{n:x}::1", 1)  # a distinct /64 each time
            response = await http.get("/api/v1/things", headers={"Authorization": f"Bearer hmx_{n:08x}_guess"})
            assert response.status_code == 401
    assert len(edge.clients) == 64 and len(edge.token_ids) == 64


async def test_a_missing_token_is_401_and_is_not_counted_as_a_failure() -> None:
    edge, _ = make_edge(EdgeLimits(AuthLimits(max_failures=1)))
    for _ in range(3):
        response = await call(edge, None)
        assert response.status_code == 401 and "missing bearer token" in response.json()["detail"]
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert (await call(edge, GOOD)).status_code == 200


async def test_control_characters_in_a_filter_are_422_not_a_database_error() -> None:
    edge, _ = make_edge()
    response = await call(edge, GOOD, params={"state": "run\x00ning"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "state"] and "U+0000" in response.json()["detail"][0]["msg"]
    assert (await call(edge, GOOD, path="/api/v1/th%00ings")).status_code == 422
    assert (await call(edge, GOOD, params={"state": "running"})).json()["state"] == "running"


async def test_the_database_away_is_a_503_and_no_failure() -> None:
    edge, _ = make_edge(EdgeLimits(AuthLimits(max_failures=1)), outage=True)
    for _ in range(2):
        response = await call(edge, GOOD)
        assert response.status_code == 503 and "temporarily unavailable: OSError" in response.json()["detail"]
    assert len(edge.clients) == 0


async def test_a_body_over_the_limit_is_413_whether_declared_or_streamed() -> None:
    edge, seen = make_edge(EdgeLimits(max_body_bytes=1000))
    assert (await call(edge, GOOD, "POST", json={"data": "x" * 900})).json()["size"] == 900
    declared = await call(edge, GOOD, "POST", json={"data": "x" * 1000})
    assert declared.status_code == 413 and "limit of 1000" in declared.json()["detail"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as read
        yield b'{"data": "'
        for _ in range(20):
            yield b"x" * 100
        yield b'"}'

    streamed = await call(edge, GOOD, "POST", content=chunks())
    assert streamed.status_code == 413 and streamed.headers["Connection"] == "close"
    assert seen == [900]


# -- before the body is read: a real server, a client that sends headers and waits


@contextlib.asynccontextmanager
async def served(edge: Edge) -> AsyncIterator[int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(edge, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="off"))
    serving = asyncio.create_task(server.serve())
    try:

        async def started() -> bool:
            return server.started

        await eventually(started, timeout_s=10, every_s=0.02)
        yield port
    finally:
        server.should_exit = True
        await serving


async def test_before_the_body_a_missing_token_is_401_and_a_declared_50_mb_body_is_413() -> None:
    edge, seen = make_edge()
    async with served(edge) as port:
        head = {"Content-Type": "application/json", "Content-Length": str(50 * 1024 * 1024)}
        nobody = await RawRequest("127.0.0.1", port).start("POST", "/api/v1/things", head)
        try:
            answer = await nobody.answer()  # no byte of the body was sent
            assert answer.status == 401 and b"missing bearer token" in answer.body
        finally:
            await nobody.close()
        big = await RawRequest("127.0.0.1", port).start("POST", "/api/v1/things", {**head, "Authorization": f"Bearer {GOOD}"})
        try:
            answer = await big.answer()
            assert answer.status == 413 and answer.headers["connection"] == "close"
        finally:
            await big.close()
    assert seen == []


async def test_a_chunked_body_is_answered_413_as_soon_as_it_passes_the_limit() -> None:
    limit = 64 * 1024
    edge, seen = make_edge(EdgeLimits(max_body_bytes=limit))
    async with served(edge) as port:
        head = {"Content-Type": "application/json", "Transfer-Encoding": "chunked", "Authorization": f"Bearer {GOOD}"}
        request = await RawRequest("127.0.0.1", port).start("POST", "/api/v1/things", head)
        try:
            await request.chunk(b'{"data": "')
            while request.sent <= limit:
                await request.chunk(b"x" * 8192)
            answer = await request.answer()  # the body is not finished: the server stopped at the limit
            assert answer.status == 413, answer
            assert request.sent <= limit + 8192 + 10
        finally:
            await request.close()
    assert seen == []
