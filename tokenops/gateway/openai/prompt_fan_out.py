"""A ``/v1/completions`` body with a list of prompts, answered as OpenAI answers it: each prompt
runs as a request of its own through the pipeline (admission, routing, cache, telemetry per
prompt; the engine batches them), and the answers come back as one, prompt ``i``'s choice ``j``
at ``index`` ``i * n + j``, usage summed. Streams are merged as their deltas arrive.

:class:`PromptFanOut` has the two methods of the pipeline the route calls (``respond`` and
``open_stream``), so the route runs one prompt or several the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from tokenops.backends.base import Delta
from tokenops.types import GatewayRequest, GatewayResponse


def _choices(response: GatewayResponse) -> list[dict[str, Any]]:
    return response.extra.get("choices") or [
        {
            "index": 0,
            "text": response.text,
            "finish_reason": response.finish_reason,
            "logprobs": None,
        }
    ]


class PromptFanOut:
    """The requests of one body's prompts (the first is the one the answer is named after)."""

    def __init__(self, pipeline: Any, requests: list[GatewayRequest]) -> None:
        assert requests
        self.pipeline = pipeline
        self.requests = requests
        self.decision_headers = pipeline.decision_headers
        self._n = requests[0].sampling.n or 1

    async def respond(self, request: GatewayRequest) -> tuple[GatewayResponse, Any]:
        assert request is self.requests[0]
        answers = await _all([self.pipeline.respond(r) for r in self.requests])
        first, rec = answers[0]
        choices = [
            {**c, "index": i * self._n + c["index"]} for i, (answer, _) in enumerate(answers) for c in _choices(answer)
        ]
        merged = GatewayResponse(
            text=first.text,
            model=first.model,
            finish_reason=first.finish_reason,
            prompt_tokens=sum(a.prompt_tokens for a, _ in answers),
            completion_tokens=sum(a.completion_tokens for a, _ in answers),
            cached_tokens=sum(a.cached_tokens for a, _ in answers),
            backend=first.backend,
            extra={**first.extra, "choices": choices},
        )
        return merged, rec

    async def open_stream(self, request: GatewayRequest) -> tuple[AsyncIterator[Delta], Any]:
        assert request is self.requests[0]
        opened = await _all(
            [self.pipeline.open_stream(r) for r in self.requests],
            cleanup=lambda pair: pair[0].aclose(),  # an opened stream's engine request is aborted
        )
        return merged_deltas([d for d, _ in opened], self._n), opened[0][1]


async def _all(calls: list[Any], cleanup: Any = None) -> list[Any]:
    """The results of ``calls`` run together; on the first failure the others are cancelled (and
    ``cleanup`` run on those that finished) and that failure is raised as it was."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:
            if cleanup is not None and t.done() and not t.cancelled() and t.exception() is None:
                with contextlib.suppress(Exception):
                    await cleanup(t.result())
        raise


async def merged_deltas(streams: list[AsyncIterator[Delta]], n: int) -> AsyncIterator[Delta]:
    """The deltas of every stream as they come (stream ``i``'s choice ``j`` as ``i * n + j``), then
    one usage delta summing theirs. Closing it closes them all; an error in one ends it."""
    queue: asyncio.Queue[tuple[int, Delta | None, Exception | None]] = asyncio.Queue()

    async def pump(i: int, deltas: AsyncIterator[Delta]) -> None:
        try:
            async for d in deltas:
                await queue.put((i, d, None))
        except Exception as e:  # handed to the reader, which raises it to the client's stream
            await queue.put((i, None, e))
            return
        await queue.put((i, None, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    usage = Delta(prompt_tokens=0, completion_tokens=0, cached_tokens=0)
    try:
        left = len(tasks)
        while left:
            i, d, err = await queue.get()
            if err is not None:
                raise err
            if d is None:
                left -= 1
            elif d.is_usage:
                usage.prompt_tokens = (usage.prompt_tokens or 0) + (d.prompt_tokens or 0)
                usage.completion_tokens = (usage.completion_tokens or 0) + (d.completion_tokens or 0)
                usage.cached_tokens = (usage.cached_tokens or 0) + (d.cached_tokens or 0)
            else:
                d.index = i * n + d.index
                yield d
        yield usage
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in streams:
            with contextlib.suppress(Exception):
                await s.aclose()  # type: ignore[attr-defined]
