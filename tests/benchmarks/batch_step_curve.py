"""A step's time against what it computes, on the default model in the engine alone (issue 55: how
much batch work an interactive step can carry): decode steps of 1..16 rows, prompt chunks of 16..512
tokens, and one decode row beside a prompt chunk (an interactive decode sharing its step with batch
prefill). Loads ``LLMEngine`` on SmolLM2-135M (GGUF, ``max_num_seqs`` 16, 2 torch threads, as
``batch_priority.py`` serves it) and times ``engine.step()`` with ``time.perf_counter`` and
``time.process_time``: on a shared box the minimum of a point's steps is the figure least disturbed by
other jobs (the median is printed beside it), and CPU-ms per step moves less than wall time.
With ``--threads 1`` on a loaded box the CPU-ms are steady (no OpenMP thread spinning while
descheduled, which inflates them with 2 threads), and the fit over them gives the curve's shape.
Prints each point, then the least-squares fits ``step = fixed + row_ms * decode rows`` and
``+ token_ms * prompt tokens``: the inputs of ``batch_priority_sim.py --step-ms --row-ms --token-ms``.

Run: ``.venv/bin/python tests/benchmarks/batch_step_curve.py [--steps 12] [--rows 1,2,4,8,16]
[--chunks 16,32,64,128,256,512]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

_n = 0


def _prompt(length: int) -> list[int]:
    global _n
    _n += 1
    return [(_n * 131 + j * 7) % 30000 + 100 for j in range(length)]  # no prefix shared with another


def timed_step(engine: Any) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    engine.step()
    return time.perf_counter() - w0, time.process_time() - c0


def drain(engine: Any) -> None:
    for rid in list(engine._requests):
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()


def decode_point(engine: Any, rows: int, steps: int) -> list[tuple[float, float]]:
    from tokenops.engine.sampling.sampling import SamplingParams

    params = SamplingParams(max_tokens=steps + 4, temperature=0.0, ignore_eos=True)
    for i in range(rows):
        engine.add_request(f"d{rows}-{i}-{time.monotonic_ns()}", _prompt(64), params)
    while engine.scheduler.waiting or any(s.is_prefill for s in engine.scheduler.running):
        engine.step()
    out = [timed_step(engine) for _ in range(steps)]
    drain(engine)
    return out


def prompt_point(engine: Any, tokens: int, steps: int, beside_decode: bool) -> list[tuple[float, float]]:
    """Steps that compute one whole ``tokens``-token prompt (and one decode row when ``beside_decode``)."""
    from tokenops.engine.sampling.sampling import SamplingParams

    out = []
    for k in range(steps):
        if beside_decode:
            params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
            engine.add_request(f"row-{tokens}-{k}", _prompt(32), params)
            while engine.scheduler.waiting or any(s.is_prefill for s in engine.scheduler.running):
                engine.step()
        engine.add_request(f"p{tokens}-{k}", _prompt(tokens), SamplingParams(max_tokens=1, temperature=0.0))
        out.append(timed_step(engine))
        drain(engine)
    return out


def fit(points: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """Least squares of ms = a + b * rows + c * prompt tokens over (rows, tokens, ms)."""
    import numpy as np

    x = np.array([[1.0, r, t] for r, t, _ in points])
    y = np.array([ms for _, _, ms in points])
    a, b, c = np.linalg.lstsq(x, y, rcond=None)[0]
    return float(a), float(b), float(c)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="timed steps per point")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--chunks", default="16,32,64,128,256,512")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from real_model import gguf_path
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine

    engine = LLMEngine(
        EngineConfig(model=str(gguf_path()), torch_threads=args.threads, max_num_seqs=16, max_num_batched_tokens=512)
    )
    decode_point(engine, 4, 4)  # warm up
    prompt_point(engine, 64, 2, False)
    rows: list[tuple[str, int, int, list[tuple[float, float]]]] = []
    for n in (int(x) for x in args.rows.split(",")):
        rows.append((f"decode, {n} rows", n, 0, decode_point(engine, n, args.steps)))
    for n in (int(x) for x in args.chunks.split(",")):
        rows.append((f"prompt, {n} tokens", 0, n, prompt_point(engine, n, max(3, args.steps // 3), False)))
    for n in (int(x) for x in args.chunks.split(",")):
        rows.append((f"1 row + prompt {n}", 1, n, prompt_point(engine, n, max(3, args.steps // 3), True)))
    print(f"{'step':<24}{'wall min':>10}{'wall med':>10}{'CPU-ms min':>12}{'CPU-ms med':>12}")
    mins: list[tuple[float, float, float]] = []
    cpu_mins: list[tuple[float, float, float]] = []
    for name, num_rows, tokens, samples in rows:
        walls, cpus = [1000 * w for w, _ in samples], [1000 * c for _, c in samples]
        mins.append((num_rows, tokens, min(walls)))
        cpu_mins.append((num_rows, tokens, min(cpus)))
        print(
            f"{name:<24}{min(walls):>8.1f}ms{statistics.median(walls):>8.1f}ms"
            f"{min(cpus):>12.1f}{statistics.median(cpus):>12.1f}"
        )
    for what, points in (("wall", mins), ("CPU", cpu_mins)):
        a, b, c = fit(points)
        print(
            f"fit over the {what} minima: step = {a:.1f} ms + {b:.2f} ms per decode row + {c:.3f} ms per prompt token"
        )


if __name__ == "__main__":
    main()
