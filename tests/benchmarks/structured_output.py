"""Structured outputs on the bundled engine: decode speed with and without a JSON schema,
at batch 1 and 8, on the demo model, and the per-step cost of the grammar masks.

For each batch size the same prompts run free (``ignore_eos``, so every row makes
``--max-tokens`` tokens) and under a JSON schema (``response_format`` json_schema's
grammar, compiled once; rows end when their JSON is complete), interleaved over
``--repeats`` rounds; medians are printed. "mask ms/step" is the time the sampler
spends computing the rows' bitmasks (llguidance) and applying them, measured inside
the same runs; "overhead" is that time as a share of the constrained step.

Then how many of 20 answers sampled at temperature 1 are valid JSON with the grammar
alone and with the budget-aware close (tokenops/engine/sampling/grammar.py, steer_to_close).

Then the two grammar libraries on the demo tokenizer, the peer comparison behind the
choice of llguidance: schema compile time and mask time per token over a fixed JSON
answer (xgrammar only when it is importable; it is not a tokenops dependency).

Run: .venv/bin/python tests/benchmarks/structured_output.py [--max-tokens 64] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from tokenops.backends.local_structured import close_objects
from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.sampling.grammar import GrammarSpec
from tokenops.engine.sampling.sampling import Sampler, SamplingParams

DEMO = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target"
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"enum": ["Paris", "Tokyo", "Lima"]},
    "languages": {"type": "array", "items": {"type": "string"}}, "employed": {"type": "boolean"}},
    "required": ["name", "age", "city", "languages", "employed"]}
ANSWER = {"name": "Ada Lovelace", "age": 36, "city": "Paris", "languages": ["English", "French"], "employed": False}


class MaskTimer:
    """Wraps ``Sampler._constrain`` to add up the time the masks take."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._orig = Sampler._constrain

    def __enter__(self) -> "MaskTimer":
        orig, timer = self._orig, self

        def timed(sampler, logits, rows, seqs):
            t = time.perf_counter()
            out = orig(sampler, logits, rows, seqs)
            timer.seconds += time.perf_counter() - t
            timer.calls += 1
            return out

        Sampler._constrain = timed
        return self

    def __exit__(self, *exc) -> None:
        Sampler._constrain = self._orig


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int, int]:
    steps0 = engine.num_steps
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - t
    for out in outs if params.grammar is not None else []:
        json.loads(out.outputs[0].text)  # every constrained answer is JSON
    return seconds, sum(len(o.outputs[0].token_ids) for o in outs), engine.num_steps - steps0


def engine_figures(args: argparse.Namespace) -> None:
    engine = LLMEngine(EngineConfig(model=str(DEMO), device="cpu"))
    tok = engine.tokenizer
    matcher = engine.grammar_compiler.compile(GrammarSpec.json_schema(close_objects(SCHEMA)))
    print(f"demo model {DEMO.name}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"max_tokens {args.max_tokens}, {args.repeats} interleaved rounds (medians)")
    print(f"{'batch':>5} {'free tok/s':>11} {'schema tok/s':>13} {'ratio':>6} {'free ms/step':>13} "
          f"{'schema ms/step':>15} {'mask ms/step':>13} {'overhead':>9}")
    for batch in (1, 8):
        prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Describe person {i} as JSON."}]),
                              add_special_tokens=False) for i in range(batch)]
        free_p = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=1, ignore_eos=True)
        schema_p = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=1, grammar=matcher)
        run(engine, prompts, free_p)  # warm-up
        free, constrained, masks = [], [], []
        for _ in range(args.repeats):
            s, n, steps = run(engine, prompts, free_p)
            free.append((n / s, s / steps))
            with MaskTimer() as timer:
                s, n, steps = run(engine, prompts, schema_p)
            constrained.append((n / s, s / steps))
            masks.append(timer.seconds / max(timer.calls, 1))
        f_tps, f_step = (statistics.median(x[i] for x in free) for i in (0, 1))
        c_tps, c_step = (statistics.median(x[i] for x in constrained) for i in (0, 1))
        mask = statistics.median(masks)
        print(f"{batch:>5} {f_tps:>11.1f} {c_tps:>13.1f} {c_tps / f_tps:>6.2f} {f_step * 1e3:>13.2f} "
              f"{c_step * 1e3:>15.2f} {mask * 1e3:>13.3f} {mask / c_step:>8.1%}")


def validity_figures(args: argparse.Namespace) -> None:
    """Valid answers out of 20 sampled at temperature 1, with and without the budget-aware close."""
    engine = LLMEngine(EngineConfig(model=str(DEMO), device="cpu"))
    tok = engine.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Describe person number {i} as JSON."}]),
                          add_special_tokens=False) for i in range(20)]
    print(f"\nvalid JSON out of 20 prompts, temperature 1, max_tokens {args.max_tokens}")
    for is_steered in (False, True):
        matcher = engine.grammar_compiler.compile(GrammarSpec.json_schema(close_objects(SCHEMA)))
        if not is_steered:
            matcher.reserve_tokens = -1  # never steer
        outs = engine.generate(prompts, SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=11,
                                                       grammar=matcher))
        valid = 0
        for out in outs:
            try:
                json.loads(out.outputs[0].text)
                valid += 1
            except ValueError:
                pass
        print(f"{'with the budget-aware close' if is_steered else 'grammar only':>28} {valid:>3}/20")


def library_figures() -> None:
    import llguidance
    import llguidance.torch as llt

    tok_json = (DEMO / "tokenizer.json").read_text()
    from tokenops.engine.core.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEMO)
    vocab = 8192
    print("\ngrammar library on the demo tokenizer (one schema, one answer; ms)")
    print(f"{'library':>22} {'compile':>9} {'mask/token':>11}")
    lltok = llguidance.LLTokenizer(tok_json, n_vocab=vocab, eos_token=sorted(tok.eos_token_ids))
    ids = tok.encode(json.dumps(ANSWER, separators=(",", ":")), add_special_tokens=False)
    compile_s, mask_s = [], []
    for _ in range(5):
        t = time.perf_counter()
        m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(
            SCHEMA, defaults={"whitespace_flexible": False}))
        compile_s.append(time.perf_counter() - t)
        bitmask = llt.allocate_token_bitmask(1, vocab)
        t = time.perf_counter()
        for token in ids:
            llt.fill_next_token_bitmask(m, bitmask, 0)
            assert m.consume_token(token)
        mask_s.append((time.perf_counter() - t) / len(ids))
    print(f"{'llguidance ' + llguidance.__version__:>22} {statistics.median(compile_s) * 1e3:>9.2f} "
          f"{statistics.median(mask_s) * 1e3:>11.3f}")
    try:
        import xgrammar as xgr
    except ImportError:
        print(f"{'xgrammar':>22} not installed (pip install xgrammar to compare)")
        return
    info = xgr.TokenizerInfo([tok.id_to_token(i) for i in range(vocab)], vocab_type=xgr.VocabType.BYTE_LEVEL,
                             vocab_size=vocab, stop_token_ids=sorted(tok.eos_token_ids))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    ids = tok.encode(json.dumps(ANSWER), add_special_tokens=False)  # xgrammar's default separators
    compile_s, mask_s = [], []
    for _ in range(5):
        t = time.perf_counter()
        m = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False))
        compile_s.append(time.perf_counter() - t)
        bitmask = xgr.allocate_token_bitmask(1, vocab)
        t = time.perf_counter()
        for token in ids:
            m.fill_next_token_bitmask(bitmask, 0)
            assert m.accept_token(token)
        mask_s.append((time.perf_counter() - t) / len(ids))
    from importlib.metadata import version

    print(f"{'xgrammar ' + version('xgrammar'):>22} {statistics.median(compile_s) * 1e3:>9.2f} "
          f"{statistics.median(mask_s) * 1e3:>11.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine_figures(args)
    validity_figures(args)
    library_figures()


if __name__ == "__main__":
    main()
