"""The quantized linear kernels (``tokenops/engine/kernels/quant_kernels.py``) on SmolLM2-135M's weight shapes:
GB/s (encoded weight bytes over time) and GFLOP/s of each path, against decoding the weight and
running ``torch``'s ``F.linear`` on it, and against ``F.linear`` on a float32 weight held in memory.

Shapes (out x in): q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536, lm_head 49152x576.
Weights are random blocks (``gguf.quants.quantize`` of Gaussian weights for Q8_0/Q4_0/Q4_1, random
valid blocks for the K-quants; the kernels' speed does not depend on the values).

The ``token`` lines run one decode token's products (30 layers of q, k, v, o, gate, up, down plus the
lm_head, each its own weight, in order) at 1 row: the time the linear layers of a batch-1 decode step
take, the bytes they read, and the bound they set on tokens per second.

Run: ``.venv/bin/python tests/benchmarks/quant_kernels.py [--qtypes Q4_1,Q8_0] [--rows 1,16,48,512]
[--threads 2] [--no-torch]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QT

from tokenops.engine.kernels.quant_kernels import Method, QuantKernels, get_kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from quant_blocks import K_QUANTS, random_raw  # noqa: E402

SHAPES = {"q/o": (576, 576), "k/v": (192, 576), "gate/up": (1536, 576), "down": (576, 1536),
          "lm_head": (49152, 576)}
LAYER = [("q/o", 2), ("k/v", 2), ("gate/up", 2), ("down", 1)]  # (shape, times per layer)
NUM_LAYERS = 30


def best_time(fn: Callable[[], object], min_time: float = 0.15) -> float:
    """Median of repeated calls after a warm-up, repeating until ``min_time`` seconds have passed."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_time or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_shape(k: QuantKernels, qtype: QT, name: str, rows: int, threads: int, torch_too: bool) -> dict[str, float]:
    out_features, in_features = SHAPES[name]
    if in_features % (256 if qtype in K_QUANTS else 32):
        return {}
    raw = random_raw(qtype, out_features, in_features)
    x = torch.randn(rows, in_features)
    res: dict[str, float] = {}
    methods = [Method.GEMV, Method.GEMV_MADDUBS, Method.GEMM]
    for m in methods:
        res[m.name] = best_time(lambda m=m: k.linear(x, raw, qtype, in_features, m, threads))
    packed = k.pack(raw, qtype, in_features)
    if packed is not None:
        for m in methods:
            res[f"packed {m.name}"] = best_time(lambda m=m: k.linear(x, None, qtype, in_features, m, threads, packed))
    if torch_too:
        w = k.dequantize(raw, qtype, in_features)
        res["dequant+F.linear"] = best_time(
            lambda: torch.nn.functional.linear(x, k.dequantize(raw, qtype, in_features)))
        res["fp32 F.linear"] = best_time(lambda: torch.nn.functional.linear(x, w))
    res["_bytes"] = raw.numel()
    res["_flops"] = 2.0 * rows * out_features * in_features
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qtypes", default="Q4_1,Q8_0")
    ap.add_argument("--rows", default="1,16,48,512")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--no-torch", action="store_true", help="skip the torch baselines")
    ap.add_argument("--head", default="Q8_0", help="the lm_head's type in the token lines (the file's: Q8_0)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    k = get_kernels()
    assert k is not None, "no C compiler: the kernels could not be built"
    print(f"kernels: avx2={k.has_avx2} vnni={k.has_vnni} threads={args.threads}")
    print(f"{'type':5} {'shape':8} {'rows':>4}  {'path':17} {'us':>9} {'GB/s':>7} {'GFLOP/s':>8}")
    for qname in args.qtypes.split(","):
        qtype = QT[qname]
        for rows in (int(r) for r in args.rows.split(",")):
            per_shape: dict[str, dict[str, float]] = {}
            for name in args.shapes.split(","):
                res = bench_shape(k, qtype, name, rows, args.threads, not args.no_torch)
                per_shape[name] = res
                for path, secs in res.items():
                    if path.startswith("_"):
                        continue
                    print(f"{qname:5} {name:8} {rows:4}  {path:17} {secs * 1e6:9.1f} "
                          f"{res['_bytes'] / secs / 1e9:7.2f} {res['_flops'] / secs / 1e9:8.2f}")
    if "1" in args.rows.split(","):
        for qname in args.qtypes.split(","):
            for packed in (False, True):
                token(k, QT[qname], QT[args.head], args.threads, packed)


def token(k: QuantKernels, qtype: QT, head_qtype: QT, threads: int, packed: bool) -> None:
    """One batch-1 decode token's linear layers, each its own weight as in the model (so the weights
    stream from memory as in a real step, not from a warm cache), called in the model's order."""
    layers = [name for name, times in LAYER for _ in range(times)]
    weights = [(random_raw(qtype, *SHAPES[n], seed=i), qtype, SHAPES[n][1])
               for i in range(NUM_LAYERS) for n in layers]
    weights.append((random_raw(head_qtype, *SHAPES["lm_head"]), head_qtype, SHAPES["lm_head"][1]))
    nbytes = sum(w.numel() for w, _, _ in weights)
    packs = [k.pack(w, t, n) if packed else None for w, t, n in weights]
    xs = {n: torch.randn(1, n) for n in (576, 1536)}

    def step() -> None:
        for (w, t, n), p in zip(weights, packs):
            k.linear(xs[n], None if p else w, t, n, Method.GEMV, threads, p)

    secs = best_time(step, min_time=1.0)
    print(f"token: {NUM_LAYERS} layers {qtype.name} + lm_head {head_qtype.name}{' packed' if packed else ''}: "
          f"{secs * 1e3:.2f} ms, {nbytes / 1e6:.1f} MB, {nbytes / secs / 1e9:.1f} GB/s, <= {1 / secs:.0f} tok/s")

if __name__ == "__main__":
    main()
