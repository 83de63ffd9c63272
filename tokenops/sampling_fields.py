"""The sampling fields of a request, declared once.

Each :class:`SamplingField` of :data:`REGISTRY` says everything the server knows about one field:
its JSON schema (the request models of chat and completions are built from it), the typed value
backends read (an attribute of :class:`SamplingFields` of the same name), what the bundled engine
and an upstream do with it (the rows of the request-field tables in docs/serve.md), whether it
belongs in the answer cache's key, and the ``SamplingParams`` argument the bundled engine takes it
as (with the model's recommended default when the client sent none).

A new sampling field is one entry here and one attribute of :class:`SamplingFields` (plus its
engine support, if the engine does not have it yet): the schema, the typed field, the field
table, the pass-through to upstreams, the cache key and the bundled engine's argument follow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field
from pydantic.fields import FieldInfo

from tokenops.json_types import INTEGRAL_FLOAT

PASS = "passes through"
#: Entries of ``logit_bias`` (OpenAI's limit; a 400 naming the field above it).
MAX_LOGIT_BIAS = 300


@dataclass(frozen=True)
class SamplingField:
    """One sampling field: its schema, its typed value, its table row, its cache-key membership."""

    name: str
    annotation: Any  # the schema's type (validated strictly, JSON Schema's integers)
    schema: Any  # a pydantic ``Field``: default, bounds and description
    bundled: str  # what the bundled engine does with it (the field table's row)
    upstream: str = PASS  # what an ``openai`` upstream gets
    #: the ``SamplingParams`` argument the bundled engine takes it as; None: handled on its own
    #: (the logits processors, stop strings, n). Unset, it takes the model's recommended default.
    engine_param: str | None = None
    in_cache_key: bool = True  # it changes the answer, so the answer cache keys on it
    typed: Callable[[Any], Any] | None = None  # the typed value from the validated one (None: as is)


def _int(ge: int, le: int) -> Any:
    return Annotated[int, Field(strict=True, ge=ge, le=le), INTEGRAL_FLOAT]


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _stop(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value or ())


#: Every sampling field chat and completions take, in the order of the field tables.
REGISTRY: tuple[SamplingField, ...] = (
    SamplingField("temperature", float | None, Field(None, ge=0, le=2), "acts", engine_param="temperature"),
    SamplingField("top_p", float | None, Field(None, gt=0, le=1), "acts", engine_param="top_p"),
    SamplingField(
        "top_k",
        _int(-1, 2**31 - 1) | None,
        Field(None, description="Extension: sample from the k most likely tokens (0 or -1: off)."),
        "acts (extension, as vLLM)",
        engine_param="top_k",
    ),
    SamplingField(
        "min_p",
        float | None,
        Field(
            None,
            ge=0,
            lt=1,
            description="Extension (vLLM, llama.cpp): drop tokens less likely than min_p times the likeliest (0: off).",
        ),
        "acts (extension, as vLLM and llama.cpp): tokens less likely than `min_p` times the likeliest are "
        "dropped; in [0, 1); unset, the model's default (docs/serve.md, sampling defaults)",
        engine_param="min_p",
    ),
    SamplingField("n", _int(1, 16), Field(1), "acts (1-16)"),
    SamplingField("stop", str | list[str] | None, Field(None), "acts", typed=_stop),
    SamplingField(
        "seed",
        _int(-(2**63), 2**63 - 1) | None,
        Field(None, description="A 64-bit signed integer."),
        "acts",
        engine_param="seed",
    ),
    SamplingField(
        "ignore_eos",
        bool | None,
        Field(None, description="Extension: keep generating past end-of-sequence."),
        "acts (extension, as vLLM)",
        typed=bool,
    ),
    SamplingField(
        "frequency_penalty",
        float | None,
        Field(None, ge=-2, le=2),
        "acts: minus the value times each token's count in the output so far ([-2, 2], else 400)",
        typed=_float_or_none,
    ),
    SamplingField(
        "presence_penalty",
        float | None,
        Field(None, ge=-2, le=2),
        "acts: minus the value for each token already in the output ([-2, 2], else 400)",
        typed=_float_or_none,
    ),
    SamplingField(
        "logit_bias",
        dict[str, float] | None,
        Field(
            None,
            description=f"Token id (as a string) -> bias in [-100, 100]; at most {MAX_LOGIT_BIAS} entries.",
            json_schema_extra={
                "propertyNames": {"pattern": "^[0-9]+$"},
                "maxProperties": MAX_LOGIT_BIAS,
                "additionalProperties": {"minimum": -100, "maximum": 100},
            },
        ),
        "acts: token id -> value in [-100, 100] added to its logit (an id outside the vocabulary, 400)",
        "passes through (the range is checked first)",
        typed=lambda value: value or None,
    ),
    SamplingField(
        "repetition_penalty",
        float | None,
        Field(
            None, gt=0, description="Extension (vLLM): divide the logits of prompt and output tokens by it (1: off)."
        ),
        "acts (extension, as vLLM): logits of the prompt's and output's tokens divided by "
        "it (multiplied when negative); > 0, 1 is off",
        typed=_float_or_none,
    ),
    SamplingField(
        "min_tokens",
        _int(0, 2**31 - 1) | None,
        Field(None, description="Extension (vLLM): no stop rule ends the output before it."),
        "acts (extension, as vLLM): end-of-sequence, stop strings and stop tokens end nothing "
        "before it; at most `max_tokens`",
    ),
)

BY_NAME: dict[str, SamplingField] = {f.name: f for f in REGISTRY}


@dataclass(frozen=True, slots=True)
class SamplingFields:
    """The sampling fields of a request as the client sent them: None (or empty) where it sent
    none. One attribute per :data:`REGISTRY` entry, plus the client's token limit. Backends read
    these, not the body."""

    n: int | None = None  # choices asked
    temperature: float | None = None  # None: the model's recommended default
    top_p: float | None = None  # nucleus sampling mass
    top_k: int | None = None  # the ``top_k`` extension (vLLM's); 0 or None: off
    min_p: float | None = None  # the ``min_p`` extension (vLLM's, llama.cpp's): relative probability floor
    seed: int | None = None  # a per-request seed for reproducible sampling
    stop: tuple[str, ...] = ()  # stop strings (a single string becomes one)
    ignore_eos: bool = False  # the ``ignore_eos`` extension: generate up to max_tokens
    #: the client's ``max_completion_tokens`` (chat; it wins) or ``max_tokens``; None: not sent (the
    #: limit after the server's default is ``GatewayRequest.max_tokens``)
    max_tokens: int | None = None
    presence_penalty: float | None = None  # minus this for each token already in the output
    frequency_penalty: float | None = None  # minus this times each token's count in the output
    repetition_penalty: float | None = None  # the vLLM extension: logits of seen tokens divided by it
    #: token id (a string of digits, as the JSON key) -> bias in [-100, 100]; None when not sent
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = None  # the vLLM extension: no stop rule ends the output before it

    @property
    def is_max_tokens_sent(self) -> bool:
        """Whether the client set ``max_tokens`` or ``max_completion_tokens``."""
        return self.max_tokens is not None

    @classmethod
    def from_values(cls, values: dict[str, Any], sent: Iterable[str] | None = None) -> SamplingFields:
        """The fields of ``values`` (a validated body or a request model's attributes); with
        ``sent`` (the names the client's JSON held) a value a schema filled in by default counts
        as not sent."""
        names = set(values) if sent is None else set(sent) & set(values)
        out: dict[str, Any] = {}
        for f in REGISTRY:
            if f.name in names and values[f.name] is not None:
                out[f.name] = f.typed(values[f.name]) if f.typed is not None else values[f.name]
        for name in ("max_tokens", "max_completion_tokens"):  # the latter wins, as OpenAI's
            if name in names and values.get(name) is not None:
                out["max_tokens"] = values[name]
        return cls(**out)

    def sent(self) -> set[str]:
        """The names of the fields the client sent (for decisions and logs)."""
        out = {f.name for f in REGISTRY if _is_sent(getattr(self, f.name))}
        return out | ({"max_tokens"} if self.max_tokens is not None else set())

    def engine_args(self, defaults: Any) -> dict[str, Any]:
        """The bundled engine's ``SamplingParams`` arguments of the fields that have one: the
        client's value, else ``defaults``' (the model's recommended value) where it has one."""
        out = {}
        for f in REGISTRY:
            if f.engine_param is None:
                continue
            value = getattr(self, f.name)
            if value is None:
                value = getattr(defaults, f.name, None)
            if value is not None:
                out[f.engine_param] = value
        return out


def _is_sent(value: Any) -> bool:
    return value is not None and value is not False and value != ()


def schema_fields() -> dict[str, tuple[Any, FieldInfo]]:
    """``{name: (type, Field)}`` of every registered field, for ``pydantic.create_model``."""
    return {f.name: (f.annotation, f.schema) for f in REGISTRY}


def cache_key_names() -> tuple[str, ...]:
    """The registered fields that change the answer (the answer cache's key holds them)."""
    return tuple(f.name for f in REGISTRY if f.in_cache_key)
