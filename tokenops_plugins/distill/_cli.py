"""``tokenops distill``: export captured teacher traffic, train a student on it, evaluate it.

Registered by the ``distill_capture`` plugin through ``tokenops_register_commands``. Store
commands work whether or not a server holds the store (``open_store``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from tokenops.cli.options import ConfigOpt, JsonOpt, StoreOpt

distill_app = typer.Typer(
    help="The distillation loop: captured teacher traffic -> a cheaper student / a better draft.", no_args_is_help=True
)

STRONG_DIMENSIONS = "extraction,code,instruction"  # where ladder-large beats ladder-small (ladder_report.json)


def _settings(config: str | None):
    from tokenops.config import load_settings

    return load_settings(config)


def _open(store: str | None, config: str | None, read_only: bool = False):
    from tokenops.store import open_store

    return open_store(store or _settings(config).store.path, read_only=read_only)


def _retention(config: str | None, store) -> int:
    from ._pairs import prune
    from .capture import parse_config

    cfg = parse_config(dict(_settings(config).plugin_settings("distill_capture")))
    return prune(store, cfg.retention_days, cfg.max_rows)


def _emit(data: dict, as_json: bool, line: str) -> None:
    typer.echo(json.dumps(data) if as_json else line)


MinConfidenceOpt = Annotated[
    float | None,
    typer.Option(
        "--min-confidence",
        metavar="P",
        help="Keep pairs whose teacher's mean token probability exp(mean logprob) >= P "
        "(pairs captured without logprobs are kept and counted).",
    ),
]
KeepTruncatedOpt = Annotated[
    bool,
    typer.Option("--keep-truncated", help="Keep answers cut at max_tokens (finish_reason length); dropped by default."),
]


def _min_confidence(value: float | None) -> float | None:
    from tokenops.errors import UserError

    from ._pairs import validate_min_confidence

    try:
        return validate_min_confidence(value)
    except ValueError as e:
        raise UserError(str(e)) from None


_STATUS_SQL = """
SELECT tenant, model, count(*) AS pairs,
       count(*) FILTER (WHERE coalesce(finish_reason, '') <> 'length') AS not_truncated,
       count(mean_logprob) AS with_logprobs,
       median(exp(mean_logprob)) AS median_confidence,
       count(*) FILTER (WHERE mean_logprob IS NULL OR exp(mean_logprob) >= ?) AS confident,
       count(*) FILTER (WHERE coalesce(finish_reason, '') <> 'length'
                        AND (mean_logprob IS NULL OR exp(mean_logprob) >= ?)) AS kept
FROM distill_pairs GROUP BY ALL ORDER BY ALL
"""


@distill_app.command("status")
def status(
    min_confidence: MinConfidenceOpt = None, store: StoreOpt = None, config: ConfigOpt = None, as_json: JsonOpt = False
) -> None:
    """Captured pairs per tenant and teacher model, and how many each quality filter keeps."""
    p = _min_confidence(min_confidence) or 0.0
    with _open(store, config) as s:
        pruned = _retention(config, s)
        rows = s.execute(_STATUS_SQL, [p, p]).fetchall()
    pairs = [
        {
            "tenant": t,
            "model": m,
            "count": n,
            "not_truncated": nt,
            "with_logprobs": wl,
            "median_confidence": None if med is None else round(float(med), 4),
            "confident": conf,
            "kept": kept,
        }
        for t, m, n, nt, wl, med, conf, kept in rows
    ]
    data = {"pruned": pruned, "min_confidence": min_confidence, "pairs": pairs}
    lines = []
    for r in pairs:
        med = "-" if r["median_confidence"] is None else f"{r['median_confidence']:.2f}"
        line = (
            f"{r['tenant']}\t{r['model']}\t{r['count']} pairs\tnot truncated {r['not_truncated']}\t"
            f"with logprobs {r['with_logprobs']} (median confidence {med})"
        )
        if min_confidence:
            line += f"\tconfidence >= {min_confidence:g}: {r['confident']}\tboth filters: {r['kept']}"
        lines.append(line)
    _emit(data, as_json, "\n".join(lines) or "no captured pairs")


@distill_app.command("purge")
def purge(
    tenant: Annotated[str, typer.Option("--tenant", help="Delete every captured pair of this tenant.")],
    store: StoreOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a tenant's captured pairs."""
    from ._pairs import purge as purge_pairs

    with _open(store, config) as s:
        n = purge_pairs(s, tenant)
    _emit({"tenant": tenant, "deleted": n}, as_json, f"deleted {n} captured pairs of tenant {tenant!r}")


@distill_app.command("export")
def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="JSON Lines file to write.")],
    model: Annotated[str | None, typer.Option("--model", help="Only this teacher's answers.")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's pairs.")] = None,
    min_confidence: MinConfidenceOpt = None,
    keep_truncated: KeepTruncatedOpt = False,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write captured pairs as chat fine-tuning JSON Lines ({"messages": [...]} per line)."""
    from ._pairs import export_jsonl, load, quality_filter

    min_confidence = _min_confidence(min_confidence)
    with _open(store, config) as s:
        _retention(config, s)
        pairs = load(s, model=model, tenant=tenant)
    pairs, counts = quality_filter(pairs, min_confidence, keep_truncated)
    n = export_jsonl(pairs, out)
    _emit(
        {"out": str(out), "pairs": n, "filter": counts.as_dict()},
        as_json,
        f"wrote {n} pairs to {out} ({counts.line()})",
    )


def _pairs_for(
    store: str | None,
    config: str | None,
    teacher: str,
    tenant: str | None,
    heldout: float,
    limit: int | None,
    min_confidence: float | None = None,
    keep_truncated: bool = False,
    dropped: list | None = None,
):
    """(train, held-out, filter counts): the split is by request id over all pairs, then both sides are
    filtered, so the held-out set does not move with the filter. The training pairs the filter
    dropped are appended to ``dropped`` when given."""
    from ._pairs import load, quality_filter, split_heldout

    with _open(store, config) as s:
        _retention(config, s)
        pairs = load(s, model=teacher, tenant=tenant, limit=limit)
    if not pairs:
        raise FileNotFoundError(
            f"no captured pairs of model {teacher!r} in the store: enable [plugins.distill_capture] "
            f"and send traffic first (docs/distillation.md)"
        )
    train_pairs, held = split_heldout(pairs, heldout)
    candidates = train_pairs
    train_pairs, counts = quality_filter(train_pairs, min_confidence, keep_truncated)
    if dropped is not None:
        kept_ids = {p.id for p in train_pairs}
        dropped += [p for p in candidates if p.id not in kept_ids]
    held, _ = quality_filter(held, min_confidence, keep_truncated)
    return train_pairs, held, counts


@distill_app.command("train")
def train(
    teacher: Annotated[
        str, typer.Option("--teacher", help="Captured model name; also a bundled model/folder for logit KD.")
    ],
    student: Annotated[str, typer.Option("--student", help="Bundled student (ladder-small) or HF folder.")],
    out: Annotated[Path | None, typer.Option("--out", help="Output HF folder (default store/distilled/NAME).")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Name of the distilled model.")] = None,
    steps: Annotated[int, typer.Option(min=1)] = 200,
    lr: float = 1e-3,
    batch_size: Annotated[int, typer.Option(min=1)] = 16,
    kd_weight: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of logit KD (0: answers only).")] = 0.5,
    temperature: Annotated[float, typer.Option(min=0.05)] = 1.0,
    heldout: Annotated[float, typer.Option(min=0.0, max=0.9, help="Share of pairs kept for eval.")] = 0.1,
    limit: Annotated[int | None, typer.Option(help="Use the oldest N pairs only.")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from OUT/checkpoint.pt.")] = False,
    min_confidence: MinConfidenceOpt = None,
    keep_truncated: KeepTruncatedOpt = False,
    replay_dropped: Annotated[
        bool,
        typer.Option(
            "--replay-dropped",
            help="Train on the student's own answers to the prompts the quality filter "
            "dropped (no logit KD there), so it does not forget those kinds of prompt.",
        ),
    ] = False,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Fine-tune the student on the teacher's captured answers (sequence + logit KD), on CPU."""
    from ._kd import KDConfig, resolve_model
    from ._kd import train as run_train

    min_confidence = _min_confidence(min_confidence)
    student_dir = resolve_model(student)
    try:
        teacher_dir = resolve_model(teacher)
    except FileNotFoundError:
        teacher_dir = None  # an upstream teacher: its answers only
    dropped: list = []
    train_pairs, _, counts = _pairs_for(
        store, config, teacher, tenant, heldout, limit, min_confidence, keep_truncated, dropped
    )
    if not train_pairs:
        raise FileNotFoundError(f"no training pairs left after the quality filter ({counts.line()})")
    if not as_json:
        typer.echo(f"training pairs: {counts.line()}", err=True)
    name = name or f"{student}-from-{Path(teacher).name}"
    out = out or Path(_settings(config).store.path).expanduser().parent / "distilled" / name
    cfg = KDConfig(steps=steps, lr=lr, batch_size=batch_size, kd_weight=kd_weight, temperature=temperature)
    info = run_train(
        student_dir,
        [(p.prompt, p.answer) for p in train_pairs],
        out,
        cfg,
        teacher_dir=teacher_dir,
        resume=resume,
        progress=not as_json,
        log=lambda s: typer.echo(s, err=True),
        replay_prompts=[p.prompt for p in dropped] if replay_dropped else None,
    )
    info["filter"] = counts.as_dict()
    (out / "distill_info.json").write_text(json.dumps(info | {"teacher": teacher, "student": student}, indent=2) + "\n")
    _emit(
        info,
        as_json,
        f"distilled {name}: {info['steps']} steps on {info['pairs']} pairs -> {out}\n"
        f'serve it with [[models]] name = "{name}" path = "{out}"',
    )


@distill_app.command("eval")
def evaluate(
    distilled: Annotated[Path, typer.Option("--distilled", help="The distilled HF folder.")],
    student: Annotated[str, typer.Option("--student", help="The student before distillation.")] = "ladder-small",
    teacher: Annotated[str, typer.Option("--teacher")] = "ladder-large",
    dimensions: Annotated[str, typer.Option(help="Held-out suite dimensions.")] = STRONG_DIMENSIONS,
    n: Annotated[int, typer.Option("-n", min=1, help="Held-out tasks per dimension.")] = 50,
    heldout: Annotated[float, typer.Option(min=0.0, max=0.9)] = 0.1,
    acceptance: Annotated[bool, typer.Option(help="Also measure draft acceptance on the engine.")] = True,
    min_confidence: MinConfidenceOpt = None,
    keep_truncated: KeepTruncatedOpt = False,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Student before/after (and teacher) on held-out suites and held-out captured traffic."""
    from ._evaluation import draft_acceptance, suite_figures, traffic_figures
    from ._kd import resolve_model

    min_confidence = _min_confidence(min_confidence)
    models = {"before": resolve_model(student), "after": resolve_model(str(distilled))}
    teacher_dir = None
    try:
        teacher_dir = resolve_model(teacher)
        models["teacher"] = teacher_dir
    except FileNotFoundError:
        pass
    dims = [d.strip() for d in dimensions.split(",") if d.strip()]
    try:
        _, held, _ = _pairs_for(store, config, teacher, None, heldout, None, min_confidence, keep_truncated)
    except FileNotFoundError:
        held = []
    held_pairs = [(p.prompt, p.answer) for p in held]
    report: dict = {"suites": {}, "traffic": {}, "acceptance": {}}
    for label, folder in models.items():
        report["suites"][label] = {d: v["accuracy"] for d, v in suite_figures(folder, dims, n).items()}
        if label != "teacher":
            report["traffic"][label] = traffic_figures(folder, held_pairs)
            if acceptance and teacher_dir is not None and held_pairs:
                report["acceptance"][label] = draft_acceptance(teacher_dir, folder, [p for p, _ in held_pairs[:16]])
    if as_json:
        typer.echo(json.dumps(report))
        return
    for label, accs in report["suites"].items():
        typer.echo(f"{label:8s} suites  " + "  ".join(f"{d} {a:.2f}" for d, a in accs.items()))
    for label, t in report["traffic"].items():
        if t.get("n"):
            typer.echo(
                f"{label:8s} traffic n={t['n']} exact {t['exact_match']:.2f} token agreement {t['token_agreement']:.2f}"
            )
    for label, a in report["acceptance"].items():
        typer.echo(f"{label:8s} draft acceptance {a['acceptance_rate']:.2f} (k={a['k']})")


def register(app: typer.Typer) -> None:
    app.add_typer(distill_app, name="distill")
