"""The request pipeline: every step is a hook call (through :mod:`tokenops.gateway.core.hooks`): admit ->
cache lookup -> route -> select replica -> backend call (fallback on BackendError) -> validate ->
backend outcome -> cache store -> record. Non-streamed requests go through :meth:`Pipeline.respond`;
streamed ones through :meth:`Pipeline.open_stream`, which runs every step up to the backend's first
delta before anything is sent, so errors up to that point keep their HTTP status. What the gateway
keeps of a stream as it passes (tokens, timings, choice 0's answer) is in :mod:`.delta_stream`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

from tokenops.backends.base import Delta, Replica
from tokenops.gateway.core import confidence, hooks
from tokenops.gateway.core.admission import AdmissionControl, QueueLimits, Ticket
from tokenops.gateway.core.decision_headers import decision_headers
from tokenops.gateway.core.delta_stream import (
    DeltaStream,
    StreamAssembly,
    aclose_quietly,
    first_delta,
    is_cancel,
    replay_deltas,
)
from tokenops.gateway.core.multi_model import run_cascade, run_ensemble
from tokenops.gateway.core.pipeline_steps import OFF_LOOP_PROMPT_CHARS, PipelineSteps
from tokenops.gateway.errors import APIError, api_error
from tokenops.gateway.observability.records import RequestRecord
from tokenops.types import BackendError, BackendOutcome, GatewayRequest, GatewayResponse, RouteDecision

__all__ = ["OFF_LOOP_PROMPT_CHARS", "Pipeline"]


class Pipeline(PipelineSteps):
    """Runs requests through the steps (:class:`PipelineSteps`) against the configured replicas:
    a whole answer (:meth:`respond`) or a stream (:meth:`open_stream`). Past the routing step a
    request holds one of its model's slots (:mod:`.admission`) until its backend is done with it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the bounded, tenant-fair queue in front of each model (the gateway passes its live limits)
        self.admission = AdmissionControl(self.num_slots)
        #: the tasks running a whole answer or a stream's start, which a drain cuts at its deadline
        self.live: set[asyncio.Task[Any]] = set()
        self.is_cut = False

    def cut(self) -> None:
        """The drain's deadline: every whole answer (and stream start) still running is cancelled
        and answered 503 ``shutting_down`` (streams already sending are left to the server)."""
        self.is_cut = True
        for task in list(self.live):
            task.cancel()

    @contextlib.contextmanager
    def _cuttable(self) -> Iterator[None]:
        task = asyncio.current_task()
        if task is not None:
            self.live.add(task)
        try:
            yield
        except asyncio.CancelledError:
            if not self.is_cut:
                raise
            raise APIError(
                503, "The server shut down before the answer was ready; retry.", code="shutting_down"
            ) from None
        finally:
            self.live.discard(task)

    def num_slots(self, model: str, limits: QueueLimits) -> int:
        """Requests ``model``'s replicas run at once: a bundled engine's ``max_num_seqs``, else the
        ``[gateway] upstream_max_running`` of each upstream replica."""
        total = 0
        for replica in self.replicas.get(model, ()):
            slots = getattr(replica.backend, "num_slots", None)
            total += slots if isinstance(slots, int) and slots > 0 else limits.upstream_max_running
        return max(1, total)

    async def answer(self, request: GatewayRequest, rec: RequestRecord, decision: RouteDecision) -> GatewayResponse:
        """The routed answer: one model, a cascade (``escalate_to``) or an ensemble (``members``)."""
        if decision.members:
            return await run_ensemble(self, request, rec, decision)
        wants = confidence.needs_confidence(decision) or hooks.wants_logprobs(request, decision.model)
        is_stripped = wants and confidence.request_logprobs(request)
        response, score = await self.call_model(request, rec, decision.model)
        if decision.escalate_to and decision.min_score is not None:
            response = await run_cascade(self, request, rec, decision, response, score)
        if is_stripped:
            confidence.strip_logprobs(request, response)
        return response

    # -- non-streamed -----------------------------------------------------

    async def respond(self, request: GatewayRequest) -> tuple[GatewayResponse, RequestRecord]:
        rec = self.new_record(request)
        self.retry_budget.on_request()
        with self.tracked(rec), self._cuttable():
            response = await self._admit_and_lookup(request, rec)
            if response is None:
                decision = await self._decide(request, rec)
                async with self.admission.slot(request, decision.model):
                    await self._fit_context(request, decision)
                    response = await self.answer(request, rec, decision)
            else:
                self._account(rec, "", response)
            rec.finish_reason = response.finish_reason
            if rec.first_token_at is None:
                rec.first_token_at = time.perf_counter()
            self.finish(rec, 200)
            self.show_decisions(request, rec)
            return response, rec

    def show_decisions(self, request: GatewayRequest, rec: RequestRecord, *, with_cost: bool = True) -> None:
        """Add the ``x-tokenops-*`` headers to the client's response (every endpoint calls this)."""
        if self.decision_headers:
            request.response_headers.update(decision_headers(rec, with_cost=with_cost))

    # -- streamed ---------------------------------------------------------

    async def open_stream(self, request: GatewayRequest) -> tuple[DeltaStream, RequestRecord]:
        """Everything up to the first delta; the returned iterator yields all deltas
        and finishes the record when it ends (or is closed)."""
        rec = self.new_record(request)
        self.retry_budget.on_request()
        hold = contextlib.ExitStack()  # counted in flight until the stream ends: the deltas close it
        hold.enter_context(self.counted())
        with self._finish_on_failure(rec, hold), self._cuttable():
            cached = await self._admit_and_lookup(request, rec)
            if cached is not None:
                self._account(rec, "", cached)
                self.show_decisions(request, rec)
                return await DeltaStream.start(self._replay(rec, cached, hold)), rec
            decision = await self._decide(request, rec)
            ticket = await self.admission.enter(request, decision.model)  # held until the stream ends
            try:
                await self._fit_context(request, decision)
                if decision.members or decision.escalate_to:  # needs whole answers: run, then replay
                    try:
                        response = await self.answer(request, rec, decision)
                    finally:
                        ticket.release()
                    self.show_decisions(request, rec)
                    return await DeltaStream.start(self._replay(rec, response, hold)), rec

                def step(r: Replica) -> Awaitable[tuple[AsyncIterator[Delta], Delta | None]]:
                    return first_delta(r.backend.stream(request))

                # a plugin (distill capture) wants choice 0's logprobs: asked for, hidden from a client that did not ask
                hide_logprobs = hooks.wants_logprobs(request, decision.model) and confidence.request_logprobs(request)
                replica, (it, first), t0 = await self._call(request, rec, decision.model, step)
            except BaseException:
                ticket.release()
                raise
        hold.enter_context(replica.busy())
        self.show_decisions(request, rec, with_cost=False)  # a stream's cost is known at its end (final chunk)
        deltas = self._deltas(request, rec, replica, it, first, t0, hold, hide_logprobs, ticket)
        return await DeltaStream.start(deltas), rec

    async def _deltas(
        self,
        request: GatewayRequest,
        rec: RequestRecord,
        replica: Replica,
        it: AsyncIterator[Delta],
        first: Delta | None,
        t0: float,
        hold: contextlib.ExitStack,
        hide_logprobs: bool = False,
        ticket: Ticket | None = None,
    ) -> AsyncIterator[Delta]:
        assembly = StreamAssembly(rec, hide_logprobs)
        status, error, error_kind = 200, None, None
        try:
            delta = first
            while delta is not None:
                assembly.add(delta)
                yield delta
                delta = await it.__anext__()
        except StopAsyncIteration:
            pass
        except BackendError as e:
            err = api_error(e, request.kind)
            status, error, error_kind = err.status, str(e), err.code
            raise err from None
        except BaseException as e:
            status, error = (499, "client disconnected") if is_cancel(e) else (500, f"{type(e).__name__}: {e}")
            raise
        finally:
            await aclose_quietly(it)
            if ticket is not None:
                ticket.release()
            hold.close()  # the replica's and the pipeline's counts in flight
            rec.finish_reason = assembly.finish.get(0)
            await self._stream_ended(request, rec, replica, assembly, t0, status, error, error_kind)

    async def _stream_ended(
        self,
        request: GatewayRequest,
        rec: RequestRecord,
        replica: Replica,
        assembly: StreamAssembly,
        t0: float,
        status: int,
        error: str | None,
        error_kind: str | None,
    ) -> None:
        """After a backend stream: validate, report and offer to caches the answer, then finish the record."""
        if status == 200:
            response = assembly.response(rec.model_served or request.model, replica.name)
            rec.cost_usd += self.cost(replica.model, rec.tokens_in, rec.tokens_out)
            try:  # may wait for a worker thread (@may_block validators, caches): the record is finished regardless
                await self._after(request, replica, response, t0)
            finally:
                self.finish(rec, status, error, error_kind)
        else:
            # A client that went away is not the replica's failure (breakers must not count it).
            is_replica_ok = status == 499
            hooks.report_outcome(
                replica.name,
                BackendOutcome(
                    is_replica_ok, time.perf_counter() - t0, "client_disconnected" if is_replica_ok else "error"
                ),
            )
            self.finish(rec, status, error, error_kind)

    async def _replay(
        self, rec: RequestRecord, response: GatewayResponse, hold: contextlib.ExitStack
    ) -> AsyncIterator[Delta]:
        """Stream an answer that is already complete (cache hit, cascade, ensemble)."""
        try:
            rec.first_token_at = rec.first_token_at or time.perf_counter()
            rec.finish_reason = response.finish_reason
            async for delta in replay_deltas(response):
                yield delta
        finally:
            hold.close()
            self.finish(rec, 200)
