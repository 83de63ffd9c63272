"""Where a mixed step's extra time goes: one 48-row decode step on the embedded GGUF, base rows only
against 36 of them over three rank-16 adapters (all seven projections), in CPU time (one thread, so
no spinning at barriers counts; the process's CPU time over interleaved repetitions, min and median).

``--variant`` rebuilds the fused library with a part of the LoRA products cut out, to split the
mixed step's extra time: ``full`` (as shipped), ``a_only`` (``T = x A^T`` only: the B half returns
at once), ``none`` (both halves return at once: what is left is the step's bookkeeping, ordering the
chunks by adapter and building the step's ``tk_lora``). Each variant is a separate process (the
library is built once per process). Prints JSON.

    .venv/bin/python tests/benchmarks/lora_profile.py [--variant full|a_only|none] [--reps 12]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ["TOKENOPS_DEFAULT_MODEL"] = ""

import torch  # noqa: E402
from lora_mixed import make_adapter  # noqa: E402
from tests.real_model import gguf_path  # noqa: E402
from tokenops.engine.core.batch import ChunkInput  # noqa: E402
from tokenops.engine.core.config import EngineConfig  # noqa: E402
from tokenops.engine.core.engine import LLMEngine  # noqa: E402
from tokenops.engine.kernels import fused_library  # noqa: E402

CONTEXT, BLOCK = 32, 16
#: the first line of each half's body in tokenops/engine/csrc/lora.c: a variant returns right there
_CUTS = {"a_only": ["/*lora_b*/"], "none": ["/*lora_a*/", "/*lora_b*/"]}


def patch(variant: str) -> None:
    """Make the halves named by ``variant`` return at once, in a copy of the sources the library is
    then built from (``fused_library.FOLDER``)."""
    folder = Path(tempfile.mkdtemp()) / "csrc"
    shutil.copytree(fused_library.FOLDER, folder)
    lora = folder / "lora.c"
    source = lora.read_text()
    for marker in _CUTS.get(variant, []):
        if marker not in source:
            raise SystemExit(f"marker {marker} not in the fused source")
        source = source.replace(marker, marker + " return;")
    lora.write_text(source)
    fused_library.FOLDER = folder


def step_cpu(engine: LLMEngine, reps: int, rows: int = 48) -> dict:
    """CPU ms of one decode step: base rows only, and 36 of them over three adapters (interleaved)."""
    names = [None, "s1", "s2", "s3"]
    blocks = CONTEXT // BLOCK + 1
    times: dict[str, list[float]] = {"base": [], "mixed": []}
    for rep in range(reps + 1):
        for label, v in times.items():
            chunks = [
                ChunkInput(
                    [100 + i],
                    CONTEXT,
                    [blocks * i + j for j in range(blocks)],
                    lora=names[i % 4] if label == "mixed" else None,
                )
                for i in range(rows)
            ]
            start = time.process_time()
            for _ in range(3):
                engine.runner.execute(chunks)
            if rep:
                v.append((time.process_time() - start) / 3)
    out = {}
    for label, v in times.items():
        v.sort()
        out[f"{label}_cpu_ms"] = {"min": round(v[0] * 1000, 1), "median": round(v[len(v) // 2] * 1000, 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="full", choices=["full", "a_only", "none"])
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    opts = ap.parse_args()
    torch.set_num_threads(opts.threads)
    patch(opts.variant)
    path = make_adapter()
    engine = LLMEngine(EngineConfig(model=str(gguf_path()), device="cpu", kv_cache_tokens=4096, max_num_seqs=48))
    for name in ("s1", "s2", "s3"):
        engine.load_lora(name, str(path))
    out: dict = {"variant": opts.variant, "threads": torch.get_num_threads(), **step_cpu(engine, opts.reps)}
    out["extra_ms_min"] = round(out["mixed_cpu_ms"]["min"] - out["base_cpu_ms"]["min"], 1)
    out["mixed_over_base_min"] = round(out["mixed_cpu_ms"]["min"] / out["base_cpu_ms"]["min"], 3)
    out["load"] = [round(x, 1) for x in os.getloadavg()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
