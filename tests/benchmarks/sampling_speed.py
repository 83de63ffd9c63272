"""The engine's token draw (inverse CDF: float64 cumsum + searchsorted) against
``torch.multinomial(probs, 1)``, the peer it replaced, on the same probabilities.

Prints milliseconds per draw for a batch of rows over a vocabulary (the engine's
way, with a cumulative-sum buffer kept between steps, and with a fresh one per
draw), the ratio to multinomial, and a frequency check that both draw from the
same distribution.

Run: .venv/bin/python tests/benchmarks/sampling_speed.py [--threads 1] [--rows 1,8,32] [--vocab 32000,128256]
"""

from __future__ import annotations

import argparse
import time

import torch

from tokenops.engine.sampling.sampling import draw


def per_call_ms(fn, repeats: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--vocab", default="32000,128256")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} thread(s); ms per draw of one token per row")
    print(f"{'rows':>5} {'vocab':>7} {'multinomial':>12} {'inverse CDF':>12} {'speed-up':>9} {'fresh buffer':>13}")
    for vocab in (int(v) for v in args.vocab.split(",")):
        for rows in (int(r) for r in args.rows.split(",")):
            probs = (torch.randn(rows, vocab, generator=g) * 3).softmax(dim=-1)
            mult = per_call_ms(lambda: torch.multinomial(probs, 1, generator=g), args.repeats)
            buf = torch.empty(rows, vocab, dtype=torch.float64)
            inv = per_call_ms(lambda: draw(probs, torch.rand(rows, generator=g, dtype=torch.float64), buf),
                              args.repeats)
            fresh = per_call_ms(lambda: draw(probs, torch.rand(rows, generator=g, dtype=torch.float64)), args.repeats)
            print(f"{rows:>5} {vocab:>7} {mult:>12.3f} {inv:>12.3f} {mult / inv:>8.1f}x {fresh:>13.3f}")
    # the same distribution: total variation distance between the two draws' frequencies on a small vocabulary
    p = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0])
    n = 400_000
    a = torch.bincount(torch.multinomial(p.expand(n, -1), 1, generator=g).view(-1), minlength=6).double() / n
    b = torch.bincount(draw(p.expand(n, -1), torch.rand(n, generator=g, dtype=torch.float64)), minlength=6).double() / n
    print(f"frequencies over {n} draws, p = {p.tolist()}")
    print(f"  multinomial  {[round(x, 4) for x in a.tolist()]}")
    print(f"  inverse CDF  {[round(x, 4) for x in b.tolist()]}")
    print(f"  total variation distance {0.5 * (a - b).abs().sum().item():.4f} (sampling noise ~0.002)")


if __name__ == "__main__":
    main()
