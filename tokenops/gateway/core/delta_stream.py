"""A started stream of backend deltas, what the gateway keeps of a stream as it passes through
(:class:`StreamAssembly`), a complete answer replayed as deltas, and the small helpers the
pipeline's streaming uses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from tokenops.backends.base import Delta, merge_tool_calls
from tokenops.gateway.core.confidence import token_logprobs
from tokenops.gateway.observability.records import RequestRecord
from tokenops.types import GatewayResponse

#: Inter-token latencies kept per request (a long answer keeps its first ones).
MAX_ITL_PER_REQUEST = 4096


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


async def first_delta(deltas: AsyncIterator[Delta]) -> tuple[AsyncIterator[Delta], Delta | None]:
    """A backend stream opened up to its first delta (None: it ended at once); closed on failure."""
    it = deltas.__aiter__()
    try:
        return it, await it.__anext__()
    except StopAsyncIteration:
        return it, None
    except BaseException:
        await aclose_quietly(it)
        raise


def is_cancel(e: BaseException) -> bool:
    return isinstance(e, (asyncio.CancelledError, GeneratorExit))


async def aclose_quietly(it: Any) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            pass


class StreamAssembly:
    """What the gateway keeps of a stream while it passes to the client: the record's token
    counts and timings (first token, inter-token latencies, queue and prefill), and choice 0's
    answer (text, token logprobs, tool calls, refusal) for validators and caches."""

    def __init__(self, rec: RequestRecord, hide_logprobs: bool = False) -> None:
        self.rec = rec
        #: a plugin asked for logprobs the client did not: kept here, removed from the deltas
        self.hide_logprobs = hide_logprobs
        self.texts: dict[int, list[str]] = {}
        self.logprobs: list[float] = []
        self.finish: dict[int, str] = {}
        self.calls: dict[int, dict[str, Any]] = {}
        self.refusal: list[str] = []
        self.last_at: float | None = None

    def add(self, delta: Delta) -> None:
        """Count ``delta`` (before it goes to the client: it may lose the logprobs it carried)."""
        if delta.is_usage:
            self._usage(delta)
            return
        rec = self.rec
        if delta.num_tokens:
            now = time.perf_counter()
            if rec.first_token_at is None:
                rec.first_token_at = now
            elif self.last_at is not None and len(rec.itl) < MAX_ITL_PER_REQUEST:
                rec.itl.extend([(now - self.last_at) / delta.num_tokens] * delta.num_tokens)
            self.last_at = now
            rec.tokens_out += delta.num_tokens
        self.texts.setdefault(delta.index, []).append(delta.text)
        if delta.index == 0 and delta.tool_calls:
            merge_tool_calls(self.calls, delta.tool_calls)
        if delta.index == 0 and delta.refusal:
            self.refusal.append(delta.refusal)
        if delta.finish_reason:
            self.finish[delta.index] = delta.finish_reason
        if delta.logprobs:
            if delta.index == 0:
                self.logprobs.extend(token_logprobs(delta.logprobs) or ())
            if self.hide_logprobs:
                delta.logprobs = None

    def _usage(self, delta: Delta) -> None:
        rec = self.rec
        rec.tokens_in = delta.prompt_tokens or 0
        rec.tokens_cached = delta.cached_tokens or 0
        rec.queue_s, rec.prefill_s = delta.queue_s, delta.prefill_s
        if delta.reasoning_tokens is not None:
            rec.reasoning_tokens = delta.reasoning_tokens
        if delta.completion_tokens is not None:
            rec.tokens_out = delta.completion_tokens

    def response(self, model: str, backend: str) -> GatewayResponse:
        """Choice 0 as a whole answer (the record's finish reason must be set)."""
        rec = self.rec
        return GatewayResponse(
            text="".join(self.texts.get(0, [])),
            model=model,
            finish_reason=rec.finish_reason,
            prompt_tokens=rec.tokens_in,
            completion_tokens=rec.tokens_out,
            cached_tokens=rec.tokens_cached,
            backend=backend,
            token_logprobs=self.logprobs or None,
            tool_calls=[self.calls[k] for k in sorted(self.calls)] or None,
            refusal="".join(self.refusal) if self.refusal else None,
        )


async def replay_deltas(response: GatewayResponse) -> AsyncIterator[Delta]:
    """An answer that is already complete (cache hit, cascade, ensemble) as the deltas of a stream."""
    choices = response.extra.get("choices") or [
        {
            "index": 0,
            "text": response.text,
            "finish_reason": response.finish_reason,
            "logprobs": None,
            "tool_calls": response.tool_calls,
            "refusal": response.refusal,
        }
    ]
    for c in choices:
        calls = [{"index": k, **call} for k, call in enumerate(c.get("tool_calls") or [])]
        yield Delta(
            index=c["index"],
            text=c["text"],
            num_tokens=0,
            logprobs=c.get("logprobs"),
            tool_calls=calls or None,
            refusal=c.get("refusal"),
            extra=c.get("message_extra"),
        )
        yield Delta(index=c["index"], finish_reason=c.get("finish_reason") or "stop")
    yield Delta(
        prompt_tokens=response.prompt_tokens,
        completion_tokens=response.completion_tokens,
        cached_tokens=response.cached_tokens,
        reasoning_tokens=response.reasoning_tokens,
    )
