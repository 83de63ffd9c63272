"""Two-byte against one-byte activations in the quantized integer products (``quant_act_bytes``, issue 50).

Products: packed Q4_K / Q6_K weights of Qwen2.5-1.5B's shapes (random blocks), one thread, the calling
thread's CPU time per call (best of ``--repeat``: robust on a shared box), at 1 / 16 / 64 rows, with
two bytes and with one. ``--engine FILE``: that GGUF in the engine (the fused step where it runs), one
thread, process CPU time: perplexity over ``--windows`` held-out windows of 512 tokens (the texts of
``models_vs_llamacpp.py``), the best 512-token prefill and the median batch-1 decode step, two bytes
then one.

Run: ``.venv/bin/python tests/benchmarks/quant_act_bytes.py [--rows 1,16,64] [--bytes 2,1] [--lm-head]
[--engine FILE --windows 2 [--batch 16]]``. ``TOKENOPS_CPU=avx2`` in the environment measures the Haswell-class build (no
VNNI, no AVX-512: the ``maddubs`` kernels); the first line printed names the build. ``--lm-head`` adds
Qwen2.5-1.5B's Q6_K output layer (151936 x 1536, 191 MB: products from memory, not the caches).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QT
from tokenops.engine.kernels import switches
from tokenops.engine.kernels.quant_kernels import Method, get_kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_blocks import random_raw  # noqa: E402

SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}
LM_HEAD = (151936, 1536)


def best_cpu(fn: Callable[[], object], repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


def products(rows: list[int], repeat: int, act_bytes: list[int], lm_head: bool) -> None:
    switches.apply(dataclasses.replace(switches.current, cpu_isa=switches.env_isa()))  # TOKENOPS_CPU
    k = get_kernels()
    assert k is not None and k.has_avx2, "needs the SIMD kernels"
    names = " / ".join(f"{ab} byte(s)" for ab in act_bytes)
    print(f"packed products, {k.isa}, 1 thread, CPU ms per call (best of {repeat}), {names}:")
    for qtype in (QT.Q4_K, QT.Q6_K):
        shapes = dict(SHAPES, lm_head=LM_HEAD) if lm_head and qtype == QT.Q6_K else SHAPES
        for name, (n, kk) in shapes.items():
            packed = k.pack(random_raw(qtype, n, kk), qtype, kk)
            assert packed is not None
            cells = []
            for r in rows:
                x = torch.randn(r, kk)
                t = []
                call = lambda x=x, q=qtype, kk=kk, p=packed: k.linear(x, None, q, kk, Method.GEMV, 1, p)  # noqa: E731
                for ab in act_bytes:
                    k.set_act_bytes(ab)
                    t.append(best_cpu(call, repeat))
                ratio = f" ({t[-1] / t[0]:.2f}x)" if len(t) > 1 else ""
                cells.append(f"{r} rows " + " / ".join(f"{v * 1e3:.3f}" for v in t) + ratio)
            print(f"  {qtype.name} {name} {n}x{kk}: " + ", ".join(cells), flush=True)
    k.set_act_bytes(None)


def engine(file: Path, windows_n: int, act_bytes: list[int], batch: int = 0) -> None:
    from gguf_parity import held_out_texts, windows
    from tokenops.engine.core.batch import ChunkInput
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    text = "\n\n".join(held_out_texts(15000, 600)[200:])
    wins, _, _ = windows(file, text, 512, windows_n)
    table = list(range(600 // 16 + 2))
    for ab in act_bytes:  # a runner per setting: a runner applies its own config's switches at each step
        config = EngineConfig(
            model=str(file), device="cpu", block_size=16, kv_cache_tokens=2048, torch_threads=1, quant_act_bytes=ab
        )
        runner = ModelRunner(config)
        print(f"{file.name}: fused step {runner.fused_decode is not None}, 1 thread, process CPU time", flush=True)
        nll, count, prefill = 0.0, 0, []
        for ids in wins:
            t0 = time.process_time()
            logits = runner.execute([ChunkInput(ids, 0, table, num_logits=len(ids))])
            prefill.append(time.process_time() - t0)
            lp = torch.log_softmax(logits.double(), -1)
            for i in range(len(ids) // 2, len(ids) - 1):
                nll -= float(lp[i, ids[i + 1]])
                count += 1
        seq = list(wins[0][:64])
        logits = runner.execute([ChunkInput(seq, 0, table)])[0]
        steps = []
        for _ in range(12):
            seq.append(int(logits.argmax()))
            t0 = time.process_time()
            logits = runner.execute([ChunkInput(seq[-1:], len(seq) - 1, table)])[0]
            steps.append(time.process_time() - t0)
        print(
            f"  {ab} byte(s): perplexity {math.exp(nll / count):.4f} ({windows_n} x 512), 512-token prefill "
            f"{min(prefill):.2f} s, decode step {sorted(steps)[len(steps) // 2] * 1e3:.1f} ms",
            flush=True,
        )
        if batch > 1:
            print(f"  {ab} byte(s): decode step of {batch} sequences {batch_step(runner, wins[0], batch) * 1e3:.1f} ms")
        del runner, logits


def batch_step(runner: object, ids: list[int], batch: int) -> float:
    """The median process CPU time of a decode step of ``batch`` sequences (64-token prompts, 8 steps)."""
    from tokenops.engine.core.batch import ChunkInput

    blocks = 64 // 16 + 2  # blocks per sequence: the prompt and the steps
    tables = [list(range(i * blocks, (i + 1) * blocks)) for i in range(batch)]
    seqs = [list(ids[i : i + 64]) for i in range(batch)]
    logits = runner.execute([ChunkInput(s, 0, t) for s, t in zip(seqs, tables, strict=True)])  # type: ignore[attr-defined]
    steps = []
    for _ in range(8):
        for s, row in zip(seqs, logits, strict=True):
            s.append(int(row.argmax()))
        t0 = time.process_time()
        logits = runner.execute([ChunkInput(s[-1:], len(s) - 1, t) for s, t in zip(seqs, tables, strict=True)])  # type: ignore[attr-defined]
        steps.append(time.process_time() - t0)
    return sorted(steps)[len(steps) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--engine", type=Path, default=None, help="a GGUF file: also the engine's figures")
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--batch", type=int, default=0, help="with --engine: also a decode step of this many sequences")
    ap.add_argument("--bytes", default="2,1", help="activation bytes to measure, in order")
    ap.add_argument("--lm-head", action="store_true", help="also the Q6_K lm_head shape (151936 x 1536)")
    args = ap.parse_args()
    act_bytes = [int(b) for b in args.bytes.split(",")]
    products([int(r) for r in args.rows.split(",")], args.repeat, act_bytes, args.lm_head)
    if args.engine is not None:
        engine(args.engine.expanduser(), args.windows, act_bytes, args.batch)


if __name__ == "__main__":
    main()
