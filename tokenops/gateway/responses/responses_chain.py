"""What a ``/v1/responses`` turn stores, and the bounds a ``previous_response_id`` chain keeps.

A turn stores its own input items once (the rows before it are linked, never copied:
:mod:`tokenops.store.stored_responses`). Items go in the form the model will be given them
again: when the conversation is translated to chat (the bundled engine, an upstream without
``/v1/responses``), only what :func:`tokenops.gateway.responses.responses_chat.chat_messages` reads is
kept (a ``reasoning`` item, which the model never sees, keeps its id and type; unknown keys
of an item are dropped). An upstream serving ``/v1/responses`` gets the items as sent, so they
are stored as sent. Either way a row and a chain are bounded in bytes (``[gateway]
max_stored_response_bytes``, ``max_chain_bytes``): a turn that would pass a bound is a 400
that names it before the model runs; an answer whose own output passes it is returned but
not kept (``"store": false`` in the Response).
"""

from __future__ import annotations

import json
from typing import Any

from tokenops.gateway.errors import APIError
from tokenops.store.stored_responses import ChainHead, Limits

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

#: The keys the chat translation reads per item type; a reasoning item keeps its identity only.
_READ_KEYS: dict[str, tuple[str, ...]] = {
    "message": ("id", "type", "role", "status", "content"),
    "function_call": ("id", "type", "call_id", "name", "arguments", "status"),
    "function_call_output": ("id", "type", "call_id", "output", "status"),
    "reasoning": ("id", "type"),
}


def limits(gateway: Any, store: Any) -> Limits:
    """The bounds of ``[store]`` (age, count per tenant) and ``[gateway]`` (bytes)."""
    return Limits(
        max_age_s=float(store.responses_max_age_hours) * 3600.0,
        max_per_tenant=int(store.responses_max_per_tenant),
        max_response_bytes=int(gateway.max_stored_response_bytes),
        max_chain_bytes=int(gateway.max_chain_bytes),
    )


def is_translated(kinds: list[tuple[str | None, Any]]) -> bool:
    """Whether the model's replicas (``(kind, serves_responses)``) all get the chat translation."""
    return not any(kind == "openai" and serves is not False for kind, serves in kinds)


def stored_items(items: list[dict[str, Any]], translated: bool) -> list[dict[str, Any]]:
    """``items`` as they are stored: as sent for an upstream that reads them so, else what the
    chat translation reads of them."""
    if not translated:
        return items
    out = []
    for item in items:
        keys = _READ_KEYS.get(item.get("type", "message"))
        if keys is None:  # no such item reaches a translated model (refused with a 400 before)
            out.append(item)
            continue
        kept = {k: item[k] for k in keys if k in item}
        if kept["type"] == "reasoning":
            kept["summary"] = []
        out.append(kept)
    return out


def check_stored_bytes(
    bounds: Limits, previous: ChainHead | None, own_items: list[dict[str, Any]], response: dict[str, Any]
) -> None:
    """A 400 naming the bound when storing ``own_items`` and ``response`` (the Response without
    its output yet) after ``previous`` passes one."""
    num_bytes = len(_dumps(own_items)) + len(_dumps(response))
    bound = bounds.bound_passed(num_bytes, previous)
    if bound == "max_stored_response_bytes":
        raise APIError(
            400,
            f"input: this response would store {num_bytes} bytes, over this server's limit of "
            f"{bounds.max_response_bytes} bytes per stored response ([gateway] max_stored_response_bytes); "
            "send less input, or send it with store: false.",
            code="stored_response_too_large",
            param="input",
        )
    if bound == "max_chain_bytes":
        assert previous is not None
        raise APIError(
            400,
            f"previous_response_id: the conversation stored under {previous.id} holds "
            f"{previous.num_chain_bytes} bytes; with this turn's {num_bytes} it would pass this server's limit "
            f"of {bounds.max_chain_bytes} bytes per chain ([gateway] max_chain_bytes). Start a new chain: "
            "send the turns you need as input, without previous_response_id.",
            code="chain_too_large",
            param="previous_response_id",
        )


def not_stored_event(event: bytes) -> bytes:
    """A streamed closing event (``response.completed`` ...) saying its Response was not kept."""
    head, sep, data = event.partition(b"\ndata: ")
    body = json.loads(data)
    body["response"]["store"] = False
    return head + sep + _dumps(body).encode("utf-8") + b"\n\n"
