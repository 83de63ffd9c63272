"""Request bodies of the OpenAI API (validated with pydantic) and their conversion
to :class:`tokenops.types.GatewayRequest`.

Unknown fields are kept (``extra="allow"``) so an ``openai`` backend passes them
upstream; the bundled engine answers 400 for the ones it does not implement
(:mod:`tokenops.gateway.core.fields` says which, per field). ``top_k``, ``ignore_eos``, ``priority``,
``repetition_penalty`` and ``min_tokens`` are extensions, as in vLLM. The ranges are OpenAI's
(penalties in [-2, 2], ``logit_bias`` values in [-100, 100]) and apply to upstreams as well.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator

from tokenops.gateway.errors import APIError
from tokenops.gateway.openai.metadata_bounds import Metadata
from tokenops.gateway.openai.structured import check_structured
from tokenops.json_types import INTEGRAL_FLOAT
from tokenops.request_fields import OUTPUT_NAMES
from tokenops.sampling_fields import MAX_LOGIT_BIAS, schema_fields
from tokenops.types import GatewayRequest, OutputFields, SamplingFields


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


#: Only an assistant message may come without content (it holds tool_calls then).
_MAY_OMIT_CONTENT = frozenset({"assistant"})


def _message_schema(schema: dict[str, Any]) -> None:
    # what the validators below and chat_request enforce, declared: content parts have a
    # string type (text parts a string text), and only an assistant message may omit content
    content = schema["properties"]["content"]
    for option in content.get("anyOf", ()):
        if option.get("type") == "array":
            option["items"] = {
                "type": "object",
                "required": ["type"],
                "properties": {"type": {"type": "string"}},
                "if": {"properties": {"type": {"const": "text"}}},
                "then": {"required": ["text"], "properties": {"text": {"type": "string"}}},
            }
    schema["if"] = {"properties": {"role": {"const": "assistant"}}}
    schema["else"] = {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}}


def _chat_schema(schema: dict[str, Any]) -> None:
    schema["if"] = {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}}
    schema["then"] = {
        "required": ["logprobs"],
        "properties": {"logprobs": {"const": True}},
        "description": "top_logprobs needs logprobs: true",
    }


#: A token id as a prompt may carry it (the vocabulary sizes served fit in 31 bits).
TokenId = Annotated[int, Field(strict=True, ge=0, le=2**31 - 1), INTEGRAL_FLOAT]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra=_message_schema)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    # validated when absent too: only an assistant message (with tool_calls) may omit it
    content: str | list[dict[str, Any]] | None = Field(None, validate_default=True)
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content_parts(cls, value: Any, info: ValidationInfo) -> Any:
        role = info.data.get("role")
        if value is None and role is not None and role not in _MAY_OMIT_CONTENT:
            raise ValueError(f"a {role} message needs content (a string or a list of parts)")
        # a part's own fields are checked here so no backend meets a non-string text
        for i, part in enumerate(value if isinstance(value, list) else ()):
            kind = part.get("type")
            if not isinstance(kind, str):
                raise ValueError(f'content part {i} needs a string "type"')
            if kind == "text" and not isinstance(part.get("text"), str):
                raise ValueError(f'content part {i} of type "text" needs a string "text"')
        return value


#: The sampling fields' schemas, from their registry (tokenops/sampling_fields.py).
_SamplingRequest = create_model("_SamplingRequest", __config__=ConfigDict(extra="allow"), **schema_fields())  # type: ignore[call-overload]


class _CommonRequest(_SamplingRequest):  # type: ignore[valid-type,misc]
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    max_tokens: Annotated[int, Field(strict=True, ge=1, le=2**31 - 1), INTEGRAL_FLOAT] | None = Field(None)
    cache: bool | None = Field(None, description="Extension: false skips the semantic cache.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="End-user id; used as the session hint (and tenant on an open server).")
    priority: Annotated[int, Field(strict=True, ge=-(2**31), le=2**31 - 1), INTEGRAL_FLOAT] = Field(
        0, description="Extension: lower runs first under the `priority` schedule policy."
    )

    def to_fields(self) -> tuple[SamplingFields, OutputFields]:
        """The typed sampling and output fields, read from the validated attributes (a field the
        schema filled in by default counts as not sent)."""
        sent = self.model_fields_set
        values = {name: getattr(self, name) for name in sent}
        output = {k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in values.items() if k in OUTPUT_NAMES}
        return SamplingFields.from_values(values), OutputFields.from_body(output)

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _logit_bias_size(cls, value: Any) -> Any:
        # counted before each entry is validated: OpenAI's limit, and a 100k-entry map took 0.1 s
        if isinstance(value, dict) and len(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} token biases (OpenAI's limit), got {len(value)}")
        return value

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
    model_config = ConfigDict(extra="allow", json_schema_extra=_chat_schema)
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int, Field(strict=True, ge=1, le=2**31 - 1), INTEGRAL_FLOAT] | None = Field(None)
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=20), INTEGRAL_FLOAT] | None = Field(None)
    metadata: Metadata | None = None


def _completion_schema(schema: dict[str, Any]) -> None:
    schema["if"] = {"required": ["max_tokens"], "properties": {"max_tokens": {"const": 0}}}
    schema["then"] = {
        "required": ["echo"],
        "properties": {"echo": {"const": True}},
        "description": "max_tokens 0 scores the prompt: it needs echo: true",
    }


class CompletionRequest(_CommonRequest):
    model_config = ConfigDict(extra="allow", json_schema_extra=_completion_schema)
    # a list of strings or of token-id lists is one prompt each (at most [gateway] max_messages)
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    )
    max_tokens: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1), INTEGRAL_FLOAT] | None = Field(
        None, description="0 (with `echo`): score the prompt, generate nothing."
    )
    logprobs: Annotated[int, Field(strict=True, ge=0, le=20), INTEGRAL_FLOAT] | None = Field(None)
    echo: bool | None = False
    suffix: str | None = None


def _format_validation(e: ValidationError) -> APIError:
    err = e.errors(include_url=False)[0]
    if err.get("type") == "json_invalid":
        return APIError(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
            "using your HTTP library correctly. The OpenAI API expects a JSON payload.)",
            code="invalid_json",
        )
    loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body",))
    msg = err.get("msg", "invalid value")
    return APIError(400, f"{loc}: {msg}" if loc else msg, code="invalid_value", param=loc or None)


def parse_body(raw: bytes) -> dict[str, Any]:
    from tokenops.gateway.edge.body import parse_json

    return parse_json(raw)


def chat_request(data: dict[str, Any], default_max_tokens: int, *, is_generating: bool = True) -> GatewayRequest:
    """The validated request; ``is_generating=False`` (counting tokens) leaves the output its
    schemas force unchecked against ``max_tokens`` (the server's ceilings still apply)."""
    try:
        req = ChatCompletionRequest.model_validate(data, strict=True)  # JSON types as sent: "yes" is no bool
    except ValidationError as e:
        raise _format_validation(e) from None
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs requires logprobs to be true", code="invalid_value", param="top_logprobs")
    body = req.model_dump(exclude_none=True)  # what an upstream is sent
    sampling, output = req.to_fields()
    limit = sampling.max_tokens if sampling.max_tokens is not None else default_max_tokens
    # response_format / tools / tool_choice, and the output their schemas force: a 400 before any backend
    check_structured(body, limit if is_generating else None)
    return GatewayRequest(
        kind="chat",
        model=req.model,
        body=body,
        messages=body["messages"],
        stream=req.stream,
        max_tokens=limit,
        session_id=req.user,
        priority=req.priority,
        sampling=sampling,
        output=output,
    )


def completion_request(data: dict[str, Any], default_max_tokens: int) -> GatewayRequest:
    """The request of a body with one prompt (a list of several: :func:`completion_requests`)."""
    [request] = completion_requests(data, default_max_tokens, max_prompts=1)
    return request


def completion_requests(data: dict[str, Any], default_max_tokens: int, max_prompts: int) -> list[GatewayRequest]:
    """One request per prompt: ``prompt`` may be a list of strings or of token-id lists (OpenAI's
    batch of prompts), at most ``max_prompts`` of them (``[gateway] max_messages``)."""
    try:
        req = CompletionRequest.model_validate(data, strict=True)
    except ValidationError as e:
        raise _format_validation(e) from None
    prompts: list[Any] = [req.prompt]
    if isinstance(req.prompt, list) and not isinstance(req.prompt[0], int):
        prompts = list(req.prompt)
    if len(prompts) > max_prompts:
        raise APIError(
            400,
            f"prompt: {len(prompts)} prompts exceed this server's limit of {max_prompts} per request "
            "([gateway] max_messages); send fewer.",
            code="too_many_messages",
            param="prompt",
        )
    if req.max_tokens == 0 and not req.echo:
        raise APIError(
            400,
            "max_tokens: 0 is only accepted with echo (scoring the prompt)",
            code="invalid_value",
            param="max_tokens",
        )
    common = req.model_dump(exclude_none=True)  # what an upstream is sent, one body per prompt
    sampling, output = req.to_fields()
    limit = sampling.max_tokens if sampling.max_tokens is not None else default_max_tokens
    return [
        GatewayRequest(
            kind="completion",
            model=req.model,
            body={**common, "prompt": prompt},
            prompt=prompt,
            stream=req.stream,
            max_tokens=limit,
            session_id=req.user,
            priority=req.priority,
            sampling=sampling,
            output=output,
        )
        for prompt in prompts
    ]


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads its body itself (size limit first);
    the app puts the model's schema under ``components/schemas``."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }
