"""Is a batched decode step of the GGUF base compute-bound on this CPU? (issue 40's "2x the merged models")

One engine with the adapters runs the 48 rows of ``lora_serve.py``'s load in one step; four engines
with merged models run 12 rows each, four steps that read the weights four times. Batching wins only
where reading the weights costs more than the arithmetic on them. This times one decode step
(``runner.execute``, ~32 tokens of context per row, interleaved repetitions: min and median of the
wall and of the process's CPU time) at 1, 12 and 48 rows on the embedded Q4_1 GGUF, and sets beside
it the FLOPs such a step does and the bytes it reads (the weights once, each row's K/V), with this
box's copy bandwidth. ``four_12_over_one_48`` is the time of four 12-row steps over one 48-row step:
the most that putting 48 rows in one step can gain over four engines of 12, per step and nothing
else counted. On a shared box the CPU time of a one-thread run (``--threads 1``) is the clean
figure: with two threads, one spins at the kernels' barriers while the other is descheduled, and
that spinning counts as CPU time. Prints JSON.

    .venv/bin/python tests/benchmarks/lora_roofline.py [--reps 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ["TOKENOPS_DEFAULT_MODEL"] = ""

from gguf_peer import stream_bandwidth, weight_bytes_per_token  # noqa: E402
from lora_merged import kv_bytes_per_token  # noqa: E402
from tests.real_model import gguf_path  # noqa: E402
from tokenops.engine.core.config import EngineConfig  # noqa: E402
from tokenops.engine.core.engine import LLMEngine  # noqa: E402

CONTEXT = 32  # tokens each row has in the cache: ~10 of prompt and half of lora_serve.py's 32 outputs
BLOCK = 16


def matrix_params(gguf: Path) -> int:
    """Weights one token multiplies by (every matrix, the tied embedding once as the output projection)."""
    from tokenops.engine.gguf.gguf_reader import GGUFFile

    file = GGUFFile(gguf)
    tied = not file.has_tensor("output.weight")
    total = 0
    for name, t in file.tensors.items():
        if len(t.shape) < 2 or (name == "token_embd.weight" and not tied):
            continue
        total += t.shape[0] * t.shape[1]
    file.close()
    return total


def attention_flops_per_row(gguf: Path, context: int) -> int:
    """Q.K and P.V over ``context`` positions, every head of every layer (2 FLOPs a multiply-add)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields
    arch = bytes(fields["general.architecture"].parts[-1]).decode()
    layers = int(fields[f"{arch}.block_count"].parts[-1][0])
    hidden = int(fields[f"{arch}.embedding_length"].parts[-1][0])
    return 2 * 2 * context * hidden * layers


def time_steps(engine: LLMEngine, rows_list: list[int], reps: int) -> dict[int, dict]:
    """Wall and process-CPU ms of one decode step of each row count (interleaved, after a warm-up)."""
    from tokenops.engine.core.batch import ChunkInput

    blocks = CONTEXT // BLOCK + 1
    walls: dict[int, list[float]] = {r: [] for r in rows_list}
    cpus: dict[int, list[float]] = {r: [] for r in rows_list}
    for rep in range(reps + 1):
        for rows in rows_list:
            chunks = [ChunkInput([100 + i], CONTEXT, [blocks * i + j for j in range(blocks)]) for i in range(rows)]
            wall, cpu = time.perf_counter(), time.process_time()
            engine.runner.execute(chunks)
            if rep:  # the first round warms up
                walls[rows].append(time.perf_counter() - wall)
                cpus[rows].append(time.process_time() - cpu)

    def ms(v: list[float]) -> dict:
        v = sorted(v)
        return {"min": round(v[0] * 1000, 1), "median": round(v[len(v) // 2] * 1000, 1)}

    return {r: {"wall_ms": ms(walls[r]), "cpu_ms": ms(cpus[r])} for r in rows_list}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch (and native kernel) threads; 0: torch's default")
    opts = ap.parse_args()
    import torch

    if opts.threads:
        torch.set_num_threads(opts.threads)
    gguf = gguf_path()
    engine = LLMEngine(EngineConfig(model=str(gguf), device="cpu", kv_cache_tokens=4096, max_num_seqs=48))
    params = matrix_params(gguf)
    weights = weight_bytes_per_token(gguf).total
    kv_row = CONTEXT * kv_bytes_per_token(gguf)
    bandwidth = stream_bandwidth(threads=opts.threads or None)
    steps = time_steps(engine, [1, 12, 48], opts.reps)
    out: dict = {
        "matrix_params": params,
        "weight_bytes": weights,
        "kv_bytes_per_row": kv_row,
        "copy_gb_s": round(bandwidth / 1e9, 2),
        "threads": torch.get_num_threads(),
        "load": [round(x, 1) for x in os.getloadavg()],
    }
    for rows, t in steps.items():
        flops = rows * (2 * params + attention_flops_per_row(gguf, CONTEXT))
        num_bytes = weights + rows * kv_row
        best = t["wall_ms"]["min"] / 1000
        out[f"rows_{rows}"] = {
            **t,
            "gflop": round(flops / 1e9, 2),
            "mbytes": round(num_bytes / 1e6, 1),
            "flop_per_byte": round(flops / num_bytes, 1),
            "gflop_s_at_min": round(flops / best / 1e9, 1),
            "read_ms_at_copy_bw": round(num_bytes / bandwidth * 1000, 1),
        }
    for key in ("wall_ms", "cpu_ms"):
        for stat in ("min", "median"):
            ratio = 4 * steps[12][key][stat] / steps[48][key][stat]
            out[f"four_12_over_one_48_{key}_{stat}"] = round(ratio, 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
