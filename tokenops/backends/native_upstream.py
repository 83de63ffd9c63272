"""Reading an ``openai`` upstream's answers (:func:`json_answer`, :func:`upstream_error`), and a
client's own API request (``GatewayRequest.native``: an Anthropic Messages or a Responses
body) sent as it is to an ``openai`` upstream's path for that API, beside
``OpenAIBackend._send`` which sends chat completions.

Both native pass-throughs (:mod:`tokenops.backends.anthropic_upstream`,
:mod:`tokenops.backends.openai_responses`) probe the same way: an upstream answering 404 or 405
with a message that does not name a model has no such route. The backend remembers it
(``serves_messages`` / ``serves_responses``) and this request and the next get the chat
translation (what the translation cannot carry is then a 400 naming it).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tokenops.types import BackendError, GatewayRequest

#: Status codes of an upstream without the API's route.
NOT_SERVED = (404, 405)


async def native_post(
    backend: Any, request: GatewayRequest, stream: bool, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response | None:
    """POST ``payload`` to the upstream's path of ``request.native.api``; None (remembered on
    ``backend.serves_<api>``) when the upstream does not serve it."""
    assert request.native is not None
    flag = f"serves_{request.native.api}"
    try:
        response = await backend._send(request, stream, path=request.native.path, payload=payload, headers=headers)
    except BackendError as e:
        message = str(getattr(e, "upstream_message", "") or "")
        if e.status in NOT_SERVED and "model" not in message.lower():  # an unknown path, not an unknown model
            setattr(backend, flag, False)
            request.native.check_translatable(backend.name)
            return None
        raise
    setattr(backend, flag, True)
    return response


def json_answer(backend: Any, response: httpx.Response) -> Any:
    """The upstream's non-streamed answer as JSON; a 502 naming the backend when it is not JSON."""
    try:
        return json.loads(response.content)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BackendError(f"{backend.name}: bad upstream answer: {e}", "error", 502, backend.name) from None


def upstream_error(name: str, status: int, body: bytes) -> BackendError:
    """Turn an upstream error answer into a BackendError that keeps its status and message."""
    message, code = body.decode("utf-8", "replace")[:500], None
    try:
        err = json.loads(body).get("error")
        if isinstance(err, dict):
            message, code = err.get("message") or message, err.get("code")
        elif isinstance(err, str):
            message = err
    except (json.JSONDecodeError, AttributeError):
        pass
    if status == 429:
        kind = "overload"
    elif code == "context_length_exceeded" or "context length" in message.lower():
        kind = "context_length"
    elif 400 <= status < 500:
        kind = "bad_request"
    else:
        kind = "error"
    err = BackendError(f"{name}: upstream {status}: {message}", kind, status if status < 500 else 502, name)
    err.upstream_message = message  # type: ignore[attr-defined]
    err.upstream_code = code  # type: ignore[attr-defined]
    return err
