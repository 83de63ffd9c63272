"""The fused decode step (``tokenops/engine/kernels/fused_decode.py``) in-process: where its time goes,
and how it compares with the PyTorch forward at 1-96 decode rows.

Builds the 32M-parameter Llama of ``engine_throughput.py --peer llamacpp`` (random weights,
hidden 512, 8 layers, 8/4 heads, vocab 8192, float32), then

- ``phases``: compiles a copy of the fused step's C source with timers after each phase
  (thread 0, after a barrier) and prints milliseconds per step for the QKV product, rotary +
  attention, the output projection, the gate/up product, the down projection and the
  vocabulary projection, at ``--phase-rows`` decode rows (default 1) and the given context
  length, plus the bandwidth the products reach (their weight bytes over their time);
- ``rows``: the same step for 1-96 decode rows through the fused call and through the
  PyTorch forward (oneDNN linear layers, the paged attention kernel), best of three
  interleaved rounds.

``--products`` instead times the panel products alone against oneDNN with prepacked weights on
the model's weight shapes at 1-512 rows.

Run: ``.venv/bin/python tests/benchmarks/fused_decode.py [--context 200] [--threads 2] [--products]``.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES = ["qkv", "rope + attention", "o_proj", "gate_up", "down", "lm_head"]


def _instrument(source: str) -> str:
    src = source.replace("#include <stdlib.h>", "#include <stdlib.h>\n#include <omp.h>\ndouble tk_t[16];\n"
                         "static double tk_last;\n#define TP(i) do { _Pragma(\"omp barrier\") if (omp_get_thread_num() "
                         "== 0) { double n = omp_get_wtime(); if ((i) >= 0) tk_t[(i)] += n - tk_last; tk_last = n; } } "
                         "while (0)", 1)
    # each phase is timed from the previous mark to the end of its product
    marks = [("gemm(h, HD, M, ly->wqkv", "TP(-1); ", " TP(0);"),
             ("gemm(att, H * D, M, ly->wo", "TP(1); ", " TP(2);"),
             ("gemm(h, HD, M, ly->wgu", "TP(-1); ", " TP(3);"),
             ("gemm(gu, 2 * I, M, ly->wd", "TP(-1); ", " TP(4);"),
             ("gemm(h, HD, L, lm_head", "TP(-1); ", " TP(5);")]
    for call, before, after in marks:
        at = src.index(call)
        end = src.index(";", at) + 1
        src = src[:at] + before + src[at:end] + after + src[end:]
    return src


def phases(runner, context: int, threads: int, num_rows: int = 1, steps: int = 200) -> None:
    from tokenops.engine.core.batch import ChunkInput
    from tokenops.engine.kernels.c_header import CSRC, bind, read

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(CSRC, Path(tmp) / "csrc")
        src, lib_path = Path(tmp) / "csrc" / "fused_decode.c", Path(tmp) / "fd.so"
        src.write_text(_instrument(src.read_text()))
        subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", str(src), "-o",
                        str(lib_path), "-lm"], check=True)
        lib = bind(ctypes.CDLL(str(lib_path)), read("fused_decode.h"))
    decoder = runner.fused_decode
    decoder._fn = lib.fused_decode_f32
    width = context // runner.block_size + 1  # num_rows decodes at the same context, each its own blocks
    chunk = [ChunkInput([5 + i], context, list(range(width * i, width * (i + 1)))) for i in range(num_rows)]
    for _ in range(5):
        decoder(chunk)
    timers = (ctypes.c_double * 16).in_dll(lib, "tk_t")
    for i in range(16):
        timers[i] = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        decoder(chunk)
    total = (time.perf_counter() - start) / steps * 1e3
    args = runner.args
    qkv = (args.num_heads + 2 * args.num_kv_heads) * args.head_dim
    weight_bytes = 4 * (args.num_layers * args.hidden_size * (qkv + args.num_heads * args.head_dim
                                                               + 3 * args.intermediate_size)
                        + args.vocab_size * args.hidden_size)
    print(f"fused step, {num_rows} row(s), context {context}, {threads} threads: {total:.2f} ms per call "
          f"({1e3 / total:.0f} steps/s)")
    gemv_ms = 0.0
    for i, name in enumerate(PHASES):
        ms = timers[i] / steps * 1e3
        gemv_ms += ms if name != "rope + attention" else 0.0
        print(f"  {name:<18} {ms:6.3f} ms")
    print(f"  matrix-vector products: {gemv_ms:.2f} ms for {weight_bytes / 1e6:.0f} MB of weights = "
          f"{weight_bytes / gemv_ms / 1e6:.1f} GB/s; the rest of the call "
          f"{total - sum(timers[i] for i in range(6)) / steps * 1e3:.2f} ms")


def rows(runner, sizes: list[int]) -> None:
    from tokenops.engine.core.batch import ChunkInput

    decoder = runner.fused_decode
    # contexts 150-395 tokens, like decodes of the clipped ShareGPT workload; 25 blocks of 16 each
    chunks = [ChunkInput([5 + i], 150 + 5 * (i % 50), list(range(25 * i, 25 * i + 25))) for i in range(max(sizes))]
    print("decode rows  fused step  PyTorch forward  ratio (best of 3 interleaved rounds, 40 steps each)")
    for m in sizes:
        best = {}
        for _ in range(3):
            for name in ("fused", "torch"):
                runner.fused_decode = decoder if name == "fused" else None
                for _ in range(3):
                    runner.execute(chunks[:m])
                start = time.perf_counter()
                for _ in range(40):
                    runner.execute(chunks[:m])
                ms = (time.perf_counter() - start) / 40 * 1e3
                best[name] = min(best.get(name, ms), ms)
        print(f"{m:>11}  {best['fused']:7.2f} ms  {best['torch']:12.2f} ms  {best['torch'] / best['fused']:5.2f}x")
    runner.fused_decode = decoder


def products(threads: int, sizes: list[int]) -> None:
    """The panel products (``linear_panels``) against oneDNN with prepacked weights on the benchmark
    model's five weight shapes, at each row count: GFLOP/s over all five, best of 10 calls each,
    the two interleaved per shape."""
    import torch
    from tokenops.engine.kernels import fused_decode, panels

    lib = fused_decode._library()
    shapes = [(1024, 512), (512, 512), (2816, 512), (512, 1408), (8192, 512)]  # qkv, o, gate/up, down, vocab

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(10):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    print("rows  panel products  oneDNN (GFLOP/s over the five weight shapes of one layer + vocabulary)")
    for m in sizes:
        flops = spent_p = spent_o = 0.0
        for n, k in shapes:
            w, x = torch.randn(n, k), torch.randn(m, k)
            arena = torch.empty(panels._panelled_size(w))
            panels._pack_panels(w, arena)
            y = torch.empty(m, n)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
            for _ in range(2):
                spent_p += best(lambda: lib.linear_panels(x.data_ptr(), m, arena.data_ptr(), None, y.data_ptr(), n, k,
                                                          threads)) / 2
                spent_o += best(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")) / 2
            flops += 2 * m * n * k
        print(f"{m:>4}  {flops / spent_p / 1e9:9.1f}  {flops / spent_o / 1e9:12.1f}   {spent_o / spent_p:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--phase-rows", type=int, default=1, help="decode rows of the per-phase timing")
    ap.add_argument("--products", action="store_true",
                    help="only the panel products against oneDNN at 1, 16, 48, 128 and 512 rows")
    ap.add_argument("--rows", default="1,2,4,8,16,24,48,96")
    args = ap.parse_args()
    import torch
    from engine_throughput import PEER_MODEL_CONFIG, build_model
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine

    torch.set_num_threads(args.threads)
    sizes = [int(x) for x in args.rows.split(",") if x]
    if args.products:
        return products(args.threads, [1, 16, 48, 128, 512])
    with tempfile.TemporaryDirectory(prefix="tokenops-fused-") as tmp:
        path = Path(tmp) / "llama-32m"
        build_model(path, 0, PEER_MODEL_CONFIG)
        # the PyTorch forward of the comparison multiplies through oneDNN (under weight_layout "auto" it
        # would share the fused step's panel products)
        engine = LLMEngine(EngineConfig(model=str(path), device="cpu", decode_kernel="native", weight_layout="onednn",
                                        torch_threads=args.threads,
                                        kv_cache_tokens=max(16384, 400 * max(sizes), (args.context + 16) * args.phase_rows)))
        phases(engine.runner, args.context, args.threads, args.phase_rows)
        rows(engine.runner, sizes)


if __name__ == "__main__":
    sys.exit(main())
