"""How many loads a burst costs under ``[gateway] max_loaded_models``: four toy ``[[models]]`` with room
for two, the 48 requests of ``lora_serve.py`` (same interleaved order, 32 tokens each) sent at once, a
few rounds back to back. Two loads a round is the least (two models are not resident at a round's
start); more means resident engines were closed before their own requests of the burst arrived, and
loaded again. Quick (toy models load in ~0.1 s): a check of the swap policy, not of load speed.

    .venv/bin/python tests/benchmarks/model_swap_burst.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lora_serve import NUM_REQUESTS, REQUEST_ORDER  # noqa: E402
from tokenops.testing_serve import ServeProcess  # noqa: E402

TOYS = {"target": "target", "draft": "draft", "small": "ladder-small", "large": "ladder-large"}


def config() -> str:
    folder = ROOT / "tokenops" / "demo_models"
    models = "".join(f'\n[[models]]\nname = "{n}"\npath = "{folder / p}"\n' for n, p in TOYS.items())
    return "[gateway]\nmax_loaded_models = 2\n" + models


async def burst(base_url: str) -> tuple[int, float]:
    import openai

    models = list(TOYS)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)

    async def one(i: int) -> int:
        r = await client.completions.create(
            model=models[REQUEST_ORDER[i]],
            prompt=f"item {i}",
            max_tokens=32,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        return r.usage.completion_tokens

    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i) for i in range(NUM_REQUESTS))))
    await client.close()
    return tokens, round(time.perf_counter() - start, 2)


def main() -> None:
    import httpx

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    opts = ap.parse_args()
    rounds = []
    with ServeProcess("/tmp/tokenops-model-swap-burst", config=config(), store=False) as srv:

        def loads() -> int:
            return httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers).json()["model_swap"]["num_loads"]

        for _ in range(opts.rounds):
            before = loads()
            tokens, wall = asyncio.run(burst(srv.base_url))
            rounds.append({"tokens": tokens, "wall_s": wall, "loads": loads() - before})
    print(json.dumps({"rounds": rounds, "loads_per_round": [r["loads"] for r in rounds]}, indent=1))


if __name__ == "__main__":
    main()
