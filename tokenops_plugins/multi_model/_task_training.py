"""Reusable pieces for training demo models on the checkable task suites.

The task-trained ladder (``scripts/train_ladder.py``) is built from these functions, and the
reasoning-budget, memory and distillation work (``tokenops distill train|eval``) reuse them;
``scripts/task_training.py`` re-exports this module for the scripts. It ships in the wheel
(``tokenops distill`` needs no source checkout); the chat template and the schedule it uses
are core (:mod:`tokenops.training.chat`):

- :func:`heldout_prompts` / :func:`task_pairs` — (prompt, answer) pairs generated from
  ``tokenops_plugins.multi_model._suites`` with training seeds, never a held-out prompt;
- :func:`chat_pairs` — first exchanges of ShareGPT conversations (keeps the chat habit);
- :func:`encode_pair` / :func:`make_batch` — chat-template tokens with an answer-only
  loss mask (the prompt is context, only the assistant's answer and ``<|im_end|>`` are
  learned);
- :func:`finetune` — AdamW on those batches with bf16 autocast, a warmup+cosine
  schedule and a wall-clock budget that sets the step count from measured speed;
- :func:`generate_greedy` / :func:`suite_accuracy` — batched greedy answers to suite
  tasks and per-dimension accuracy with Wilson intervals.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
from tokenops.training.chat import IM_END, IM_START, lr_at, render

from ._profiles import wilson
from ._suites import DIMENSIONS, Task, make_suite

HELDOUT_SEED = 0  # the suites' seed 0 is what `tokenops profile run` and routing_eval measure on
HELDOUT_PER_DIMENSION = 100


def heldout_prompts(n: int = HELDOUT_PER_DIMENSION, seed: int = HELDOUT_SEED) -> set[str]:
    """Prompts that training must never see (the evaluation suites)."""
    return {t.prompt for d in DIMENSIONS for t in make_suite(d, n, seed)}


def task_pairs(weights: dict[str, float], num: int, seed: int, exclude: set[str]) -> list[tuple[str, str, str]]:
    """``num`` (dimension, prompt, answer) training pairs drawn by dimension ``weights``;
    prompts in ``exclude`` are skipped (the suites' held-out prompts)."""
    rng = random.Random(f"train:{seed}")
    dims = list(weights)
    probs = np.asarray([weights[d] for d in dims], dtype=float)
    probs /= probs.sum()
    counts = np.random.default_rng(seed).multinomial(num, probs)
    pairs: list[tuple[str, str, str]] = []
    for dim, count in zip(dims, counts):
        suite_seed, made = 1000 + seed, 0
        while made < count:
            for task in make_suite(dim, max(64, int(count)), seed=suite_seed):
                if task.prompt in exclude:
                    continue
                pairs.append((dim, task.prompt, task.reference))
                made += 1
                if made == count:
                    break
            suite_seed += 1
    rng.shuffle(pairs)
    return pairs


_KEYS = [
    "vault access code",
    "gym locker code",
    "bike lock combination",
    "door PIN",
    "safe code",
    "parking permit number",
    "badge number",
    "order number",
    "alarm code",
    "storage unit code",
]
_FILLER_THINGS = [
    "timber",
    "grain",
    "cement",
    "textile",
    "copper",
    "coffee",
    "paper",
    "glass",
    "steel",
    "cotton",
    "river",
    "maple",
    "harbor",
    "lantern",
    "silver",
]
_FILLER_CITIES = [
    "Lisbon",
    "Osaka",
    "Lagos",
    "Quito",
    "Oslo",
    "Perth",
    "Tunis",
    "Riga",
    "Lima",
    "Hanoi",
    "Paris",
    "Pune",
    "Sofia",
    "Turin",
]


def recall_pair(rng: random.Random) -> tuple[str, str | list[dict], str]:
    """A training-only retrieval pair that teaches reading a number out of the context:
    one to three facts ("the <key> is NNNN") with different keys among 0-8 filler notes in
    one user message, or 0-4 as a multi-turn chat (user notes answered "Noted."; sized to
    fit a 192-token training window), and a
    question about one of the keys. The answer is the number with a leading space, so its
    tokens are the very tokens that follow "is" in the context (the demo tokenizer splits
    " 4821" and "4821" differently): a pure copy. The held-out suite (always the vault
    code among 8 notes) is never generated here: its prompts are excluded by the caller."""
    keys = rng.sample(_KEYS, rng.randint(1, 3))
    codes = [rng.randint(1000, 9999) for _ in keys]
    lead = ["Important: the", "By the way, the", "Also, the", "Remember: the", "The"]
    facts = [f"{rng.choice(lead)} {k} is {c}." for k, c in zip(keys, codes)]
    notes = [
        f"Note {i}: the {rng.choice(_FILLER_THINGS)} shipment to {rng.choice(_FILLER_CITIES)} is on schedule."
        for i in range(rng.randint(0, 8))
    ]
    chat = rng.random() < 0.5
    if chat:
        notes = notes[:4]
    for fact in facts:
        notes.insert(rng.randint(0, len(notes)), fact)
    ask = rng.randrange(len(keys))
    question = f"What is the {keys[ask]}? Reply with the number only."
    answer = f" {codes[ask]}"
    if not chat:
        return "retrieval", "\n".join(notes) + "\n\n" + question, answer
    messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant."}] if rng.random() < 0.5 else []
    for note in notes:
        messages += [{"role": "user", "content": note}, {"role": "assistant", "content": "Noted."}]
    return "retrieval", messages + [{"role": "user", "content": question}], answer


def recall_pairs(num: int, seed: int, exclude: set[str]) -> list[tuple]:
    rng = random.Random(f"recall:{seed}")
    out: list[tuple] = []
    while len(out) < num:
        pair = recall_pair(rng)
        if not (isinstance(pair[1], str) and pair[1] in exclude):
            out.append(pair)
    return out


def chat_pairs(conversations: Iterable[list[dict]], num: int, max_chars: int = 600) -> list[tuple[str, str, str]]:
    """(\"chat\", user turn, assistant turn) from the first exchange of each conversation."""
    out = []
    for messages in conversations:
        if len(messages) >= 2 and messages[0]["role"] == "user" and messages[1]["role"] == "assistant":
            out.append(("chat", messages[0]["content"][:max_chars], messages[1]["content"][:max_chars]))
            if len(out) == num:
                break
    return out


def prompt_text(prompt: str | list[dict]) -> str:
    """The rendered chat prompt up to the assistant's turn (what the engine's template makes);
    ``prompt`` is one user message or a whole message list."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return render(messages) + f"{IM_START}assistant\n"


def encode_pair(tok, prompt: str | list[dict], answer: str, max_len: int) -> tuple[list[int], list[int]]:
    """Token ids of prompt + answer + <|im_end|> and the loss mask (1 on the answer only).
    A long prompt is cut from the left so the answer always fits."""
    p = tok.encode(prompt_text(prompt), add_special_tokens=False).ids
    a = tok.encode(answer + IM_END, add_special_tokens=False).ids[: max_len // 2]
    p = p[-(max_len - len(a)) :]
    return p + a, [0] * len(p) + [1] * len(a)


def make_batch(
    encoded: list[tuple[list[int], list[int]]], pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, labels) with -100 outside the loss mask."""
    width = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(encoded), width), dtype=torch.long)
    labels = torch.full((len(encoded), width), -100, dtype=torch.long)
    for row, (x, mask) in enumerate(encoded):
        ids[row, : len(x)] = torch.tensor(x)
        att[row, : len(x)] = 1
        labels[row, : len(x)] = torch.where(torch.tensor(mask, dtype=torch.bool), torch.tensor(x), -100)
    return ids, att, labels


def answer_loss(model, ids: torch.Tensor, att: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy on the answer positions only; the vocabulary projection
    runs on those positions alone (most of a small model's cost on a long prompt)."""
    hidden = model.model(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state
    target = labels[:, 1:]
    keep = target != -100
    logits = model.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), target[keep])


def length_bucketed(encoded: list, batch_size: int, rng: np.random.Generator, pool: int = 32) -> np.ndarray:
    """A seeded epoch order whose consecutive ``batch_size`` runs have similar lengths
    (sorted within pools of ``pool`` batches, batches then shuffled): less padding."""
    order = rng.permutation(len(encoded))
    batches = []
    for i in range(0, len(order), batch_size * pool):
        group = sorted(order[i : i + batch_size * pool], key=lambda j: len(encoded[j][0]))
        batches += [group[k : k + batch_size] for k in range(0, len(group), batch_size)]
    batches = [b for b in batches if len(b) == batch_size]
    return np.asarray([j for k in rng.permutation(len(batches)) for j in batches[k]])


@dataclass(slots=True)
class FinetuneConfig:
    lr: float = 2e-3
    batch_size: int = 16
    max_len: int = 192
    warmup: int = 30
    steps: int | None = None  # exact step count; None = from ``minutes`` and measured speed
    minutes: float = 5.0
    seed: int = 0
    bf16: bool = False  # bf16 autocast only pays on CPUs with AMX/AVX512-BF16
    log_every: int = 25

    def __post_init__(self) -> None:
        assert self.steps is None or self.steps > 0
        assert self.minutes > 0 and self.batch_size > 0


def make_optimizer(model, lr: float) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only (norms and biases are not shrunk), as the ladder
    and the distillation student are both trained."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def optimizer_step(model, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """One update from ``loss``, the gradient norm clipped to 1 (a long answer cannot blow a step up)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def finetune(
    model,
    tok,
    pairs: list[tuple[str, str, str]],
    cfg: FinetuneConfig,
    name: str = "model",
    log: Callable[[str], None] = print,
) -> dict:
    """Train ``model`` in place on ``pairs`` with the answer-only loss; returns a training info dict.

    Pairs are visited in a seeded random order (epochs reshuffle). Without ``cfg.steps``
    the step count is set from the speed of steps 3-12 so the run takes ``cfg.minutes``."""
    torch.manual_seed(cfg.seed)
    order_rng = np.random.default_rng(cfg.seed)
    encoded = [encode_pair(tok, p, a, cfg.max_len) for _, p, a in pairs]
    model.float().train()
    opt = make_optimizer(model, cfg.lr)
    num_steps, losses, order, cursor = cfg.steps, [], length_bucketed(encoded, cfg.batch_size, order_rng), 0
    started = time.perf_counter()
    calibration_started = started
    step = 0
    while num_steps is None or step < num_steps:
        if cursor + cfg.batch_size > len(order):
            order, cursor = length_bucketed(encoded, cfg.batch_size, order_rng), 0
        rows = [encoded[i] for i in order[cursor : cursor + cfg.batch_size]]
        cursor += cfg.batch_size
        ids, att, labels = make_batch(rows)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, num_steps or 10**9, cfg.lr, cfg.warmup)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss = answer_loss(model, ids, att, labels)
        optimizer_step(model, opt, loss)
        losses.append(loss.item())
        step += 1
        if step == 3:
            calibration_started = time.perf_counter()
        if num_steps is None and step == 13:
            per_step = (time.perf_counter() - calibration_started) / 10
            num_steps = max(step + 1, int(cfg.minutes * 60 / per_step))
            log(
                f"[{name}] {per_step:.2f}s/step -> {num_steps} steps for {cfg.minutes} min "
                f"(reproduce with --steps-{name} {num_steps})"
            )
        if (
            cfg.steps is None
            and num_steps is not None
            and step < num_steps
            and time.perf_counter() - started > 1.5 * cfg.minutes * 60
        ):
            log(
                f"[{name}] stopping at step {step} of {num_steps}: over 1.5x the time budget "
                f"(the machine got slower than calibrated)"
            )
            break
        if step % cfg.log_every == 0:
            log(
                f"[{name}] step {step}/{num_steps} answer loss {np.mean(losses[-cfg.log_every :]):.3f} "
                f"{(time.perf_counter() - started) / 60:.1f} min"
            )
    minutes = (time.perf_counter() - started) / 60
    return {
        "num_steps": step,
        "train_minutes": round(minutes, 2),
        "examples_seen": step * cfg.batch_size,
        "final_answer_loss": float(np.mean(losses[-50:])),
        "batch_size": cfg.batch_size,
        "peak_lr": cfg.lr,
        "max_len": cfg.max_len,
        "seed": cfg.seed,
        "bf16_autocast": cfg.bf16,
    }


@torch.no_grad()
def generate_greedy(model, tok, prompts: list[str], max_new_tokens: int, batch_size: int = 32) -> list[str]:
    """Greedy answers (chat template, left-padded batches, stop at <|im_end|>/<|eos|>)."""
    model.eval()
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        chunk = [tok.encode(prompt_text(p), add_special_tokens=False).ids for p in prompts[i : i + batch_size]]
        width = max(map(len, chunk))
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        att = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, x in enumerate(chunk):
            ids[row, width - len(x) :] = torch.tensor(x)
            att[row, width - len(x) :] = 1
        gen = model.generate(
            input_ids=ids,
            attention_mask=att,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=[4, 2],
            pad_token_id=0,
        )
        for row in gen[:, width:].tolist():
            cut = [t for t in row]
            for stop in (4, 2):
                if stop in cut:
                    cut = cut[: cut.index(stop)]
            out.append(tok.decode(cut, skip_special_tokens=True))
    return out


MAX_NEW_TOKENS = {"code": 48, "extraction": 40, "instruction": 16}


def suite_accuracy(model, tok, tasks: list[Task]) -> dict[str, dict]:
    """Per-dimension greedy accuracy of ``model`` on ``tasks`` with Wilson 95% intervals."""
    by_dim: dict[str, list[Task]] = {}
    for t in tasks:
        by_dim.setdefault(t.dimension, []).append(t)
    result = {}
    for dim, group in by_dim.items():
        answers = generate_greedy(model, tok, [t.prompt for t in group], MAX_NEW_TOKENS.get(dim, 12))
        correct = sum(bool(t.check(a)) for t, a in zip(group, answers))
        lo, hi = wilson(correct, len(group))
        result[dim] = {
            "accuracy": correct / len(group),
            "ci_low": round(lo, 3),
            "ci_high": round(hi, 3),
            "n": len(group),
            "sample": {"prompt": group[0].prompt[-120:], "answer": answers[0]},
        }
    return result
