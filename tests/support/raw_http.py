"""HTTP/1.1 at the socket, for what an HTTP client library hides: a request whose headers are
sent and whose body is not (or only partly, chunk by chunk), to see what the server answers
before it has the body."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class Head:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


class RawRequest:
    """One connection: `start` sends the request line and headers, `chunk` a chunked-body piece,
    `answer` reads the response (bounded wait)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port, self.sent = host, port, 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def start(self, method: str, path: str, headers: dict[str, str]) -> RawRequest:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", *(f"{k}: {v}" for k, v in headers.items())]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await self._writer.drain()
        return self

    async def chunk(self, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await self._writer.drain()
        self.sent += len(data)

    async def answer(self, timeout_s: float = 10.0) -> Head:
        assert self._reader is not None
        head = await asyncio.wait_for(self._reader.readuntil(b"\r\n\r\n"), timeout_s)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(self._reader.readexactly(length), timeout_s) if length else b""
        return Head(int(status_line.split()[1]), headers, body)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (ConnectionError, OSError):
                pass
