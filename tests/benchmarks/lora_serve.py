"""LoRA through a real ``tokenops serve`` (issue 40's goals, ratios from one run).

Three random rank-16 adapters on every projection of SmolLM2-135M-Instruct (peft,
``init_lora_weights=False``; speed does not need trained ones), served on one base:

1. the same 48 requests (``--max-tokens`` greedy tokens each, all sent at once) on the base alone,
   then spread evenly over the base and the three adapters: ``mixed / base`` throughput;
2. the three adapters merged into their base with peft (``merge_and_unload``, saved as HF folders)
   and served as three more ``[[models]]`` beside the base, the KV budget split between the four:
   ``lora mixed / merged mixed`` throughput, and each server's resident memory;
3. ``/health`` latency (polled every 10 ms from a thread) while a fourth adapter is loaded through
   ``POST /admin/lora`` during the mixed load, against the same load without a load.

``--base hf`` (the default) serves the float32 HF folder of the model (``tests/real_model.py``) so the
merged models are in the base's own format; ``--base gguf`` the embedded Q4_1 GGUF (the merged models
are then float32 folders, so only the first ratio compares like with like; ``--no-merged`` skips it).
Rounds alternate the loads (``--rounds``); the best round of each counts. Prints JSON.

    .venv/bin/python tests/benchmarks/lora_serve.py [--base hf|gguf] [--rounds 2] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.real_model import MODEL, gguf_path, smollm2_folder  # noqa: E402
from tokenops.testing_serve import ServeProcess  # noqa: E402

ROOT = Path(os.environ.get("TOKENOPS_LORA_BENCH_DIR", "/tmp/tokenops-lora-bench"))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
NUM_REQUESTS = 48
KV_TOKENS = 8192


def make_adapter(seed: int) -> Path:
    """A random rank-16 peft adapter on every projection (B not zero: it changes the output)."""
    out = ROOT / f"r16-seed{seed}"
    if (out / "adapter_model.safetensors").exists():
        return out
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_folder()), dtype=torch.float32)
    config = peft.LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, init_lora_weights=False)
    peft.get_peft_model(hf, config).save_pretrained(str(out))
    return out


def merge(adapter: Path) -> Path:
    """The adapter merged into the float32 base, as an HF folder with the base's tokenizer files."""
    out = ROOT / f"merged-{adapter.name}"
    if (out / "model.safetensors").exists():
        return out
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    base = smollm2_folder()
    hf = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(hf, str(adapter)).merge_and_unload()
    tmp = Path(tempfile.mkdtemp(dir=ROOT))
    merged.save_pretrained(str(tmp))
    for f in base.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "generation_config", "special_tokens")):
            shutil.copy(f, tmp / f.name)
    tmp.rename(out)
    return out


async def run_load(base_url: str, models: list[str], max_tokens: int) -> dict:
    """NUM_REQUESTS completions sent at once, round-robin over ``models``; output tokens per second."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=900)

    async def one(i: int) -> int:
        r = await client.completions.create(model=models[i % len(models)], prompt=f"Write a short note about item number {i}.",
                                            max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i) for i in range(NUM_REQUESTS))))
    wall = time.perf_counter() - start
    await client.close()
    return {"tok_s": round(tokens / wall, 2), "wall_s": round(wall, 2), "tokens": tokens}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


class HealthPoller:
    """``/health`` every 10 ms from a thread (not the load's event loop): latencies with their times."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                t = time.perf_counter()
                client.get(f"{self.url}/health")
                self.samples.append((t, time.perf_counter() - t))
                time.sleep(0.01)

    def __enter__(self) -> "HealthPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def stats(self, start: float, end: float) -> dict:
        lat = sorted(d for t, d in self.samples if start <= t <= end)
        if not lat:
            return {"n": 0}
        pick = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 1)  # noqa: E731
        return {"n": len(lat), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": round(lat[-1] * 1000, 1)}


async def health_during_adapter_load(srv: ServeProcess, models: list[str], extra: Path, max_tokens: int) -> dict:
    """/health latency during the mixed load with and without loading ``extra`` meanwhile."""
    import httpx

    out = {}
    with HealthPoller(srv.url) as poller:
        for label in ("load_only", "load_and_adapter"):
            start = time.perf_counter()
            task = asyncio.create_task(run_load(srv.base_url, models, max_tokens))
            await asyncio.sleep(2.0)  # the load is running
            if label == "load_and_adapter":
                async with httpx.AsyncClient(timeout=300) as client:
                    t0 = time.perf_counter()
                    r = await client.post(f"{srv.url}/admin/lora", headers=srv.admin_headers,
                                          json={"name": "extra", "path": str(extra)})
                    out["adapter_load_s"] = round(time.perf_counter() - t0, 2)
                    assert r.status_code in (200, 201), r.text
                    window = (t0, time.perf_counter())
            await task
            if label == "load_only":
                window = (start, time.perf_counter())
            out[label] = poller.stats(*window)
    return out


def lora_config(base: str, adapters: list[Path], kernel: str) -> str:
    lora = ", ".join(f'a{i} = "{p}"' for i, p in enumerate(adapters, 1))
    return (f'[[models]]\nname = "{MODEL}"\npath = "{base}"\nlora = {{ {lora} }}\n'
            f'engine = {{ kv_cache_tokens = {KV_TOKENS}, max_num_seqs = {NUM_REQUESTS}, decode_kernel = "{kernel}" }}\n')


def merged_config(base: str, merged: list[Path], kernel: str) -> str:
    kv = KV_TOKENS // (len(merged) + 1)
    engine = f'engine = {{ kv_cache_tokens = {kv}, max_num_seqs = {NUM_REQUESTS}, decode_kernel = "{kernel}" }}\n'
    text = f'[[models]]\nname = "{MODEL}"\npath = "{base}"\n{engine}'
    for i, p in enumerate(merged, 1):
        text += f'\n[[models]]\nname = "m{i}"\npath = "{p}"\n{engine}'
    return text


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", choices=["hf", "gguf"], default="hf")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-merged", action="store_true")
    opts = ap.parse_args()
    ROOT.mkdir(parents=True, exist_ok=True)
    adapters = [make_adapter(seed) for seed in (1, 2, 3)]
    extra = make_adapter(4)
    base = str(smollm2_folder() if opts.base == "hf" else gguf_path())
    # float32 SmolLM2's copy for the fused step is just over decode_kernel "auto"'s bound: ask for it
    kernel = "native" if opts.base == "hf" else "auto"
    env = {"TOKENOPS_DEFAULT_MODEL": ""}
    out: dict = {"base": opts.base, "requests": NUM_REQUESTS, "max_tokens": opts.max_tokens}
    lora_models = [MODEL, "a1", "a2", "a3"]
    with ServeProcess(ROOT / "serve-lora", config=lora_config(base, adapters, kernel), env=env, store=False) as srv:
        await run_load(srv.base_url, lora_models, 4)  # warm-up
        runs: dict[str, list[float]] = {"base_only": [], "mixed": []}
        for _ in range(opts.rounds):
            runs["base_only"].append((await run_load(srv.base_url, [MODEL], opts.max_tokens))["tok_s"])
            runs["mixed"].append((await run_load(srv.base_url, lora_models, opts.max_tokens))["tok_s"])
            print("round", runs, file=sys.stderr, flush=True)
        out["lora_rss_mib"] = rss_mib(srv.proc.pid)
        out["health"] = await health_during_adapter_load(srv, lora_models, extra, opts.max_tokens)
        import httpx

        stats = httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers).json()
        out["engine_lora"] = next((b["lora"] for b in _engines(stats) if "lora" in b), None)
    out.update({f"{k}_tok_s": max(v) for k, v in runs.items()}, rounds=runs)
    out["mixed_over_base"] = round(out["mixed_tok_s"] / out["base_only_tok_s"], 3)
    if not opts.no_merged:
        merged = [merge(a) for a in adapters]
        with ServeProcess(ROOT / "serve-merged", config=merged_config(base, merged, kernel), env=env, store=False) as srv:
            models = [MODEL, "m1", "m2", "m3"]
            await run_load(srv.base_url, models, 4)
            out["merged_mixed_rounds"] = [(await run_load(srv.base_url, models, opts.max_tokens))["tok_s"]
                                          for _ in range(opts.rounds)]
            out["merged_rss_mib"] = rss_mib(srv.proc.pid)
        out["merged_mixed_tok_s"] = max(out["merged_mixed_rounds"])
        out["lora_over_merged"] = round(out["mixed_tok_s"] / out["merged_mixed_tok_s"], 3)
    print(json.dumps(out, indent=1))


def _engines(stats: object) -> list[dict]:
    """Every engine stats object in /admin/stats' answer (whatever its nesting)."""
    found: list[dict] = []
    if isinstance(stats, dict):
        if "lora" in stats and isinstance(stats["lora"], dict):
            found.append(stats)
        for v in stats.values():
            found.extend(_engines(v))
    elif isinstance(stats, list):
        for v in stats:
            found.extend(_engines(v))
    return found


if __name__ == "__main__":
    asyncio.run(main())
