"""CPU time per call of the quantized kernels' paths on SmolLM2-135M's shapes, one thread, best of N:
the weight in GGUF's layout (the path ``linear`` picks for it: the integer GEMV up to 8 rows, the
float32-panel GEMM above), packed with the 256-bit kernels, packed with the 512-bit kernels
(AVX-512 VNNI) and with AMX tiles (AMX-INT8, Q8_0/Q4_0/Q4_1, from ``QuantKernels.amx_min_rows``
rows, 3 unless ``TOKENOPS_QUANT_AMX_MIN_ROWS`` says otherwise: below that the 512-bit kernel runs
either way; ``-`` where the CPU or the type has none).

CPU time of the calling thread (``time.thread_time``; with one thread the kernels run on it), the best
of ``--repeat`` calls after a warm-up: on a shared box the best is the figure least disturbed by other
jobs. Shapes (out x in): down 576x1536, gate_up 3072x576 (the fused step's gate and up in one
weight), lm_head 49152x576; the K-quants only on down (their 256-value super-blocks do not divide 576). Random blocks (``tests/engine/quant_blocks.py``): the kernels' speed does
not depend on the values.

``--engine``: the packaged SmolLM2-135M Q4_1 in the engine's fused step instead (one thread), a
``--prompt``-token prefill and ``--decode`` batch-1 decode steps, process CPU time, best of 5, with
``TOKENOPS_QUANT_AVX512=0``, then ``=1`` with ``TOKENOPS_QUANT_AMX=0`` and with ``=1`` (each in its
own process: the variables are read once).

Run: ``.venv/bin/python tests/benchmarks/quant_paths.py [--qtypes Q4_1,Q8_0,Q4_K,Q5_K,Q6_K]
[--rows 1,4,64,512] [--repeat 20] [--engine [--prompt 512] [--decode 64]]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QT

from tokenops.engine.kernels.quant_kernels import Method, QuantKernels, get_kernels

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
    for wide, amx in ((False, False), (True, False), (True, True)):
        if packed is None or (wide and not k.set_avx512(True)) or (amx and (rows < k.amx_min_rows or not k.set_amx(True))):
            res.append(None)
            continue
        k.set_avx512(wide)
        k.set_amx(amx)
        res.append(best_cpu(lambda: k.linear(x, None, qtype, in_features, Method.GEMV, 1, packed), n))
    k.set_avx512(None)
    k.set_amx(None)
    return res


def engine_child(prompt: int, decode: int, repeat: int) -> None:
    """In a process whose ``TOKENOPS_QUANT_AVX512`` is set: the packaged SmolLM2 Q4_1 in the engine's
    fused step, 1 thread: a ``prompt``-token prefill and ``decode`` batch-1 steps, process CPU time,
    best of ``repeat``."""
    from tokenops.engine.core.batch import ChunkInput
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from real_model import gguf_path

    runner = ModelRunner(
        EngineConfig(model=str(gguf_path()), device="cpu", block_size=16, kv_cache_tokens=2048, torch_threads=1)
    )
    assert runner.fused_decode is not None
    ids = torch.randint(100, 40000, (prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    table = list(range((prompt + decode) // 16 + 1))
    best_prefill = best_decode = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        logits = runner.execute([ChunkInput(ids, 0, table)])[0]
        t1 = time.process_time()
        seq = list(ids)
        for _ in range(decode):
            seq.append(int(logits.argmax()))
            logits = runner.execute([ChunkInput(seq[-1:], len(seq) - 1, table)])[0]
        t2 = time.process_time()
        best_prefill, best_decode = min(best_prefill, t1 - t0), min(best_decode, (t2 - t1) / decode)
    print(f"{best_prefill * 1e3:.1f} {best_decode * 1e3:.2f}")


def engine(prompt: int, decode: int, repeat: int) -> None:
    """:func:`engine_child` with the 256-bit and the 512-bit kernels, each in its own process."""
    import os
    import subprocess

    print(f"SmolLM2-135M Q4_1, fused step, 1 thread, process CPU time, best of {repeat}:")
    for flag, amx, name in (("0", "0", "256-bit"), ("1", "0", "512-bit"), ("1", "1", "512-bit + AMX")):
        env = {**os.environ, "TOKENOPS_QUANT_AVX512": flag, "TOKENOPS_QUANT_AMX": amx, "TOKENOPS_QUANT_EXACT": "0"}
        cmd = [sys.executable, __file__, "--engine-child", f"{prompt},{decode},{repeat}"]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.split()
        print(f"  {name}: prefill of {prompt} tokens {out[-2]} ms, batch-1 decode {out[-1]} ms per token", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qtypes", default="Q4_1,Q8_0,Q4_K,Q5_K,Q6_K")
    ap.add_argument("--rows", default="1,4,64,512")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--engine", action="store_true", help="the real model's prefill and decode: 256-bit, 512-bit, AMX")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--engine-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.engine_child:
        engine_child(*(int(v) for v in args.engine_child.split(",")))
        return
    if args.engine:
        engine(args.prompt, args.decode, min(args.repeat, 5))
        return
    k = get_kernels()
    assert k is not None, "no C compiler: the kernels could not be built"
    print(
        f"kernels: avx2={k.has_avx2} vnni={k.has_vnni} avx512={k.has_avx512} amx={k.has_amx}; "
        "1 thread, CPU us per call, best"
    )
    print(
        f"{'type':5} {'shape':8} {'rows':>4} {'GGUF layout':>12} {'packed 256':>11} {'packed 512':>11} "
        f"{'512/256':>8} {'AMX':>10} {'AMX/512':>8}"
    )
    for qname in args.qtypes.split(","):
        for shape in args.shapes.split(","):
            if SHAPES[shape][1] % (256 if QT[qname] in K_QUANTS else 32):
                continue  # K-quant rows are 256-value super-blocks: 576 wide cannot be one
            for rows in (int(r) for r in args.rows.split(",")):
                flat, p256, p512, amx = paths(k, QT[qname], shape, rows, args.repeat)
                cells = [f"{v * 1e6:.1f}" if v is not None else "-" for v in (flat, p256, p512, amx)]
                ratio = f"{p512 / p256:.2f}" if p512 is not None and p256 else "-"
                amx_ratio = f"{amx / p512:.2f}" if amx is not None and p512 else "-"
                print(
                    f"{qname:5} {shape:8} {rows:4} {cells[0]:>12} {cells[1]:>11} {cells[2]:>11} {ratio:>8} "
                    f"{cells[3]:>10} {amx_ratio:>8}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
