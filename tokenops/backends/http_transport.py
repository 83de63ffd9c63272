"""A lean HTTP/1.1 keep-alive transport for the ``openai`` backend's ``httpx.AsyncClient``.

httpcore's pool re-checks every pooled connection on every request (O(connections)
per request, socket probes included), which dominated the gateway's CPU under
concurrency. This transport keeps a LIFO stack of idle connections per host,
parses responses with ``httptools`` and streams bodies as they arrive. It speaks
plain ``http://`` only; ``https://`` goes to httpx's default transport.

Errors are httpx's own (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``,
``RemoteProtocolError``), so callers handle both transports alike. A request on
a reused connection that the server closed while idle is retried once on a fresh one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

import httptools
import httpx

_READ = 65536


class _Connection:
    """One TCP connection; parses one response at a time."""

    __slots__ = (
        "reader",
        "writer",
        "key",
        "status",
        "headers",
        "chunks",
        "is_head_done",
        "is_done",
        "is_keep_alive",
        "_parser",
    )

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: tuple) -> None:
        self.reader, self.writer, self.key = reader, writer, key
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.is_head_done = False
        self.is_done = False
        self.is_keep_alive = True
        self._parser = httptools.HttpResponseParser(self)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.is_keep_alive = self._parser.should_keep_alive()
        self.is_head_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(bytes(body))

    def on_message_complete(self) -> None:
        self.is_done = True

    async def feed(self, timeout: float | None) -> bool:
        """Read once and parse; False at end of stream."""
        try:
            if timeout is None:
                data = await self.reader.read(_READ)
            else:
                async with asyncio.timeout(timeout):
                    data = await self.reader.read(_READ)
        except TimeoutError:
            raise httpx.ReadTimeout("upstream read timed out") from None
        except OSError as e:
            raise httpx.ReadError(str(e)) from None
        if not data:
            try:
                self._parser.feed_data(b"")  # ends bodies delimited by connection close
            except httptools.HttpParserError:
                pass
            return False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise httpx.RemoteProtocolError("upstream asked for a protocol upgrade") from None
        except httptools.HttpParserError as e:
            raise httpx.RemoteProtocolError(f"malformed upstream response: {e}") from None
        return True

    def close(self) -> None:
        self.writer.close()


class _Body(httpx.AsyncByteStream):
    """The response body as it arrives; hands the connection back when complete."""

    def __init__(self, transport: PooledTransport, conn: _Connection, timeout: float | None) -> None:
        self.transport, self.conn, self.timeout = transport, conn, timeout
        self.is_closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self.conn
        while True:
            while conn.chunks:
                yield conn.chunks.popleft()
            if conn.is_done:
                break
            if not await conn.feed(self.timeout) and not conn.is_done and not conn.chunks:
                conn.is_keep_alive = False
                if _header(conn.headers, b"content-length") or _header(conn.headers, b"transfer-encoding"):
                    raise httpx.RemoteProtocolError("upstream closed the connection mid-body")
                break
        await self.aclose()

    async def aclose(self) -> None:
        if self.is_closed:
            return
        self.is_closed = True
        conn = self.conn
        if conn.is_done and conn.is_keep_alive and not conn.chunks:
            self.transport._release(conn)
        else:
            conn.close()


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


class PooledTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 for ``http://`` upstreams; ``https://`` via httpx's transport."""

    def __init__(self, max_idle_per_host: int = 512, tls: httpx.AsyncBaseTransport | None = None) -> None:
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple, list[_Connection]] = {}
        self._tls = tls
        self.num_opened = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            if self._tls is None:
                self._tls = httpx.AsyncHTTPTransport()
            return await self._tls.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        key = (url.host, url.port or 80)
        head = self._head(request)
        body = await request.aread()
        for attempt in range(2):
            conn, is_reused = await self._acquire(key, timeouts.get("connect"))
            try:
                conn.writer.write(head + body)
                while not conn.is_head_done:
                    if not await conn.feed(timeouts.get("read")):
                        raise httpx.RemoteProtocolError("upstream closed the connection without a response")
            except (httpx.RemoteProtocolError, httpx.ReadError):
                conn.close()
                if is_reused and attempt == 0:
                    continue  # the server closed it while idle: retry once on a fresh connection
                raise
            except BaseException:
                conn.close()
                raise
            return httpx.Response(
                conn.status,
                headers=conn.headers,
                stream=_Body(self, conn, timeouts.get("read")),
                extensions={"http_version": b"HTTP/1.1"},
            )
        raise AssertionError("unreachable")

    @staticmethod
    def _head(request: httpx.Request) -> bytes:
        url = request.url
        target = url.raw_path or b"/"
        lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
        has_length = False
        for name, value in request.headers.raw:
            low = name.lower()
            if low in (b"connection", b"transfer-encoding"):
                continue
            has_length |= low == b"content-length"
            lines.append(name + b": " + value)
        if not has_length:
            lines.append(b"content-length: " + str(len(request.content)).encode())
        lines.append(b"connection: keep-alive")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _acquire(self, key: tuple, timeout: float | None) -> tuple[_Connection, bool]:
        stack = self._idle.get(key)
        while stack:
            conn = stack.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                conn._reset()
                return conn, True
            conn.close()
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(key[0], key[1])
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} timed out") from None
        except OSError as e:
            raise httpx.ConnectError(f"cannot connect to {key[0]}:{key[1]}: {e}") from None
        self.num_opened += 1
        return _Connection(reader, writer, key), False

    def _release(self, conn: _Connection) -> None:
        stack = self._idle.setdefault(conn.key, [])
        if len(stack) < self.max_idle_per_host:
            stack.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        for stack in self._idle.values():
            for conn in stack:
                conn.close()
        self._idle.clear()
        if self._tls is not None:
            await self._tls.aclose()
