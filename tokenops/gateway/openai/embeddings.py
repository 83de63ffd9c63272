"""``POST /v1/embeddings``: validated like OpenAI's, then admit -> the named model's
replica -> ``backend.embed`` -> record. ``openai`` backends pass the body through
(``encoding_format``, ``dimensions`` and any other field unchanged); the
``embedding`` backend embeds in-process. Backends without ``embed`` (the bundled
chat engine) answer 400.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tokenops.gateway.core import hooks
from tokenops.gateway.core.capability import choose_capable_replica
from tokenops.gateway.errors import APIError
from tokenops.json_types import INTEGRAL_FLOAT
from tokenops.types import BackendError, BackendOutcome, GatewayRequest

#: OpenAI's limit on inputs per request.
MAX_INPUTS = 2048


_TokenId = Annotated[int, Field(strict=True, ge=0, le=2**31 - 1), INTEGRAL_FLOAT]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    input: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_INPUTS)]
        | Annotated[list[_TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[_TokenId], Field(min_length=1)]], Field(min_length=1, max_length=MAX_INPUTS)]
    )
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Field(strict=True, ge=1, le=2**31 - 1), INTEGRAL_FLOAT] | None = None
    user: str | None = None

    @field_validator("input", mode="before")  # before the union: its own words, not the branches'
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if value == "" or value == []:
            raise ValueError("input must not be empty")
        if isinstance(value, list):
            if len(value) > MAX_INPUTS:
                raise ValueError(f"at most {MAX_INPUTS} inputs per request")
            if any(x == "" or x == [] for x in value):
                raise ValueError("input must not contain empty strings or empty token arrays")
        return value


def embedding_request(data: dict[str, Any]) -> GatewayRequest:
    try:
        req = EmbeddingRequest.model_validate(data, strict=True)  # JSON types as sent: true is no number
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise APIError(
            400, f"{loc}: {err.get('msg', 'invalid value')}", code="invalid_value", param=loc or None
        ) from None
    body = req.model_dump(exclude_unset=True)
    texts = [req.input] if isinstance(req.input, str) else req.input
    # the text, for admission plugins that count or read it (rate limits, budgets)
    strings = [t for t in texts if isinstance(t, str)]
    prompt = "\n".join(strings) if len(strings) == len(texts) else None
    return GatewayRequest(
        kind="embedding", model=req.model, body=body, prompt=prompt, session_id=req.user, max_tokens=0
    )


async def embed(gw: Any, request: GatewayRequest) -> dict[str, Any]:
    """Answer one embeddings request through the gateway's pipeline pieces; the record
    (telemetry, stats, cost of the input tokens) is finished whatever the outcome."""
    pipeline = gw.pipeline
    rec = pipeline.new_record(request)
    with pipeline.tracked(rec):
        await pipeline.admit(request)
        replica = choose_capable_replica(
            pipeline,
            request,
            rec,
            reason="embeddings",
            method="embed",
            does="serve embeddings",
            use="an embedding model",
            alternatives=embedding_models(pipeline),
        )
        t0 = time.perf_counter()
        try:
            with replica.busy():
                answer = await replica.backend.embed(request)
        except BackendError as e:
            hooks.report_outcome(replica.name, BackendOutcome(False, time.perf_counter() - t0, e.kind))
            raise _api_error(e) from None
        usage = answer.get("usage") or {}
        rec.tokens_in = int(usage.get("prompt_tokens") or 0)
        rec.first_token_at = time.perf_counter()
        rec.cost_usd = pipeline.cost(request.model, rec.tokens_in, 0)
        hooks.report_outcome(replica.name, BackendOutcome(True, time.perf_counter() - t0, None, rec.tokens_in, 0))
        answer["model"] = request.model
        pipeline.finish(rec, 200)
        pipeline.show_decisions(request, rec)
        return answer


def embedding_models(pipeline: Any) -> list[str]:
    return [m for m, rs in pipeline.replicas.items() if rs and getattr(rs[0].backend, "kind", None) == "embedding"]


def _api_error(e: BackendError) -> APIError:
    message = getattr(e, "upstream_message", None) or str(e)
    code = getattr(e, "upstream_code", None) or e.kind
    status = e.status if 400 <= e.status < 600 else 502
    return APIError(status, message, code=code, param=getattr(e, "param", None))


def response_bytes(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
