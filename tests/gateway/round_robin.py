"""A tiny round-robin load balancer for tests of several gateways: an httpx transport that sends
each request to the next ``tokenops serve`` in turn, and skips one that refuses the connection
(a killed gateway), as a load balancer's health check would. ``ports`` records where each request
went. Sync (openai SDK) and async (openai-agents) flavours."""

from __future__ import annotations

from typing import Any

import httpx


class _Rotation:
    def __init__(self, servers: list[Any]) -> None:
        self.servers = list(servers)
        self.next = 0
        self.ports: list[int] = []

    def targets(self) -> list[int]:
        """Every gateway's port, starting with the next one's; advances the rotation."""
        ports = [s.port for s in self.servers]
        start = self.next % len(ports)
        self.next += 1
        return ports[start:] + ports[:start]

    @staticmethod
    def aim(request: httpx.Request, port: int) -> None:
        request.url = request.url.copy_with(host="127.0.0.1", port=port)
        request.headers["host"] = f"127.0.0.1:{port}"


class RoundRobin(httpx.BaseTransport, _Rotation):
    def __init__(self, servers: list[Any]) -> None:
        _Rotation.__init__(self, servers)
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        for port in self.targets():
            self.aim(request, port)
            try:
                response = self.inner.handle_request(request)
            except httpx.ConnectError:
                continue  # a dead gateway: the next one
            self.ports.append(port)
            return response
        raise httpx.ConnectError("no gateway answered", request=request)


class AsyncRoundRobin(httpx.AsyncBaseTransport, _Rotation):
    def __init__(self, servers: list[Any]) -> None:
        _Rotation.__init__(self, servers)
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        for port in self.targets():
            self.aim(request, port)
            try:
                response = await self.inner.handle_async_request(request)
            except httpx.ConnectError:
                continue
            self.ports.append(port)
            return response
        raise httpx.ConnectError("no gateway answered", request=request)
