"""Which n-gram proposals pay on the real default model: greedy outputs replayed offline.

Greedy output does not depend on speculation, so one run of the plain engine over a workload
(``speculative.py``'s ``rewrite`` and ``chat`` prompts on SmolLM2-135M-Instruct, the Q4_1 GGUF)
fixes every token; what a proposer would have proposed at each position, and how much of it the
target would have accepted, follows from the tokens alone. With the measured cost of a verify step
of r rows (``speculative.py --verify-cost``, in decode steps), the replay predicts the decode
speed-up of each setting without running it, and prints:

- what proposals from a match of n tokens had accepted (first / second / third token), per n;
- the predicted decode speed-up for ``min_ngram`` x ``num_speculative_tokens`` (the engine's
  adaptive k: EWMA of accepted tokens, alpha 0.5, ``ceil(ewma) + 1``);
- the best any per-match-length choice of k could do with those acceptance tables known in advance
  (a ceiling for prompt lookup on the workload);
- the ``suffix`` proposer's predicted speed-up (prompt lookup and the shipped corpus of the model's
  own answers, :mod:`tokenops.engine.spec.suffix_proposer`), under the engine's adaptive k.

Run::

    .venv/bin/python tests/benchmarks/speculative_replay.py --requests 16
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import speculative as bench  # noqa: E402

Sample = tuple[list[int], list[int]]  # prompt, greedy output


def find(tokens: list[int], k: int, min_n: int, max_n: int) -> tuple[list[int], int]:
    """The engine's prompt lookup (``NgramProposer.find``), also returning the match length."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for i in range(length - n - 1, -1, -1):
            if tokens[i] == suffix[0] and tokens[i:i + n] == suffix:
                return tokens[i + n:i + n + k], n
    return [], 0


def _accepted(proposal: list[int], out: list[int], at: int) -> int:
    a = 0
    while a < len(proposal) and at + a < len(out) and proposal[a] == out[at + a]:
        a += 1
    return a


def replay(samples: list[Sample], cost: list[float], min_n: int, max_n: int, max_k: int,
           table: dict[int, list[float]] | None = None) -> float:
    """Predicted decode speed-up of prompt lookup (plain decode steps / speculative step cost).
    ``table``: cut each proposal where the acceptance table of its match length says it pays most."""
    def propose(seq: list[int], k: int) -> list[int]:
        proposal, n = find(seq, k, min_n, max_n)
        if not proposal or table is None:
            return proposal
        expected, best, best_k = 1.0, 1.0 / cost[0], 0
        for j in range(1, len(proposal) + 1):
            expected += table[n][j - 1]
            if expected / cost[j] > best:
                best, best_k = expected / cost[j], j
        return proposal[:best_k]

    return replay_proposer(samples, cost, propose, max_k)


def replay_proposer(samples: list[Sample], cost: list[float], propose, max_k: int) -> float:
    """Predicted decode speed-up of ``propose(tokens, k) -> proposal`` under the engine's adaptive k."""
    plain = spec = 0.0
    for prompt, out in samples:
        plain += len(out) - 1
        seq, done, ewma = list(prompt) + out[:1], 1, None
        while done < len(out):
            k = max_k if ewma is None else min(max_k, max(1, math.ceil(ewma - 1e-9) + 1))
            k = min(k, len(out) - done - 1)
            proposal = propose(seq, k) if k > 0 else []
            if not proposal:
                spec += cost[0]
                seq.append(out[done])
                done += 1
                continue
            a = _accepted(proposal, out, done)
            spec += cost[len(proposal)]
            emit = min(a + 1, len(out) - done)
            seq += out[done:done + emit]
            done += emit
            ewma = 0.5 * (float(max_k) if ewma is None else ewma) + 0.5 * a
    return plain / spec


def acceptance_by_match_length(samples: list[Sample], min_n: int, max_n: int, k: int) -> dict[int, list[float]]:
    """Per match length n: the fraction of proposals whose first 1..k tokens were all accepted."""
    counts: dict[int, int] = {}
    accepted: dict[int, list[int]] = {}
    for prompt, out in samples:
        for at in range(1, len(out)):
            proposal, n = find(list(prompt) + out[:at], k, min_n, max_n)
            if not proposal:
                continue
            counts[n] = counts.get(n, 0) + 1
            row = accepted.setdefault(n, [0] * k)
            for i in range(_accepted(proposal, out, at)):
                row[i] += 1
    return {n: [accepted[n][i] / counts[n] for i in range(k)] for n in sorted(counts)}, counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=16, help="prompts per workload")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import torch
    from tokenops.engine.models.default_model import SMOLLM2_INSTALL, smollm2_path
    from tokenops.engine.models.loader import load_tokenizer
    from tokenops.engine.sampling.sampling import SamplingParams

    torch.set_num_threads(args.threads)
    model = smollm2_path()
    if model is None:
        sys.exit(f"the default model's package is not installed ({SMOLLM2_INSTALL})")
    cost = bench.verify_cost(model, args.threads, max_rows=13)
    tok, convs = load_tokenizer(model), bench.heldout_messages(400)
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.spec.suffix_proposer import build_suffix_proposer

    suffix = build_suffix_proposer(EngineConfig(model=str(model)))
    if suffix.index is None:
        print("# suffix proposer: no corpus for this model (skipped)")
        suffix = None
    engine = bench.make_engine(model, 8, args.threads)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for name, make in (("rewrite", bench.rewrite_prompts), ("chat", bench.chat_prompts)):
        prompts = make(tok, convs, args.requests)
        samples = [(pr, o.outputs[0].token_ids) for pr, o in zip(prompts, engine.generate(prompts, params))]
        print(f"\n## {name}: {len(samples)} prompts, {sum(len(o) for _, o in samples)} greedy tokens")
        table, counts = acceptance_by_match_length(samples, 1, 6, 12)
        for n, row in table.items():
            print(f"#   match of {n}: {counts[n]:>5} proposals, accepted 1st/2nd/3rd "
                  + " / ".join(f"{x:.0%}" for x in row[:3]))
        print(f"{'min_ngram':>10}" + "".join(f"{'k=' + str(k):>8}" for k in (4, 6, 8, 12)))
        for min_n in (1, 2, 3):
            print(f"{min_n:>10}" + "".join(f"{replay(samples, cost, min_n, 4, k):>7.2f}x" for k in (4, 6, 8, 12)))
        print(f"# acceptance tables known in advance, k chosen per match length: "
              f"{replay(samples, cost, 1, 6, 12, table):.2f}x (ceiling)")
        if suffix is not None:
            print("# suffix proposer (prompt lookup + the shipped corpus, its acceptance tables): "
                  + "  ".join(f"k={k} {replay_proposer(samples, cost, lambda t, n: suffix.find(t, n)[0], k):.2f}x"
                              for k in (4, 8)))


if __name__ == "__main__":
    main()
