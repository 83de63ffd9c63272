"""The output a request's schemas force, bounded before any work is spent on them.

``response_format`` schemas and ``tools`` parameter schemas are measured by
:mod:`tokenops.engine.sampling.json_schema_size` while the request is parsed: their own size
(subschemas, nesting, ``enum``/``const`` values) and every keyword that sizes or
multiplies the answer (``minLength``, ``minItems``, ``minProperties``, ``minContains``,
``pattern`` repetitions, ``required`` through ``$ref``) against ``[gateway]
schema_max_output_chars``; a schema the model must follow (``response_format``, a
forced tool) also against what the request's ``max_tokens`` can hold. A schema with no
finite answer (a property required inside itself) is refused too. Each refusal is a 400
naming the keyword and where it sits.

Why characters per token: no token of the bundled tokenizers decodes to more than
:data:`CHARS_PER_TOKEN` characters of JSON in practice, so an answer of ``C``
characters needs at least ``C / CHARS_PER_TOKEN`` tokens: a schema refused here could
not have been answered within ``max_tokens`` anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from tokenops.engine.sampling.json_schema_size import (
    INFINITE,
    SchemaSizeError,
    ShapeLimits,
    check_shape,
    min_json_chars,
)
from tokenops.gateway.errors import APIError

CHARS_PER_TOKEN = 16


@dataclass(slots=True, frozen=True)
class SchemaBudget:
    """The ceilings of ``[gateway] schema_*`` (see the module docstring)."""

    max_output_chars: int = 65_536
    shape: ShapeLimits = field(default_factory=ShapeLimits)

    @classmethod
    def from_settings(cls, gateway: Any) -> SchemaBudget:
        return cls(
            max_output_chars=gateway.schema_max_output_chars,
            shape=ShapeLimits(
                max_nodes=gateway.schema_max_nodes,
                max_depth=gateway.schema_max_depth,
                max_enum_values=gateway.schema_max_enum_values,
            ),
        )


#: The budget of the gateway serving the running request: each ``Gateway`` owns one and sets it
#: around its requests (:func:`in_force`); outside any gateway the defaults hold.
_in_force: ContextVar[SchemaBudget | None] = ContextVar("tokenops_schema_budget", default=None)
_DEFAULT = SchemaBudget()


def current() -> SchemaBudget:
    return _in_force.get() or _DEFAULT


@contextlib.contextmanager
def in_force(budget: SchemaBudget) -> Iterator[None]:
    token = _in_force.set(budget)
    try:
        yield
    finally:
        _in_force.reset(token)


def _refusal(param: str, e: SchemaSizeError, limit: str) -> APIError:
    where = f" (at {e.where})" if e.where else ""
    return APIError(400, f"{param}: {e.keyword}: the schema {e}{where}; {limit}.", code="schema_too_large", param=param)


def check_schema_shape(schema: Any, param: str, budget: SchemaBudget | None = None) -> None:
    """400 unless ``schema``'s own size (subschemas, nesting, enum values, sizing keywords
    one by one) is within the ceilings: cheap, and done before anything else reads it."""
    budget = budget or current()
    try:
        check_shape(schema, budget.shape, budget.max_output_chars)
    except SchemaSizeError as e:
        raise _refusal(param, e, _limit_note(e, budget)) from None


def _limit_note(e: SchemaSizeError, budget: SchemaBudget) -> str:
    if e.keyword in ("minLength", "minItems", "minProperties", "minContains", "pattern", "required", "prefixItems"):
        return f"this server allows {budget.max_output_chars} characters ([gateway] schema_max_output_chars)"
    return "this server's [gateway] schema_max_* settings bound it: simplify the schema"


def check_schema_size(
    schema: Any, param: str, max_tokens: int | None, is_enforced: bool, budget: SchemaBudget | None = None
) -> None:
    """400 unless ``schema`` fits the ceilings and, when ``is_enforced`` (decoding follows
    it), ``max_tokens``."""
    budget = budget or current()
    ceiling = budget.max_output_chars
    try:
        check_shape(schema, budget.shape, ceiling)
        size = min_json_chars(schema, ceiling)
    except SchemaSizeError as e:
        raise _refusal(param, e, _limit_note(e, budget)) from None
    if size == INFINITE:
        raise _refusal(
            param,
            SchemaSizeError("has no finite answer: a property or item is required inside itself", "$ref"),
            "make the recursive property optional",
        ) from None
    if is_enforced and max_tokens is not None and size > max_tokens * CHARS_PER_TOKEN:
        try:
            min_json_chars(schema, max_tokens * CHARS_PER_TOKEN)
        except SchemaSizeError as e:
            raise _refusal(
                param,
                e,
                f"max_tokens={max_tokens} holds at most {max_tokens * CHARS_PER_TOKEN} "
                f"characters ({CHARS_PER_TOKEN} per token): raise max_tokens or lower {e.keyword}",
            ) from None


def check_request_schemas(body: dict[str, Any], max_tokens: int | None) -> None:
    """:func:`check_schema_size` for ``response_format`` and every tool of a chat body
    whose fields were already checked by :mod:`tokenops.gateway.openai.structured`."""
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if schema is not None:
            check_schema_size(schema, "response_format.json_schema.schema", max_tokens, True)
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    forced = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    for i, tool in enumerate(tools):
        fn = tool.get("function") or {}
        if "parameters" in fn:
            check_schema_size(fn["parameters"], f"tools[{i}].function.parameters", max_tokens, fn.get("name") == forced)
