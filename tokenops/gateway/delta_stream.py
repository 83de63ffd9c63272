"""A started stream of backend deltas, and the small helpers the pipeline's streaming uses."""

from __future__ import annotations

import asyncio
from typing import Any

from tokenops.backends.base import Delta


class DeltaStream:
    """A started delta generator: its ``finally`` (abort the backend, finish the record)
    is armed, so ``aclose()`` cleans up even when nobody iterated (a client gone before
    the first byte). An unstarted async generator would skip its ``finally`` entirely."""

    def __init__(self, head: Delta | None, gen: Any) -> None:
        self._head = head
        self._gen = gen

    @classmethod
    async def start(cls, gen: Any) -> DeltaStream:
        try:
            return cls(await gen.__anext__(), gen)
        except StopAsyncIteration:
            return cls(None, None)

    def __aiter__(self) -> DeltaStream:
        return self

    async def __anext__(self) -> Delta:
        if self._head is not None:
            head, self._head = self._head, None
            return head
        if self._gen is None:
            raise StopAsyncIteration
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        self._head = None
        if self._gen is not None:
            await self._gen.aclose()


def is_cancel(e: BaseException) -> bool:
    return isinstance(e, (asyncio.CancelledError, GeneratorExit))


async def aclose_quietly(it: Any) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            pass
