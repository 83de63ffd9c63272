"""Knowledge distillation of a bundled student on captured teacher answers (CPU).

Loss per answer token: ``(1 - w) * CE(student, captured answer)`` (sequence-level KD: the
teacher's answers are the labels) ``+ w * T^2 * KL(teacher_T || student_T)`` (logit KD, only
when the teacher is a bundled HF folder with the student's vocabulary: it is loaded and run
on the same batch). Reuses the ladder's answer-only batching (``tokenops_plugins.multi_model._task_training``)
and writes an HF folder like the ladder's. Resumable: ``checkpoint.pt`` in the output folder
holds the weights, the optimizer and the step; ``resume=True`` continues from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tokenops
import torch

DEMO_MODELS = Path(tokenops.__file__).resolve().parent / "demo_models"


def resolve_model(name_or_path: str) -> Path:
    """A bundled demo model name (``ladder-small``) or an HF folder path."""
    for candidate in (Path(name_or_path).expanduser(), DEMO_MODELS / name_or_path):
        if (candidate / "config.json").exists():
            return candidate
    raise FileNotFoundError(
        f"no HF model folder for {name_or_path!r} (a bundled name like ladder-small, or a path holding config.json)"
    )


def load_hf(folder: Path):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bar is the one shown

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


@dataclass(slots=True)
class KDConfig:
    steps: int = 200
    lr: float = 1e-3
    batch_size: int = 16
    max_len: int = 192
    warmup: int = 20
    kd_weight: float = 0.5  # share of the logit-KD term (0: sequence-level KD only)
    temperature: float = 1.0
    seed: int = 0
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        assert self.steps > 0 and self.batch_size > 0 and self.max_len >= 16
        assert 0.0 <= self.kd_weight <= 1.0 and self.temperature > 0


def kd_loss(
    student, teacher, ids, att, labels, cfg: KDConfig, kd_rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, float, float]:
    """(loss, ce, kl) on the answer positions only; ``kd_rows`` (bool per row, default all)
    limits the logit-KD term to those rows (replayed student answers get none)."""
    target = labels[:, 1:]
    keep = target != -100
    hidden = student.model(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state
    logits = student.lm_head(hidden[:, :-1][keep]).float()
    ce = torch.nn.functional.cross_entropy(logits, target[keep])
    if teacher is None or cfg.kd_weight == 0:
        return ce, ce.item(), 0.0
    with torch.no_grad():
        t_hidden = teacher.model(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state
        t_logits = teacher.lm_head(t_hidden[:, :-1][keep]).float()
    t = cfg.temperature
    per_token = (
        torch.nn.functional.kl_div(
            torch.log_softmax(logits / t, -1), torch.log_softmax(t_logits / t, -1), log_target=True, reduction="none"
        ).sum(-1)
        * t
        * t
    )
    if kd_rows is not None:
        rows = torch.arange(ids.shape[0]).unsqueeze(1).expand_as(target)[keep]
        per_token = per_token[kd_rows[rows]]
    if per_token.numel() == 0:
        return ce, ce.item(), 0.0
    kl = per_token.mean()
    return (1 - cfg.kd_weight) * ce + cfg.kd_weight * kl, ce.item(), kl.item()


def _teacher(teacher_dir: Path | None, student: Any, cfg: KDConfig, log: Callable[[str], None]) -> Any:
    """The teacher for logit KD, or None (no teacher, no KD weight, or another vocabulary)."""
    if teacher_dir is None or cfg.kd_weight <= 0:
        return None
    teacher = load_hf(teacher_dir).eval()
    if teacher.config.vocab_size != student.config.vocab_size:
        log(
            f"teacher vocabulary {teacher.config.vocab_size} != student {student.config.vocab_size}: "
            f"sequence-level KD only"
        )
        return None
    return teacher


def _encode(
    tok: Any,
    student: Any,
    pairs: list[tuple[str, str]],
    replay_prompts: list[str] | None,
    cfg: KDConfig,
    log: Callable[[str], None],
) -> tuple[list[Any], torch.Tensor]:
    """The training rows (the pairs, then the replayed prompts with the student's own greedy
    answers) and, per row, whether it is a KD row (replayed ones are cross-entropy only)."""
    from ..multi_model import _task_training as tt

    encoded = [tt.encode_pair(tok, p, a, cfg.max_len) for p, a in pairs]
    is_kd = [True] * len(encoded)
    if replay_prompts:
        started_replay = time.perf_counter()
        own = tt.generate_greedy(student, tok, replay_prompts, max(tt.MAX_NEW_TOKENS.values()))
        student.train()
        encoded += [tt.encode_pair(tok, p, a, cfg.max_len) for p, a in zip(replay_prompts, own)]
        is_kd += [False] * len(own)
        log(
            f"replay: the student answered {len(own)} dropped prompts itself "
            f"({time.perf_counter() - started_replay:.0f}s)"
        )
    return encoded, torch.tensor(is_kd)


def train(
    student_dir: Path,
    pairs: list[tuple[str, str]],
    out: Path,
    cfg: KDConfig,
    teacher_dir: Path | None = None,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
    replay_prompts: list[str] | None = None,
) -> dict:
    """Fine-tune the student in ``student_dir`` on (prompt, answer) ``pairs``; the result goes to ``out``.

    ``replay_prompts`` (the prompts of pairs the quality filter dropped) are answered by the
    student itself before training (greedy) and trained on with cross-entropy only: the
    student keeps what it did on them instead of forgetting that kind of prompt."""
    from tokenizers import Tokenizer
    from tokenops.training.chat import lr_at, save_model

    from ..multi_model import _task_training as tt

    if not pairs:
        raise ValueError("no captured pairs to train on (capture some traffic first, see docs/distillation.md)")
    tok = Tokenizer.from_file(str(student_dir / "tokenizer.json"))
    torch.manual_seed(cfg.seed)
    student = load_hf(student_dir).train()
    teacher = _teacher(teacher_dir, student, cfg, log)
    encoded, kd_flags = _encode(tok, student, pairs, replay_prompts, cfg, log)
    opt = tt.make_optimizer(student, cfg.lr)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / "checkpoint.pt"
    rng = np.random.default_rng(cfg.seed)
    step = _resume(ckpt_path, student, opt, rng, cfg, log) if resume else 0
    batch = min(cfg.batch_size, len(encoded))
    ces, kls, started = [], [], time.perf_counter()
    with _progress_bar(progress) as bar:
        task = bar.add_task("train", total=cfg.steps, completed=step, info="")
        while step < cfg.steps:
            picked = rng.choice(len(encoded), size=batch, replace=False)
            rows = [encoded[i] for i in picked]
            ids, att, labels = tt.make_batch(rows)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
            loss, ce, kl = kd_loss(
                student, teacher, ids, att, labels, cfg, kd_flags[torch.from_numpy(picked)] if replay_prompts else None
            )
            tt.optimizer_step(student, opt, loss)
            ces.append(ce)
            kls.append(kl)
            step += 1
            bar.update(task, advance=1, info=f"ce {np.mean(ces[-20:]):.3f} kl {np.mean(kls[-20:]):.3f}")
            if step % cfg.checkpoint_every == 0 and step < cfg.steps:
                _save_checkpoint(ckpt_path, student, opt, step, rng)
    _save_checkpoint(ckpt_path, student, opt, step, rng)
    save_model(student, out, student_dir)
    return {
        "steps": step,
        "pairs": len(pairs),
        "replayed": len(encoded) - len(pairs),
        "logit_kd": teacher is not None,
        "kd_weight": cfg.kd_weight,
        "final_ce": float(np.mean(ces[-20:])) if ces else None,
        "final_kl": float(np.mean(kls[-20:])) if kls else None,
        "train_minutes": round((time.perf_counter() - started) / 60, 2),
        "out": str(out),
    }


def _save_checkpoint(path: Path, student: Any, opt: Any, step: int, rng: np.random.Generator) -> None:
    """Weights, optimizer, step and the batch sampler's state: ``--resume`` continues the same run."""
    torch.save(
        {"model": student.state_dict(), "optimizer": opt.state_dict(), "step": step, "rng": rng.bit_generator.state},
        path,
    )


def _resume(path: Path, student: Any, opt: Any, rng: np.random.Generator, cfg: KDConfig, log: Callable) -> int:
    """Load the checkpoint at ``path`` into ``student``, ``opt`` and ``rng``; the step to continue from."""
    if not path.exists():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}")
    ckpt = torch.load(path, weights_only=False)
    student.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    step = ckpt["step"]
    rng.bit_generator.state = ckpt["rng"]
    log(f"resumed at step {step} of {cfg.steps}")
    return step


def _progress_bar(progress: bool) -> Any:
    """The training's progress bar (steps, running CE/KL, time left); a no-op without ``progress``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("distill"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    )
    return Progress(*columns, disable=not progress, transient=False)
