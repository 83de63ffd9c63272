"""CPU time per call of the quantized kernels' paths on SmolLM2-135M's shapes, one thread, best of N:
the weight in GGUF's layout (the path ``linear`` picks for it: the integer GEMV up to 8 rows, the
float32-panel GEMM above), packed with the 256-bit kernels, and packed with the 512-bit kernels
(AVX-512 VNNI, Q8_0/Q4_0/Q4_1 only; ``-`` where the CPU or the type has none).

CPU time of the calling thread (``time.thread_time``; with one thread the kernels run on it), the best
of ``--repeat`` calls after a warm-up: on a shared box the best is the figure least disturbed by other
jobs. Shapes (out x in): down 576x1536, gate_up 3072x576 (the fused step's gate and up in one
weight), lm_head 49152x576; the K-quants only on down (their 256-value super-blocks do not divide 576). Random blocks (``tests/engine/quant_blocks.py``): the kernels' speed does
not depend on the values.

Run: ``.venv/bin/python tests/benchmarks/quant_paths.py [--qtypes Q4_1,Q8_0,Q4_K,Q5_K,Q6_K]
[--rows 1,4,64,512] [--repeat 20]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QT

from tokenops.engine.quant_kernels import Method, QuantKernels, get_kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from quant_blocks import K_QUANTS, random_raw  # noqa: E402

SHAPES = {"down": (576, 1536), "gate_up": (3072, 576), "lm_head": (49152, 576)}


def best_cpu(fn: Callable[[], object], repeat: int) -> float:
    """The least thread CPU time of ``repeat`` calls, after one warm-up call (seconds)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


def paths(k: QuantKernels, qtype: QT, shape: str, rows: int, repeat: int) -> list[float | None]:
    out_features, in_features = SHAPES[shape]
    raw = random_raw(qtype, out_features, in_features)
    packed = k.pack(raw, qtype, in_features)
    x = torch.randn(rows, in_features)
    n = repeat if rows * out_features * in_features < 1e9 else max(3, repeat // 5)  # big calls: fewer
    res: list[float | None] = [best_cpu(lambda: k.linear(x, raw, qtype, in_features, Method.AUTO, 1), n)]
    for wide in (False, True):
        if packed is None or (wide and not k.set_avx512(True)):
            res.append(None)
            continue
        k.set_avx512(wide)
        res.append(best_cpu(lambda: k.linear(x, None, qtype, in_features, Method.GEMV, 1, packed), n))
    k.set_avx512(True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qtypes", default="Q4_1,Q8_0,Q4_K,Q5_K,Q6_K")
    ap.add_argument("--rows", default="1,4,64,512")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    k = get_kernels()
    assert k is not None, "no C compiler: the kernels could not be built"
    print(f"kernels: avx2={k.has_avx2} vnni={k.has_vnni} avx512={k.has_avx512}; 1 thread, CPU us per call, best")
    print(
        f"{'type':5} {'shape':8} {'rows':>4} {'GGUF layout':>12} {'packed 256':>11} {'packed 512':>11} {'512/256':>8}"
    )
    for qname in args.qtypes.split(","):
        for shape in args.shapes.split(","):
            if SHAPES[shape][1] % (256 if QT[qname] in K_QUANTS else 32):
                continue  # K-quant rows are 256-value super-blocks: 576 wide cannot be one
            for rows in (int(r) for r in args.rows.split(",")):
                flat, p256, p512 = paths(k, QT[qname], shape, rows, args.repeat)
                cells = [f"{v * 1e6:.1f}" if v is not None else "-" for v in (flat, p256, p512)]
                ratio = f"{p512 / p256:.2f}" if p512 is not None and p256 else "-"
                print(
                    f"{qname:5} {shape:8} {rows:4} {cells[0]:>12} {cells[1]:>11} {cells[2]:>11} {ratio:>8}", flush=True
                )


if __name__ == "__main__":
    main()
