"""Hold a trained LoRA adapter to its own suite: rewrite each ``lora_A`` so that the adapter's update
stays what it was on the activations of its own suite and shrinks on the activations of the other
suites (issue 40: each adapter must stay within 3 points of the base off its suite).

A LoRA module adds ``B A x`` to a projection's output. Let ``C_in`` be the second moment of the
module's input ``x`` over the adapter's own training rows (training seeds: prompt and answer tokens,
with the adapter active, as served) and ``C_off`` the same over keep rows (the other suites' training
prompts answered by the base, the ``--keep`` share of ``scripts/train_lora_adapters.py``). The new
``A'`` minimises ``E_in |A' x - A x|^2 + lam E_off |A' x|^2 + eps |A'|^2``::

    A' = A C_in (C_in + lam C_off + eps I)^-1,    eps = ridge * trace(C_in) / d

- ``lam = 0`` keeps the update on the span of the suite's own activations and drops it on directions
  that suite never excites (the ridge sets how faint a direction may be and still count);
- ``lam > 0`` also trades some of the own-suite update away where the other suites' activations lie.

``B`` is unchanged, so the adapter keeps its rank, its file size and its format (a PEFT folder
``tokenops serve --lora`` and ``peft`` load as before). Once ``A' x`` is small off the suite, a larger
``--scale`` (a factor on ``lora_alpha``) buys back own-suite strength at little cost elsewhere.
No prompt of the held-out split (the suites' seed 0) or the validation split (seed 9000) is used:
the rows come from the same training-seed generators as the training script, which exclude both
(``tests/multi_model/test_lora_training_data.py``). Settings are chosen on the validation split
(``tests/benchmarks/lora_quality.py --seed 9000``) and the held-out split is measured once.

    .venv/bin/python scripts/restrict_lora_adapters.py --only smollm2-math --off-weight 0 \\
        --out /tmp/restricted                     # then lora_quality.py --adapters /tmp/restricted
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
ADAPTERS = REPO / "tokenops" / "demo_models" / "adapters"


def restrict(a: torch.Tensor, c_in: torch.Tensor, c_off: torch.Tensor, off_weight: float, ridge: float) -> torch.Tensor:
    """``A C_in (C_in + off_weight C_off + eps I)^-1`` with ``eps = ridge * trace(C_in) / d``, in float64,
    returned in ``a``'s dtype. ``c_in`` and ``c_off`` are (d, d) second moments (mean of ``x x^T``)."""
    d = c_in.shape[0]
    c_in, c_off = c_in.double(), c_off.double()
    eps = ridge * torch.trace(c_in) / d
    m = c_in + off_weight * c_off + eps * torch.eye(d, dtype=torch.float64)
    # m is symmetric: A C_in m^-1 = (m^-1 C_in A^T)^T
    return torch.linalg.solve(m, c_in @ a.double().T).T.to(a.dtype)


def lora_modules(model) -> dict[str, torch.nn.Module]:
    """The ``peft`` LoRA layers of ``model`` by the name their weights carry in the safetensors file."""
    return {name: mod for name, mod in model.named_modules() if "default" in getattr(mod, "lora_A", {})}


@torch.no_grad()
def second_moments(model, rows: list[list[int]]) -> dict[str, tuple[torch.Tensor, int]]:
    """Sum of ``x x^T`` and the token count of each LoRA module's input over ``rows`` (token id lists,
    one forward each, all positions)."""
    acc: dict[str, list] = {}
    hooks = []
    for name, mod in lora_modules(model).items():

        def hook(_m, inputs, name=name):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).float()
            entry = acc.setdefault(name, [torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64), 0])
            entry[0] += (x.T @ x).double()
            entry[1] += x.shape[0]

        hooks.append(mod.register_forward_pre_hook(hook))
    try:
        model.eval()
        for ids in rows:
            model(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return {name: (s, n) for name, (s, n) in acc.items()}


def rewrite(
    src: Path, dst: Path, stats_in: dict, stats_off: dict, off_weight: float, ridge: float, scale: float
) -> dict:
    """Write the restricted copy of the adapter folder ``src`` to ``dst``; returns what changed."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(src / "adapter_model.safetensors"))
    kept = []
    for key, value in weights.items():
        if ".lora_A." not in key:
            continue
        module = key.rsplit(".lora_A.", 1)[0]
        (s_in, n_in), (s_off, n_off) = stats_in[module], stats_off[module]
        new = restrict(value, s_in / n_in, s_off / n_off, off_weight, ridge)
        x_off = (new.double() @ (s_off / n_off) @ new.double().T).trace() / (
            value.double() @ (s_off / n_off) @ value.double().T
        ).trace()
        kept.append(float(x_off))
        weights[key] = new
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "adapter_config.json").read_text())
    config["lora_alpha"] = config["lora_alpha"] * scale
    (dst / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(weights, str(dst / "adapter_model.safetensors"), metadata={"format": "pt"})
    if (src / "README.md").exists():
        shutil.copy(src / "README.md", dst / "README.md")
    return {
        "off_weight": off_weight,
        "ridge": ridge,
        "scale": scale,
        "lora_alpha": config["lora_alpha"],
        # E_off |A' x|^2 / E_off |A x|^2 over the modules: how much of the off-suite input the rows still see
        "off_energy_kept_mean": round(sum(kept) / len(kept), 4),
    }


def combine_off(by_suite: dict, balance: str) -> dict[str, tuple[torch.Tensor, int]]:
    """One (sum, count) per module from the per-suite second moments: ``tokens`` pools every keep token
    (a suite with long answers weighs more), ``suites`` averages each suite's mean (returned with count 1)."""
    suites = list(by_suite.values())
    out = {}
    for module in suites[0]:
        if balance == "tokens":
            out[module] = (sum(s[module][0] for s in suites), sum(s[module][1] for s in suites))
        else:
            out[module] = (sum(s[module][0] / s[module][1] for s in suites) / len(suites), 1)
    return out


def parse_per_adapter(values: list[str] | None, default: float) -> tuple[float, dict[str, float]]:
    """``X`` sets the default, ``NAME=X`` one adapter's value."""
    per: dict[str, float] = {}
    for v in values or []:
        if "=" in v:
            name, x = v.split("=", 1)
            per[name] = float(x)
        else:
            default = float(v)
    return default, per


def main() -> None:
    import train_lora_adapters as T

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adapters", type=Path, default=ADAPTERS, help="folder holding the adapter folders to restrict")
    ap.add_argument("--only", action="append", help="adapter name(s) (default: all three)")
    ap.add_argument("--off-weight", action="append", help="lam, or NAME=lam (default 0)")
    ap.add_argument("--ridge", action="append", help="ridge, or NAME=ridge (default 1e-3)")
    ap.add_argument("--scale", action="append", help="factor on lora_alpha, or NAME=factor (default 1)")
    ap.add_argument("--examples", type=int, default=200, help="own-suite training rows for C_in")
    ap.add_argument("--keep", type=int, default=48, help="keep prompts per other suite for C_off")
    ap.add_argument("--keep-dim", action="append", help="SUITE=K: K keep prompts of that suite instead of --keep")
    ap.add_argument(
        "--code-neighbours", type=int, default=64, help="code neighbours among the keep rows (not for code)"
    )
    ap.add_argument("--keep-cache", type=Path, default=Path("/tmp/tokenops-lora-keep-answers.json"))
    ap.add_argument("--stats-cache", type=Path, default=None, help="folder keeping the second moments per adapter")
    ap.add_argument(
        "--off-balance",
        choices=["tokens", "suites"],
        default="tokens",
        help="C_off over all keep tokens, or the mean of each other suite's own (short answers count as much as long)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True, help="folder the restricted adapter folders go to")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    off_weight, off_per = parse_per_adapter(args.off_weight, 0.0)
    ridge, ridge_per = parse_per_adapter(args.ridge, 1e-3)
    scale, scale_per = parse_per_adapter(args.scale, 1.0)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(REPO / "tests"))
    from real_model import smollm2_folder

    folder = smollm2_folder()
    tok = AutoTokenizer.from_pretrained(str(folder))
    base = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    report = {}
    for spec in T.SPECS:
        if args.only and spec.name not in args.only:
            continue
        t0 = time.perf_counter()
        cached = args.stats_cache / f"{spec.name}.pt" if args.stats_cache else None
        if cached and cached.exists():
            stats_in, stats_off, counts = torch.load(cached)
        else:
            pairs = T.training_pairs(spec.dimension, args.examples, 0)
            counts_per = {d: int(k) for d, k in (x.split("=") for x in args.keep_dim or [])}
            dims = T.keep_prompts(spec.dimension, args.keep, 0, counts_per)
            if spec.dimension != "code":
                dims.update(dict.fromkeys(T.code_neighbours(args.code_neighbours, 0), "code"))
            prompts = list(dims)
            kept = list(zip(prompts, T.base_answers(base, tok, prompts, dims, args.keep_cache, end_id)))
            model = PeftModel.from_pretrained(base, str(args.adapters / spec.name))
            stats_in = second_moments(model, [T.encode(tok, p, a, end_id)[0] for p, a in pairs])
            stats_off = {
                suite: second_moments(model, [T.encode(tok, p, a, end_id)[0] for p, a in kept if dims[p] == suite])
                for suite in sorted(set(dims.values()))
            }
            base = model.unload()
            counts = {"own_rows": len(pairs), "keep_rows": len(kept)}
            if cached:
                cached.parent.mkdir(parents=True, exist_ok=True)
                torch.save((stats_in, stats_off, counts), cached)
        info = rewrite(
            args.adapters / spec.name,
            args.out / spec.name,
            stats_in,
            combine_off(stats_off, args.off_balance),
            off_per.get(spec.name, off_weight),
            ridge_per.get(spec.name, ridge),
            scale_per.get(spec.name, scale),
        )
        info.update(
            counts,
            off_balance=args.off_balance,
            seconds=round(time.perf_counter() - t0, 1),
            source=str(args.adapters / spec.name),
        )
        info["command"] = "scripts/restrict_lora_adapters.py " + " ".join(sys.argv[1:])
        report[spec.name] = info
        print(f"[{spec.name}] {json.dumps(info)}", flush=True)
    path = args.out / "restrict-report.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**earlier, **report}, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
