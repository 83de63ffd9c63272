"""uvicorn's httptools protocol with the limits a public server needs against slow
or greedy clients (uvicorn itself only times out idle keep-alive connections):

- ``header_timeout_s``: a request's headers must be complete this long after its
  first byte (or after the connection opened); else 408 and close. Slowloris
  clients sending one header byte every few seconds are cut off.
- ``max_connections_per_client``: connections open at once from one address; the
  next one gets a 429 and is closed before anything is parsed.
- a body shorter than its ``Content-Length`` followed by the client closing its
  side gets a 400 that says so (uvicorn closes without a word); a body that stops
  arriving is the app's ``[gateway] body_timeout_s`` (408).

:func:`protocol_class` binds the settings; ``uvicorn.Config(http=...)`` takes the class.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _raw_response(status: int, reason: str, message: str, code: str) -> bytes:
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    ).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    max_connections_per_client: int = 256
    #: client address -> open connections (shared by every connection of the process)
    open_per_client: dict[str, int] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._counted_as: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else None
        if address is not None:
            num_open = self.open_per_client.get(address, 0)
            if num_open >= self.max_connections_per_client:
                transport.write(
                    _raw_response(
                        429,
                        "Too Many Requests",
                        f"{address} already has {num_open} open "
                        "connections to this server ([gateway] max_connections_per_client); "
                        "reuse them.",
                        "too_many_connections",
                    )
                )
                transport.close()
                return
            self.open_per_client[address] = num_open + 1
            self._counted_as = address
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._counted_as is not None:
            left = self.open_per_client.get(self._counted_as, 1) - 1
            if left > 0:
                self.open_per_client[self._counted_as] = left
            else:
                self.open_per_client.pop(self._counted_as, None)
            self._counted_as = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # between requests uvicorn's keep-alive timeout applies; the header clock restarts at the next request
        self._cancel_header_timer()
        super().on_response_complete()

    def eof_received(self) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not cycle.response_started and not self.transport.is_closing():
            cycle.response_started = True
            self.transport.write(
                _raw_response(
                    400,
                    "Bad Request",
                    "The connection was closed before the request body was complete (shorter than its Content-Length).",
                    "incomplete_body",
                )
            )
        return None

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        # a connection that never started a request, or stalls inside its headers
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(
                _raw_response(
                    408,
                    "Request Timeout",
                    f"The request headers did not arrive within {self.header_timeout_s:g} s.",
                    "request_timeout",
                )
            )
            self.transport.close()


def protocol_class(header_timeout_s: float, max_connections_per_client: int) -> type[GuardedHttpToolsProtocol]:
    """A protocol class with these limits (each server gets its own counters)."""
    return type(
        "TokenopsHttpProtocol",
        (GuardedHttpToolsProtocol,),
        {
            "header_timeout_s": header_timeout_s,
            "max_connections_per_client": max_connections_per_client,
            "open_per_client": {},
        },
    )


def uvicorn_limits(gateway: Any) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments from ``[gateway]`` settings."""
    return {
        "http": protocol_class(gateway.header_timeout_s, gateway.max_connections_per_client),
        "timeout_keep_alive": gateway.keep_alive_timeout_s,
        "limit_concurrency": gateway.max_connections,
    }
