"""Token logprobs for the validators that score answers (cascades).

A cascade decides on the cheap tier's confidence, so the gateway asks the backend for
token logprobs when a cascade runs (the bundled engine and OpenAI-compatible upstreams
both return them in OpenAI's shape), copies choice 0's into
``GatewayResponse.token_logprobs`` for ``tokenops_validate``, and removes them from the
answer again when the client did not ask for logprobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tokenops.types import GatewayRequest, GatewayResponse, RouteDecision


def needs_confidence(decision: RouteDecision) -> bool:
    return bool(decision.escalate_to) and decision.min_score is not None


def request_logprobs(request: GatewayRequest) -> bool:
    """Ask the backend for logprobs; True when the client had not asked (strip them later)."""
    if request.output.wants_logprobs(request.kind):
        return False
    request.override_output(logprobs=True if request.kind == "chat" else 0)
    request.decide("logprobs_for_validation", True)
    return True


def token_logprobs(logprobs: dict[str, Any] | None) -> list[float] | None:
    """The sampled tokens' logprobs from an OpenAI-shaped ``logprobs`` object (chat or completions)."""
    if not logprobs:
        return None
    if isinstance(logprobs.get("content"), list):
        values = [e.get("logprob") for e in logprobs["content"]]
    else:
        values = list(logprobs.get("token_logprobs") or [])
    values = [float(v) for v in values if v is not None]
    return values or None


def fill_token_logprobs(response: GatewayResponse) -> None:
    """Set ``response.token_logprobs`` from choice 0's logprobs when the backend left it empty."""
    if response.token_logprobs:
        return
    choices = response.extra.get("choices") or []
    if choices:
        response.token_logprobs = token_logprobs(choices[0].get("logprobs"))


def strip_logprobs(request: GatewayRequest, response: GatewayResponse) -> None:
    """Remove the logprobs the gateway asked for on the client's behalf."""
    for choice in response.extra.get("choices") or []:
        choice["logprobs"] = None
    request.override_output(logprobs=None)


def is_added(request: GatewayRequest) -> bool:
    """Whether the gateway, not the client, asked for this request's logprobs."""
    return bool(request.decisions.get("logprobs_for_validation"))


def hide_added_logprobs(request: GatewayRequest, response: GatewayResponse) -> None:
    """Clear the choices' logprobs the gateway asked for (``token_logprobs`` keeps choice 0's),
    before validators and caches see the answer: a cache must not replay them to a client."""
    if is_added(request):
        for choice in response.extra.get("choices") or []:
            choice["logprobs"] = None


@contextmanager
def client_body(request: GatewayRequest) -> Iterator[None]:
    """The request body as the client sent it (without the logprobs the gateway added) for the
    duration of the block: what a cache keys on."""
    if not is_added(request) or "logprobs" not in request.body:
        yield
        return
    value = request.body.pop("logprobs")
    if request.kind == "chat":
        request.body["logprobs"] = False  # the validated chat body's default: what the client's body held
    try:
        yield
    finally:
        request.body["logprobs"] = value
