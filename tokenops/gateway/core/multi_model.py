"""Layer-1 orchestration the router asks for through its :class:`RouteDecision`:
a cascade (``escalate_to`` + ``min_score``: ask the next model while the
validators score the answer too low) and an ensemble (``members``: ask every
member, combine with ``tokenops_ensemble``)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from tokenops.gateway.core import hooks
from tokenops.gateway.errors import APIError
from tokenops.gateway.observability.records import RequestRecord
from tokenops.types import EnsembleFollowUp, GatewayRequest, GatewayResponse, RouteDecision


class ModelCaller(Protocol):
    """What orchestration needs from the request pipeline (:class:`tokenops.gateway.core.pipeline.Pipeline`).

    Declared here so this module does not import the pipeline that imports it.
    """

    @property
    def replicas(self) -> Mapping[str, Any]: ...

    async def call_model(
        self, request: GatewayRequest, rec: RequestRecord, model: str
    ) -> tuple[GatewayResponse, float | None]: ...

    def cost(self, model: str | None, tokens_in: int, tokens_out: int) -> float: ...


async def run_cascade(
    pipeline: ModelCaller,
    request: GatewayRequest,
    rec: RequestRecord,
    decision: RouteDecision,
    response: GatewayResponse,
    score: float | None,
) -> GatewayResponse:
    """Escalate along ``decision.escalate_to`` while the lowest validation score is below ``min_score``."""
    assert decision.min_score is not None
    steps: list[dict[str, Any]] = [{"model": decision.model, "score": score}]
    for model in decision.escalate_to:
        if score is None or score >= decision.min_score:
            break
        response, score = await pipeline.call_model(request, rec, model)
        steps.append({"model": model, "score": score})
        request.decide("escalated", True)
        rec.route_reason = f"{decision.reason}:escalated"
    request.decide("cascade", {"min_score": decision.min_score, "steps": steps})
    rec.model_served = response.model if response.model in pipeline.replicas else steps[-1]["model"]
    return response


def member_request(request: GatewayRequest, index: int) -> GatewayRequest:
    """The request as member ``index`` gets it: its own request id (an engine refuses an id
    already in flight, and two calls with one id would be one sample), the same decisions."""
    if index == 0:
        return request
    return dataclasses.replace(request, id=f"{request.id}-m{index}", body=dict(request.body))


def _call_cost(pipeline: ModelCaller, model: str, request_id: str, answer: GatewayResponse) -> dict[str, Any]:
    """One member's call in ``decisions["ensemble"]["member_costs"]``: its tokens and cost."""
    return {
        "model": model,
        "request_id": request_id,
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "cost_usd": pipeline.cost(model, answer.prompt_tokens, answer.completion_tokens),
    }


async def run_ensemble(
    pipeline: ModelCaller, request: GatewayRequest, rec: RequestRecord, decision: RouteDecision
) -> GatewayResponse:
    """Ask every member concurrently; combine the answers that came back."""
    members = list(decision.members)
    calls = [member_request(request, i) for i in range(len(members))]
    results = await asyncio.gather(
        *(pipeline.call_model(c, rec, m) for c, m in zip(calls, members)), return_exceptions=True
    )
    answers = [(m, r[0]) for m, r in zip(members, results) if not isinstance(r, BaseException)]
    failures = {f"{i}:{m}": str(r) for i, (m, r) in enumerate(zip(members, results)) if isinstance(r, BaseException)}
    request.decide(
        "ensemble",
        {
            "members": members,
            "method": decision.method,
            "failed": failures or None,
            # what each member's own call cost (the request's cost is their sum, plus a judge/aggregator)
            "member_costs": [
                _call_cost(pipeline, m, c.id, r[0])
                for c, m, r in zip(calls, members, results)
                if not isinstance(r, BaseException)
            ],
        },
    )
    if not answers:
        first = next(r for r in results if isinstance(r, BaseException))
        if isinstance(first, APIError):
            raise first
        raise APIError(502, f"every ensemble member failed: {failures}", code="ensemble_failed")
    combined = (
        await hooks.call("tokenops_ensemble", hooks.get_ensemble, request=request, responses=[a for _, a in answers])
        or answers[0][1]
    )
    # (model, answer) of every call billed for this request, with its usage as it came back
    # (a combiner may rewrite an answer's usage in place)
    calls_made = list(answers)
    billed = [_usage(a) for _, a in answers]
    if isinstance(combined, EnsembleFollowUp):  # a judge or an aggregator has the last word
        request.decide("ensemble", {**request.decisions["ensemble"], "follow_up": combined.model})
        follow = dataclasses.replace(
            request,
            id=f"{request.id}-follow",
            kind="chat",
            messages=combined.messages,
            stream=False,
            max_tokens=combined.max_tokens,
            body={**request.body, "messages": combined.messages, "max_tokens": combined.max_tokens, "n": 1},
            sampling=None,
            decisions={},
            attempts=[],
        )  # sampling: read again from this body
        answer, _ = await pipeline.call_model(follow, rec, combined.model)
        follow_up_cost = {
            "model": combined.model,
            "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens,
            "cost_usd": pipeline.cost(combined.model, answer.prompt_tokens, answer.completion_tokens),
        }
        request.decide("ensemble", {**request.decisions["ensemble"], "follow_up_cost": follow_up_cost})
        calls_made.append((combined.model, answer))
        billed.append(_usage(answer))
        combined = combined.finish(answer)
    # the model whose text is returned: the member (or the aggregator) whose answer object came back
    answered_by = next((m for m, a in reversed(calls_made) if a is combined), None)
    rec.model_served = answered_by or (combined.model if combined.model in pipeline.replicas else decision.model)
    rec.backend = "ensemble"
    request.decide("ensemble", {**request.decisions["ensemble"], "answered_by": rec.model_served})
    # usage is what was billed: every member's call plus the judge's/aggregator's
    reasoning = [u[3] for u in billed if u[3] is not None]
    return dataclasses.replace(
        combined,
        model=rec.model_served,
        prompt_tokens=sum(u[0] for u in billed),
        completion_tokens=sum(u[1] for u in billed),
        cached_tokens=sum(u[2] for u in billed),
        reasoning_tokens=sum(reasoning) if reasoning else None,
    )


def _usage(response: GatewayResponse) -> tuple[int, int, int, int | None]:
    return response.prompt_tokens, response.completion_tokens, response.cached_tokens, response.reasoning_tokens
