"""The SSE response every streaming endpoint returns (chat, completions, Messages, Responses)."""

from __future__ import annotations

from typing import Any

from starlette.responses import StreamingResponse


class EventStream(StreamingResponse):
    """SSE response that always closes the request's delta stream, even when the
    client left before the body started (the engine request is aborted then too)."""

    def __init__(self, content: Any, deltas: Any, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._deltas = deltas

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._deltas.aclose()
