"""Reading a server-sent event stream from an upstream, line by line as it arrives."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx


async def sse_data(response: httpx.Response) -> AsyncIterator[bytes]:
    """The ``data:`` lines of an event stream, as bytes, each as soon as it is complete."""
    buf = b""
    async for chunk in response.aiter_bytes():
        buf += chunk
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            line = buf[start:end]
            start = end + 1
            if line.startswith(b"data:"):
                yield line
        buf = buf[start:]
    if buf.startswith(b"data:"):
        yield buf
