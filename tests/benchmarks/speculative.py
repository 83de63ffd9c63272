"""Speculative decoding benchmark: acceptance rate and decode speed-up, batch 1 and 8.

Two workloads, each run with and without speculation on the same engine settings
(greedy, so the outputs must be identical; the script checks it):

- ``ngram``: the n-gram (prompt lookup) proposer on a repetitive workload: chat
  prompts asking the model to repeat or edit a held-out ShareGPT passage that is in
  the prompt, with the assistant turn already started on the passage (as in code
  editing, where most of the output copies the input).
- ``draft``: the demo draft model (``tokenops/demo_models/draft``, ~1.6M params)
  proposing for the demo target (``tokenops/demo_models/target``) on held-out
  ShareGPT user prompts.

Speed is generated tokens per second of wall time (prefill included). The base and
speculative engines process the same groups of ``batch`` prompts alternately (ABBA),
so the load swings of a shared machine hit both alike; batch 8 runs at least two
groups (prompts repeated when needed). Run::

    .venv/bin/python tests/benchmarks/speculative.py                 # both, batch 1 and 8
    .venv/bin/python tests/benchmarks/speculative.py --methods ngram --batch-sizes 1

Without the demo models the draft workload is skipped (say so in reports).

``--model default`` runs the real default model instead: SmolLM2-135M-Instruct from the packaged
Q4_1 GGUF through the quantized kernels (the fused step), greedy, generations ending at EOS (or
``--max-tokens``), on two workloads:

- ``rewrite``: "rewrite / summarise this text" chat prompts over held-out ShareGPT answers (the
  assistant turn NOT started): prompt lookup finds the copies the answer makes of the text.
- ``chat``: held-out ShareGPT user prompts, as they are.

Each row prints four speed-up ratios of the speculative engine over the same engine without
speculation (both models, ABBA order): ``wall x`` (generated tokens per second of wall time,
prefill included), ``cpu x`` (per second of process CPU time, the figure to trust on a shared box:
with one torch thread it is the work each engine did), and ``dec wall x`` / ``dec cpu x`` (the same
after every request of a group has its first token: at batch 1 the decode speed, prefill left
out)::

    .venv/bin/python tests/benchmarks/speculative.py --model default --methods ngram --batch-sizes 1
    .venv/bin/python tests/benchmarks/speculative.py --model default --methods suffix --batch-sizes 1
    .venv/bin/python tests/benchmarks/speculative.py --model default --methods draft --draft DIR_OR_GGUF

``suffix`` is prompt lookup plus the shipped corpus of the model's own answers to other ShareGPT
prompts (``tokenops/demo_models/smollm2-answers``, built by ``scripts/build_spec_corpus.py`` from
the conversations after the 400 held out here: no prompt of these workloads is in it).

``--verify-cost`` prints what one verify step of 1-9 rows costs against as many decode steps.
A draft for the default model must share SmolLM2's tokenizer (49152 tokens); none ships (the
``suffix`` proposer's corpus of the model's own answers is the draft-free alternative).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tokenops" / "demo_models"
sys.path.insert(0, str(ROOT / "scripts"))


def heldout_messages(num: int, seed: int = 0) -> list[list[dict]]:
    """Held-out conversations of the demo models' training split (never trained on)."""
    from train_demo_models import load_conversations, split_data

    heldout, _, _ = split_data(load_conversations(), seed, 400, 0)
    return heldout[:num]


def chat_prompt(tok, user: str, assistant_start: str = "") -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True)
    return tok.encode(text + assistant_start, add_special_tokens=False)


def ngram_prompts(tok, convs, num: int) -> list[list[int]]:
    prompts = []
    for messages in convs:
        passage = next((m["content"] for m in messages if m["role"] == "assistant" and len(m["content"]) > 400), None)
        if passage is None:
            continue
        passage = passage[:700]
        words = passage.split()
        start = " ".join(words[:8])
        prompts.append(chat_prompt(tok, f"Repeat this text exactly, fixing any typos:\n\n{passage}", start))
        if len(prompts) == num:
            break
    return prompts


def draft_prompts(tok, convs, num: int) -> list[list[int]]:
    prompts = []
    for messages in convs:
        user = next((m["content"] for m in messages if m["role"] == "user"), "")
        if 20 <= len(user) <= 600:
            prompts.append(chat_prompt(tok, user))
        if len(prompts) == num:
            break
    return prompts


#: the "rewrite / summarise this text" instructions, taken in turn
REWRITE_TASKS = ("Rewrite the following text, correcting any spelling or grammar mistakes:",
                 "Summarise the following text:",
                 "Rewrite the following text in a more formal tone:",
                 "Summarize this text in a few sentences:")


def rewrite_prompts(tok, convs, num: int) -> list[list[int]]:
    """Chat prompts asking to rewrite or summarise a held-out ShareGPT answer (300-900 characters,
    mostly ASCII text); the assistant turn starts empty."""
    prompts = []
    for messages in convs:
        passage = next((m["content"] for m in messages if m["role"] == "assistant"
                        and 300 <= len(m["content"]) <= 900 and m["content"].isascii()), None)
        if passage is None:
            continue
        prompts.append(chat_prompt(tok, f"{REWRITE_TASKS[len(prompts) % len(REWRITE_TASKS)]}\n\n{passage}"))
        if len(prompts) == num:
            break
    return prompts


def chat_prompts(tok, convs, num: int) -> list[list[int]]:
    """Held-out ShareGPT first user turns (20-600 characters), as asked."""
    return draft_prompts(tok, convs, num)


def make_engine(model: Path, batch: int, threads: int, **spec):
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.sampling.sampling import SamplingParams
    from tokenops.policy_hooks import build_engine

    config = EngineConfig(model=str(model), device="cpu", torch_threads=threads, max_num_seqs=batch,
                          max_num_batched_tokens=1024, kv_cache_tokens=16384, **spec)
    engine = build_engine(config)  # as serve builds it: the plugins' proposers with their settings
    engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    return engine


def run_group(engine, group: list[list[int]], params) -> tuple[list[list[int]], int, float, float]:
    """Generate ``group`` together, stepping the engine; returns the outputs and the tokens, wall
    seconds and process CPU seconds after every request of the group has its first token (at batch 1:
    the decode phase, prefill left out)."""
    for i, prompt in enumerate(group):
        engine.add_request(str(i), prompt, params)
    outs: dict[str, list[int]] = {}
    counts = [0] * len(group)
    mark: tuple[int, float, float] | None = None
    while engine.has_unfinished():
        for out in engine.step():
            counts[int(out.request_id)] = len(out.outputs[0].token_ids)
            if out.finished:
                outs[out.request_id] = out.outputs[0].token_ids
        if mark is None and all(counts):
            mark = (sum(counts), time.perf_counter(), time.process_time())
    assert mark is not None
    num = sum(len(t) for t in outs.values())
    return [outs[str(i)] for i in range(len(group))], num - mark[0], time.perf_counter() - mark[1], \
        time.process_time() - mark[2]


def compare(model: Path, prompts, batch: int, max_tokens: int, threads: int, ignore_eos: bool = True, **spec):
    """Base and speculative engines run the same groups of ``batch`` prompts in turn
    (ABBA order), so load swings on the shared machine hit both alike. Returns the generated tokens
    per second of each engine (keys ``NAME_wall``, ``NAME_cpu`` end to end, ``NAME_decode_wall``,
    ``NAME_decode_cpu`` after the group's first tokens; NAME base or spec), whether the outputs are
    identical, the speculative engine's stats and the number of generated tokens."""
    from tokenops.engine.sampling.sampling import SamplingParams

    engines = {"base": make_engine(model, batch, threads), "spec": make_engine(model, batch, threads, **spec)}
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    totals = {f"{n}_{what}": 0.0 for n in engines for what in ("wall", "cpu", "decode_wall", "decode_cpu",
                                                                "decode_tokens")}
    tokens: dict[str, list] = {"base": [], "spec": []}
    for g, start in enumerate(range(0, len(prompts), batch)):
        group = prompts[start:start + batch]
        for name in (("base", "spec") if g % 2 == 0 else ("spec", "base")):
            t, c = time.perf_counter(), time.process_time()
            outs, num_decode, decode_wall, decode_cpu = run_group(engines[name], group, params)
            totals[f"{name}_wall"] += time.perf_counter() - t
            totals[f"{name}_cpu"] += time.process_time() - c
            totals[f"{name}_decode_wall"] += decode_wall
            totals[f"{name}_decode_cpu"] += decode_cpu
            totals[f"{name}_decode_tokens"] += num_decode
            tokens[name] += outs
    rates = {}
    for name in engines:
        num = sum(len(t) for t in tokens[name])
        rates[f"{name}_wall"], rates[f"{name}_cpu"] = num / totals[f"{name}_wall"], num / totals[f"{name}_cpu"]
        for what in ("decode_wall", "decode_cpu"):
            rates[f"{name}_{what}"] = totals[f"{name}_decode_tokens"] / totals[f"{name}_{what}"]
    same = tokens["base"] == tokens["spec"]
    return rates, same, engines["spec"].stats()["spec_decode"], sum(len(t) for t in tokens["spec"])


def _set_plugin_settings(**values) -> None:
    """The ``[plugins.speculative]`` settings build_engine's proposers read (as serve sets them)."""
    from tokenops.plugin_manager import get_plugin

    get_plugin("ngram_proposer").conf.update(values)  # the process's instance: what build_engine's hooks call


def _print_row(label: str, batch: int, rates, same: bool, stats, num_tokens: int) -> None:
    def ratio(what: str) -> float:
        return rates[f"spec_{what}"] / rates[f"base_{what}"]

    print(f"{label:<16}{batch:>6}{rates['base_wall']:>10.1f}{rates['spec_wall']:>10.1f}"
          + "".join(f"{ratio(w):>10.2f}x" for w in ("wall", "cpu", "decode_wall", "decode_cpu"))
          + f"{stats['acceptance_rate']:>8.2f}{stats['mean_acceptance_length']:>9.2f}{num_tokens:>8}{str(same):>10}",
          flush=True)
    print(f"#   accepted per position {stats['accepted_per_position']}, drafts {stats['num_drafts']}, "
          f"proposer time {stats['propose_time_s']:.1f}s", flush=True)
    for source, counts in (stats.get("proposer") or {}).items():
        print(f"#   from {source}: {counts['num_drafts']} drafts, {counts['num_draft_tokens']} tokens proposed, "
              f"{counts['num_accepted_tokens']} accepted", flush=True)


HEADER = (f"{'method/workload':<16}{'batch':>6}{'base t/s':>10}{'spec t/s':>10}{'wall x':>11}{'cpu x':>11}"
          f"{'dec wall x':>11}{'dec cpu x':>11}{'accept':>8}{'mean len':>9}{'tokens':>8}{'identical':>10}")


def run_default_model(args) -> None:
    """The real default model (module doc): the rewrite and chat workloads, batch 1 by default."""
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.models.default_model import SMOLLM2_INSTALL, smollm2_path
    from tokenops.engine.models.loader import load_tokenizer
    from tokenops.engine.spec.suffix_proposer import default_verify_costs, linear_verify_costs

    model = smollm2_path()
    if model is None:
        sys.exit(f"the default model's package is not installed ({SMOLLM2_INSTALL})")
    tok = load_tokenizer(model)
    convs = heldout_messages(400)
    costs = None if args.verify_costs is None else \
        list(linear_verify_costs()) if args.verify_costs == "linear" else [float(c) for c in args.verify_costs.split(",")]
    _set_plugin_settings(min_ngram=args.min_ngram, max_ngram=args.max_ngram, corpus=args.corpus,
                         draft_min_confidence=args.min_confidence, verify_costs=costs)
    sizes = "method defaults" if args.min_ngram is None and args.max_ngram is None else \
        f"{args.min_ngram}..{args.max_ngram}"
    print(f"# SmolLM2-135M-Instruct Q4_1 GGUF ({model.name}), greedy, ends at EOS or {args.max_tokens} tokens, "
          f"{args.requests} requests per workload, k={args.k} (adaptive), prompt lookup sizes {sizes}")
    shown = costs or default_verify_costs(EngineConfig(model=str(model), device="cpu"))
    print(f"# suffix: verify costs {', '.join(f'{c:.2f}' for c in shown[:8])} decode steps for 1.. tokens "
          f"({'--verify-costs' if costs else 'the default for this model and CPU'})")
    print(HEADER)
    makers = {"rewrite": rewrite_prompts, "chat": chat_prompts}
    for method in args.methods.split(","):
        if method == "draft" and not args.draft:
            print("draft: skipped (no --draft: none with SmolLM2's tokenizer ships)")
            continue
        spec = dict(speculative=method, num_speculative_tokens=args.k,
                    speculative_disable_by_batch_size=args.disable_by_batch_size)
        if method == "draft":
            spec.update(draft_model=args.draft, draft_panel_dtype=args.draft_panel_dtype)
        for workload in args.workloads.split(","):
            prompts = makers[workload](tok, convs, args.requests)
            for batch in [int(b) for b in args.batch_sizes.split(",")]:
                rates, same, stats, num = compare(model, prompts, batch, args.max_tokens, args.threads,
                                                  ignore_eos=False, **spec)
                _print_row(f"{method}/{workload}", batch, rates, same, stats, num)


def verify_cost(model: Path, threads: int, repeats: int = 30, max_rows: int = 9) -> list[float]:
    """CPU milliseconds of one step of ``rows`` tokens with logits at every row (a verify chunk of
    ``rows - 1`` proposals) at position 256, against ``rows`` single-token decode steps: what a round
    of speculation costs before any proposal is accepted."""
    from tokenops.engine.core.batch import ChunkInput
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.model_runner import ModelRunner

    runner = ModelRunner(EngineConfig(model=str(model), device="cpu", block_size=16, kv_cache_tokens=2048,
                                      torch_threads=threads))
    table, ids = list(range(32)), [(7 * i) % 40000 + 100 for i in range(272)]
    runner.execute([ChunkInput(ids[:256], 0, table)])
    print(f"# one step over rows 256.. of one sequence, {repeats} repeats, {runner.weight_format}, "
          f"forward {'fused' if runner.fused_decode is not None else 'torch'}")
    print(f"{'rows':>5}{'cpu ms':>9}{'x decode':>10}{'rows x decode':>15}")
    single, costs = 0.0, []
    for rows in range(1, max_rows + 1):
        start = time.process_time()
        for _ in range(repeats):
            runner.execute([ChunkInput(ids[256:256 + rows], 256, table, num_logits=rows)])
        ms = 1000 * (time.process_time() - start) / repeats
        single = single or ms
        costs.append(ms / single)
        print(f"{rows:>5}{ms:>9.2f}{ms / single:>9.2f}x{rows:>14}x", flush=True)
    return costs


def run_demo_models(args) -> None:
    target, draft = DEMO / "target", DEMO / "draft"
    if not (target / "model.safetensors").exists():
        sys.exit("demo target model missing (tokenops/demo_models/target); train it first")
    from tokenops.engine.core.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(target)
    convs = heldout_messages(200)
    _set_plugin_settings(min_ngram=args.min_ngram, max_ngram=args.max_ngram)
    sizes = "method defaults" if args.min_ngram is None and args.max_ngram is None else \
        f"{args.min_ngram}..{args.max_ngram}"
    print(f"# prompt lookup sizes {sizes}, greedy, {args.requests} requests x {args.max_tokens} tokens, k={args.k} (adaptive), "
          f"draft min confidence {args.min_confidence}, draft weights {args.draft_panel_dtype}, "
          f"disabled at batch >= {args.disable_by_batch_size or 'never'}")
    print(HEADER)
    for method in args.methods.split(","):
        if method == "draft" and not (draft / "model.safetensors").exists():
            print("draft: skipped (tokenops/demo_models/draft missing)")
            continue
        make = ngram_prompts if method == "ngram" else draft_prompts
        prompts = make(tok, convs, args.requests)
        spec = dict(speculative=method, num_speculative_tokens=args.k,
                    speculative_disable_by_batch_size=args.disable_by_batch_size)
        if method == "draft":
            spec["draft_model"] = str(args.draft or draft)
            spec["draft_panel_dtype"] = args.draft_panel_dtype
            _set_plugin_settings(draft_min_confidence=args.min_confidence)
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            group_prompts = prompts * max(1, (2 * batch) // len(prompts)) if batch > len(prompts) // 2 else prompts
            rates, same, stats, num = compare(target, group_prompts, batch, args.max_tokens, args.threads, **spec)
            _print_row(method, batch, rates, same, stats, num)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="demo", choices=("demo", "default"),
                   help="demo: the demo target/draft pair; default: SmolLM2-135M-Instruct (Q4_1 GGUF)")
    p.add_argument("--methods", default="ngram,draft")
    p.add_argument("--workloads", default="rewrite,chat", help="--model default: rewrite, chat or both")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--requests", type=int, default=8, help="requests per run")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=8,
                   help="num_speculative_tokens (8 with --min-confidence 0.1: the demo pair's best since the draft "
                        "steps run in one native call, 1.53-1.64x at batch 1 against 1.40x with k = 6 and no "
                        "confidence stop; docs/engine-optimizations.md)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--min-ngram", type=int, default=None,
                   help="prompt lookup: shortest suffix matched (min_ngram; default ngram 2, suffix 1)")
    p.add_argument("--max-ngram", type=int, default=None,
                   help="prompt lookup: longest suffix matched (max_ngram; default ngram 4, suffix 8)")
    p.add_argument("--corpus", default=None,
                   help="suffix proposer: corpus file (default: the shipped corpus of the default model)")
    p.add_argument("--draft", default=None, help="draft model folder or GGUF (default: the demo draft for --model demo)")
    p.add_argument("--min-confidence", type=float, default=0.1,
                   help="draft proposer: stop a proposal below this draft probability (plugin setting "
                        "draft_min_confidence)")
    p.add_argument("--draft-panel-dtype", default="bfloat16", choices=("float32", "bfloat16"),
                   help="draft: the draft model's weights in the fused decode step (engine draft_panel_dtype)")
    p.add_argument("--disable-by-batch-size", type=int, default=0,
                   help="no proposals while this many sequences or more run (0: never)")
    p.add_argument("--verify-costs", default=None,
                   help="suffix: what a step verifying 1, 2, ... tokens costs in decode steps, comma-separated, or "
                        "'linear' (a quarter step a row); default: the table for this model and CPU")
    p.add_argument("--verify-cost", action="store_true",
                   help="only print what a verify step of 1-9 rows costs against single decode steps")
    args = p.parse_args()
    import os

    import torch

    torch.set_num_threads(args.threads)
    print(f"# conditions: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, torch threads {args.threads}")
    if args.verify_cost:
        from tokenops.engine.models.default_model import smollm2_path

        verify_cost(smollm2_path() if args.model == "default" else DEMO / "target", args.threads)
    elif args.model == "default":
        run_default_model(args)
    else:
        run_demo_models(args)


if __name__ == "__main__":
    main()
