"""Shared helpers for the layer-4 plugin tests."""

from dataclasses import dataclass, field
from typing import Any



from tokenops.types import GatewayRequest


@dataclass
class FakeReplica:
    name: str
    model: str = "m"
    backend: Any = None
    index: int = 0
    labels: dict = field(default_factory=dict)
    in_flight: int = 0


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def chat(text: str, *, tenant: str = "default", session: str | None = None, max_tokens: int = 16,
         system: str | None = None, **kw) -> GatewayRequest:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, **kw.pop("body", {})}
    return GatewayRequest(kind="chat", model="m", body=body, messages=messages, tenant=tenant,
                          session_id=session, max_tokens=max_tokens, **kw)




def replicas(n: int) -> list[FakeReplica]:
    return [FakeReplica(f"m#{i}", index=i) for i in range(n)]
