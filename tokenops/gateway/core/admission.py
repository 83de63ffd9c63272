"""Admission to a model's backends: a bounded queue per model, fair across tenants.

Each model has **slots**, the requests its replicas run at once: a bundled engine's
``max_num_seqs`` (live), ``[gateway] upstream_max_running`` per upstream replica. A request holds
a slot while its backend works on it (a stream: until it ends). Past the slots it waits here, in
the model's queue, bounded by ``[gateway] max_queued_requests`` and ``max_queued_tokens`` (prompt
tokens, estimated at four characters a token: the gateway does not tokenize). Past a bound the
request is refused at once with :class:`QueueFull`: a 429 with ``Retry-After`` (``/v1/messages``
answers it as Anthropic's 529 ``overloaded_error``: :func:`for_messages`).

Fair: free slots go round-robin across the tenants that wait (FIFO within a tenant), and a full
queue makes room for a tenant by refusing the newest waiting request of the tenant with the most
waiting, while that tenant has at least two more than the newcomer (longest queue drop). One
tenant alone may fill the queue; it cannot keep another tenant out of it.

Priority classes: ``interactive`` (every API request) is what the bounds are for; ``batch``
(reserved for batch work) never takes a slot or a queue place, so it never counts against
interactive bounds; its share of the engine is the batch runner's policy.

Why here and not in the engine's waiting queue: the bound must hold for upstream backends too,
and a refusal must come before any backend work (tokenizing, grammar compilation).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from tokenops.backends.prompt_bound import prompt_chars
from tokenops.errors import APIError
from tokenops.types import GatewayRequest

INTERACTIVE, BATCH = "interactive", "batch"
PRIORITY_CLASSES = (INTERACTIVE, BATCH)
_CHARS_PER_TOKEN = 4
_MAX_RETRY_AFTER_S = 60


@dataclass(slots=True, frozen=True)
class QueueLimits:
    """The bounds (``[gateway]`` settings, live tunables ``gateway.*``)."""

    max_queued_requests: int = 256
    max_queued_tokens: int = 262144
    upstream_max_running: int = 256

    @classmethod
    def current(cls, gateway_settings: Any, tunable_values: dict[str, Any]) -> QueueLimits:
        """The settings' values, overridden by live tunables patched since start."""

        def value(name: str) -> int:
            return int(tunable_values.get(f"gateway.{name}", getattr(gateway_settings, name)))

        return cls(value("max_queued_requests"), value("max_queued_tokens"), value("upstream_max_running"))


class QueueFull(APIError):
    """429 with Retry-After: the model's queue is at a bound."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(429, message, code="queue_full", headers={"retry-after": str(retry_after_s)})


def for_messages(err: APIError) -> APIError:
    """The error as ``/v1/messages`` answers it: a full queue is Anthropic's 529 ``overloaded_error``."""
    if isinstance(err, QueueFull):
        return APIError(529, err.message, code=err.code, headers=err.headers)
    return err


def estimated_tokens(request: GatewayRequest) -> int:
    if isinstance(request.prompt, list):
        return len(request.prompt)
    return prompt_chars(request) // _CHARS_PER_TOKEN + 1


@dataclass(eq=False, slots=True)
class _Waiter:
    tenant: str
    tokens: int
    future: asyncio.Future[None]


@dataclass(slots=True)
class ModelQueue:
    """One model's running count and waiting requests (per tenant, in arrival order)."""

    num_running: int = 0
    num_waiting_tokens: int = 0
    num_rejected: int = 0
    #: mean seconds a slot is held (exponentially weighted): what Retry-After is estimated from
    hold_s: float = 1.0
    waiting: OrderedDict[str, deque[_Waiter]] = field(default_factory=OrderedDict)

    @property
    def num_waiting(self) -> int:
        return sum(len(d) for d in self.waiting.values())

    def count(self, tenant: str) -> int:
        return len(self.waiting.get(tenant, ()))

    def push(self, waiter: _Waiter) -> None:
        self.waiting.setdefault(waiter.tenant, deque()).append(waiter)
        self.num_waiting_tokens += waiter.tokens

    def discard(self, waiter: _Waiter) -> None:
        waiting = self.waiting.get(waiter.tenant)
        if waiting is not None and waiter in waiting:
            waiting.remove(waiter)
            self.num_waiting_tokens -= waiter.tokens
            if not waiting:
                del self.waiting[waiter.tenant]

    def pop_next(self) -> _Waiter:
        """The oldest request of the tenant whose turn it is; that tenant goes to the back."""
        tenant, waiting = next(iter(self.waiting.items()))
        waiter = waiting.popleft()
        self.num_waiting_tokens -= waiter.tokens
        if waiting:
            self.waiting.move_to_end(tenant)
        else:
            del self.waiting[tenant]
        return waiter

    def pop_newest_of_longest(self, newcomer: str) -> _Waiter | None:
        """Longest queue drop: the newest request of the tenant with the most waiting, if it has
        at least two more than ``newcomer`` (else None: the newcomer is the one refused)."""
        if not self.waiting:
            return None
        tenant = max(self.waiting, key=lambda t: (len(self.waiting[t]), sum(w.tokens for w in self.waiting[t])))
        if tenant == newcomer or len(self.waiting[tenant]) < self.count(newcomer) + 2:
            return None
        waiter = self.waiting[tenant][-1]
        self.discard(waiter)
        return waiter


class Ticket:
    """A held slot (or none, for work outside the bounds); :meth:`release` is idempotent."""

    __slots__ = ("_admission", "_model", "_since")

    def __init__(self, admission: AdmissionControl | None, model: str) -> None:
        self._admission = admission
        self._model = model
        self._since = time.monotonic()

    def release(self) -> None:
        if self._admission is not None:
            admission, self._admission = self._admission, None
            admission.leave(self._model, time.monotonic() - self._since)


class AdmissionControl:
    """The queues of every model. ``slots_of(model)`` says how many requests its replicas run at once."""

    def __init__(
        self,
        slots_of: Callable[[str, QueueLimits], int],
        limits: Callable[[], QueueLimits] = QueueLimits,
    ) -> None:
        self.slots_of = slots_of
        self.limits = limits
        self.queues: dict[str, ModelQueue] = {}
        self.is_closed = False

    @asynccontextmanager
    async def slot(self, request: GatewayRequest, model: str) -> AsyncIterator[None]:
        ticket = await self.enter(request, model)
        try:
            yield
        finally:
            ticket.release()

    async def enter(self, request: GatewayRequest, model: str) -> Ticket:
        """A slot of ``model`` for ``request``: at once, after a wait in the queue, or
        :class:`QueueFull` (a refused request never waits)."""
        if request.priority_class != INTERACTIVE:
            return Ticket(None, model)
        q = self.queues.setdefault(model, ModelQueue())
        limits = self.limits()
        if not q.waiting and q.num_running < self.slots_of(model, limits):
            q.num_running += 1
            return Ticket(self, model)
        if self.is_closed:
            raise APIError(503, "The server is shutting down.", code="shutting_down")
        waiter = _Waiter(request.tenant, estimated_tokens(request), asyncio.get_running_loop().create_future())
        self._make_room(q, model, waiter, limits)
        q.push(waiter)
        try:
            await waiter.future
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self.leave(model, None)  # the slot came as the request was cancelled: pass it on
            q.discard(waiter)
            raise
        return Ticket(self, model)

    def _make_room(self, q: ModelQueue, model: str, newcomer: _Waiter, limits: QueueLimits) -> None:
        while q.num_waiting >= limits.max_queued_requests or (
            q.waiting and q.num_waiting_tokens + newcomer.tokens > limits.max_queued_tokens
        ):
            victim = q.pop_newest_of_longest(newcomer.tenant)
            if victim is None:
                q.num_rejected += 1
                raise self._full(q, model, limits)
            q.num_rejected += 1
            victim.future.set_exception(self._full(q, model, limits, "to make room for another tenant"))

    def _full(self, q: ModelQueue, model: str, limits: QueueLimits, why: str = "") -> QueueFull:
        slots = max(1, self.slots_of(model, limits))
        retry_after = min(_MAX_RETRY_AFTER_S, max(1, math.ceil(q.hold_s * (q.num_waiting + 1) / slots)))
        return QueueFull(
            f"The model `{model}` is at capacity{f' (refused {why})' if why else ''}: {q.num_running} "
            f"requests running and {q.num_waiting} ({q.num_waiting_tokens} prompt tokens) waiting, the bounds "
            f"being [gateway] max_queued_requests = {limits.max_queued_requests} and max_queued_tokens = "
            f"{limits.max_queued_tokens}; retry after {retry_after} s.",
            retry_after,
        )

    def leave(self, model: str, held_s: float | None) -> None:
        """A slot is free: the next waiting request (round-robin across tenants) takes it."""
        q = self.queues[model]
        q.num_running -= 1
        if held_s is not None:
            q.hold_s = 0.8 * q.hold_s + 0.2 * held_s
        slots = self.slots_of(model, self.limits())
        while q.waiting and q.num_running < slots:
            waiter = q.pop_next()
            if not waiter.future.done():  # a cancelled waiter leaves its place to the next
                q.num_running += 1
                waiter.future.set_result(None)

    def close(self) -> None:
        """Shutting down: every waiting request is refused (503); running ones finish."""
        self.is_closed = True
        for q in self.queues.values():
            while q.waiting:
                waiter = q.pop_next()
                if not waiter.future.done():
                    waiter.future.set_exception(APIError(503, "The server is shutting down.", code="shutting_down"))

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per model: running, waiting (requests, tokens), rejected so far, slots."""
        limits = self.limits()
        return {
            model: {
                "running": q.num_running,
                "waiting": q.num_waiting,
                "waiting_tokens": q.num_waiting_tokens,
                "rejected": q.num_rejected,
                "slots": self.slots_of(model, limits),
            }
            for model, q in self.queues.items()
        }
