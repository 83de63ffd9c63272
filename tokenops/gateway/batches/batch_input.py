"""Checking a batch input file line by line as it is uploaded (``POST /v1/files`` with
``purpose = "batch"``): each line is a JSON object ``{"custom_id", "method": "POST", "url",
"body"}`` with a ``custom_id`` no other line has, one of the batch endpoints as ``url`` and a
``body`` its route accepts for a model served here. The first bad line is a 400 that names it
by number; a file past ``[batches] max_lines`` is a 400 too. Runs in a worker thread."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from tokenops.gateway.batches.batch_lines import ENDPOINTS, build_call
from tokenops.gateway.edge.body import parse_json
from tokenops.gateway.errors import APIError

MAX_CUSTOM_ID_CHARS = 512


@dataclass(slots=True, frozen=True)
class InputLine:
    number: int  # 1-based line of the file
    custom_id: str
    url: str
    body: dict[str, Any]


def bad_line(number: int, message: str) -> APIError:
    return APIError(400, f"line {number}: {message}", code="invalid_batch_line", param="file")


def parse_line(number: int, raw: bytes) -> InputLine:
    """One line as an :class:`InputLine`, or the 400 naming it (shape only: see :func:`check_file`)."""
    try:
        data = parse_json(raw)
    except APIError as e:
        raise bad_line(number, e.message) from None
    unknown = sorted(set(data) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise bad_line(number, f"unknown field(s) {', '.join(unknown)}; a line has custom_id, method, url and body")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise bad_line(number, f"custom_id must be a non-empty string of at most {MAX_CUSTOM_ID_CHARS} characters")
    if data.get("method") != "POST":
        raise bad_line(number, f'method must be "POST", got {data.get("method")!r}')
    url = data.get("url")
    if url not in ENDPOINTS:
        raise bad_line(number, f"url must be one of {', '.join(ENDPOINTS)}, got {url!r}")
    body = data.get("body")
    if not isinstance(body, dict):
        raise bad_line(number, "body must be a JSON object (the request the url takes)")
    return InputLine(number, custom_id, str(url), body)


def _in_body(e: APIError) -> str:
    """The route's message with its field named inside the line (``body.messages: ...``)."""
    if not e.param or e.param.startswith("body."):
        return e.message
    if e.message.startswith(f"{e.param}:"):
        return f"body.{e.message}"
    return f"body.{e.param}: {e.message}"


def raw_lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of every non-blank line."""
    for number, raw in enumerate(stream, start=1):
        if raw.strip():
            yield number, raw


def check_file(gw: Any, stream: IO[bytes], out: IO[bytes], max_lines: int) -> int:
    """Check every line of ``stream`` (see the module docstring) while copying it to ``out``;
    returns the number of lines."""
    seen: dict[str, int] = {}
    num_lines = 0
    for number, raw in raw_lines(stream):
        num_lines += 1
        if num_lines > max_lines:
            raise bad_line(number, f"the file has more than [batches] max_lines = {max_lines} lines; split it")
        line = parse_line(number, raw)
        if line.custom_id in seen:
            raise bad_line(number, f"custom_id {line.custom_id!r} is already used on line {seen[line.custom_id]}")
        seen[line.custom_id] = number
        model = line.body.get("model")
        if not isinstance(model, str) or model not in gw.replicas:
            served = ", ".join(sorted(gw.replicas)) or "none"
            raise bad_line(number, f"body.model {model!r} is not served here (served: {served})")
        try:
            build_call(gw, line.url, line.body)
        except APIError as e:
            raise bad_line(number, _in_body(e)) from None
        out.write(raw if raw.endswith(b"\n") else raw + b"\n")
    if num_lines == 0:
        raise APIError(
            400,
            "The file has no lines: a batch input holds one request per line.",
            code="invalid_batch_line",
            param="file",
        )
    return num_lines
