"""Answer validators for cascades (``tokenops_validate``): each returns a score in
[0, 1], or None when it has nothing to say about this answer.

- ``logprob``: geometric-mean token probability, exp(mean token logprob);
- ``json``: 1 when the answer parses as JSON (and matches the request's JSON schema,
  for ``response_format`` ``json_schema``), else 0 — only for requests asking for JSON;
- ``regex``: 1 when ``[plugins.validators] regex`` matches the answer, else 0;
- ``consistency``: agreement of the answer with the other samples of the same request
  (share of samples equal to the majority answer), when several were drawn.

``[plugins.validators] use = ["logprob", "json"]`` limits which run (default: all).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

from tokenops import hookimpl

TOKENOPS_LAYER = "multi_model"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"validators": ("use", "regex")}


def logprob_confidence(token_logprobs: list[float] | None) -> float | None:
    if not token_logprobs:
        return None
    return math.exp(sum(token_logprobs) / len(token_logprobs))


def _schema_ok(value, schema: dict) -> bool:
    """A small JSON-schema subset: type, properties, required, items, enum."""
    types: dict[str, type | tuple[type, ...]] = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
        "null": type(None),
    }
    t = schema.get("type")
    if t and not isinstance(value, types.get(t, object)) or (t in ("integer", "number") and isinstance(value, bool)):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if isinstance(value, dict):
        if any(k not in value for k in schema.get("required", [])):
            return False
        return all(_schema_ok(value[k], sub) for k, sub in schema.get("properties", {}).items() if k in value)
    if isinstance(value, list) and "items" in schema:
        return all(_schema_ok(v, schema["items"]) for v in value)
    return True


def json_validity(text: str, response_format: dict | None) -> float | None:
    kind = (response_format or {}).get("type")
    if kind not in ("json_object", "json_schema"):
        return None
    try:
        value = json.loads(text.strip().removeprefix("```json").removesuffix("```").strip())
    except ValueError:
        return 0.0
    schema = ((response_format or {}).get("json_schema") or {}).get("schema")
    if kind == "json_schema" and schema:
        return 1.0 if _schema_ok(value, schema) else 0.0
    return 1.0 if isinstance(value, (dict, list)) else 0.0


def normalise_answer(text: str) -> str:
    """What two samples must share to agree: the last number if any, else the words."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return numbers[-1] if numbers else " ".join(re.findall(r"\w+", text.lower()))


def agreement(samples: list[str]) -> float | None:
    if len(samples) < 2:
        return None
    counts = Counter(normalise_answer(s) for s in samples)
    return counts.most_common(1)[0][1] / len(samples)


class Validators:
    """One gateway's validator choice (``use``) and ``regex``."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.use: list[str] | None = None  # None: every validator
        self.regex: re.Pattern[str] | None = None

    def is_on(self, name: str) -> bool:
        return self.use is None or name in self.use

    @hookimpl
    def tokenops_configure(self, settings):
        conf = settings.plugin_settings("validators")
        self.use = conf.get("use")
        self.regex = re.compile(conf["regex"]) if conf.get("regex") else None

    @hookimpl
    def tokenops_validate(self, request, response):
        scores: list[float | None] = []
        if self.is_on("logprob"):
            scores.append(logprob_confidence(response.token_logprobs))
        if self.is_on("json"):
            scores.append(json_validity(response.text, request.output.response_format))
        if self.is_on("regex") and self.regex is not None:
            scores.append(1.0 if self.regex.search(response.text) else 0.0)
        if self.is_on("consistency"):
            scores.append(agreement(response.extra.get("samples") or []))
        known = [s for s in scores if s is not None]
        return min(known) if known else None
