"""PooledTransport: keep-alive reuse, chunked streaming, stale connections, timeouts, connect errors."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tokenops.backends.http_transport import PooledTransport


async def _server(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _read_request(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


async def test_keep_alive_reuses_one_connection_and_sends_the_body():
    seen = []

    async def handle(reader, writer):
        try:
            while True:
                head, body = await _read_request(reader)
                seen.append(body)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok")
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    server, port = await _server(handle)
    transport = PooledTransport()
    async with server, httpx.AsyncClient(transport=transport) as c:
        for i in range(5):
            r = await c.post(f"http://127.0.0.1:{port}/x", content=f"body{i}".encode())
            assert r.status_code == 200 and r.text == "ok" and r.headers["content-type"] == "text/plain"
    assert transport.num_opened == 1 and seen == [f"body{i}".encode() for i in range(5)]


async def test_chunked_body_streams_piece_by_piece():
    release = asyncio.Event()

    async def handle(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()

    server, port = await _server(handle)
    async with server, httpx.AsyncClient(transport=PooledTransport()) as c:
        async with c.stream("POST", f"http://127.0.0.1:{port}/s", content=b"{}") as r:
            it = r.aiter_raw()
            assert await it.__anext__() == b"first"  # arrives before the rest is even sent
            release.set()
            assert [x async for x in it] == [b"second"]


async def test_a_connection_closed_while_idle_is_retried_on_a_fresh_one():
    num_conns = 0

    async def handle(reader, writer):
        nonlocal num_conns
        num_conns += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n1")
        await writer.drain()
        writer.close()  # closes right after answering (idle close)

    server, port = await _server(handle)
    transport = PooledTransport()
    async with server, httpx.AsyncClient(transport=transport) as c:
        for _ in range(3):
            assert (await c.post(f"http://127.0.0.1:{port}/", content=b"x")).text == "1"
            await asyncio.sleep(0.05)
    assert num_conns == 3


async def test_read_timeout_and_connect_error_are_httpx_errors():
    async def handle(reader, writer):
        await _read_request(reader)
        await asyncio.sleep(5)

    server, port = await _server(handle)
    async with server, httpx.AsyncClient(transport=PooledTransport()) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(f"http://127.0.0.1:{port}/", content=b"x", timeout=httpx.Timeout(5.0, read=0.2))
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    async with httpx.AsyncClient(transport=PooledTransport()) as c:
        with pytest.raises(httpx.ConnectError):
            await c.post(f"http://127.0.0.1:{dead}/", content=b"x")
