"""Request bodies of the OpenAI API (validated with pydantic) and their conversion
to :class:`tokenops.types.GatewayRequest`.

Unknown fields are kept (``extra="allow"``) so an ``openai`` backend passes them
upstream; the bundled engine answers 400 for the ones it does not implement
(:mod:`tokenops.gateway.fields` says which, per field). ``top_k``, ``ignore_eos``, ``priority``,
``repetition_penalty`` and ``min_tokens`` are extensions, as in vLLM. The ranges are OpenAI's
(penalties in [-2, 2], ``logit_bias`` values in [-100, 100]) and apply to upstreams as well.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tokenops.gateway.errors import APIError
from tokenops.gateway.structured import check_structured
from tokenops.types import GatewayRequest


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content_parts(cls, value: Any) -> Any:
        # a part's own fields are checked here so no backend meets a non-string text
        for i, part in enumerate(value if isinstance(value, list) else ()):
            kind = part.get("type")
            if not isinstance(kind, str):
                raise ValueError(f"content part {i} needs a string \"type\"")
            if kind == "text" and not isinstance(part.get("text"), str):
                raise ValueError(f"content part {i} of type \"text\" needs a string \"text\"")
        return value


class _CommonRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="Extension: sample from the k most likely tokens (0 or -1: off).")
    n: int = Field(1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="End-user id; used as the session hint (and tenant on an open server).")
    ignore_eos: bool | None = Field(None, description="Extension: keep generating past end-of-sequence.")
    priority: int = Field(0, description="Extension: lower runs first under the `priority` schedule policy.")
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(None, description="Token id (as a string) -> bias in [-100, 100].")
    repetition_penalty: float | None = Field(
        None, gt=0, description="Extension (vLLM): divide the logits of prompt and output tokens by it (1: off).")
    min_tokens: int | None = Field(None, ge=0, description="Extension (vLLM): no stop rule ends the output before it.")

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        # OpenAI's rule: keys are token ids, values in [-100, 100]; the bundled engine checks the vocabulary
        for key, bias in (value or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"keys must be token ids (integers as strings), got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"values must be in [-100, 100], got {bias} for token {key}")
        return value


class ChatCompletionRequest(_CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class CompletionRequest(_CommonRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(None, ge=0, description="0 (with `echo`): score the prompt, generate nothing.")
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = False
    suffix: str | None = None


def _format_validation(e: ValidationError) -> APIError:
    err = e.errors(include_url=False)[0]
    if err.get("type") == "json_invalid":
        return APIError(400, "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
                        "using your HTTP library correctly. The OpenAI API expects a JSON payload.)", code="invalid_json")
    loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body",))
    msg = err.get("msg", "invalid value")
    return APIError(400, f"{loc}: {msg}" if loc else msg, code="invalid_value", param=loc or None)


def parse_body(raw: bytes) -> dict[str, Any]:
    from tokenops.gateway.body import parse_json

    return parse_json(raw)


def chat_request(data: dict[str, Any], default_max_tokens: int) -> GatewayRequest:
    try:
        req = ChatCompletionRequest.model_validate(data, strict=True)  # JSON types as sent: "yes" is no bool
    except ValidationError as e:
        raise _format_validation(e) from None
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs requires logprobs to be true", code="invalid_value", param="top_logprobs")
    body = req.model_dump(exclude_none=True)
    check_structured(body)  # response_format / tools / tool_choice: a 400 before any backend
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return GatewayRequest(
        kind="chat", model=req.model, body=body, messages=body["messages"], stream=req.stream,
        max_tokens=asked if asked is not None else default_max_tokens, session_id=req.user, priority=req.priority,
    )


def completion_request(data: dict[str, Any], default_max_tokens: int) -> GatewayRequest:
    try:
        req = CompletionRequest.model_validate(data, strict=True)
    except ValidationError as e:
        raise _format_validation(e) from None
    prompt: Any = req.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise APIError(400, "batched prompts are not supported: send one prompt per request", param="prompt")
        prompt = prompt[0]
    if req.max_tokens == 0 and not req.echo:
        raise APIError(400, "max_tokens: 0 is only accepted with echo (scoring the prompt)", code="invalid_value",
                       param="max_tokens")
    body = req.model_dump(exclude_none=True)
    body["prompt"] = prompt
    return GatewayRequest(
        kind="completion", model=req.model, body=body, prompt=prompt, stream=req.stream,
        max_tokens=req.max_tokens if req.max_tokens is not None else default_max_tokens,
        session_id=req.user, priority=req.priority,
    )


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads its body itself (size limit first);
    the app puts the model's schema under ``components/schemas``."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}
