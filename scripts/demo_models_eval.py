"""Evaluation of the demo model family, used by ``train_demo_models.py``.

Every figure is measured on held-out ShareGPT conversations (never trained on)
with the weights as saved (bf16 on disk, upcast to float32), through plain
Hugging Face ``transformers`` forward passes:

- held-out perplexity per model,
- greedy speculative decoding: the draft proposes ``k`` tokens greedily, the
  target verifies them in one forward; acceptance = accepted / proposed,
- MoE expert load per layer (top-2 assignments; max/mean imbalance) and how the
  experts specialise by kind of text (code, English prose, other languages,
  chat markup),
- a few greedy sample completions.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import numpy as np
import torch

from train_demo_models import BOS, EOS, IM_END, IM_START, encode_stream, render

CATEGORIES = ("markup", "code", "english", "other-language")
SAMPLE_PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain what a neural network is in simple terms.",
    "Give me three tips for a job interview.",
]
_FENCE = re.compile(r"(```.*?(?:```|$))", re.DOTALL)


def load_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def perplexity(model, windows: torch.Tensor, batch_size: int = 8) -> float:
    """exp(mean next-token NLL) over the windows (each scored independently)."""
    total_nll, total_tokens = 0.0, 0
    for i in range(0, len(windows), batch_size):
        batch = windows[i:i + batch_size]
        logits = model(input_ids=batch, use_cache=False).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                batch[:, 1:].reshape(-1), reduction="sum")
        total_nll += nll.item()
        total_tokens += batch[:, 1:].numel()
    return math.exp(total_nll / total_tokens)


def classify_text(text: str) -> str:
    letters = [c for c in text if c.isalpha()]
    non_ascii = sum(1 for c in letters if ord(c) > 127)
    return "other-language" if letters and non_ascii / len(letters) > 0.3 else "english"


def categorized_tokens(tok, heldout: list[list[dict]], num_tokens: int,
                       max_per_conversation: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Held-out tokens with a category per token (segments encoded separately).

    At most ``max_per_conversation`` tokens are taken from each conversation so that
    one long conversation does not stand for all of ShareGPT."""
    ids: list[int] = []
    cats: list[int] = []

    def add(text: str, cat: str) -> None:
        enc = tok.encode(text, add_special_tokens=False).ids
        ids.extend(enc)
        cats.extend([CATEGORIES.index(cat)] * len(enc))

    for messages in heldout:
        start = len(ids)
        add(BOS, "markup")
        for m in messages:
            add(f"{IM_START}{m['role']}\n", "markup")
            for part in _FENCE.split(m["content"]):
                if part:
                    add(part, "code" if part.startswith("```") else classify_text(part))
            add(f"{IM_END}\n", "markup")
        add(EOS, "markup")
        del ids[start + max_per_conversation:], cats[start + max_per_conversation:]
        if len(ids) >= num_tokens:
            break
    return np.asarray(ids[:num_tokens]), np.asarray(cats[:num_tokens])


@torch.no_grad()
def expert_load(model, tok, heldout, seq_len: int, num_windows: int) -> dict:
    """Top-2 routing counts per layer/expert overall and per category of text."""
    ids, cats = categorized_tokens(tok, heldout, seq_len * num_windows)
    num_windows = len(ids) // seq_len
    ids = torch.from_numpy(ids[:num_windows * seq_len].reshape(num_windows, seq_len)).long()
    cats = torch.from_numpy(cats[:num_windows * seq_len]).long()
    num_experts = model.config.num_local_experts
    top_k = model.config.num_experts_per_tok
    counts = None  # [layer, category, expert]
    for i in range(0, num_windows, 8):
        out = model(input_ids=ids[i:i + 8], output_router_logits=True, use_cache=False)
        batch_cats = cats[i * seq_len:(i + 8) * seq_len]
        if counts is None:
            counts = torch.zeros(len(out.router_logits), len(CATEGORIES), num_experts, dtype=torch.long)
        for layer, logits in enumerate(out.router_logits):
            chosen = logits.float().topk(top_k, dim=-1).indices  # [tokens, top_k]
            flat = (batch_cats[:, None] * num_experts + chosen).reshape(-1)
            counts[layer] += torch.bincount(flat, minlength=len(CATEGORIES) * num_experts).view(len(CATEGORIES), -1)
    load = counts.sum(dim=1).float()  # [layer, expert]
    per_layer = []
    for layer in range(load.shape[0]):
        share = load[layer] / load[layer].sum()
        joint = counts[layer].float() / counts[layer].sum()
        p_cat, p_exp = joint.sum(1, keepdim=True), joint.sum(0, keepdim=True)
        mask = joint > 0
        mutual_info = float((joint[mask] * (joint[mask] / (p_cat @ p_exp)[mask]).log2()).sum())
        cat_share = {CATEGORIES[c]: [round(float(x), 3) for x in counts[layer, c] / max(1, counts[layer, c].sum())]
                     for c in range(len(CATEGORIES))}
        per_layer.append({
            "layer": layer,
            "tokens_per_expert": [int(x) for x in load[layer]],
            "share": [round(float(x), 3) for x in share],
            "max_over_mean": round(float(load[layer].max() / load[layer].mean()), 3),
            "min_over_mean": round(float(load[layer].min() / load[layer].mean()), 3),
            "category_expert_mutual_info_bits": round(mutual_info, 3),
            "category_share": cat_share,
        })
    num_per_cat = {CATEGORIES[c]: int((cats == c).sum()) for c in range(len(CATEGORIES))}
    return {"num_tokens": int(ids.numel()), "tokens_per_category": num_per_cat, "layers": per_layer}


@torch.no_grad()
def greedy_next(model, ids: list[int]) -> int:
    return int(model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].argmax())


@torch.no_grad()
def speculative_acceptance(target, draft, prompts: list[list[int]], k: int, max_new_tokens: int,
                           eos_ids: set[int]) -> dict:
    """Greedy speculative decoding with plain forwards: the output equals target greedy by construction."""
    num_proposed = num_accepted = num_rounds = num_generated = 0
    started = time.perf_counter()
    for prompt in prompts:
        ctx, new = list(prompt), 0
        while new < max_new_tokens:
            proposal = []
            for _ in range(k):
                proposal.append(greedy_next(draft, ctx + proposal))
            logits = target(input_ids=torch.tensor([ctx + proposal]), use_cache=False).logits[0, len(ctx) - 1:]
            verified = logits.argmax(-1).tolist()  # k+1 target tokens
            n = 0
            while n < k and proposal[n] == verified[n]:
                n += 1
            num_proposed += k
            num_accepted += n
            num_rounds += 1
            step_tokens = proposal[:n] + [verified[n]]
            for j, t in enumerate(step_tokens):
                if t in eos_ids:
                    step_tokens = step_tokens[:j + 1]
                    break
            ctx += step_tokens
            new += len(step_tokens)
            num_generated += len(step_tokens)
            if step_tokens[-1] in eos_ids:
                break
    return {"k": k, "num_prompts": len(prompts), "num_proposed": num_proposed, "num_accepted": num_accepted,
            "acceptance": round(num_accepted / max(1, num_proposed), 3),
            "tokens_per_target_forward": round(num_generated / max(1, num_rounds), 3),
            "seconds": round(time.perf_counter() - started, 1)}


@torch.no_grad()
def greedy_sample(model, tok, prompt: str, max_new_tokens: int = 40) -> str:
    ids = tok.encode(render([{"role": "user", "content": prompt}]) + f"{IM_START}assistant\n",
                     add_special_tokens=False).ids
    out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=[4, 2], pad_token_id=0)
    return tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)


def evaluate_all(out: Path, heldout: list[list[dict]], args) -> dict:
    """All figures for the saved folders under ``out``; prints them as it goes."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "target" / "tokenizer.json"))
    stream = encode_stream(tok, [render(m) for m in heldout])
    num_windows = min(args.eval_windows, len(stream) // args.seq_len)
    windows = torch.from_numpy(stream[:num_windows * args.seq_len].reshape(num_windows, args.seq_len)).long()
    print(f"== eval: {len(heldout)} held-out conversations, {windows.numel()} tokens for perplexity", flush=True)
    result: dict = {"heldout_tokens": int(windows.numel()), "perplexity": {}, "samples": {}}
    models = {n: load_model(out / n) for n in ("target", "draft", "moe") if (out / n / "config.json").exists()}
    for name, model in models.items():
        ppl = perplexity(model, windows)
        result["perplexity"][name] = round(ppl, 2)
        print(f"== held-out perplexity {name}: {ppl:.2f}", flush=True)
    if "target" in models and "draft" in models:
        prompts = []
        for messages in heldout:
            first_user = next((m for m in messages if m["role"] == "user"), None)
            if first_user is None:
                continue
            ids = tok.encode(render([first_user]) + f"{IM_START}assistant\n", add_special_tokens=False).ids
            if len(ids) <= 160:
                prompts.append(ids)
            if len(prompts) == args.spec_prompts:
                break
        spec = speculative_acceptance(models["target"], models["draft"], prompts, k=4, max_new_tokens=48,
                                      eos_ids={2, 4})
        result["speculative"] = spec
        print(f"== speculative decoding (greedy, k=4, {spec['num_prompts']} held-out ShareGPT prompts): "
              f"acceptance {spec['acceptance']:.3f} ({spec['num_accepted']}/{spec['num_proposed']}), "
              f"{spec['tokens_per_target_forward']:.2f} tokens per target forward", flush=True)
    if "moe" in models:
        load = expert_load(models["moe"], tok, heldout, args.seq_len, args.moe_eval_windows)
        result["expert_load"] = load
        print(f"== MoE expert load on {load['num_tokens']} held-out tokens {load['tokens_per_category']}", flush=True)
        for layer in load["layers"]:
            print(f"   layer {layer['layer']}: share {layer['share']} max/mean {layer['max_over_mean']} "
                  f"min/mean {layer['min_over_mean']} I(category;expert) "
                  f"{layer['category_expert_mutual_info_bits']} bits", flush=True)
            for cat, share in layer["category_share"].items():
                print(f"      {cat:>14}: {share}", flush=True)
    for name, model in models.items():
        result["samples"][name] = {p: greedy_sample(model, tok, p) for p in SAMPLE_PROMPTS}
        for p, text in result["samples"][name].items():
            print(f"== sample {name} | {p!r} -> {text!r}", flush=True)
    return result
