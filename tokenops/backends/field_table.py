"""What tokenops does with every OpenAI request field, per endpoint and backend kind:
**acts** on it, **passes it through** to an upstream, or answers **400** saying why.
Nothing is silently dropped.

The table here is the one source: :func:`check_bundled_fields` enforces the 400s of
the bundled backends (the ``local`` engine for chat/completions, the ``embedding``
backend for embeddings), docs/serve.md carries :func:`markdown` verbatim (a test
compares them; ``python -m tokenops.gateway.core.fields`` prints it), and a test checks
that every field the request schemas and the openai SDK know has a row. The
``openai`` backend sends every field the client sent (``model`` replaced by the
upstream's id, ``max_tokens`` and ``stream_options`` set by the gateway).

It sits with the backends, which enforce it; :mod:`tokenops.gateway.core.fields` is its name for the
gateway and the docs.

The sampling fields' rows come from their registry (:mod:`tokenops.sampling_fields`), with their
schemas. Another field the bundled engine learns to act on: change its row's ``bundled`` text from
the 400 to what it does; its schema field (if any) is enough.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenops.sampling_fields import REGISTRY
from tokenops.types import BackendError, GatewayRequest

PASS = "passes through"
STRUCTURED = "acts: grammar-constrained decoding (see structured outputs)"


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    bundled: str  # what the bundled backend does ("acts...", or "400 ..." with the reason)
    upstream: str = PASS  # what the openai backend does
    #: For the 400s: the values that change nothing and are accepted (e.g. a penalty of 0).
    is_neutral: Callable[[Any], bool] | None = None

    @property
    def is_rejected(self) -> bool:
        return self.bundled.startswith("400")


def _rejected(reason: str) -> str:
    return f"400 ({reason})"


#: The sampling fields' rows, from their registry (tokenops/sampling_fields.py).
_SAMPLING_FIELDS = [Field(f.name, f.bundled, f.upstream) for f in REGISTRY]
_SAMPLING = [
    Field(
        "model",
        "acts: picks the model (routers may choose another)",
        "acts: sent as the upstream's own id (`served_model`, else learned from its /v1/models)",
    ),
    Field("stream", "acts", "acts: the gateway streams from the upstream when the client streams"),
    Field(
        "stream_options",
        "acts (`include_usage`)",
        "acts: the gateway always asks for usage; the client gets the usage chunk when it asked",
    ),
    Field(
        "user", "acts: session hint; the tenant on an open server", "passes through (and acts as on the bundled engine)"
    ),
    Field("priority", "acts (extension: order under the `priority` schedule policy)"),
    Field(
        "cache",
        "acts (extension): `false` skips the semantic cache",
        "acts as on the bundled engine; not sent upstream",
    ),
]

CHAT = [
    Field(
        "messages",
        "acts: rendered through the model's chat template; `text` content parts only: an "
        "`image_url`, `input_audio` or `file` part is a 400 naming it (the bundled models are text-only)",
        "passes through (every content part)",
    ),
    *_SAMPLING,
    *_SAMPLING_FIELDS,
    Field("max_tokens", "acts", "acts: sent as `max_tokens` (the gateway's default when absent)"),
    Field("max_completion_tokens", "acts (wins over `max_tokens`)", "acts: sent as `max_tokens`"),
    Field("logprobs", "acts"),
    Field("top_logprobs", "acts (0-20)"),
    Field("tools", STRUCTURED),
    Field("tool_choice", STRUCTURED),
    Field("parallel_tool_calls", STRUCTURED),
    Field("response_format", STRUCTURED),
    Field("functions", _rejected("deprecated by OpenAI: send `tools`")),
    Field("function_call", _rejected("deprecated by OpenAI: send `tool_choice`")),
    Field("audio", _rejected("no audio output")),
    Field("modalities", _rejected('text only; ["text"] is accepted'), is_neutral=lambda v: v == ["text"]),
    Field("prediction", _rejected("predicted outputs are not implemented")),
    Field("web_search_options", _rejected("no web search")),
    Field(
        "reasoning_effort",
        "acts on models with a `reasoning_parser`: thinking budget by budget forcing "
        "(`none`/`minimal` 0, `low`/`medium`/`high` the `reasoning.budget_*` tunables); 400 on other models",
    ),
    Field(
        "max_thinking_tokens",
        "acts (extension) on models with a `reasoning_parser`: the thinking budget in tokens; 400 on other models",
    ),
    Field("verbosity", _rejected("not implemented")),
    Field(
        "store",
        _rejected("OpenAI's stored completions are not implemented; false is accepted"),
        is_neutral=lambda v: v is False,
    ),
    Field("metadata", _rejected("kept only with `store`, which is not implemented")),
    Field(
        "service_tier",
        _rejected('one tier; "auto" and "default" are accepted'),
        is_neutral=lambda v: v in ("auto", "default"),
    ),
    Field(
        "prompt_cache_key",
        "acts: replica affinity: requests with the same key go to the same replica (bounded load; "
        "every routing policy but `least_load` and `p2c`); the engine's prefix cache itself needs no key",
        "passes through (and acts as on the bundled engine)",
    ),
    Field("prompt_cache_retention", _rejected("not implemented")),
    Field("prompt_cache_options", _rejected("not implemented")),
    Field("safety_identifier", _rejected("not implemented; send `user`")),
    Field("moderation", _rejected("no moderation")),
]

COMPLETIONS = [
    Field(
        "prompt",
        "acts: a string, token ids, or a list of either (one choice per prompt and `n`: prompt i's choices "
        "are `index` i*n to i*n+n-1; at most `[gateway] max_messages` prompts)",
        "acts: the same checks; each prompt is sent as a request of its own",
    ),
    *_SAMPLING,
    *_SAMPLING_FIELDS,
    Field("max_tokens", "acts (0 only with `echo`)", "acts: sent as `max_tokens` (the gateway's default when absent)"),
    Field("logprobs", "acts (0-20)"),
    Field(
        "echo",
        "acts: the prompt before the completion and, with `logprobs`, its tokens' logprobs (the first "
        "null); `max_tokens: 0` scores the prompt without generating (lm-eval's loglikelihood)",
    ),
    Field("suffix", _rejected("insertion is not implemented")),
    Field("best_of", _rejected("not implemented; 1 is accepted"), is_neutral=lambda v: v == 1),
]

EMBEDDINGS = [
    Field("model", "acts: picks the model", "acts: sent as the upstream's own id"),
    Field("input", "acts: a string or a list of strings (token-id arrays are a 400)"),
    Field("encoding_format", "acts: `float` or `base64`"),
    Field("dimensions", "acts: must equal the model's size (384 for MiniLM), else 400"),
    Field("user", "acts: the tenant on an open server", "passes through (and acts as on the bundled backend)"),
]

#: Request kind -> its fields (``GatewayRequest.kind``).
TABLES: dict[str, list[Field]] = {"chat": CHAT, "completion": COMPLETIONS, "embedding": EMBEDDINGS}
_TITLES = {
    "chat": ("`POST /v1/chat/completions`", "bundled engine (`local`)"),
    "completion": ("`POST /v1/completions`", "bundled engine (`local`)"),
    "embedding": ("`POST /v1/embeddings`", "bundled `embedding` model"),
}


def fields(kind: str) -> dict[str, Field]:
    return {f.name: f for f in TABLES[kind]}


def check_bundled_fields(request: GatewayRequest, backend: str) -> None:
    """400 (as a ``BackendError`` of kind ``bad_request``) for the first field of the
    request that the bundled backend would not act on: a rejected field with a value
    that changes something, or a field neither the table nor the schema knows."""
    if request.native is not None:  # e.g. an Anthropic request: what its chat translation lost is a 400 here
        request.native.check_translatable(backend)
    known = fields(request.kind)
    for name, value in request.body.items():
        if value is None:
            continue
        f = known.get(name)
        if f is None:  # every field the gateway's schemas declare has a row (tests/gateway/test_request_fields.py)
            reason = "it is not an OpenAI field the bundled backend knows"
        elif f.is_rejected and not (f.is_neutral is not None and f.is_neutral(value)):
            reason = f.bundled[len("400 (") : -1]
        else:
            continue
        message = (
            f"Unsupported parameter `{name}` for the model `{request.model}`: {reason}. Remove it, or send it "
            "to a model served by an OpenAI-compatible upstream (the gateway passes it through there)."
        )
        err = BackendError(message, kind="bad_request", status=400, backend=backend)
        err.upstream_message = message  # type: ignore[attr-defined]
        err.upstream_code = "unsupported_parameter"  # type: ignore[attr-defined]
        err.param = name  # type: ignore[attr-defined]
        raise err


def markdown() -> str:
    """The tables of docs/serve.md."""
    out = []
    for kind, rows in TABLES.items():
        path, bundled = _TITLES[kind]
        out.append(f"{path}\n\n| field | {bundled} | `openai` upstream |\n|---|---|---|")
        out += [f"| `{f.name}` | {f.bundled} | {f.upstream} |" for f in rows]
        out.append("| any other field | 400 naming it (`unsupported_parameter`) | passes through |\n")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
