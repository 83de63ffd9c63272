"""Before/after figures of a distilled student.

- :func:`suite_figures`: per-dimension greedy accuracy on the ladder's held-out suites
  (seed 0, never trained on), via ``multi_model._task_training.suite_accuracy``;
- :func:`traffic_figures`: on held-out captured pairs, how often the student's greedy answer
  equals the teacher's, and the share of the teacher's answer tokens the student predicts
  (teacher forcing: the per-token acceptance of greedy speculative decoding);
- :func:`draft_acceptance`: the bundled engine's own speculative decoding with the student
  as draft for the teacher: acceptance rate over the same prompts.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ._kd import load_hf


def suite_figures(model_dir: Path, dimensions: list[str], n: int) -> dict[str, dict]:
    from tokenizers import Tokenizer

    from ..multi_model import _task_training as tt
    from ..multi_model._suites import make_suite

    tasks = [t for d in dimensions for t in make_suite(d, n, tt.HELDOUT_SEED)]
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return tt.suite_accuracy(load_hf(model_dir).eval(), tok, tasks)


@torch.no_grad()
def traffic_figures(model_dir: Path, pairs: list[tuple[str, str]], max_new_tokens: int = 48) -> dict:
    from tokenizers import Tokenizer

    from ..multi_model import _task_training as tt

    if not pairs:
        return {"n": 0}
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = load_hf(model_dir).eval()
    answers = tt.generate_greedy(model, tok, [p for p, _ in pairs], max_new_tokens)
    same = sum(a.strip() == t.strip() for a, (_, t) in zip(answers, pairs))
    hit = total = 0
    for prompt, answer in pairs:
        ids, mask = tt.encode_pair(tok, prompt, answer, 256)
        x = torch.tensor([ids])
        pred = model(input_ids=x).logits[0, :-1].argmax(-1)
        target, keep = x[0, 1:], torch.tensor(mask[1:], dtype=torch.bool)
        hit += int((pred[keep] == target[keep]).sum())
        total += int(keep.sum())
    return {"n": len(pairs), "exact_match": same / len(pairs), "token_agreement": hit / max(1, total)}


def draft_acceptance(teacher_dir: Path, draft_dir: Path, prompts: list[str], k: int = 4, max_tokens: int = 32) -> dict:
    """The bundled engine's speculative decoding (greedy) with ``draft_dir`` drafting for ``teacher_dir``."""
    from tokenizers import Tokenizer
    from tokenops.engine.core.config import EngineConfig
    from tokenops.engine.core.engine import LLMEngine
    from tokenops.engine.sampling.sampling import SamplingParams

    from ..multi_model import _task_training as tt

    tok = Tokenizer.from_file(str(teacher_dir / "tokenizer.json"))
    config = EngineConfig(
        model=str(teacher_dir),
        device="cpu",
        torch_threads=1,
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        kv_cache_tokens=8192,
        speculative="draft",
        num_speculative_tokens=k,
        draft_model=str(draft_dir),
    )
    engine = LLMEngine(config)
    ids: list[str | list[int]] = [tok.encode(tt.prompt_text(p), add_special_tokens=False).ids for p in prompts]
    engine.generate(ids, SamplingParams(temperature=0, max_tokens=max_tokens))
    stats = engine.stats()["spec_decode"]
    return {
        "acceptance_rate": stats["acceptance_rate"],
        "mean_acceptance_length": stats["mean_acceptance_length"],
        "k": k,
        "n": len(prompts),
    }
