"""A lean pooled HTTP/1.1 client (asyncio protocol + httptools) for the one upstream the proxy talks to.

In a profile under load aiohttp's client took about 40% of the proxy's CPU per call; this client sends a request
as one prebuilt head plus the body and parses the reply with httptools (the parser uvicorn already uses).
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from typing import Any, Optional
from urllib.parse import urlsplit

import httptools


class Reply:
    """A complete response: status, lower-cased headers and the (decompressed) body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.open = False
        self._waiter: Optional[asyncio.Future[Reply]] = None
        self._parser: Any = None
        self._chunks: list[bytes] = []
        self._headers: dict[str, str] = {}
        self.received = False

    def connection_made(self, transport: Any) -> None:
        self.transport, self.open = transport, True

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.open = False
        if self._waiter is not None and not self._waiter.done():
            if self._parser is not None and self._reads_to_eof():
                self._finish()
            else:
                self._waiter.set_exception(ConnectionResetError(f"the upstream closed the connection: {exc or 'EOF'}"))

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost settles a pending request

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self._parser is None:
            return  # bytes nobody asked for: the connection is not reused (see request)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(ConnectionError(f"the upstream's reply is not valid HTTP: {e}"))
            self.close()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        self._finish()

    def _reads_to_eof(self) -> bool:
        """A reply without Content-Length or chunked encoding ends when the server closes the connection."""
        return (self._parser.get_status_code() > 0 and "content-length" not in self._headers
                and "chunked" not in self._headers.get("transfer-encoding", ""))

    def _finish(self) -> None:
        body = b"".join(self._chunks)
        keep = self.open and self._parser.should_keep_alive()
        reply = Reply(self._parser.get_status_code(), self._headers, body)
        self._parser = None
        if not keep:
            self.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(reply)

    async def request(self, head: bytes, body: bytes) -> Reply:
        self._waiter = asyncio.get_running_loop().create_future()
        self._chunks, self._headers, self.received = [], {}, False
        self._parser = httptools.HttpResponseParser(self)
        assert self.transport is not None
        self.transport.writelines((head, body)) if body else self.transport.write(head)
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Keep-alive connections to one server, reused most recent first; at most ``limit`` open at once."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float, connect_timeout_s: float = 10.0,
                 limit: int = 1024):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host, self.ssl = parts.hostname, ssl.create_default_context() if parts.scheme == "https" else None
        self.port = parts.port or (443 if self.ssl else 80)
        self.prefix = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = self.port == (443 if self.ssl else 80)
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in
                              {"host": host if default_port else f"{host}:{self.port}", "user-agent": "orchard-proxy",
                               **headers}.items())
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(limit)

    async def request(self, method: str, path: str, body: bytes = b"") -> Reply:
        """Send one request and return the whole reply; raises OSError (connection), TimeoutError."""
        head = (f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._fixed}content-length: {len(body)}\r\n\r\n").encode("latin-1")
        async with self._slots, asyncio.timeout(self.timeout_s):
            reply = await self._send(head, body)
        return _decoded(reply)

    async def _send(self, head: bytes, body: bytes) -> Reply:
        while self._idle:
            connection = self._idle.pop()
            if not connection.open:
                continue
            try:
                return await self._exchange(connection, head, body)
            except ConnectionResetError:
                if connection.received:
                    raise
                # a kept-alive connection the server had closed before it read anything: use a fresh one
        return await self._exchange(await self._connect(), head, body)

    async def _exchange(self, connection: _Connection, head: bytes, body: bytes) -> Reply:
        try:
            reply = await connection.request(head, body)
        except BaseException:
            connection.close()
            raise
        if connection.open:
            self._idle.append(connection)
        return reply

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, connection = await loop.create_connection(_Connection, self.host, self.port, ssl=self.ssl,
                                                         server_hostname=self.host if self.ssl else None)
        return connection

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


def _decoded(reply: Reply) -> Reply:
    """Undo a Content-Encoding the server applied although none was asked for (gzip or deflate)."""
    encoding = reply.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        try:
            reply.body = zlib.decompress(reply.body, 47 if encoding != "deflate" else zlib.MAX_WBITS)
        except zlib.error as e:
            raise ConnectionError(f"the upstream's {encoding} body does not decompress: {e}") from e
    return reply
