"""Weight quantization and KV-cache options: memory, speed and held-out perplexity.

Rows (all on the demo target, ``tokenops/demo_models/target``, or on a random
~50M-parameter Llama when the demo model is absent -- the output says which):

- weights fp32, bf16, int8 (per-channel), int4 (group-wise) via the quantization
  plugin (``tokenops_transform_model``);
- KV cache int8 (fp32 weights), and sink + window eviction (fp32).

Perplexity is measured through the engine's own runner and paged cache on
held-out ShareGPT conversations (the demo models' held-out split): each text of
``--ctx`` tokens is fed in chunks of ``--chunk`` tokens with logits at every
position, so all but the first chunk attend to K/V read back from the cache (which
is what the int8 KV cache and eviction change). Speed: greedy generation of
``--max-tokens`` tokens for ``--batch`` concurrent requests through ``LLMEngine``.

    .venv/bin/python tests/benchmarks/quantization.py
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tokenops" / "demo_models" / "target"
sys.path.insert(0, str(ROOT / "scripts"))


def heldout_texts(tok, num: int, ctx: int) -> list[list[int]]:
    from train_demo_models import load_conversations, render, split_data

    heldout, _, _ = split_data(load_conversations(), 0, 400, 0)
    out = []
    for messages in heldout:
        ids = tok.encode(render(messages), add_special_tokens=False)
        if len(ids) >= ctx:
            out.append(ids[:ctx])
        if len(out) == num:
            break
    return out


def random_llama(path: Path) -> Path:
    """A random ~50M-parameter Llama with the tiny test tokenizer (demo model absent)."""
    import transformers as tf

    sys.path.insert(0, str(ROOT / "tests" / "engine"))
    from tiny_models import write_tokenizer

    if not (path / "config.json").exists():
        config = tf.LlamaConfig(vocab_size=320, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                                num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048)
        tf.LlamaForCausalLM(config).save_pretrained(str(path))
        write_tokenizer(path)
    return path


def perplexity(runner, texts, chunk: int, policy=None) -> float:
    import torch

    from tokenops.engine.core.batch import ChunkInput

    bs = runner.block_size
    total_nll, total = 0.0, 0
    for ids in texts:
        table = list(range(-(-len(ids) // bs)))
        for start in range(0, len(ids) - 1, chunk):
            piece = ids[start:start + chunk]
            if policy is not None:
                for i in policy.blocks_to_evict(start, bs, table):
                    table[i] = -1
            logits = runner.execute([ChunkInput(piece, start, table, num_logits=len(piece))])
            targets = torch.tensor(ids[start + 1:start + 1 + len(piece)])
            logits = logits[: len(targets)]
            total_nll += float(torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum"))
            total += len(targets)
    return math.exp(total_nll / total)


def weight_bytes(model) -> int:
    from tokenops.engine.kernels.weight_layout import packed_bytes

    seen, num = set(), packed_bytes(model)
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            num += t.numel() * t.element_size()
    return num


def tokens_per_s(config, prompts, max_tokens: int) -> float:
    from tokenops.engine.sampling.sampling import SamplingParams
    from tokenops.policy_hooks import build_engine

    engine = build_engine(config)  # with the plugins' transforms, as tokenops serve builds it
    engine.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2))
    start = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--texts", type=int, default=12, help="held-out texts for perplexity")
    p.add_argument("--ctx", type=int, default=512, help="tokens per text")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sink", type=int, default=4)
    p.add_argument("--window", type=int, default=128)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    import tokenops_plugins.model_optimization.quantization as quant
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner
    from tokenops.engine.core.tokenizer import Tokenizer
    from tokenops.policy_hooks import collect_policies
    from tokenops_plugins.model_optimization.kv_policy import SinkWindowPolicy

    if (DEMO / "model.safetensors").exists():
        model, label = DEMO, "demo target (tokenops/demo_models/target)"
        tok = Tokenizer.from_dir(model)
        texts = heldout_texts(tok, args.texts, args.ctx)
        prompts = [t[:64] for t in texts[: args.batch]]
    else:
        model, label = random_llama(Path("/tmp/tokenops_bench_llama50m")), "RANDOM ~50M Llama (demo model absent)"
        gen = torch.Generator().manual_seed(0)
        texts = [torch.randint(0, 300, (args.ctx,), generator=gen).tolist() for _ in range(args.texts)]
        prompts = [t[:64] for t in texts[: args.batch]]
    print(f"# model: {label}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, torch threads "
          f"{args.threads}; perplexity on {len(texts)} held-out texts x {args.ctx} tokens (chunks of {args.chunk}); "
          f"speed: {args.batch} requests x {args.max_tokens} greedy tokens")
    rows = [("fp32", dict(dtype="float32"), "none", None),
            ("bf16", dict(dtype="bfloat16"), "none", None),
            ("int8 weights", dict(dtype="float32"), "int8", None),
            ("int4 weights (g128)", dict(dtype="float32"), "int4", None),
            ("int8 KV cache", dict(dtype="float32", kv_cache_dtype="int8"), "none", None),
            (f"sink {args.sink} + window {args.window}", dict(dtype="float32"), "none",
             SinkWindowPolicy(args.sink, args.window))]
    print(f"{'config':<24}{'weights MB':>11}{'KV B/token':>11}{'tok/s':>8}{'ppl':>9}{'ppl change':>11}")
    base_ppl = None
    for name, overrides, mode, policy in rows:
        quant._settings["weights"] = mode
        config = EngineConfig(model=str(model), device="cpu", torch_threads=args.threads, kv_cache_tokens=8192,
                              max_num_seqs=args.batch, **overrides)
        policies = collect_policies(config)  # the quantization plugin's transform, as serve applies it
        runner = ModelRunner(config, policies.transforms, policies.compile)
        ppl = perplexity(runner, texts, args.chunk, policy)
        kv_per_token = runner.kv_cache_bytes // (runner.num_blocks * runner.block_size)
        wbytes = weight_bytes(runner.model)
        del runner
        kw = dict(overrides)
        if policy is not None:
            kw.update(kv_sink_tokens=args.sink, kv_window_tokens=args.window)
        rate = tokens_per_s(EngineConfig(model=str(model), device="cpu", torch_threads=args.threads,
                                         kv_cache_tokens=8192, max_num_seqs=args.batch, **kw), prompts, args.max_tokens)
        base_ppl = base_ppl or ppl
        print(f"{name:<24}{wbytes / 1e6:>11.2f}{kv_per_token:>11}{rate:>8.1f}{ppl:>9.3f}"
              f"{100 * (ppl / base_ppl - 1):>10.2f}%", flush=True)
    quant._settings["weights"] = "none"
    if policy is not None:
        print(f"# sink+window: a sequence holds at most {policy.max_blocks(16)} blocks of 16 "
              f"({policy.max_blocks(16) * 16} tokens) instead of {args.ctx // 16} at {args.ctx} tokens")


if __name__ == "__main__":
    main()
