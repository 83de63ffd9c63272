"""A client that leaves cancels its request, on every route, streamed or not.

A stream notices at its next write (:class:`tokenops.gateway.edge.event_stream.EventStream` closes the
delta stream, which aborts the engine request). A whole answer writes nothing until it is done,
so :func:`unless_abandoned` runs the pipeline call as a task beside a watch on the ASGI
``receive`` channel: once the request body is read, the server's next message is
``http.disconnect``, and it arrives when the client goes. The call is then cancelled: the
backend's stream is closed (the engine ``abort``\\s the request and frees its KV blocks before its
next step), the slot is given back and the record is finished as 499 (``disconnected``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from tokenops.errors import APIError

T = TypeVar("T")

#: Pause after a message that is not a disconnect (a server that answers ``receive`` at once
#: with something else must not make the watch spin).
_POLL_S = 0.05


class ClientGone(APIError):
    """The client disconnected before the answer was ready (nobody reads this response)."""

    def __init__(self) -> None:
        super().__init__(499, "The client disconnected before the answer was ready.", code="client_disconnected")


async def disconnected(receive: Callable[[], Awaitable[Mapping[str, Any]]]) -> None:
    """Returns once ``receive`` says the client is gone (call it after the body was read)."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return
        await asyncio.sleep(_POLL_S)


async def unless_abandoned(receive: Callable[[], Awaitable[Mapping[str, Any]]], work: Awaitable[T]) -> T:
    """``await work``, cancelled if the client disconnects first (then :class:`ClientGone` is raised).

    :param receive: the request's ASGI ``receive`` (``request.receive``), its body already read.
    """
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected(receive))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and watch.done() and not watch.cancelled() and watch.exception() is not None:
            await asyncio.shield(task)  # the watch itself failed: the work goes on unwatched
    except BaseException:  # this handler was cancelled (a shutdown past its drain deadline)
        await _cancel(task)
        raise
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    await _cancel(task)
    raise ClientGone()


async def _cancel(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until its cleanup (abort, record, slot) has run."""
    task.cancel()
    await asyncio.wait((task,))  # returns when the task ended, without raising what it raised
    if not task.cancelled():
        task.exception()  # retrieved: an error raised while cancelling is not "never retrieved"
