"""The ``file`` workload: requests read from a JSON Lines (or JSON array) file.

One record per request, sent in file order (the file is repeated when more
requests are asked for than it holds)::

    {"prompt": "Summarise ...", "output_tokens": 128}
    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}], "max_tokens": 64}

* the prompt: ``messages`` (chat messages) or ``prompt`` (a user turn), with an
  optional ``system`` prompt;
* the answer length: ``output_tokens``, ``output_tokens_count``,
  ``completion_tokens_count`` or ``max_tokens``; without one, ``--output-len``
  (default 64);
* optionally the prompt's token count (``prompt_tokens``, ``prompt_tokens_count``
  or ``input_tokens_count``), used only as the expected input size.

The column names are the ones GuideLLM and vLLM's custom datasets read, so one
file can drive both tools with identical requests.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from tokenops.bench.request import BenchRequest, WorkloadError

OUTPUT_KEYS = ("output_tokens", "output_tokens_count", "completion_tokens_count", "max_tokens")
PROMPT_TOKEN_KEYS = ("prompt_tokens", "prompt_tokens_count", "input_tokens_count")
ROLES = ("system", "user", "assistant", "developer", "tool")


def _records(path: Path) -> list[tuple[int, Any]]:
    """(line number, parsed record) of a JSON Lines file or of a JSON array."""
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return [(i + 1, rec) for i, rec in enumerate(data)]
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((lineno, json.loads(line)))
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    return out


def _int_field(rec: dict, keys: tuple[str, ...], where: str) -> int | None:
    for key in keys:
        if rec.get(key) is None:
            continue
        value = rec[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
            raise WorkloadError(f"{where}: {key} must be a positive integer, got {value!r}")
        return int(value)
    return None


def _messages(rec: dict, where: str) -> list[dict[str, str]]:
    if rec.get("messages") is not None:
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise WorkloadError(f"{where}: messages must be a non-empty list of {{role, content}} objects")
        out = []
        for m in msgs:
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise WorkloadError(
                    f"{where}: each message needs a role ({', '.join(ROLES)}) and a string content, "
                    f"got {json.dumps(m)[:80]}"
                )
            out.append({"role": m["role"], "content": m["content"]})
        return out
    prompt = rec.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise WorkloadError(f'{where}: a record needs a non-empty "prompt" string or a "messages" list')
    system = rec.get("system")
    if system is not None and not isinstance(system, str):
        raise WorkloadError(f"{where}: system must be a string")
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def load_file(path: str | Path, output_len: int | None = None) -> list[BenchRequest]:
    """Every record of ``path`` as a request, in file order."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise WorkloadError(f"dataset file {p} does not exist")
    requests = []
    for lineno, rec in _records(p):
        where = f"{p}:{lineno}"
        if not isinstance(rec, dict):
            raise WorkloadError(f"{where}: each record must be a JSON object, got {type(rec).__name__}")
        max_tokens = _int_field(rec, OUTPUT_KEYS, where) or output_len
        if max_tokens is None:
            raise WorkloadError(f"{where}: no answer length (give one of {', '.join(OUTPUT_KEYS)}, or --output-len)")
        requests.append(
            BenchRequest(
                _messages(rec, where),
                max_tokens=max_tokens,
                num_prompt_tokens=_int_field(rec, PROMPT_TOKEN_KEYS, where),
            )
        )
    if not requests:
        raise WorkloadError(f"dataset file {p} has no records")
    return requests


def file_workload(
    num_requests: int, seed: int = 0, dataset: str | None = None, output_len: int | None = None, **_: object
) -> list[BenchRequest]:
    """``num_requests`` requests from ``dataset`` in file order, repeating the file if it is shorter;
    ``output_len`` is the answer length of records that give none."""
    if not dataset:
        raise WorkloadError(
            "the file workload needs --dataset PATH (JSON Lines with prompt/messages and output_tokens per record)"
        )
    records = load_file(dataset, output_len)
    return [replace(records[i % len(records)]) for i in range(num_requests)]
