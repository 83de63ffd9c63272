"""torch.compile plugin: decode tokens/s with and without it.

Both runs use the same engine settings on the demo target (or the embedded default
model when the demo model is absent). The compiled run first generates a warm-up
batch so compilation (dynamic shapes) happens before timing; the warm-up time is
printed separately. ``--backend`` is passed as the plugin's ``mode`` setting.

    .venv/bin/python tests/benchmarks/compile_speed.py
    .venv/bin/python tests/benchmarks/compile_speed.py --batch 1 --max-tokens 64
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tokenops" / "demo_models" / "target"


def run(model, batch: int, max_tokens: int, threads: int, compiled: bool) -> tuple[float, float]:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.sampling.sampling import SamplingParams
    from tokenops.plugin_manager import get_plugin
    from tokenops.policy_hooks import build_engine  # the plugins transform and compile, as in serve

    compile_plugin = get_plugin("compile")  # the process's instance: what build_engine's hooks call
    compile_plugin.conf["enabled"] = compiled
    try:
        engine = build_engine(EngineConfig(model=model, device="cpu", torch_threads=threads, max_num_seqs=batch,
                                        kv_cache_tokens=8192))
        prompts = [[1] + list(range(100 + 7 * i, 140 + 7 * i)) for i in range(batch)]
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        start = time.perf_counter()
        engine.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))  # warm-up
        warmup = time.perf_counter() - start
        start = time.perf_counter()
        outs = engine.generate(prompts, params)
        rate = sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)
    finally:
        compile_plugin.conf["enabled"] = False
    return rate, warmup


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    model = str(DEMO) if (DEMO / "model.safetensors").exists() else None
    print(f"# model: {model or 'embedded default model'}; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}, torch {torch.__version__}, threads {args.threads}, greedy {args.max_tokens} tokens")
    print(f"{'batch':>5}{'eager tok/s':>13}{'compiled tok/s':>16}{'speed-up':>10}{'compile warm-up s':>19}")
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        eager, _ = run(model, batch, args.max_tokens, args.threads, False)
        try:
            compiled, warmup = run(model, batch, args.max_tokens, args.threads, True)
        except Exception as e:  # e.g. no C++ compiler for inductor
            print(f"{batch:>5}{eager:>13.1f}  compile failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        print(f"{batch:>5}{eager:>13.1f}{compiled:>16.1f}{compiled / eager:>9.2f}x{warmup:>19.1f}", flush=True)


if __name__ == "__main__":
    main()
