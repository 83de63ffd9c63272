"""LoRA through a real ``tokenops serve`` (issue 40's goals, ratios from one run).

Three random rank-16 adapters on every projection of SmolLM2-135M-Instruct (peft,
``init_lora_weights=False``; speed does not need trained ones), served on one base:

1. the same 48 requests (``--max-tokens`` greedy tokens each, all sent at once, the models they name
   in one seeded interleaved order for every server: :func:`request_order`) on the base alone,
   then spread evenly over the base and the three adapters: ``mixed / base`` throughput;
2. the three adapters merged into their base (``lora_merged.py``: peft's ``merge_and_unload``, then
   for the GGUF base converted and quantized to Q4_1 like the packaged file) and served as three more
   ``[[models]]`` beside the base **in the adapter server's memory**: their KV caches are sized so the
   merged server's peak resident set (``VmHWM``) is within 5 % of the adapter server's (a run, then
   resized from the bytes a KV token takes; the size found is cached for the next run), or are at
   their floor (1024 tokens each: the set does not fit). The same 48 requests spread over the four:
   ``lora mixed / merged mixed``; ``--merged 1`` serves only the base and one merged model (what fits
   the adapter server's memory on the GGUF base; on the float32 one not even that does);
3. the same merged models as four ``[[models]]`` under ``[gateway] max_loaded_models = --swap-bound``
   (2: the base and one merged Q4_1 model are what fit the adapter server's memory): the others are
   loaded on demand and the least recently used idle engine closed for room, as Ollama does; the same
   48 requests, the same rounds, with the loads they cost and the server's peak; the always-resident
   run of 2. is kept beside it (labelled: it does not fit);
4. ``/health`` latency (polled every 10 ms from a thread) while a fourth adapter is loaded through
   ``POST /admin/lora`` during the mixed load, against the same load without a load.

Every KV block of both servers is made resident first (long prompts fill the caches), so the peak is
what a long-running server holds. Every load reports tokens per wall second and per CPU second of
the server process (user + system, all threads): the box is shared, and the CPU ratio is the
steadier one. Rounds alternate the loads (``--rounds``); the best round of each counts. ``--base
gguf`` (the default) serves the embedded Q4_1 GGUF, ``--base hf`` the float32 HF folder. The
adapters and merged models are cached in ``~/.cache/tokenops/lora-bench``. Prints JSON.

    .venv/bin/python tests/benchmarks/lora_serve.py [--base gguf|hf] [--rounds 3] [--merged 3] [--no-health]
        [--swap-bound 3] [--no-resident-merged]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lora_merged import ROOT, kv_bytes_per_token, kv_tokens_for_budget, make_adapter, merged_gguf, merged_hf  # noqa: E402
from tests.real_model import MODEL, SERVE_ENV, gguf_path, smollm2_folder  # noqa: E402
from tokenops.testing_serve import ServeProcess  # noqa: E402

WORK = Path(os.environ.get("TOKENOPS_LORA_BENCH_WORK", "/tmp/tokenops-lora-bench"))
NUM_REQUESTS = 48
KV_TOKENS = 8192
#: KV tokens a merged model needs at least for its share of the load (12 rows of ~10 + 32 tokens: 3 blocks each)
MIN_KV_TOKENS = 1024
#: a merged server's peak within this fraction of the adapter server's counts as the same budget
BUDGET_TOLERANCE = 0.05


def request_order(num_models: int = 4, seed: int = 40) -> list[int]:
    """Which model each of the NUM_REQUESTS requests names (an index into the server's models): as many
    for each, in a seeded shuffle rather than round-robin, as traffic from several users interleaves.
    Every server gets the same order."""
    import random

    order = [i % num_models for i in range(NUM_REQUESTS)]
    random.Random(seed).shuffle(order)
    return order


REQUEST_ORDER = request_order()


async def run_load(base_url: str, models: list[str], max_tokens: int, pid: int | None = None) -> dict:
    """NUM_REQUESTS completions sent at once, over ``models`` in :data:`REQUEST_ORDER`: output tokens per
    second, and per CPU second of the server process ``pid`` (all its threads) when given: on a shared box
    the wall clock counts other people's work, the server's CPU time much less so."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=900)

    async def one(i: int) -> int:
        r = await client.completions.create(
            model=models[REQUEST_ORDER[i] % len(models)],
            prompt=f"Write a short note about item number {i}.",
            max_tokens=max_tokens,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        return r.usage.completion_tokens

    cpu0 = cpu_seconds(pid) if pid else 0.0
    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i) for i in range(NUM_REQUESTS))))
    wall = time.perf_counter() - start
    await client.close()
    out = {"tok_s": round(tokens / wall, 2), "wall_s": round(wall, 2), "tokens": tokens}
    if pid:
        cpu = cpu_seconds(pid) - cpu0
        out.update(cpu_s=round(cpu, 2), tok_cpu_s=round(tokens / cpu, 2))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid``, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_mib(pid: int, key: str) -> float:
    """A ``kB`` line of ``/proc/PID/status`` in MiB (``VmHWM``: peak resident set; ``VmRSS``: now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
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

    def __enter__(self) -> HealthPoller:
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
                    r = await client.post(
                        f"{srv.url}/admin/lora", headers=srv.admin_headers, json={"name": "extra", "path": str(extra)}
                    )
                    out["adapter_load_s"] = round(time.perf_counter() - t0, 2)
                    assert r.status_code in (200, 201), r.text
                    window = (t0, time.perf_counter())
            await task
            if label == "load_only":
                window = (start, time.perf_counter())
            out[label] = poller.stats(*window)
    return out


async def fill_kv(base_url: str, models: list[str], kv_tokens: int, caches: int) -> None:
    """Make every block of the KV caches resident: NUM_REQUESTS prompts of distinct token ids, each the
    length of its share of one of ``caches`` caches of ``kv_tokens`` (one per engine), one output token
    each (the block manager hands out never-used blocks first). A long-running server gets there by
    itself; the budget compares that."""
    import random

    import openai

    rng = random.Random(0)
    length = kv_tokens * caches // NUM_REQUESTS - 8
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=900)

    async def one(i: int) -> None:
        ids = [rng.randrange(1000, 40000) for _ in range(length)]
        await client.completions.create(model=models[i % len(models)], prompt=ids, max_tokens=1, temperature=0)

    await asyncio.gather(*(one(i) for i in range(NUM_REQUESTS)))
    await client.close()


def engine_toml(kv_tokens: int, kernel: str) -> str:
    return f'engine = {{ kv_cache_tokens = {kv_tokens}, max_num_seqs = {NUM_REQUESTS}, decode_kernel = "{kernel}" }}\n'


def lora_config(base: str, adapters: list[Path], kernel: str) -> str:
    lora = ", ".join(f'a{i} = "{p}"' for i, p in enumerate(adapters, 1))
    return f'[[models]]\nname = "{MODEL}"\npath = "{base}"\nlora = {{ {lora} }}\n' + engine_toml(KV_TOKENS, kernel)


def merged_config(base: str, merged: list[Path], kernel: str, kv_tokens: int, swap_bound: int = 0) -> str:
    """The base and each merged model as its own ``[[models]]``, ``kv_tokens`` of KV cache each; at most
    ``swap_bound`` of them resident (``[gateway] max_loaded_models``; 0: all)."""
    engine = engine_toml(kv_tokens, kernel)
    text = f"[gateway]\nmax_loaded_models = {swap_bound}\n\n"
    text += f'[[models]]\nname = "{MODEL}"\npath = "{base}"\n{engine}'
    for i, p in enumerate(merged, 1):
        text += f'\n[[models]]\nname = "m{i}"\npath = "{p}"\n{engine}'
    return text


async def timed_rounds(srv: ServeProcess, loads: dict[str, list[str]], rounds: int, max_tokens: int) -> dict:
    """``rounds`` rounds of every load in turn (alternated: the box's load drifts); per load each
    round's figures and the best round's tokens/s and tokens per CPU second."""
    runs: dict[str, list[dict]] = {name: [] for name in loads}
    for _ in range(rounds):
        for name, models in loads.items():
            before = swap_stats(srv)
            run = await run_load(srv.base_url, models, max_tokens, srv.proc.pid)
            if before is not None:  # a server under max_loaded_models: the loads this round cost
                after = swap_stats(srv) or {}
                run["loads"] = after["num_loads"] - before["num_loads"]
                run["load_s"] = round(after["load_seconds"] - before["load_seconds"], 2)
            runs[name].append(run)
        print("round", json.dumps(runs), file=sys.stderr, flush=True)
    keys = ("tok_s", "tok_cpu_s", "cpu_s", "loads", "load_s")
    return {
        name: {
            "tok_s": max(r["tok_s"] for r in rs),
            "tok_cpu_s": max(r["tok_cpu_s"] for r in rs),
            "rounds": [{k: r[k] for k in keys if k in r} for r in rs],
        }
        for name, rs in runs.items()
    }


def swap_stats(srv: ServeProcess) -> dict | None:
    """``/admin/stats``' ``model_swap`` (None: no bound on resident engines)."""
    import httpx

    return httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers, timeout=60).json().get("model_swap")


async def lora_server(base: str, adapters: list[Path], extra: Path, kernel: str, opts: argparse.Namespace) -> dict:
    """One engine with the adapters: base-only and mixed loads, peak memory, /health during a load."""
    import httpx

    lora_models = [MODEL, "a1", "a2", "a3"]
    config = lora_config(base, adapters, kernel)
    # the extra adapter is loaded at run time (POST /admin/lora): its folder must be under [lora] roots
    env = {**SERVE_ENV, "TOKENOPS_LORA__ROOTS": str(extra.parent)}
    with ServeProcess(WORK / "serve-lora", config=config, env=env, store=False) as srv:
        ready_mib = status_mib(srv.proc.pid, "VmRSS")
        await fill_kv(srv.base_url, lora_models, KV_TOKENS, 1)
        await run_load(srv.base_url, lora_models, 4)  # warm-up
        loads = {"base_only": [MODEL], "mixed": lora_models}
        out = await timed_rounds(srv, loads, opts.rounds, opts.max_tokens)
        out.update(rss_at_ready_mib=ready_mib, peak_rss_mib=status_mib(srv.proc.pid, "VmHWM"), kv_tokens=KV_TOKENS)
        if not opts.no_health:
            out["health"] = await health_during_adapter_load(srv, lora_models, extra, opts.max_tokens)
            out["peak_rss_mib_after_4th_adapter"] = status_mib(srv.proc.pid, "VmHWM")
        stats = httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers).json()
        out["engine_lora"] = next((b["lora"] for b in _engines(stats) if "lora" in b), None)
    return out


async def merged_server(base: str, merged: list[Path], kernel: str, kv_tokens: int, opts: argparse.Namespace) -> dict:
    """The base and the merged models as separate ``[[models]]``: the mixed load over all of them."""
    models = [MODEL] + [f"m{i}" for i in range(1, len(merged) + 1)]
    config = merged_config(base, merged, kernel, kv_tokens)
    with ServeProcess(WORK / "serve-merged", config=config, env=SERVE_ENV, store=False) as srv:
        ready_mib = status_mib(srv.proc.pid, "VmRSS")
        await fill_kv(srv.base_url, models, kv_tokens, len(models))
        await run_load(srv.base_url, models, 4)  # warm-up
        out = (await timed_rounds(srv, {"mixed": models}, opts.rounds, opts.max_tokens))["mixed"]
        peak = status_mib(srv.proc.pid, "VmHWM")
        out.update(kv_tokens_per_model=kv_tokens, models=len(models), rss_at_ready_mib=ready_mib, peak_rss_mib=peak)
    return out


async def merged_in_budget(base: str, merged: list[Path], kernel: str, budget_mib: float, opts) -> dict:
    """Serve the merged set with its KV caches sized so its peak resident memory is ``budget_mib`` (the
    adapter server's): a first run at the last size that fitted (or the adapter server's KV split
    evenly), then resized from the bytes a KV token takes, until within BUDGET_TOLERANCE or at
    MIN_KV_TOKENS (the set does not fit the budget). The size that fitted is kept for the next run."""
    n = len(merged) + 1
    per_token = kv_bytes_per_token(Path(base))
    cache = ROOT / "kv-budget.json"
    known = json.loads(cache.read_text()) if cache.exists() else {}
    key = f"{opts.base}-{n}"
    kv = known.get(key, KV_TOKENS // n)
    runs = []
    for _ in range(3):
        run = await merged_server(base, merged, kernel, kv, opts)
        runs.append(run)
        print("merged run", json.dumps(run), file=sys.stderr, flush=True)
        if abs(run["peak_rss_mib"] / budget_mib - 1) <= BUDGET_TOLERANCE:
            break
        new = max(MIN_KV_TOKENS, kv_tokens_for_budget(budget_mib, run["peak_rss_mib"], kv, n, per_token))
        if new == kv:  # at MIN_KV_TOKENS and still over: the set does not fit
            break
        kv = new
    final = runs[-1]
    known[key] = final["kv_tokens_per_model"]
    cache.write_text(json.dumps(known, indent=1))
    final["rss_over_budget"] = round(final["peak_rss_mib"] / budget_mib, 3)
    final["fits_budget"] = final["rss_over_budget"] <= 1 + BUDGET_TOLERANCE
    final["kv_bytes_per_token"] = per_token
    final["earlier_runs"] = [{k: r[k] for k in ("kv_tokens_per_model", "peak_rss_mib", "tok_s")} for r in runs[:-1]]
    return final


async def merged_swapping(base: str, merged: list[Path], kernel: str, budget_mib: float, opts) -> dict:
    """The base and the merged models as ``[[models]]`` with at most ``opts.swap_bound`` engines resident
    (``[gateway] max_loaded_models``), ``opts.swap_kv_tokens`` of KV cache each; the others load on
    demand, the least recently used idle one closed for room. The same 48 requests in the same order,
    the same rounds; the loads each round cost. Its peak includes what a swap holds for a moment (the
    file mapping and new buffers of the engine being built, heap not yet returned by the closed one)."""
    n, bound, kv = len(merged) + 1, opts.swap_bound, opts.swap_kv_tokens
    models = [MODEL] + [f"m{i}" for i in range(1, n)]
    config = merged_config(base, merged, kernel, kv, bound)
    with ServeProcess(WORK / "serve-merged-swap", config=config, env=SERVE_ENV, store=False) as srv:
        ready_mib = status_mib(srv.proc.pid, "VmRSS")
        await fill_kv(srv.base_url, models, kv, n)
        await run_load(srv.base_url, models, 4)  # warm-up
        at_start = swap_stats(srv) or {}
        out = (await timed_rounds(srv, {"mixed": models}, opts.rounds, opts.max_tokens))["mixed"]
        stats = swap_stats(srv) or {}
        out.update(
            max_loaded_models=bound,
            models=n,
            kv_tokens_per_model=kv,
            rss_at_ready_mib=ready_mib,
            peak_rss_mib=status_mib(srv.proc.pid, "VmHWM"),
            loads_in_rounds=stats.get("num_loads", 0) - at_start.get("num_loads", 0),
            load_s_in_rounds=round(stats.get("load_seconds", 0.0) - at_start.get("load_seconds", 0.0), 2),
            loads_in_all=stats.get("num_loads"),
            evictions_in_all=stats.get("num_evictions"),
        )
    out["rss_over_budget"] = round(out["peak_rss_mib"] / budget_mib, 3)
    out["fits_budget"] = out["rss_over_budget"] <= 1 + BUDGET_TOLERANCE
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", choices=["hf", "gguf"], default="gguf")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--merged", type=int, default=3, help="merged models served beside the base (0: none)")
    ap.add_argument("--no-merged", action="store_true", help="the same as --merged 0")
    ap.add_argument("--no-health", action="store_true", help="skip /health during an adapter load")
    ap.add_argument(
        "--swap-bound",
        type=int,
        default=3,
        help="engines resident at once for the merged models loaded on demand (0: skip that run); 3: what "
        "fits the adapter server's memory since the one-pass GGUF header read (0.95x its peak; docs/lora.md)",
    )
    ap.add_argument(
        "--swap-kv-tokens",
        type=int,
        default=MIN_KV_TOKENS,
        help="KV cache tokens of each engine loaded on demand (the floor by default: with 2304, two engines "
        "fit at rest but a swap's moment went over the adapter server's peak)",
    )
    ap.add_argument("--no-resident-merged", action="store_true", help="skip the always-resident merged run")
    opts = ap.parse_args()
    ROOT.mkdir(parents=True, exist_ok=True)
    adapters = [make_adapter(seed) for seed in (1, 2, 3)]
    extra = make_adapter(4)
    base = str(smollm2_folder() if opts.base == "hf" else gguf_path())
    # float32 SmolLM2's copy for the fused step is just over decode_kernel "auto"'s bound: ask for it
    kernel = "native" if opts.base == "hf" else "auto"
    count = 0 if opts.no_merged else opts.merged
    merged = [(merged_hf if opts.base == "hf" else merged_gguf)(a) for a in adapters[:count]]
    out: dict = {"base": opts.base, "requests": NUM_REQUESTS, "max_tokens": opts.max_tokens, "load_before": load_avg()}
    lora = await lora_server(base, adapters, extra, kernel, opts)
    out["lora"] = lora
    out["mixed_over_base"] = round(lora["mixed"]["tok_s"] / lora["base_only"]["tok_s"], 3)
    out["mixed_over_base_cpu"] = round(lora["mixed"]["tok_cpu_s"] / lora["base_only"]["tok_cpu_s"], 3)
    if merged and not opts.no_resident_merged:
        m = await merged_in_budget(base, merged, kernel, lora["peak_rss_mib"], opts)
        m["label"] = "always resident" + ("" if m["fits_budget"] else ": does not fit the adapter server's memory")
        out["merged"] = m
        out["lora_over_merged"] = round(lora["mixed"]["tok_s"] / m["tok_s"], 3)
        out["lora_over_merged_cpu"] = round(lora["mixed"]["tok_cpu_s"] / m["tok_cpu_s"], 3)
        out["merged_rss_over_lora_rss"] = m["rss_over_budget"]
    if merged and opts.swap_bound > 0:
        w = await merged_swapping(base, merged, kernel, lora["peak_rss_mib"], opts)
        w["label"] = f"max_loaded_models = {opts.swap_bound}, loaded on demand" + (
            "" if w["fits_budget"] else ": does not fit the adapter server's memory either"
        )
        out["merged_swapping"] = w
        out["lora_over_merged_swapping"] = round(lora["mixed"]["tok_s"] / w["tok_s"], 3)
        out["lora_over_merged_swapping_cpu"] = round(lora["mixed"]["tok_cpu_s"] / w["tok_cpu_s"], 3)
        # the most adapter rows could reach against this route: the mixed load as fast as the base alone
        out["ceiling_base_only_over_merged_swapping"] = round(lora["base_only"]["tok_s"] / w["tok_s"], 3)
        out["ceiling_base_only_over_merged_swapping_cpu"] = round(
            lora["base_only"]["tok_cpu_s"] / w["tok_cpu_s"], 3
        )
    out["load_after"] = load_avg()
    print(json.dumps(out, indent=1))


def load_avg() -> list[float]:
    return [round(x, 1) for x in os.getloadavg()]


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
