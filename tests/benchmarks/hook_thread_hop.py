"""What ``@may_block`` costs the common path: the per-call check that decides whether a hook
moves to a worker thread, next to the thread hop it saves a cheap hook and the built-in route
call itself (every built-in plugin loaded, no router configured).

    .venv/bin/python tests/benchmarks/hook_thread_hop.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from tokenops.gateway.core import hooks
from tokenops.plugin_manager import get_plugin_manager
from tokenops.types import GatewayRequest


def per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


async def hop_us(calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        await asyncio.to_thread(lambda: None)
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    calls = parser.parse_args().calls
    get_plugin_manager()
    request = GatewayRequest(kind="chat", model="m", body={}, messages=[{"role": "user", "content": "hello there"}])
    kwargs = {"request": request, "candidates": ["m"], "profiles": {}}
    num_impls = len(get_plugin_manager().hook.tokenops_route.get_hookimpls())
    check = per_call_us(lambda: hooks.is_blocking("tokenops_route", **kwargs), calls)
    route = per_call_us(lambda: hooks.get_route(request, ["m"], {}), calls)
    hop = asyncio.run(hop_us(calls // 4))
    print(f"tokenops_route implementations loaded: {num_impls}")
    print(f"is_blocking check (per request):       {check:7.2f} us")
    print(f"built-in route call on the loop:       {route:7.2f} us")
    print(f"asyncio.to_thread hop of a no-op:      {hop:7.2f} us  (what an unmarked hook does not pay)")
    print(f"check / hop: {check / hop:.2f}")


if __name__ == "__main__":
    main()
