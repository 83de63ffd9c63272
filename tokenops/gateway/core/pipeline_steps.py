"""The steps of the request pipeline (:class:`PipelineSteps`), each a hook call through
:mod:`tokenops.gateway.core.hooks`: admit -> cache lookup -> route -> select replica -> backend call
(retry on another replica, fallback to another model on BackendError) -> validate -> backend
outcome -> cache store, and the request's record. :mod:`tokenops.gateway.core.pipeline` runs them for
non-streamed and streamed requests; this module is what both share."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from tokenops.backends.base import Replica
from tokenops.backends.prompt_bound import prompt_chars
from tokenops.config import ModelConfig
from tokenops.gateway.core import confidence, hooks
from tokenops.gateway.core.delta_stream import is_cancel
from tokenops.gateway.errors import APIError, ModelNotFound, api_error
from tokenops.gateway.observability import tracing
from tokenops.gateway.observability.records import RequestRecord
from tokenops.gateway.openai.model_routes import model_failure
from tokenops.routing.retry import RetryBudget, is_retryable
from tokenops.types import BackendError, BackendOutcome, GatewayRequest, GatewayResponse, RouteDecision

#: Prompts longer than this are routed in a worker thread (see PipelineSteps._decide).
OFF_LOOP_PROMPT_CHARS = 64 * 1024


class PipelineSteps:
    """The steps one request goes through, each a hook call: its record, admission and cache
    lookup, routing, the replica, the backend call (with retries and fallbacks), validation and
    the cache store, and one model's whole answer (:meth:`call_model`, which cascades and
    ensembles call per model). :class:`tokenops.gateway.core.pipeline.Pipeline` runs them for a whole
    answer or a stream."""

    def __init__(
        self,
        replicas: dict[str, list[Replica]],
        models: dict[str, ModelConfig],
        on_finish: Callable[[RequestRecord], None],
        profiles: dict[str, Any] | None = None,
    ) -> None:
        self.replicas = replicas
        self.models = models
        self.on_finish = on_finish
        self.profiles = profiles or {}
        self.num_in_flight = 0
        self.retry_budget = RetryBudget()
        #: ``[gateway] decision_headers``: the x-tokenops-* response headers (tokenops.gateway.core.decision_headers)
        self.decision_headers = True
        #: ``[batches] discount``: the share of the price a batch line's tokens cost
        self.batch_discount = 1.0

    # -- records ----------------------------------------------------------

    def new_record(self, request: GatewayRequest) -> RequestRecord:
        rec = RequestRecord(
            id=request.id,
            kind=request.kind,
            tenant=request.tenant,
            api_key_id=request.api_key_id,
            model_requested=request.model,
            arrival=request.arrival,
            start=time.perf_counter(),
            is_stream=request.stream,
            decisions=request.decisions,
            priority_class=request.priority_class,
            batch_id=request.batch_id,
        )
        tracing.start_request(request, rec)
        return rec

    def finish(
        self, rec: RequestRecord, status: int | None = None, error: str | None = None, error_kind: str | None = None
    ) -> None:
        rec.finish(status, error, error_kind)
        if rec.priority_class == "batch":  # batch tokens are priced at [batches] discount
            rec.cost_usd *= self.batch_discount
        rec.is_escalated = bool(rec.decisions.get("escalated") or rec.decisions.get("fallbacks"))
        tracing.end_request(rec)
        self.on_finish(rec)

    # -- steps ------------------------------------------------------------

    @contextlib.contextmanager
    def counted(self) -> Iterator[None]:
        """The one place a request enters and leaves :attr:`num_in_flight` (a drain waits on it)."""
        self.num_in_flight += 1
        try:
            yield
        finally:
            self.num_in_flight -= 1

    @contextlib.contextmanager
    def tracked(self, rec: RequestRecord) -> Iterator[None]:
        """Counts a request in flight and finishes its record however the body ends
        (an OpenAI error keeps its status; a cancelled request is 499, anything else 500)."""
        with self.counted(), self._finish_on_failure(rec):
            yield

    @contextlib.contextmanager
    def _finish_on_failure(self, rec: RequestRecord, hold: contextlib.ExitStack | None = None) -> Iterator[None]:
        """A failure finishes the record (an OpenAI error keeps its status, a cancelled request is
        499, anything else 500) and closes ``hold``, a stream's count in flight."""
        try:
            yield
        except BaseException as e:
            if hold is not None:
                hold.close()
            if isinstance(e, APIError):
                self.finish(rec, e.status, e.message, e.code or e.type)
            else:
                self.finish(rec, 499 if is_cancel(e) else 500, f"{type(e).__name__}: {e}")
            raise

    async def admit(self, request: GatewayRequest) -> None:
        """Raises the OpenAI error of a ``tokenops_admit`` rejection. Off the event loop:
        a rate limiter may queue (sleep) and admission plugins may read the store."""
        rejection = await asyncio.to_thread(hooks.get_rejection, request)
        if rejection is not None:
            request.decide("admit", {"rejected": rejection.code})
            headers = {"retry-after": str(max(1, round(rejection.retry_after_s)))} if rejection.retry_after_s else None
            raise APIError(rejection.status, rejection.message, code=rejection.code, headers=headers)

    async def _admit_and_lookup(self, request: GatewayRequest, rec: RequestRecord) -> GatewayResponse | None:
        with tracing.step(rec, "tokenops.admission"):
            await self.admit(request)
        with tracing.step(rec, "tokenops.cache_lookup") as span:
            cached = await asyncio.to_thread(hooks.get_cached_response, request)
            request.decide("cache", "hit" if cached is not None else "miss")
            tracing.annotate(span, **{"tokenops.cache": request.decisions["cache"]})
        if cached is not None:
            rec.is_cache_hit = True
            rec.model_served = cached.model
            rec.backend = cached.backend or "cache"
            rec.route_reason = "cache"
        return cached

    def cost(self, model: str | None, tokens_in: int, tokens_out: int) -> float:
        config = self.models.get(model or "")
        if config is None:
            return 0.0
        return (tokens_in * config.cost_input_per_1m + tokens_out * config.cost_output_per_1m) / 1e6

    def _account(self, rec: RequestRecord, model: str, response: GatewayResponse) -> None:
        """Add one backend answer's tokens and cost to the request (cascades add several)."""
        rec.tokens_in += response.prompt_tokens
        rec.tokens_out += response.completion_tokens
        rec.tokens_cached += response.cached_tokens
        if response.reasoning_tokens is not None:
            rec.reasoning_tokens = (rec.reasoning_tokens or 0) + response.reasoning_tokens
        if response.extra.get("queue_s") is not None:  # the engine's scheduling times, when it reports them
            rec.queue_s, rec.prefill_s = response.extra["queue_s"], response.extra.get("prefill_s")
        rec.cost_usd += self.cost(model, response.prompt_tokens, response.completion_tokens)

    def _route(self, request: GatewayRequest, rec: RequestRecord) -> RouteDecision:
        try:
            decision = hooks.get_route(request, list(self.replicas), self.profiles)
        except ValueError as e:  # a router refusing the request (unknown alias, bad option) is the client's error
            raise APIError(400, str(e), code="invalid_model", param="model") from None
        if decision is None:
            raise ModelNotFound(request.model, list(self.replicas))
        for name in (decision.model, *decision.escalate_to, *decision.members):
            if name not in self.replicas and not (decision.members and name == decision.model):
                raise APIError(
                    500, f"router {decision.router or '?'} chose unknown model {name!r}", code="routing_error"
                )
        rec.route_reason = decision.reason
        rec.model_served = decision.model
        request.decide(
            "route",
            {
                "model": decision.model,
                "reason": decision.reason,
                "router": decision.router,
                "score": decision.score,
            },
        )
        return decision

    async def _decide(self, request: GatewayRequest, rec: RequestRecord) -> RouteDecision:
        """:meth:`_route`, in a worker thread for a large prompt (layer-1 routers may classify
        the whole text: the profile router took 7 s on a 3.9 MB prompt, on the event loop) or
        when a router is marked ``@may_block`` (the semantic router embeds the prompt)."""
        with tracing.step(rec, "tokenops.route") as span:
            if prompt_chars(request) > OFF_LOOP_PROMPT_CHARS or hooks.is_blocking(
                "tokenops_route", request=request, candidates=list(self.replicas), profiles=self.profiles
            ):
                decision = await asyncio.to_thread(self._route, request, rec)
            else:
                decision = self._route(request, rec)
            tracing.annotate(
                span,
                **{
                    "tokenops.router": decision.router,
                    "tokenops.route_reason": decision.reason,
                    "tokenops.route.model": decision.model,
                    "tokenops.route.escalate_to": list(decision.escalate_to) or None,
                    "tokenops.route.members": list(decision.members) or None,
                },
            )
            return decision

    async def _fit_context(self, request: GatewayRequest, decision: RouteDecision) -> None:
        """Layer 2 session memory: a plugin may fit the conversation into the routed model's context."""
        if request.kind != "chat" or not request.session_id or not hooks.has_context_fitter():
            return
        from tokenops.memory.fit import window_for

        window = window_for(self.replicas.get(decision.model, []))
        result = await asyncio.to_thread(hooks.fit_context, request, window)
        if result is not None:
            request.decide("memory", result)

    def _choose(
        self, request: GatewayRequest, rec: RequestRecord, model: str, candidates: list[Replica] | None = None
    ) -> Replica:
        ready = [r for r in (self.replicas[model] if candidates is None else candidates) if r.ready]
        if not ready and (failure := model_failure(model, self.replicas[model])) is not None:
            raise failure
        if not ready:
            raise APIError(
                503, f"The model `{model}` is not ready yet (still loading); retry shortly.", code="model_not_ready"
            )
        replica = hooks.get_replica(request, ready) or ready[0]
        request.decide("replica", replica.name)
        rec.model_served, rec.backend = model, replica.name
        rec.backend_kind = getattr(replica.backend, "kind", None)
        return replica

    async def _call(
        self, request: GatewayRequest, rec: RequestRecord, model: str, step: Callable[[Replica], Awaitable[Any]]
    ) -> tuple[Replica, Any, float]:
        """Run ``step`` on a replica of ``model``; on BackendError ask ``tokenops_fallback``."""
        replica = self._choose(request, rec, model)
        tried = {replica.name}
        why = "primary"
        while True:
            t0 = time.perf_counter()
            try:
                with replica.busy(), tracing.attempt(rec, request, replica, why):
                    result = await step(replica)
            except BackendError as e:
                hooks.report_outcome(replica.name, BackendOutcome(False, time.perf_counter() - t0, e.kind))
                other = self._retry_elsewhere(request, rec, replica, e, tried)
                if other is not None:  # nothing reached the client yet: another replica may answer it
                    replica = other
                    tried.add(other.name)
                    why = "retry"
                    continue
                request.attempts.append(replica.model)
                target = hooks.get_fallback_model(request, e)
                if not target or target not in self.replicas or target in request.attempts:
                    raise api_error(e, request.kind) from None
                request.add_decision("fallbacks", {"from": replica.model, "to": target, "error": e.kind})
                rec.route_reason = f"fallback:{e.kind}"
                replica = self._choose(request, rec, target)
                tried.add(replica.name)
                why = "fallback"
                continue
            return replica, result, t0

    def _retry_elsewhere(
        self, request: GatewayRequest, rec: RequestRecord, failed: Replica, error: BackendError, tried: set[str]
    ) -> Replica | None:
        """Another ready replica of the same model for a request whose replica failed before answering,
        if the retry policy and budget allow (:mod:`tokenops.routing.retry`)."""
        if not is_retryable(error) or len(tried) >= self.retry_budget.config.max_attempts:
            return None
        others = [r for r in self.replicas.get(failed.model, ()) if r.ready and r.name not in tried]
        if not others or not self.retry_budget.try_spend():
            return None
        request.add_decision("retries", {"from": failed.name, "error": error.kind})
        return self._choose(request, rec, failed.model, candidates=others)

    async def _after(
        self, request: GatewayRequest, replica: Replica, response: GatewayResponse, t0: float
    ) -> float | None:
        """validate -> backend outcome -> cache store; returns the lowest validation score.
        Validators and caches marked ``@may_block`` run in a worker thread."""
        scores = await hooks.call("tokenops_validate", hooks.get_validation_scores, request=request, response=response)
        score = min(scores) if scores else None
        if score is not None:
            request.decide("validate", score)
        hooks.report_outcome(
            replica.name,
            BackendOutcome(True, time.perf_counter() - t0, None, response.prompt_tokens, response.completion_tokens),
        )
        with confidence.client_body(request):  # a cache keys on what the client asked, not on the gateway's logprobs
            await hooks.call("tokenops_cache_store", hooks.offer_to_cache, request=request, response=response)
        return score

    async def call_model(
        self, request: GatewayRequest, rec: RequestRecord, model: str
    ) -> tuple[GatewayResponse, float | None]:
        """One non-streamed answer from ``model`` (with fallback), accounted; returns it and its score."""

        def step(r: Replica) -> Awaitable[GatewayResponse]:
            return r.backend.chat(request) if request.kind == "chat" else r.backend.complete(request)

        replica, response, t0 = await self._call(request, rec, model, step)
        first = response.extra.pop("first_token_at", None)
        if rec.first_token_at is None:
            rec.first_token_at = first
        self._account(rec, replica.model, response)
        confidence.fill_token_logprobs(response)  # the validators score confidence from these
        confidence.hide_added_logprobs(request, response)
        score = await self._after(request, replica, response, t0)
        tracing.end_attempt(
            rec,
            request.id,
            model=response.model,
            tokens_in=response.prompt_tokens,
            tokens_out=response.completion_tokens,
            queue_s=response.extra.get("queue_s"),
            prefill_s=response.extra.get("prefill_s"),
            score=score,
            finish_reason=response.finish_reason,
        )
        return response, score
