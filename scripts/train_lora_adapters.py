"""Train the three LoRA adapters of SmolLM2-135M-Instruct that ship in
``tokenops/demo_models/adapters/`` (issue 40 §4): ``smollm2-math``, ``smollm2-instruction`` and
``smollm2-code``, one per checkable suite of ``tokenops_plugins.multi_model._suites`` where the
base model is weak (its capability profile: math 0.00, instruction 0.00, code 0.30; it already
scores 0.9+ on extraction, classification and retrieval, so adapters there could not gain 15 points).

- Data: (prompt, answer) pairs generated from the suites with training seeds; every prompt of the
  held-out split (the suites' seed 0, the first ``HELDOUT_PER_DIMENSION`` items of each, what
  ``tokenops profile run``, ``tests/benchmarks/lora_quality.py`` and ``routing_eval.py`` measure on)
  is excluded. The math answers show the two steps (``41 * 14 = 574, 574 + 12 = 586``): the suite
  checks the last number. Nothing is downloaded.
- A "keep" share: prompts of the other suites answered by the base model itself (greedy), so an
  adapter learns to leave what it was not trained for as the base does (the quality goal asks
  each adapter to stay within 3 points of the base off its own suite).
- The validation split (the suites' seed 9000, ``VALIDATION_SEED``) is excluded too: settings are
  chosen on it (``lora_quality.py --seed 9000``), never on the held-out split.
- ``--keep-kl W`` adds W times the KL divergence from the base's next-token distributions to the
  adapter's on the keep answers (the base is the same model with the adapter disabled), so the adapter
  is held to the base's whole distribution off its suite, not only to each greedy token.
- Training: ``peft`` LoRA on the fp32 Hugging Face copy of the default model
  (``tests/real_model.py: smollm2_folder()``, dequantized from the shipped GGUF), the SmolLM2 chat
  template (what ``serve`` renders), loss on the answer only, AdamW with warmup + cosine, bf16
  autocast on CPUs that have AMX/AVX512-BF16, ``--threads`` torch threads.
- Output: PEFT folders with the weights cast to float16 (``adapter_model.safetensors`` about 1 MB
  for rank 8 on q/v) and ``tokenops/demo_models/adapters/report.json`` (steps, minutes, losses).

    nice -n 10 .venv/bin/python scripts/train_lora_adapters.py                  # all three
    nice -n 10 .venv/bin/python scripts/train_lora_adapters.py --only smollm2-code --steps 150
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "tokenops" / "demo_models" / "adapters"
HELDOUT_SEED = 0
HELDOUT_PER_DIMENSION = 100
#: the validation split (settings and checkpoints are chosen on it, never on the held-out split): the suites'
#: seed 9000, which no training pair (suite seeds 1000+) or keep prompt (5000+) uses
VALIDATION_SEED = 9000


@dataclass(frozen=True, slots=True)
class Spec:
    name: str
    dimension: str
    targets: tuple[str, ...]
    rank: int = 8
    steps: int = 36
    lr: float = 3e-3
    top_layers: int = 4  # LoRA on the last N of the 30 layers only: the rest runs once per example

    def target_regex(self, num_layers: int = 30) -> str:
        layers = "|".join(str(i) for i in range(num_layers - self.top_layers, num_layers))
        return rf".*\.layers\.({layers})\.(self_attn|mlp)\.({'|'.join(self.targets)})"


ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SPECS = (
    Spec("smollm2-math", "math", ALL, steps=160, top_layers=8),
    Spec("smollm2-instruction", "instruction", ALL, steps=80, top_layers=8),
    Spec("smollm2-code", "code", ALL, steps=60),
)
#: greedy token budget of a keep answer per suite (code answers run longer than the others)
KEEP_TOKENS = {"code": 64}
KEEP_DIMENSIONS = ("math", "extraction", "instruction", "retrieval", "code", "classification")


def heldout(dimension: str) -> set[str]:
    from tokenops_plugins.multi_model._suites import make_suite

    return {t.prompt for t in make_suite(dimension, HELDOUT_PER_DIMENSION, HELDOUT_SEED)}


def excluded(dimension: str) -> set[str]:
    """Prompts never trained on: the held-out split and the validation split (small suites such as
    instruction's 200 prompts draw the same prompt under several seeds, so seeds alone do not keep
    the splits apart)."""
    from tokenops_plugins.multi_model._suites import make_suite

    return heldout(dimension) | {t.prompt for t in make_suite(dimension, HELDOUT_PER_DIMENSION, VALIDATION_SEED)}


def math_steps(prompt: str, reference: str) -> str:
    """The suite's math answer written as steps a 135M model can compute one digit at a time (the
    checker reads the last number). The operands are first restated with two digits each (the columns
    are then copies of neighbouring tokens), every sum has two terms. ``+``: column addition with the
    carry added to the tens, the answer is the tens sum followed by the units digit (``36+78+07: units
    6+8=14, 14+7=21, tens 3+7=10, 10+0=10, 10+2=12, answer 121``). ``-``: signed columns, then tens
    and units joined (``... tens 3-7=-4, -4+0=-4, -40+5=-35``). ``*``: the
    product split over b's tens and units (``41*14 = 41*10 + 41*4 = 410+164 = 574, 574+12 = 586``)."""
    import re

    a, op, b, c = (x if x in "+-*" else int(x) for x in re.search(r"\((\d+) ([-+*]) (\d+)\) \+ (\d+)", prompt).groups())
    (a1, a0), (b1, b0), (c1, c0) = divmod(a, 10), divmod(b, 10), divmod(c, 10)
    if op == "+":
        units, tens = a0 + b0 + c0, a1 + b1 + c1
        text = (
            f"{a:02d}+{b:02d}+{c:02d}: units {a0}+{b0}={a0 + b0}, {a0 + b0}+{c0}={units}, "
            f"tens {a1}+{b1}={a1 + b1}, {a1 + b1}+{c1}={tens}, {tens}+{units // 10}={tens + units // 10}, "
            f"answer {a + b + c}"
        )
    elif op == "-":
        units, tens = a0 - b0 + c0, a1 - b1 + c1
        text = (
            f"{a:02d}-{b:02d}+{c:02d}: units {a0}-{b0}={a0 - b0}, {a0 - b0}+{c0}={units}, "
            f"tens {a1}-{b1}={a1 - b1}, {a1 - b1}+{c1}={tens}, {10 * tens}{units:+d}={10 * tens + units}"
        )
    else:
        product = a * b
        text = f"{a}*{b} = {a}*{b1 * 10} + {a}*{b0} = {a * b1 * 10}+{a * b0} = {product}, {product}+{c} = {product + c}"
    assert text.endswith(reference), (prompt, text, reference)
    return text


def training_pairs(dimension: str, num: int, seed: int) -> list[tuple[str, str]]:
    """``num`` distinct (prompt, answer) pairs of one suite, none of them held out or in the validation split. A suite with few
    distinct prompts (instruction: 200) repeats prompts with fresh reference answers."""
    from tokenops_plugins.multi_model._suites import make_suite

    exclude, pairs, suite_seed = excluded(dimension), [], 1000 + seed
    while len(pairs) < num:
        for task in make_suite(dimension, 256, seed=suite_seed):
            if task.prompt not in exclude:
                answer = math_steps(task.prompt, task.reference) if dimension == "math" else task.reference
                pairs.append((task.prompt, answer))
        suite_seed += 1
    random.Random(seed).shuffle(pairs)
    return pairs[:num]


def keep_prompts(dimension: str, per_dimension: int, seed: int, counts: dict[str, int] | None = None) -> dict[str, str]:
    """Training-seed prompts of the other suites (never held out), answered later by the base:
    prompt -> its suite."""
    from tokenops_plugins.multi_model._suites import make_suite

    out = {}
    for dim in KEEP_DIMENSIONS:
        if dim != dimension:
            exclude = excluded(dim)
            prompts = [
                t.prompt
                for t in make_suite(dim, 4 * (counts or {}).get(dim, per_dimension), seed=5000 + seed)
                if t.prompt not in exclude
            ]
            out.update(dict.fromkeys(prompts[: (counts or {}).get(dim, per_dimension)], dim))
    return out


def code_neighbours(num: int, seed: int) -> list[str]:
    """Code prompts next to the suite's but never in it: the templates with numbers above the suite's
    (2-19) and the five fixed functions under other names. Half of the code suite is prompts drawn from
    small sets (five fixed functions, ``repeat``/``count_over`` with one number), so every one of them is
    in the held-out or validation split and the keep share never shows them: an adapter drifts there
    (one flipped fixed prompt is ~5 of 100 items). The base's answers to these neighbours hold it."""
    from tokenops_plugins.multi_model._suites import _CODE_SPECS, _CODE_TEMPLATES

    rng, out = random.Random(f"neighbours:{seed}"), []
    while len(out) < num:
        if rng.random() < 0.5:
            name, spec, _, _ = rng.choice(_CODE_SPECS)
            name = f"{name}{rng.choice(['_fn', '2', '_value', '_of', 'x'])}"
        else:
            name, spec, _, _ = rng.choice(_CODE_TEMPLATES)
            a, b = rng.randint(20, 99), rng.randint(20, 99)
            spec = spec.format(a=a, b=b, c=a + b + 10)
        prompt = f"Write a Python function `{name}` that {spec}. Reply with the code only."
        out += [prompt] if prompt not in out else []
    return out


def base_answers(base, tok, prompts: list[str], dimension_of: dict[str, str], cache: Path, end_id: int) -> list[str]:
    """The base's greedy answers to keep prompts, cached in ``cache`` (JSON) so that several adapters
    (or reruns) pay the generation pass once."""
    known = json.loads(cache.read_text()) if cache.exists() else {}
    todo = [p for p in prompts if p not in known]
    for dim in sorted({dimension_of[p] for p in todo}):
        batch = [p for p in todo if dimension_of[p] == dim]
        known.update(zip(batch, greedy(base, tok, batch, KEEP_TOKENS.get(dim, 40), end_id)))
    if todo:
        cache.write_text(json.dumps(known, indent=1) + "\n")
    return [known[p] for p in prompts]


def prompt_ids(tok, prompt: str) -> list[int]:
    return tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


def encode(tok, prompt: str, answer: str, end_id: int) -> tuple[list[int], list[int]]:
    """Chat-template ids of prompt + answer + <|im_end|> and the loss mask (answer only)."""
    p = list(prompt_ids(tok, prompt))
    a = tok.encode(answer, add_special_tokens=False) + [end_id]
    return p + a, [0] * len(p) + [1] * len(a)


@torch.no_grad()
def greedy(model, tok, prompts: list[str], max_new_tokens: int, end_id: int, batch: int = 16) -> list[str]:
    """Batched greedy answers (left padding), cut at <|im_end|>."""
    model.eval()
    answers = []
    for i in range(0, len(prompts), batch):
        rows = [prompt_ids(tok, p) for p in prompts[i : i + batch]]
        width = max(map(len, rows))
        ids = torch.tensor([[0] * (width - len(r)) + list(r) for r in rows])
        att = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        gen = model.generate(
            input_ids=ids,
            attention_mask=att,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=end_id,
            pad_token_id=0,
        )
        for row in gen[:, width:].tolist():
            answers.append(tok.decode(row[: row.index(end_id)] if end_id in row else row, skip_special_tokens=True))
    return answers


@torch.no_grad()
def lower_states(base, rows: list[list[int]], cut: int, batch: int = 16) -> list[torch.Tensor]:
    """The input of layer ``cut`` for each token row: the frozen lower layers run once per example
    (no adapter there), so training steps run only the top layers (most of the CPU time saved)."""
    layers, out = base.model.layers, []
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        ids = torch.zeros((len(chunk), max(map(len, chunk))), dtype=torch.long)
        for r, x in enumerate(chunk):
            ids[r, : len(x)] = torch.tensor(x)
        h = base.model.embed_tokens(ids)
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        rope = base.model.rotary_emb(h, position_ids=pos)
        for layer in layers[:cut]:  # right padding under a causal mask: real tokens never see the pads
            h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=rope)
        out += [h[r, : len(x)].clone() for r, x in enumerate(chunk)]
    return out


def top_hidden(base, cut: int, states: list[torch.Tensor], rows: list[list[int]]) -> torch.Tensor:
    """The final-norm hidden states of token rows from their cached layer-``cut`` inputs, through the top
    layers (with LoRA unless the adapter is disabled around the call)."""
    width = max(len(x) for x in rows)
    h = torch.zeros((len(rows), width, states[0].shape[-1]))
    for r, (st, x) in enumerate(zip(states, rows)):
        h[r, : len(x)] = st
    pos = torch.arange(width).unsqueeze(0)
    rope = base.model.rotary_emb(h, position_ids=pos)
    for layer in base.model.layers[cut:]:
        h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=rope)
    return base.model.norm(h)


def cached_lower_states(base, rows: list[list[int]], cut: int, folder: Path | None) -> list[torch.Tensor]:
    """``lower_states`` kept on disk under a digest of the rows and the cut: reruns on the same examples
    (another learning rate, KL weight or step count) skip the frozen layers' pass, most of a run's time."""
    if folder is None:
        return lower_states(base, rows, cut)
    import hashlib

    digest = hashlib.sha256(json.dumps([cut, rows]).encode()).hexdigest()[:16]
    path = folder / f"states-{digest}.pt"
    if path.exists():
        return torch.load(path)
    states = lower_states(base, rows, cut)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(states, path)
    return states


def answer_positions(masks: list[list[int]], rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(where, target): the positions that predict an answer token (a [rows, width - 1] bool mask) and
    those tokens."""
    width = max(len(x) for x in rows)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for r, (m, x) in enumerate(zip(masks, rows)):
        labels[r, : len(x)] = torch.where(torch.tensor(m, dtype=torch.bool), torch.tensor(x), -100)
    target = labels[:, 1:]
    return target != -100, target[target != -100]


def top_loss(model, cut: int, states, masks, rows, is_keep: list[bool], keep_kl: float) -> torch.Tensor:
    """Answer-only cross-entropy through the top layers, plus ``keep_kl`` times the KL divergence from the
    base's next-token distributions to the adapter's on the answer tokens of keep rows (the base's own
    answers to other suites). The greedy answer alone only pins each arg-max; the KL term also holds the
    near-ties that a small drift flips, which is how an adapter loses points on a suite it never saw."""
    inner = model.base_model.model  # the LlamaForCausalLM with the LoRA layers injected
    where, target = answer_positions(masks, rows)
    logits = inner.lm_head(top_hidden(inner, cut, states, rows)[:, :-1][where]).float()
    loss = torch.nn.functional.cross_entropy(logits, target)
    keep_rows = [r for r, k in enumerate(is_keep) if k]
    if keep_kl <= 0 or not keep_rows:
        return loss
    kw, _ = answer_positions([masks[r] for r in keep_rows], [rows[r] for r in keep_rows])
    with torch.no_grad(), model.disable_adapter():
        teacher = inner.lm_head(top_hidden(inner, cut, [states[r] for r in keep_rows], [rows[r] for r in keep_rows]))
    teacher = teacher[:, :-1][kw].float()
    # the keep rows' answer positions inside the whole batch's flattened answer positions
    row_of = torch.arange(len(rows)).unsqueeze(1).expand_as(where)[where]
    student = logits[torch.isin(row_of, torch.tensor(keep_rows))]
    kl = torch.nn.functional.kl_div(
        torch.log_softmax(student, -1), torch.log_softmax(teacher, -1), log_target=True, reduction="batchmean"
    )
    return loss + keep_kl * kl


def train_one(base, tok, spec: Spec, pairs: list[tuple[str, str]], args) -> tuple[dict, object]:
    from peft import LoraConfig, get_peft_model

    from tokenops.training.chat import lr_at

    torch.manual_seed(args.seed)
    num_layers = base.config.num_hidden_layers
    cut = num_layers - spec.top_layers
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    encoded = [encode(tok, p, a, end_id) for p, a in pairs]
    started = time.perf_counter()
    states = cached_lower_states(base, [x for x, _ in encoded], cut, args.states_cache)
    cached_s = time.perf_counter() - started
    print(f"[{spec.name}] layer-{cut} inputs of {len(encoded)} examples in {cached_s:.0f}s", flush=True)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=2 * spec.rank,
        lora_dropout=0.0,
        target_modules=spec.target_regex(num_layers),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config)
    if args.init:  # warm start: continue from an adapter trained before (same rank and layers)
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        saved = load_file(str(Path(args.init) / spec.name / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(model, {k: v.float() for k, v in saved.items()})
        assert not [k for k in result.missing_keys if "lora" in k], result.missing_keys
    model.base_model.model.train()
    keep = set(args.keep_prompts)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.0)
    rng = np.random.default_rng(args.seed)
    steps, order, cursor, losses = args.steps or spec.steps, np.array([], dtype=int), 0, []
    for step in range(steps):
        if cursor + args.batch_size > len(order):
            order, cursor = rng.permutation(len(encoded)), 0
        picked = order[cursor : cursor + args.batch_size]
        cursor += args.batch_size
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, spec.lr, min(20, steps // 5))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = top_loss(
                model,
                cut,
                [states[i] for i in picked],
                [encoded[i][1] for i in picked],
                [encoded[i][0] for i in picked],
                [pairs[i][0] in keep for i in picked],
                args.keep_kl,
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 10 == 0:
            print(
                f"[{spec.name}] step {step + 1}/{steps} answer loss {np.mean(losses[-10:]):.3f} "
                f"{(time.perf_counter() - started) / 60:.1f} min",
                flush=True,
            )
    minutes = (time.perf_counter() - started) / 60
    folder = Path(args.out) / spec.name
    model.save_pretrained(str(folder))
    unwrapped = model.unload()  # the base without LoRA layers, for the next adapter
    to_fp16(folder, base_name=args.base_name)
    info = {
        "dimension": spec.dimension,
        "rank": spec.rank,
        "targets": list(spec.targets),
        "top_layers": spec.top_layers,
        "steps": steps,
        "batch_size": args.batch_size,
        "lr": spec.lr,
        "train_minutes": round(minutes, 2),
        "lower_layers_cache_s": round(cached_s, 1),
        "seconds_per_step": round((minutes * 60 - cached_s) / steps, 2),
        "threads": args.threads,
        "bf16_autocast": args.bf16,
        "examples": len(pairs),
        "keep_examples": sum(p in keep for p, _ in pairs),
        "keep_kl": args.keep_kl,
        "first_answer_loss": round(float(np.mean(losses[:5])), 3),
        "final_answer_loss": round(float(np.mean(losses[-10:])), 3),
        "file_bytes": (folder / "adapter_model.safetensors").stat().st_size,
    }
    return info, unwrapped


def to_fp16(folder: Path, base_name: str) -> None:
    """Cast the saved weights to float16 (half the size; the engine holds them in float32) and name
    the base the way the served default model is named (the engine checks the name)."""
    from safetensors.torch import load_file, save_file

    path = folder / "adapter_model.safetensors"
    save_file({k: v.to(torch.float16).contiguous() for k, v in load_file(str(path)).items()}, str(path))
    cfg_path = folder / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = base_name
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    readme = folder / "README.md"
    if readme.exists():
        readme.unlink()  # peft's model-card stub; docs/lora.md describes the adapters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", help="adapter name(s) to train (default: all)")
    ap.add_argument("--steps", type=int, default=None, help="steps per adapter (default: each adapter's own)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--examples", type=int, default=64, help="training pairs per adapter")
    ap.add_argument("--keep", type=int, default=0, help="base-answered prompts per other suite (0: none)")
    ap.add_argument("--keep-dim", action="append", help="SUITE=K: K keep prompts of that suite instead of --keep")
    ap.add_argument(
        "--keep-kl",
        type=float,
        default=0.0,
        help="weight of the KL term that holds the adapter to the base's distributions on the keep answers",
    )
    ap.add_argument(
        "--code-neighbours",
        type=int,
        default=0,
        help="keep prompts next to the code suite's but outside it (see code_neighbours), for the other adapters",
    )
    ap.add_argument(
        "--states-cache",
        type=Path,
        default=None,
        help="folder keeping the frozen lower layers' outputs per example set (reruns skip that pass)",
    )
    ap.add_argument(
        "--keep-cache",
        type=Path,
        default=Path("/tmp/tokenops-lora-keep-answers.json"),
        help="JSON cache of the base's keep answers (shared by the adapters and reruns)",
    )
    ap.add_argument(
        "--top-layers", type=int, default=None, help="LoRA on the last N layers (default: each adapter's own)"
    )
    ap.add_argument("--rank", type=int, default=None, help="LoRA rank (default: each adapter's own)")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default: each adapter's own)")
    ap.add_argument(
        "--init",
        type=Path,
        default=None,
        help="folder holding an adapter of the same name to continue training from (warm start)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-bf16", dest="bf16", action="store_false")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-name", default="smollm2-135m-instruct")
    ap.add_argument("--out", type=Path, default=OUT, help="folder the adapter folders and report.json go to")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(REPO / "tests"))
    from real_model import smollm2_folder

    folder = smollm2_folder()
    tok = AutoTokenizer.from_pretrained(str(folder))
    base = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    for p in base.parameters():
        p.requires_grad_(False)
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    report_path = args.out / "report.json"
    for spec in SPECS:
        if args.only and spec.name not in args.only:
            continue
        spec = replace(
            spec,
            **{
                k: v
                for k, v in (("top_layers", args.top_layers), ("rank", args.rank), ("lr", args.lr))
                if v is not None
            },
        )
        pairs = training_pairs(spec.dimension, args.examples, args.seed)
        args.keep_prompts = []
        if args.keep:
            t0 = time.perf_counter()
            counts = {d: int(k) for d, k in (x.split("=") for x in args.keep_dim or [])}
            dims = keep_prompts(spec.dimension, args.keep, args.seed, counts)
            if spec.dimension != "code":
                dims.update(dict.fromkeys(code_neighbours(args.code_neighbours, args.seed), "code"))
            prompts = list(dims)
            kept = list(zip(prompts, base_answers(base, tok, prompts, dims, args.keep_cache, end_id)))
            args.keep_prompts = prompts
            print(
                f"[{spec.name}] {len(kept)} keep answers from the base in {time.perf_counter() - t0:.0f}s", flush=True
            )
            pairs = pairs[: len(pairs) - len(kept)] + kept
            random.Random(args.seed).shuffle(pairs)
        info, base = train_one(base, tok, spec, pairs, args)
        info["command"] = "scripts/train_lora_adapters.py " + " ".join(sys.argv[1:])
        print(f"[{spec.name}] {json.dumps(info)}", flush=True)
        report = json.loads(report_path.read_text()) if report_path.exists() else {"adapters": {}}
        report["adapters"][spec.name] = info  # read just before writing: adapters may train in parallel
        report_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
