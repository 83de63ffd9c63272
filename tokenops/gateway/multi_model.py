"""Layer-1 orchestration the router asks for through its :class:`RouteDecision`:
a cascade (``escalate_to`` + ``min_score``: ask the next model while the
validators score the answer too low) and an ensemble (``members``: ask every
member, combine with ``tokenops_ensemble``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from tokenops.gateway import hooks
from tokenops.gateway.errors import APIError
from tokenops.gateway.records import RequestRecord
import dataclasses

from tokenops.types import EnsembleFollowUp, GatewayRequest, GatewayResponse, RouteDecision

if TYPE_CHECKING:
    from tokenops.gateway.pipeline import Pipeline


async def run_cascade(pipeline: Pipeline, request: GatewayRequest, rec: RequestRecord, decision: RouteDecision,
                      response: GatewayResponse, score: float | None) -> GatewayResponse:
    """Escalate along ``decision.escalate_to`` while the lowest validation score is below ``min_score``."""
    assert decision.min_score is not None
    steps = [{"model": decision.model, "score": score}]
    for model in decision.escalate_to:
        if score is None or score >= decision.min_score:
            break
        response, score = await pipeline.call_model(request, rec, model)
        steps.append({"model": model, "score": score})
        request.decisions["escalated"] = True
        rec.route_reason = f"{decision.reason}:escalated"
    request.decisions["cascade"] = {"min_score": decision.min_score, "steps": steps}
    rec.model_served = response.model if response.model in pipeline.replicas else steps[-1]["model"]
    return response


async def run_ensemble(pipeline: Pipeline, request: GatewayRequest, rec: RequestRecord,
                       decision: RouteDecision) -> GatewayResponse:
    """Ask every member concurrently; combine the answers that came back."""
    members = list(decision.members)
    results = await asyncio.gather(*(pipeline.call_model(request, rec, m) for m in members), return_exceptions=True)
    answers = [(m, r[0]) for m, r in zip(members, results) if not isinstance(r, BaseException)]
    failures = {m: str(r) for m, r in zip(members, results) if isinstance(r, BaseException)}
    request.decisions["ensemble"] = {"members": members, "method": decision.method, "failed": failures or None}
    if not answers:
        first = next(r for r in results if isinstance(r, BaseException))
        if isinstance(first, APIError):
            raise first
        raise APIError(502, f"every ensemble member failed: {failures}", code="ensemble_failed")
    combined = hooks.get_ensemble(request, [a for _, a in answers]) or answers[0][1]
    if isinstance(combined, EnsembleFollowUp):  # a judge or an aggregator has the last word
        request.decisions["ensemble"]["follow_up"] = combined.model
        follow = dataclasses.replace(
            request, kind="chat", messages=combined.messages, stream=False, max_tokens=combined.max_tokens,
            body={**request.body, "messages": combined.messages, "max_tokens": combined.max_tokens, "n": 1},
            decisions={}, attempts=[])
        answer, _ = await pipeline.call_model(follow, rec, combined.model)
        combined = combined.finish(answer)
    rec.model_served = decision.model
    rec.backend = "ensemble"
    return combined
