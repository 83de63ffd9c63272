"""The running upstream attempt's W3C ``traceparent``, shared by the gateway's tracing (which
sets it around each attempt, :mod:`tokenops.gateway.observability.tracing`) and the HTTP backends (which send
it upstream, so a traced vLLM joins the request's trace). It lives below both so that no
backend imports the gateway."""

from __future__ import annotations

import contextvars

#: ``00-<trace id>-<span id>-01`` while an attempt runs under a trace, else None.
attempt_parent: contextvars.ContextVar[str | None] = contextvars.ContextVar("tokenops_traceparent", default=None)


def inject(headers: dict[str, str]) -> None:
    """Add the running attempt's ``traceparent`` to an upstream request's headers."""
    value = attempt_parent.get()
    if value is not None:
        headers["traceparent"] = value
