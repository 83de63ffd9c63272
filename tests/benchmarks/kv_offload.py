"""KV offload tier benchmark: TTFT of a returning session whose prefix the KV pool evicted,
recomputed (prefix caching only) vs loaded back from the offload tier.

Workload, per prefix length (default 256, 512 and 1,500 tokens of held-out ShareGPT
text on the demo target model): the session's prefix is prefilled once; a different
prompt then fills the small KV pool (``kv_cache_tokens`` 2,048 = 128 blocks), evicting
most of the prefix's blocks; the session returns with its prefix plus a new 32-token
turn and we time its first token. Both engines get identical requests, alternately
(ABAB), so load swings on a shared machine hit both alike; the figure is the median.

Two measurements:

- ``engine``: the bundled engine in-process (``LLMEngine.generate``, max_tokens 1).
- ``serve`` (``--serve``): two real ``tokenops serve`` processes (one with
  ``[plugins.kv_offload] enabled = true``), streamed ``/v1/completions`` through the
  openai SDK, time to the first streamed token.

Run::

    .venv/bin/python tests/benchmarks/kv_offload.py                # engine only
    .venv/bin/python tests/benchmarks/kv_offload.py --serve        # plus through serve
    .venv/bin/python tests/benchmarks/kv_offload.py --lengths 1500 --reps 3 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "tokenops" / "demo_models" / "target"
sys.path.insert(0, str(ROOT / "scripts"))

POOL_TOKENS = 2048
TURN_TOKENS = 32
HOST_MB = 64


def text_tokens(tok, num_tokens: int) -> list[int]:
    """``num_tokens`` token ids of held-out ShareGPT text (the demo models never trained on it)."""
    from train_demo_models import load_conversations, split_data

    heldout, _, _ = split_data(load_conversations(), 0, 400, 0)
    ids: list[int] = []
    for messages in heldout:
        for m in messages:
            ids += tok.encode(m["content"] + "\n", add_special_tokens=False)
        if len(ids) >= num_tokens:
            return ids[:num_tokens]
    raise SystemExit("not enough held-out ShareGPT text")


def engine_config(device: str, tier: bool):
    from tokenops.engine.core.config import EngineConfig

    extra = {"kv_offload_host_mb": HOST_MB} if tier else {}
    return EngineConfig(model=str(TARGET), device=device, kv_cache_tokens=POOL_TOKENS, **extra)


def bench_engine(lengths: list[int], reps: int, device: str, corpus: list[int]) -> list[dict]:
    from tokenops.engine.core.engine import LLMEngine
    from tokenops.engine.sampling.sampling import SamplingParams

    engines = {"recompute": LLMEngine(engine_config(device, False)), "tier": LLMEngine(engine_config(device, True))}
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    flood = corpus[-(POOL_TOKENS - 64):]
    for engine in engines.values():  # warm-up (allocator, kernels)
        engine.generate([corpus[:300]], one)
    rows, offset = [], 0
    for length in lengths:
        times: dict[str, list[float]] = {name: [] for name in engines}
        cached: dict[str, list[int]] = {name: [] for name in engines}
        for _ in range(reps):
            prefix = corpus[offset:offset + length]
            turn = corpus[offset + length:offset + length + TURN_TOKENS]
            offset += 97  # a fresh prefix each repetition
            for name, engine in engines.items():
                engine.generate([prefix], one)
                engine.generate([flood], one)  # evicts most of the prefix's blocks from the pool
                start = time.perf_counter()
                out = engine.generate([prefix + turn], one)[0]
                times[name].append(time.perf_counter() - start)
                cached[name].append(out.num_cached_tokens)
        stats = engines["tier"].stats()["kv_offload"]
        rows.append({"prefix": length, "recompute_ms": 1000 * statistics.median(times["recompute"]),
                     "tier_ms": 1000 * statistics.median(times["tier"]),
                     "cached_recompute": min(cached["recompute"]), "cached_tier": min(cached["tier"]),
                     "tier_loaded_blocks": stats["loaded_blocks"]})
    return rows


def bench_serve(lengths: list[int], reps: int, corpus: list[int], tok) -> list[dict]:
    import openai

    from tokenops.testing_serve import ServeProcess

    base = f"[engine]\nkv_cache_tokens = {POOL_TOKENS}\n"
    configs = {"recompute": base,
               "tier": base + f"[plugins.kv_offload]\nenabled = true\nhost_mb = {HOST_MB}\n"}
    text = lambda ids: tok.decode(ids)  # noqa: E731
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        servers = {name: ServeProcess(Path(tmp) / name, config=cfg, store=False) for name, cfg in configs.items()}
        try:
            for srv in servers.values():
                srv.start()
            clients = {name: openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
                       for name, srv in servers.items()}
            model = clients["tier"].models.list().data[0].id

            def first_token_s(client, prompt: str) -> float:
                start = time.perf_counter()
                stream = client.completions.create(model=model, prompt=prompt, max_tokens=2, stream=True,
                                                   temperature=0)
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].text:
                        elapsed = time.perf_counter() - start
                        stream.close()
                        return elapsed
                return time.perf_counter() - start

            flood = text(corpus[-(POOL_TOKENS - 200):])
            offset = 50_000 % max(1, len(corpus) - 4000)
            for length in lengths:
                times: dict[str, list[float]] = {name: [] for name in servers}
                for _ in range(reps):
                    prefix = text(corpus[offset:offset + length])
                    turn = text(corpus[offset + length:offset + length + TURN_TOKENS])
                    offset += 97
                    for name, client in clients.items():
                        client.completions.create(model=model, prompt=prefix, max_tokens=1)
                        client.completions.create(model=model, prompt=flood, max_tokens=1)
                        times[name].append(first_token_s(client, prefix + turn))
                rows.append({"prefix": length, "recompute_ms": 1000 * statistics.median(times["recompute"]),
                             "tier_ms": 1000 * statistics.median(times["tier"])})
            metrics = __import__("httpx").get(servers["tier"].url + "/metrics").text
            hits = [line for line in metrics.splitlines() if line.startswith("tokenops:kv_offload_hits_total")]
            print("through serve, tier server:", *hits)
        finally:
            for srv in servers.values():
                srv.stop()
    return rows


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'prefix tokens':>13} {'recompute TTFT ms':>18} {'offload tier TTFT ms':>21} {'speed-up':>9}"
          + ("  cached tokens (recompute / tier)" if "cached_tier" in rows[0] else ""))
    for r in rows:
        line = f"{r['prefix']:>13} {r['recompute_ms']:>18.1f} {r['tier_ms']:>21.1f} {r['recompute_ms'] / r['tier_ms']:>8.1f}x"
        if "cached_tier" in r:
            line += f"  {r['cached_recompute']} / {r['cached_tier']}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1500])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--serve", action="store_true", help="also measure through two tokenops serve processes")
    args = parser.parse_args()
    if max(args.lengths) + TURN_TOKENS >= POOL_TOKENS:
        raise SystemExit(f"prefix lengths must leave room for a {TURN_TOKENS}-token turn in {POOL_TOKENS} tokens")
    from tokenops.engine.core.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(TARGET)
    corpus = text_tokens(tok, 80_000)
    print(f"demo target model ({TARGET.name}), KV pool {POOL_TOKENS} tokens, offload tier {HOST_MB} MB host memory, "
          f"new turn {TURN_TOKENS} tokens, median of {args.reps}, device {args.device}")
    print_rows("engine (in-process LLMEngine)", bench_engine(args.lengths, args.reps, args.device, corpus))
    if args.serve:
        print_rows("through tokenops serve (openai SDK, streamed /v1/completions)",
                   bench_serve(args.lengths, args.reps, corpus, tok))


if __name__ == "__main__":
    main()
