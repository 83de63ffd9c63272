"""What the penalties, ``logit_bias`` and ``min_tokens`` cost the sampler: milliseconds per call of
:func:`tokenops.engine.sampling.logits_processors.apply_processors` on a batch of rows with a context of
``--context`` tokens each, over a vocabulary, against the same batch asking for nothing (the transform
is skipped). The peer is vLLM's approach (batched counts per row); the figure to read is the cost
next to a decode step of the served model (tens of milliseconds on CPU for SmolLM2-135M).

With ``--model FOLDER`` it also times the engine end to end: 8 greedy requests of 64 tokens with none
and with all five transforms, alternated twice (tokens per second of each).

Run: .venv/bin/python tests/benchmarks/penalties_speed.py [--threads 1] [--rows 1,8,32] [--vocab 49152] [--context 512]
     [--model /tmp/tokenops-smollm2/SmolLM2-135M-Instruct]
"""

from __future__ import annotations

import argparse
import time

import torch

from tokenops.engine.sampling.logits_processors import apply_processors
from tokenops.engine.sampling.sampling import SamplingParams
from tokenops.engine.core.sequence import Sequence


def per_call_ms(fn, repeats: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats * 1000


def rows_of(num: int, vocab: int, context: int, **params) -> list[Sequence]:
    g = torch.Generator().manual_seed(0)
    seqs = []
    for _ in range(num):
        ids = torch.randint(0, vocab, (context,), generator=g).tolist()
        seq = Sequence("r", ids[: context // 2], SamplingParams(max_tokens=context, **params))
        seq.token_ids += ids[context // 2:]  # half prompt, half output
        seqs.append(seq)
    return seqs


def engine_ab(model: str, every: dict) -> None:
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=model))
    prompts = [f"Write a story about a dragon number {i}." for i in range(8)]
    for _ in range(2):
        for label, extra in (("none", {}), ("all five", every)):
            params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, **extra)
            t = time.perf_counter()
            outs = engine.generate(prompts, params)
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            print(f"engine, {label:>8}: {tokens / (time.perf_counter() - t):7.1f} tokens/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--model", default=None, help="a model folder: also time the engine end to end")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    every = dict(frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.2, logit_bias={1: 5.0, 2: -5.0},
                 min_tokens=1)
    print(f"vocab {args.vocab}, context {args.context} tokens per row, {args.threads} thread(s)")
    print(f"{'rows':>5} {'none ms':>9} {'all five ms':>12}")
    for num in (int(r) for r in args.rows.split(",")):
        logits = torch.randn(num, args.vocab)
        plain, full = rows_of(num, args.vocab, args.context), rows_of(num, args.vocab, args.context, **every)
        none_ms = per_call_ms(lambda: apply_processors(logits, plain, (0,)), args.repeats)
        all_ms = per_call_ms(lambda: apply_processors(logits, full, (0,)), args.repeats)
        print(f"{num:>5} {none_ms:>9.3f} {all_ms:>12.3f}")
    if args.model:
        engine_ab(args.model, every)


if __name__ == "__main__":
    main()
