"""LoRA on the real default model: memory per adapter and the cost of adapter rows in a batch.

A random rank-16 adapter on every projection (peft, ``init_lora_weights=False``; no training) of
SmolLM2-135M-Instruct, served on the embedded GGUF. Times 8 prompts x 32 greedy tokens with the base
only, half the rows on the adapter, and all of them; then one 48-row decode step (``runner.execute``,
interleaved repetitions, min and median) of base rows only against the same step with 36 of its rows
spread over three adapters (the adapter loaded three times). Prints JSON.

    .venv/bin/python tests/benchmarks/lora_mixed.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ["TOKENOPS_DEFAULT_MODEL"] = ""

import torch  # noqa: E402

from tests.real_model import smollm2_folder  # noqa: E402
from tokenops.engine.core.config import EngineConfig  # noqa: E402
from tokenops.engine.core.engine import LLMEngine  # noqa: E402
from tokenops.engine.sampling.sampling import SamplingParams  # noqa: E402

NUM, NEW = int(os.environ.get("LORA_BENCH_PROMPTS", 8)), int(os.environ.get("LORA_BENCH_TOKENS", 32))
ADAPTER = Path("/tmp/tokenops-lora-bench/r16-all")


def make_adapter() -> Path:
    if (ADAPTER / "adapter_model.safetensors").exists():
        return ADAPTER
    import peft
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_folder()), dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = peft.get_peft_model(hf, peft.LoraConfig(r=16, lora_alpha=32, target_modules=targets, init_lora_weights=False))
    model.save_pretrained(str(ADAPTER))
    return ADAPTER


def step_times(engine: LLMEngine, path: Path, rows: int = 48, reps: int = 6) -> dict:
    """ms of one decode step of ``rows`` rows: base only vs 3/4 of them over three adapters."""
    from tokenops.engine.core.batch import ChunkInput

    for name in ("s1", "s2", "s3"):
        engine.load_lora(name, str(path))
    names = [None, "s1", "s2", "s3"]
    times: dict[str, list[float]] = {"base": [], "mixed": []}
    for _ in range(reps):
        for label in times:
            chunks = [ChunkInput([100 + i], 20, [4 * i + j for j in range(4)],
                                 lora=names[i % 4] if label == "mixed" else None) for i in range(rows)]
            engine.runner.execute(chunks)
            for _ in range(5):
                start = time.perf_counter()
                engine.runner.execute(chunks)
                times[label].append(time.perf_counter() - start)
    out = {}
    for label, v in times.items():
        v.sort()
        out[f"step_{label}_ms"] = {"min": round(v[0] * 1000, 1), "median": round(v[len(v) // 2] * 1000, 1)}
    return out


def main() -> None:
    path = make_adapter()
    engine = LLMEngine(EngineConfig(model=None, device="cpu"))
    info = engine.load_lora("r16", str(path))
    prompts = [f"Write a short note about item number {i}." for i in range(NUM)]
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    engine.generate(prompts[:2], params)  # warm-up
    out = {"adapter_mib": round(info["bytes"] / 2**20, 2), "rank": info["rank"], "targets": len(info["targets"])}
    for label, loras in (("base_only", [None] * NUM), ("half_adapter", [None, "r16"] * (NUM // 2)), ("all_adapter", ["r16"] * NUM)):
        engine.reset_prefix_cache() if hasattr(engine, "reset_prefix_cache") else None
        start = time.perf_counter()
        res = engine.generate(prompts, params, loras=loras)
        wall = time.perf_counter() - start
        out[f"{label}_tok_s"] = round(sum(len(r.outputs[0].token_ids) for r in res) / wall, 1)
        print(label, out[f"{label}_tok_s"], flush=True)
    out.update(step_times(engine, path))
    out["fused_steps"] = engine.stats().get("fused_decode_steps")
    out["lora_steps"] = engine.stats()["lora"]["steps"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
