"""Reading and parsing request bodies without letting one client stall the others.

Order of work, cheapest first: the declared size, the bytes as they arrive (size
and a deadline), then JSON parsing. The parser (pydantic-core's ``from_json``)
refuses what the rest of the gateway cannot carry: lone UTF-16 surrogates,
``NaN``/``Infinity``, and objects and arrays nested deeper than :data:`MAX_JSON_DEPTH`
levels, each as a 400 that says what to fix. Everything that reads a body before it
(msgspec's count of ``messages``) refuses the same depth with the same answer. Bodies above
:data:`OFF_LOOP_BYTES` are parsed (and validated, see :func:`build_off_loop`) in
a worker thread so the event loop keeps answering ``/health`` meanwhile.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import msgspec
from pydantic_core import from_json
from starlette.requests import ClientDisconnect, Request

from tokenops.gateway.edge.body_counts import Unit, check_count, parsed_count, raw_count
from tokenops.gateway.errors import APIError
from tokenops.gateway.openai.prompt_list import check_prompt_count, parsed_prompt_count, raw_prompt_count

#: Bodies larger than this are parsed and validated in a worker thread.
OFF_LOOP_BYTES = 64 * 1024
#: Objects and arrays nested deeper than this are refused (400 ``invalid_json``) on every route:
#: pydantic-core's parser stops there, and every reader before it refuses the same depth.
MAX_JSON_DEPTH = 200
T = TypeVar("T")


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The body, refused with 413 once it exceeds ``limit`` bytes (before any parsing),
    and with 408 when it has not fully arrived within ``timeout_s`` seconds."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(
            413, f"Request body of {declared} bytes exceeds the limit of {limit} bytes.", code="request_too_large"
        )
    chunks: list[bytes] = []
    size = 0

    async def collect() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"Request body exceeds the limit of {limit} bytes.", code="request_too_large")
            chunks.append(chunk)

    try:
        if timeout_s:
            await asyncio.wait_for(collect(), timeout_s)
        else:
            await collect()
    except TimeoutError:
        raise APIError(
            408,
            f"The request body did not arrive within {timeout_s:g} s "
            f"({size} of {declared or '?'} bytes received); send the whole body at once.",
            code="request_timeout",
            headers={"connection": "close"},
        ) from None
    except ClientDisconnect:
        raise APIError(
            400,
            f"The connection ended before the request body was complete ({size} of {declared or '?'} bytes received).",
            code="incomplete_body",
            headers={"connection": "close"},
        ) from None
    return b"".join(chunks)


def parse_json(
    raw: bytes, check_finite: bool = True, max_int_bits: int | None = None, name_non_finite: bool = False
) -> dict[str, Any]:
    """A JSON object from ``raw``, or a 400 saying what is wrong with it. Integers wider
    than ``max_int_bits`` are refused (default :data:`MAX_INT_BITS`: one Python could not
    even print, which a field's own bounds then never see)."""
    try:
        data = from_json(raw, allow_inf_nan=name_non_finite)
    except ValueError as e:
        reason = "NaN and Infinity are not JSON numbers" if b"NaN" in raw or b"Infinity" in raw else _reason(str(e))
        raise APIError(
            400, f"We could not parse the JSON body of your request: {reason}.", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    if name_non_finite and _has_infinity(data):  # NaN / Infinity / 1e999 refused naming the field
        where = _path_of(data, lambda v: isinstance(v, float) and not math.isfinite(v))
        raise APIError(
            400,
            f"{where} must be a finite number (NaN and Infinity are not JSON numbers).",
            code="invalid_value",
            param=where,
        )
    if check_finite:
        _check_finite(data, max_int_bits or MAX_INT_BITS)
    return data


def _check_finite(data: dict[str, Any], max_int_bits: int = 0) -> None:
    # from_json turns 1e999 into inf even with allow_inf_nan=False; a walk of the parsed
    # tree is cheaper than scanning the raw bytes (a regex over 4 MB of text takes ~90 ms)
    if _has_infinity(data):
        raise APIError(
            400,
            "We could not parse the JSON body of your request: it holds a number too large for a 64-bit float.",
            code="invalid_json",
        )
    max_int_bits = max_int_bits or MAX_INT_BITS
    if _has_huge_int(data, max_int_bits):  # found again, with its place, only when there is one
        where = _huge_int_path(data, max_int_bits)
        limit = "64 bits (-2^63 to 2^64-1)" if max_int_bits <= 64 else f"{max_int_bits} bits"
        raise APIError(400, f"{where}: integers must fit in {limit}.", code="invalid_value", param=where)


def checked_body(raw: bytes, conf: Any, unit: Unit | None = None) -> dict[str, Any]:
    """:func:`parse_json` plus the cheap bounds of ``[gateway]`` (``max_messages``),
    checked before validation or tokenization spend time on the body. ``unit``: what
    else counts as messages (Anthropic content blocks, Responses input items)."""
    if len(raw) > OFF_LOOP_BYTES:
        # counted before parsing: building 100,000 message dicts holds the GIL ~0.15 s,
        # counting them (msgspec, messages kept as raw slices) ~15 ms
        _check_message_count(_count_messages(raw), conf.max_messages)
        if unit is not None:
            check_count(raw_count(raw, unit), conf.max_messages, unit)
        if b'"prompt"' in raw:  # batched completion prompts count as messages (tokenops/gateway/openai/prompt_list.py)
            check_prompt_count(raw_prompt_count(raw), conf.max_messages)
    data = parse_json(raw, check_finite=False)
    messages = data.get("messages")
    if isinstance(messages, list):
        _check_message_count(len(messages), conf.max_messages)
    check_prompt_count(parsed_prompt_count(data), conf.max_messages)
    if unit is not None:
        check_count(parsed_count(data, unit), conf.max_messages, unit)
    _check_finite(data, MAX_INT_BITS)
    return data


class _Envelope(msgspec.Struct):
    messages: list[msgspec.Raw] | None = None


_ENVELOPE = msgspec.json.Decoder(_Envelope)


def _count_messages(raw: bytes) -> int:
    """Elements of the top-level ``messages`` array (0 when there is none or the body is
    not what the schema wants: the parser and the schema then say what is wrong)."""
    try:
        messages = _ENVELOPE.decode(raw).messages
    except (msgspec.DecodeError, msgspec.ValidationError):
        return 0
    except RecursionError:  # msgspec recurses into the fields it skips (a 500 once)
        raise too_deep() from None
    return len(messages or ())


def too_deep() -> APIError:
    """The 400 of a body nested deeper than :data:`MAX_JSON_DEPTH`, whichever reader found it."""
    return APIError(400, f"We could not parse the JSON body of your request: {_DEPTH_REASON}.", code="invalid_json")


def check_depth(raw: bytes) -> None:
    """The 400 of :func:`too_deep` when ``raw`` nests deeper than :data:`MAX_JSON_DEPTH`, for a
    route that reads its body with another parser (other faults are left to that parser)."""
    try:
        from_json(raw, allow_inf_nan=True)
    except ValueError as e:
        if "recursion limit" in str(e):
            raise too_deep() from None


_DEPTH_REASON = f"it is nested too deeply (objects and arrays more than {MAX_JSON_DEPTH} levels deep); flatten it"


def _check_message_count(num: int, limit: int) -> None:
    if num > limit:
        raise APIError(
            400,
            f"messages: {num} messages exceed this server's limit of {limit} "
            "([gateway] max_messages); merge them or send fewer.",
            code="too_many_messages",
            param="messages",
        )


def _reason(message: str) -> str:
    if "surrogate" in message or "hex escape" in message:
        return f"a \\u escape is not valid Unicode (a lone UTF-16 surrogate?) ({message})"
    if "recursion limit" in message:
        return _DEPTH_REASON
    return message


#: The widest integer a ``/v1`` body may hold anywhere (declared fields have their own,
#: narrower bounds): Python cannot print one past 4,300 digits (~14,000 bits).
MAX_INT_BITS = 13_000
#: Admin bodies are all declared fields: 64 bits, signed or not.
ADMIN_INT_BITS = 64


def _is_huge(v: Any, max_bits: int) -> bool:
    if type(v) is not int:
        return False
    if max_bits <= 64:
        return not -(2**63) <= v <= 2**64 - 1
    return v.bit_length() > max_bits


def _has_huge_int(value: Any, max_bits: int) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is int and _is_huge(v, max_bits):
            return True
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _huge_int_path(value: Any, max_bits: int) -> str:
    return _path_of(value, lambda v: _is_huge(v, max_bits))


def _path_of(value: Any, is_bad: Callable[[Any], bool]) -> str:
    """Where in ``value`` the first value ``is_bad`` sits (``a.0.b``), for ``param``."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, path = stack.pop()
        if is_bad(v):
            return path or "body"
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{k}" if path else str(k)) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{path}.{i}" if path else str(i)) for i, x in enumerate(v))
    return "body"


async def admin_body(request: Request, limit: int = 1024 * 1024, timeout_s: float = 30.0) -> dict[str, Any]:
    """An admin request's body as a JSON object ({} when empty), read and parsed as
    ``/v1`` bodies are: size limit, deadline, depth limit, no NaN, 64-bit integers."""
    raw = await read_body(request, limit, timeout_s)
    if not raw:  # no body at all; whitespace is no JSON
        return {}
    return parse_json(raw, max_int_bits=ADMIN_INT_BITS, name_non_finite=True)


def _has_infinity(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return True
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


#: Keys of bodies that carry JSON schemas (chat's and Responses' ``schema``, tool ``parameters``,
#: Anthropic's ``input_schema``): checking a schema takes 0.1-1 s of Python even for a small body.
SCHEMA_MARKERS = (b'"schema"', b'"parameters"', b'"input_schema"')


def has_schema_work(raw: bytes) -> bool:
    """Whether ``raw`` may carry a schema to check (a byte scan: microseconds for a small body)."""
    return any(marker in raw for marker in SCHEMA_MARKERS)


async def build_off_loop(raw: bytes, build: Callable[[bytes], T]) -> T:
    """``build(raw)`` (parse + validate), in a worker thread when ``raw`` is large or carries
    a schema (:func:`has_schema_work`)."""
    if len(raw) <= OFF_LOOP_BYTES and not has_schema_work(raw):
        return build(raw)
    return await anyio.to_thread.run_sync(build, raw)
