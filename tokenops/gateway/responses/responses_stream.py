"""Streamed ``/v1/responses``: the gateway's deltas as OpenAI's typed events.

The order is OpenAI's: ``response.created``, ``response.in_progress``, then per output
item ``response.output_item.added``, its content (``response.content_part.added``,
``response.output_text.delta`` ..., ``response.output_text.done``,
``response.content_part.done``; ``response.reasoning_text.*`` for reasoning;
``response.function_call_arguments.delta`` ... ``.done`` for a call),
``response.output_item.done``; last ``response.completed`` (or ``response.incomplete``
when ``max_output_tokens`` cut it) with the whole Response; with ``[gateway] decision_headers``
on, that last event also carries the gateway's decisions beside the Response
(``"tokenops": {model, replica, cache, route, cost_usd}``, as a chat stream's last chunk does;
the openai SDK keeps the unknown key in ``event.model_extra``). Every event carries a
``sequence_number`` from 0. One item is open at a time: a delta of another kind
closes the open item first (reasoning, then text, then calls, as models write them).
An error after the stream started is an ``error`` event, then ``response.failed``.
"""

from __future__ import annotations

import json
from typing import Any

from tokenops.backends.base import Delta
from tokenops.gateway.responses.responses_output import (
    ResponseFrame,
    function_call_item,
    message_item,
    reasoning_item,
    status_of,
    usage,
)
from tokenops.gateway.responses.responses_request import new_id

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class EventWriter:
    """Turns one request's deltas (choice 0) into SSE event bytes."""

    def __init__(self, frame: ResponseFrame) -> None:
        self.frame = frame
        self.output: list[dict[str, Any]] = []  # finished items
        self.finish_reason: str | None = None
        self._seq = 0
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._text: list[str] = []
        self._logprobs: list[dict[str, Any]] = []
        self._call_index: int | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + _dumps(body).encode("utf-8") + b"\n\n"

    def start(self) -> list[bytes]:
        snapshot = self.frame.body("in_progress", [])
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    # -- items ----------------------------------------------------------------

    @property
    def _index(self) -> int:
        return len(self.output)

    def _current(self) -> dict[str, Any]:
        assert self._open is not None  # called after the caller opened (or found) the item it writes to
        return self._open

    def _open_item(self, item: dict[str, Any], part: dict[str, Any] | None) -> list[bytes]:
        self._open, self._text, self._logprobs = item, [], []
        events = [self._event("response.output_item.added", output_index=self._index, item=item)]
        if part is not None:
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self._index,
                    content_index=0,
                    part=part,
                )
            )
        return events

    def _close(self) -> list[bytes]:
        item, self._open = self._open, None
        if item is None:
            return []
        idx, text = self._index, "".join(self._text)
        events = []
        if item["type"] == "reasoning":
            done = reasoning_item(text, item["id"])
            part = done["content"][0]
            events += [
                self._event(
                    "response.reasoning_text.done", item_id=item["id"], output_index=idx, content_index=0, text=text
                ),
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=idx, content_index=0, part=part
                ),
            ]
        elif item["type"] == "message":
            refusal = item.get("refusal")
            done = message_item(text, refusal, self._logprobs, item["id"])
            part = done["content"][0]
            if refusal:
                events.append(
                    self._event(
                        "response.refusal.done", item_id=item["id"], output_index=idx, content_index=0, refusal=refusal
                    )
                )
            else:
                events.append(
                    self._event(
                        "response.output_text.done",
                        item_id=item["id"],
                        output_index=idx,
                        content_index=0,
                        text=text,
                        logprobs=self._logprobs,
                    )
                )
            events.append(
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=idx, content_index=0, part=part
                )
            )
        else:
            done = {**item, "arguments": text, "status": "completed"}
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=idx,
                    name=item["name"],
                    arguments=text,
                )
            )
        events.append(self._event("response.output_item.done", output_index=idx, item=done))
        self.output.append(done)
        return events

    def _reasoning(self, text: str) -> list[bytes]:
        events = []
        if self._open is None or self._open["type"] != "reasoning":
            events += self._close()
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            events += self._open_item(item, {"type": "reasoning_text", "text": ""})
        self._text.append(text)
        events.append(
            self._event(
                "response.reasoning_text.delta",
                item_id=self._current()["id"],
                output_index=self._index,
                content_index=0,
                delta=text,
            )
        )
        return events

    def _open_message(self) -> list[bytes]:
        if self._open is not None and self._open["type"] == "message":
            return []
        events = self._close()
        item = message_item(None, item_id=new_id("msg"), status="in_progress")
        item["content"] = []
        return events + self._open_item(item, {"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def _message_text(self, text: str, logprobs: list[dict[str, Any]]) -> list[bytes]:
        events = self._open_message()
        self._text.append(text)
        self._logprobs += logprobs
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=self._current()["id"],
                output_index=self._index,
                content_index=0,
                delta=text,
                logprobs=logprobs,
            )
        )
        return events

    def _refusal(self, text: str) -> list[bytes]:
        events = []
        if self._open is None or self._open["type"] != "message":
            events += self._close()
            item = message_item(None, item_id=new_id("msg"), status="in_progress")
            item["content"] = []
            events += self._open_item(item, {"type": "refusal", "refusal": ""})
        self._current()["refusal"] = self._current().get("refusal", "") + text
        events.append(
            self._event(
                "response.refusal.delta",
                item_id=self._current()["id"],
                output_index=self._index,
                content_index=0,
                delta=text,
            )
        )
        return events

    def _tool_calls(self, pieces: list[dict[str, Any]]) -> list[bytes]:
        events = []
        for piece in pieces:
            fn = piece.get("function") or {}
            if self._open is None or self._open["type"] != "function_call" or piece.get("index") != self._call_index:
                events += self._close()
                self._call_index = piece.get("index")
                item = function_call_item(
                    {"id": piece.get("id"), "function": {"name": fn.get("name", "")}}, status="in_progress"
                )
                events += self._open_item(item, None)
            if fn.get("arguments"):
                self._text.append(fn["arguments"])
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=self._current()["id"],
                        output_index=self._index,
                        delta=fn["arguments"],
                    )
                )
        return events

    def push(self, delta: Delta) -> list[bytes]:
        """Events for one content delta of choice 0 (other choices are not part of a Response)."""
        if delta.index != 0:
            return []
        events: list[bytes] = []
        reasoning = (delta.extra or {}).get("reasoning_content")
        if reasoning:
            events += self._reasoning(reasoning)
        if delta.text:
            lp = (delta.logprobs or {}).get("content") or [] if isinstance(delta.logprobs, dict) else []
            events += self._message_text(delta.text, lp)
        if delta.refusal:
            events += self._refusal(delta.refusal)
        if delta.tool_calls:
            events += self._tool_calls(delta.tool_calls)
        if delta.finish_reason:
            self.finish_reason = delta.finish_reason
        return events

    def finish(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        reasoning_tokens: int | None,
        decisions: dict[str, Any] | None = None,
    ) -> tuple[list[bytes], dict[str, Any]]:
        """The closing events and the final Response object; ``decisions`` ride on the last event,
        not in the Response (a stored Response is the answer, not how it was served)."""
        events = self._close()
        if not self.output:  # nothing was generated: OpenAI still answers one (empty) message
            events += self._open_message() + self._close()
        status, incomplete = status_of(self.finish_reason)
        final = self.frame.body(
            status, self.output, usage(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens), incomplete
        )
        kind = "response.completed" if status == "completed" else "response.incomplete"
        extra = {"tokenops": decisions} if decisions else {}
        events.append(self._event(kind, response=final, **extra))
        return events, final

    def failed(self, code: str | None, message: str) -> list[bytes]:
        """An ``error`` event and ``response.failed``: the stream broke after it started."""
        # Response.error.code is one of OpenAI's own codes: the gateway's goes in the error event
        error = {"code": "rate_limit_exceeded" if code == "rate_limit_exceeded" else "server_error", "message": message}
        return [
            self._event("error", code=code, message=message, param=None),
            self._event("response.failed", response=self.frame.body("failed", self.output, None, error=error)),
        ]
